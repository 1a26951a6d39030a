"""The guard of an inferred client graph: the graph takes over a run only if it beats no graph
on held-out rows; until then, and otherwise, the run is pFedHN.

Panacea with ``graph = "inferred"`` (:mod:`strategies.panacea`) builds its client graph from
warm-up updates; a wrong graph makes the GCN and the graph generator pull each client's model
toward unrelated clients, and such a run can end worse than with no graph at all
(docs/methods.md). With ``graph-guard-rounds`` G > 0 (the default, 4):

* from round 1 the run trains as pFedHN, with pFedHN's settings as this run config would run
  ``strategy = "pfedhn"`` (its server SGD, its clients' keys, local steps and batch size): it
  is what every client is sent, trains and is tested on;
* beside it, each train message of the warm-up's W rounds and the guard's G rounds carries a
  side model (:data:`SIDE`, with its training's keys, :data:`SIDE_CONFIG`: the run's own
  Panacea settings), which the client trains on its rows less a held-out
  :data:`GUARD_SHARE` (seeded by the run's seed and its id, the same rows every round) and
  replies; the held-out rows are never trained on by a side model;
* in the warm-up the side model is the initial model (the updates the graph is inferred
  from); after it the server keeps two side hypernetworks at the run's settings, one on the
  inferred graph and one with no graph (Panacea-GN on an empty graph), so that they differ in
  the graph alone; both take their first steps on the warm-up's last models;
* in each guard round each client trains the model of one of them (:func:`guard_arms`: half
  the clients each, swapped each round) and, before training, tests both on its held-out
  rows: its reply carries the two errors (:data:`VALIDATION`: classification, the share of
  rows wrong; regression, the MSE);
* after the G-th round (:func:`choose`) the graph's hypernetwork takes over the run (at the
  run's own settings) only if its mean held-out error over each round's clients (the 10%
  highest and lowest left out, :data:`TRIM`), over no graph's, averaged over the last two
  guard rounds, is below 1 - :data:`GUARD_MARGIN` (0.8: a smaller win does not make up for
  the difference between Panacea's settings, which the graph brings, and pFedHN's); else
  the side is dropped and the run goes on as the pFedHN it has been. The choice is logged
  and recorded in ``metrics.json`` (``graph_guard``);
* where the graph took over, it is watched to the run's end (:data:`WATCH`): the no-graph
  path the run had been (pFedHN, at its settings) goes on training on the side, every client
  training its model as the side model and testing both on its held-out rows (on which, from
  then on, the run's model does not train either: :data:`HOLD_OUT_RUN`); where the graph's
  run has a higher mean held-out error than the no-graph path over the last two watch
  rounds (:func:`falls_behind`), the run goes back to that path for good, logged at WARNING and
  recorded (``graph_guard.switched_back``). So a choice made early is checked to the end.

So a run whose graph loses is the pFedHN run of the same run config, to the last digit
(``tests/test_graph_guard.py``). Why the comparison is of two side hypernetworks at the same
settings and not of the graph against pFedHN: pFedHN's reference settings learn more slowly
(one server step of lr 0.01 a round against Panacea's 10 to 20 of 0.1) and would lose any
comparison made after a few rounds even where they end better (TPT-48: 0.27 against 0.018
after 4 guard rounds, 0.0165 against 0.020 after 60; docs/methods.md).

The choice is made on held-out training rows only, never on the test rows. Cost: W + G rounds
in which each client trains two models (the run's and the side's), two more models in each of
their messages, and G x 2 more numbers in replies; a run that keeps the graph has trained it on
half the clients for G rounds; a run that took the graph trains two models a client in every
round after (the watch), and its run's model trains on the rows less the held-out share. With
dp there is no guard (its errors are not made private: ``graph-guard-rounds`` must be 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord

from .core.protocol import BATCH_SIZE, LOCAL_EPOCHS, LOCAL_STEPS, short_repr
from .core.replies import arrays_problem
from .hypernetwork import GraphHyperNetwork, normalized_adjacency, sample_pairs, server_step

#: train config key: the share of its training rows a client holds out this round (0: none)
HOLD_OUT = "panacea-hold-out"
#: in a guard round's train message: the other hypernetwork's model for this client
OTHER = "panacea-other"
#: in a guard round's train reply: the held-out error of the side model trained and the other
VALIDATION = "panacea-validation"
#: the share of each client's training rows held out in the warm-up and guard rounds
GUARD_SHARE = 0.2
#: the largest share a client accepts to hold out (a hostile server cannot starve its training)
MOST_HOLD_OUT = 0.5
#: the inferred graph takes over only if its held-out error is below (1 - this) x no graph's.
#: A fifth: the graph brings Panacea's settings with it, and a smaller win over no graph at
#: them does not make up for their own gap to pFedHN's at the run's end (TPT-48, seed 0: the
#: graph 5% under no graph in the guard, Panacea on it 19% over pFedHN after 60 rounds;
#: chosen after that run, docs/methods.md)
GUARD_MARGIN = 0.2
GRAPH, NONE = "inferred graph", "no graph"


def guard_arms(rows: torch.Tensor, server_round: int) -> torch.Tensor:
    """Which hypernetwork each sampled client (store row) trains in a guard round: 0, the
    inferred graph's; 1, no graph's. Half the rows each, by the row's parity, swapped each
    round (a client trains both in turn)."""
    return (rows.cpu() + server_round) % 2


def hold_out_share(value: object) -> float:
    """The share a train message asks a client to hold out, checked (client side)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not \
            0 <= float(value) <= MOST_HOLD_OUT:
        raise ValueError(f"message key '{HOLD_OUT}' = {short_repr(value)} is invalid; allowed: "
                         f"a number in [0, {MOST_HOLD_OUT}]")
    return float(value)


def validation_record(own: float, other: float) -> ArrayRecord:
    """A client's reply record: the held-out error of the model it trains and of the other
    (classification: the share of rows it gets wrong; regression: the MSE)."""
    return ArrayRecord({"error": torch.tensor([own, other], dtype=torch.float64)})


def held_out_error(loss: float, accuracy: float | None) -> float:
    """What the guard compares on the held-out rows: 1 - accuracy (classification: a loss of
    early, overconfident models swings with a few rows, their errors do not), else the MSE."""
    return loss if accuracy is None else 1.0 - accuracy


def read_validation(record: ArrayRecord | None) -> tuple[torch.Tensor | None, str | None]:
    """The two errors of a guard round's reply record, or why they cannot be used."""
    if record is None:
        return None, f"no ArrayRecord '{VALIDATION}' (a guard round's reply needs it)"
    if list(record.keys()) != ["error"]:
        return None, f"'{VALIDATION}' holds {sorted(record.keys())[:3]}; expected ['error']"
    try:
        error = torch.as_tensor(record["error"].numpy()).double()
    except (TypeError, ValueError) as err:
        return None, f"'{VALIDATION}' is not readable: {err}"
    if tuple(error.shape) != (2,) or not bool(torch.isfinite(error).all()) \
            or bool((error < 0).any()):
        return None, f"'{VALIDATION}' must hold two finite errors >= 0, got {error.tolist()[:4]}"
    return error, None


#: the share of the clients' errors left out at each end of a guard round's mean (at least
#: one at each end where three or more replied): a client that lies about its errors (0 for
#: one hypernetwork, 1e300 for the other) moves it no more than an honest one at the edge,
#: as long as the liars are no more than that share (or one, below ten clients)
TRIM = 0.1


def trimmed_mean(values: torch.Tensor, trim: float = TRIM) -> float:
    """The mean of ``values`` without the ``max(1, floor(trim * n))`` smallest and largest
    (none where fewer than three), each divided by the count before the sum (finite values
    never overflow to an infinite mean)."""
    n = len(values)
    if not n:
        return math.nan
    cut = max(1, int(trim * n)) if n >= 3 else 0
    kept = torch.sort(values.double()).values[cut: n - cut]
    return float((kept / len(kept)).sum())


def round_means(arms: torch.Tensor, errors: torch.Tensor) -> dict[str, float | int]:
    """One guard round: each hypernetwork's held-out error over the clients that replied,
    their :func:`trimmed_mean`. ``errors``: (clients, 2), [error of the model trained, of
    the other]; ``arms``: each client's :func:`guard_arms`."""
    graph = torch.where(arms == 0, errors[:, 0], errors[:, 1])
    none = torch.where(arms == 0, errors[:, 1], errors[:, 0])
    return {"clients": len(errors), GRAPH: trimmed_mean(graph), NONE: trimmed_mean(none)}


def choose(rounds: list[dict], margin: float = GUARD_MARGIN) -> str:
    """:data:`GRAPH` if, over the last two guard rounds with replies (one, where there is
    only one), the inferred graph's mean held-out error is below ``(1 - margin)`` x no
    graph's (the mean of the two rounds' :func:`error_ratio`); else :data:`NONE` (no round
    with replies: :data:`NONE`, the path that cannot be worse than no graph). Two rounds:
    the clients swap hypernetworks each round, and a hypernetwork's models of the clients
    that trained it the round before are fresher than the others' (its error zig-zags from
    round to round); two rounds weigh both halves alike."""
    seen = [r for r in rounds if r["clients"] > 0][-2:]
    if not seen:
        return NONE
    return GRAPH if sum(map(error_ratio, seen)) / len(seen) < 1 - margin else NONE


def error_ratio(means: dict) -> float:
    """A guard round's held-out error of the graph's hypernetwork over no graph's (0 over 0:
    1, a tie; more than 0 over 0: infinite). A ratio, so that two rounds count alike while
    both errors fall from one round to the next."""
    graph, none = float(means[GRAPH]), float(means[NONE])
    if none > 0:
        return graph / none
    return 1.0 if graph == 0 else math.inf


#: in a warm-up or guard round's train message: the model the client trains on the side (the
#: warm-up's initial model, or its arm's), and the config of that training (the run's own
#: ``panacea-client-*`` keys, ``local-steps``, ``local-epochs``, ``batch-size``); in the reply,
#: the side model trained
SIDE, SIDE_CONFIG = "panacea-side", "panacea-side-config"


@dataclass
class Arm:
    """One of the guard's hypernetworks: the inferred graph's (its GCN and, for Panacea, its
    graph generator) or no graph's, at the run's own settings."""

    net: GraphHyperNetwork
    optimizer: torch.optim.Optimizer
    adj: torch.Tensor | None  # on the server's device; None: no graph
    generator: bool
    #: the normalized adjacency of the graph it last computed, and that graph
    _prop: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False,
                                                            compare=False)

    @property
    def prop(self) -> torch.Tensor | None:
        """The graph's normalized adjacency, computed once per graph (a client that joins
        gives the arm a new ``adj``)."""
        if self.adj is None:
            return None
        if self._prop is None or self._prop[0] is not self.adj:
            self._prop = (self.adj, normalized_adjacency(self.adj))
        return self._prop[1]

    @torch.no_grad()
    def generate(self, rows: torch.Tensor, buffers: torch.Tensor) -> torch.Tensor:
        """Full flat models for store rows ``rows``."""
        z = self.net.encode(self.prop)
        theta = self.net.generate(z[rows.to(z.device)])
        return torch.cat([theta, buffers.expand(len(theta), -1)], dim=1)

    def steps(self, rows: torch.Tensor, trained: torch.Tensor, count: int, clip: float,
              lambda_d: float, pair_gen: torch.Generator) -> dict[str, float]:
        """``count`` server steps (:func:`strategies.hypernetwork.server_step`; with the graph
        generator, on pairs drawn by ``pair_gen``) toward the trained models (parameters
        only) of ``rows``; the last step's losses."""
        losses: dict[str, float] = {}
        prop = self.prop
        for _ in range(count if len(rows) else 0):
            pairs = sample_pairs(self.adj, pair_gen) if self.generator and self.adj is not None \
                else None
            server_step(self.net, self.optimizer, prop, rows.to(trained.device), trained,
                        self.adj, lambda_d if self.generator else 0.0, pairs, clip, losses)
        return losses

    def finite(self) -> bool:
        """Whether every parameter, and every client's model it generates, is still finite
        (steps too large make them not; parameters finite but large enough that a
        generated model overflows, too)."""
        if not all(bool(torch.isfinite(p).all()) for p in self.net.parameters()):
            return False
        with torch.no_grad():
            return bool(torch.isfinite(self.net.generate(self.net.encode(self.prop))).all())


def side_problem(losses_needed: bool, side: ArrayRecord | None, spec: Any,
                 validation: ArrayRecord | None) -> tuple[torch.Tensor | None, str | None]:
    """A warm-up or guard round's reply: its side model must be there and be the run's model
    (``spec``), and in a guard round the two held-out errors; returns the errors."""
    if side is None:
        return None, f"no ArrayRecord '{SIDE}' (this round's reply needs its side model)"
    problem = arrays_problem(side, spec)
    if problem is not None:
        return None, f"'{SIDE}': {problem}"
    if not losses_needed:
        return None, None if validation is None else f"'{VALIDATION}' in a warm-up round"
    return read_validation(validation)

#: the guard's stages (``GraphGuard.stage``): the warm-up's rounds, the guard's, and, once the
#: graph took over, the watch to the run's end
WARMUP, GUARD, WATCH = "warm-up", "guard", "watch"
#: in a watch round's train message: the run's model too trains on the rows less the held-out
#: ones (so that the graph's run never sees the rows it is compared on; the pFedHN path did,
#: as the run, in the warm-up's and the guard's rounds)
HOLD_OUT_RUN = "panacea-hold-out-run"


def falls_behind(rounds: list[dict]) -> bool:
    """Whether, over the last two watch rounds with replies (none before there are two), the
    graph's run has a higher held-out error than the no-graph path's: the sum of its two
    rounds' means above the path's: the run then goes back to the no-graph path. A tie (both
    errors 0, say) keeps the graph: it is then no worse. Every client tests both models each
    watch round, on the same rows (each mean is trimmed on its own: :func:`trimmed_mean`), so
    the two rounds' means are summed, not their ratios (no zig-zag to even out); two rounds,
    so that one noisy round does not decide, and the first watch round, where the no-graph
    path has trained on the held-out rows in the warm-up and guard rounds (it was the run),
    never decides alone."""
    seen = [r for r in rounds if r["clients"] > 0][-2:]
    return len(seen) == 2 and sum(float(r[GRAPH]) / 2 for r in seen) > sum(  # no overflow
        float(r[NONE]) / 2 for r in seen)
#: the generic keys of a train message that the side training takes from the run's own
GENERIC_TRAIN = (LOCAL_STEPS, LOCAL_EPOCHS, BATCH_SIZE)
