"""The inferred graph's guard of one Panacea run: :mod:`strategies.graph_guard`'s rules
applied round by round (its stage, its two side hypernetworks, their record and the choice).

:class:`GraphGuard` holds the guard's state; the Panacea strategy that holds it
(:class:`GuardHost`: :class:`strategies.panacea.Panacea`) calls it to add the side models to a
round's train messages (:meth:`GraphGuard.side_messages`), to check and keep a reply's side
model (:meth:`GraphGuard.reply_problem`), to step the side after the run's own server step
(:meth:`GraphGuard.update`) and to checkpoint (:meth:`GraphGuard.state`,
:meth:`GraphGuard.load`). The run's own hypernetwork is the host's; where the guard's choice
moves the run to another hypernetwork, it asks the host (:meth:`GuardHost.run_on`).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any, Protocol

import torch
from flwr.app import ConfigRecord, Message
from flwr.supercore import log

from .core.protocol import CONFIG
from .core.settings import TRAIN, RunCannotGoOn
from .graph_guard import (
    GENERIC_TRAIN,
    GRAPH,
    GUARD,
    GUARD_MARGIN,
    GUARD_SHARE,
    HOLD_OUT,
    HOLD_OUT_RUN,
    NONE,
    OTHER,
    SIDE,
    SIDE_CONFIG,
    TRIM,
    VALIDATION,
    WARMUP,
    WATCH,
    Arm,
    choose,
    falls_behind,
    guard_arms,
    round_means,
    side_problem,
)
from .panacea_client import PanaceaSettings
from .panacea_graph import WarmUp, embedding_rows, grow, grown, new_hypernetwork


class GuardHost(Protocol):
    """What the guard uses of the Panacea run that holds it."""

    @property
    def flat(self) -> Any: ...  # the run's layout of a model as one vector
    @property
    def history(self) -> Any: ...  # its notes hold the guard's record
    @property
    def device(self) -> torch.device: ...
    seed: int
    client_ids: list[int]
    buffers: torch.Tensor  # the initial model's buffers, appended to generated models
    own: PanaceaSettings  # the run's own settings: the side hypernetworks train at them
    path: tuple[PanaceaSettings, dict]  # the no-graph path's settings and train keys
    wants_generator: bool
    infer_k: int
    similarity: str
    true_adjacency: torch.Tensor | None
    warmup_rounds: int
    guard_rounds: int
    pair_gen: torch.Generator
    main: Arm | None  # the run's hypernetwork GH, its SGD and graph

    def update_bound(self, sent_norms: torch.Tensor) -> torch.Tensor: ...
    def apart_mask(self, rows: torch.Tensor) -> torch.Tensor | None: ...
    def held_models(self, rows: torch.Tensor | None = None) -> torch.Tensor: ...
    def run_on(self, arm: Arm, settings: PanaceaSettings, adjacency: torch.Tensor | None,
               generator: bool, layers: int) -> None: ...


def infer_graph(host: GuardHost, server_round: int, warmup: WarmUp) -> torch.Tensor:
    """The warm-up is over: the graph of the clients' mean updates (pairs the policy keeps
    apart never chosen), recorded in the history's notes."""
    apart = host.apart_mask(torch.arange(len(warmup.counts)))
    adjacency, note = warmup.infer(server_round, host.infer_k, host.similarity, apart,
                                   host.client_ids, host.true_adjacency)
    host.history.notes["inferred_graph"] = note
    return adjacency


def inference_said(k: int, similarity: str, warmup_rounds: int, guard_rounds: int) -> str:
    """How the run's graph is inferred, and whether it is guarded, for the run's log."""
    return (f"the {k}-nearest-neighbour graph ({similarity} similarity) of the clients' "
            f"updates in the first {warmup_rounds} round(s), from the same initial model" + (
                f"; guarded: the run trains as pFedHN while, on the side, the graph's and no "
                f"graph's hypernetworks train {guard_rounds} round(s); the graph takes over "
                f"only if it beats no graph by more than {GUARD_MARGIN:.0%} on "
                f"{GUARD_SHARE:.0%} of the clients' training rows held out"
                if guard_rounds else "; used unchecked (graph-guard-rounds = 0)"))


def unasked(msg: Message) -> str | None:
    """A reply's side model or held-out errors where its message sent no side model."""
    records = msg.content.array_records
    return None if SIDE not in records and VALIDATION not in records else \
        f"'{SIDE}' or '{VALIDATION}' in a reply to a message that sent no side model"


def _new_net(host: GuardHost, sizes: dict, generator: bool, s: PanaceaSettings
             ) -> tuple[Any, torch.optim.Optimizer]:
    """A hypernetwork over the host run's clients (:func:`panacea_graph.new_hypernetwork`)."""
    return new_hypernetwork(host.flat, len(host.client_ids), host.seed, host.device, sizes,
                            generator, s)


class GraphGuard:
    """The guard's state: its stage (the warm-up, the guard, the watch, or "" when over), the
    warm-up's sums, the inferred graph on trial, the two side hypernetworks (``arms``), each
    round's mean held-out errors (``record``), the choice (``decided``) and, within a round,
    the side models sent (by row: arm and model) and trained (by client id: model and
    held-out errors)."""

    def __init__(self, host: GuardHost) -> None:
        self.host = host
        self.stage = WARMUP
        self.decided: str | None = None  # after the guard: GRAPH or NONE
        self.record: list[dict] = []
        self.inferred: torch.Tensor | None = None
        self.arms: dict[str, Arm] = {}
        self.warmup: WarmUp | None = None
        self.initial: torch.Tensor | None = None
        self.sent: dict[int, tuple[int, torch.Tensor]] = {}
        self.back: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def start(self, initial: torch.Tensor) -> None:
        """The run's initial model (the warm-up's side model) and, in the warm-up, its sums."""
        self.initial = initial
        if self.stage == WARMUP:
            self.warmup = WarmUp(len(self.host.client_ids), self.host.flat.num_params)

    def make_arms(self, adjacency: torch.Tensor) -> dict[str, Arm]:
        """The side hypernetworks at the run's own settings: on the inferred graph (with the
        graph generator for Panacea), and Panacea-GN on an empty graph (pFedHN's network), so
        that the two differ in the graph alone."""
        host, own = self.host, self.host.own
        adj = adjacency.float().to(host.device)
        graph = _new_net(host, own.sizes(own.panacea_gnn_layers), host.wants_generator, own)
        none = _new_net(host, own.sizes(0), False, own)
        return {GRAPH: Arm(*graph, adj, host.wants_generator), NONE: Arm(*none, None, False)}

    def side_messages(self, server_round: int, messages: list[Message], rows: torch.Tensor,
                      config: ConfigRecord) -> None:
        """In the guard's rounds each train message also carries the side model to train (the
        initial model, or its arm's), its training's keys (the run's own; in the watch the
        no-graph path's), the other arm's model to test, and the share of rows to hold out."""
        self.sent, self.back = {}, {}
        if not self.stage or not messages:
            return
        host = self.host
        keys = {k: config[k] for k in GENERIC_TRAIN if k in config}
        own = {**host.own.message_values(TRAIN), **keys}
        arms = guard_arms(rows, server_round)
        trains, other = self._side_models(rows, arms)
        if self.stage == WATCH:  # the side trains the no-graph path (pFedHN) at its settings
            own = {**host.path[0].message_values(TRAIN), **keys, **host.path[1]}
        for msg, row, arm, vec, test in zip(messages, rows.tolist(), arms.tolist(), trains, other,
                                            strict=True):
            msg.content[CONFIG] = ConfigRecord({**dict(msg.content.config_records[CONFIG]),
                                                HOLD_OUT: GUARD_SHARE,
                                                HOLD_OUT_RUN: self.stage == WATCH})
            msg.content[SIDE] = host.flat.unflatten(vec)
            msg.content[SIDE_CONFIG] = ConfigRecord(own)
            if test is not None:
                msg.content[OTHER] = host.flat.unflatten(test)
            self.sent[row] = (arm, vec)

    def _side_models(self, rows: torch.Tensor, arms: torch.Tensor
                     ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The side models of ``rows``: to train (the warm-up's initial model, or the arm's)
        and to test (the other arm's; none in the warm-up)."""
        buffers = self.host.buffers
        if self.stage == WARMUP:
            assert self.initial is not None
            return self.initial[None].expand(len(rows), -1).clone(), [None] * len(rows)
        if self.stage == WATCH:  # the no-graph path's model to train, the run's to test
            return self.arms[NONE].generate(rows, buffers), list(self.host.held_models(rows))
        graph = self.arms[GRAPH].generate(rows, buffers)
        none = self.arms[NONE].generate(rows, buffers).to(graph)
        pick = (arms == 0).to(graph.device)[:, None]
        return torch.where(pick, graph, none), list(torch.where(pick, none, graph))

    def reply_problem(self, msg: Message, cid: int, row: int | None, spec: Any) -> str | None:
        """A reply to a message that sent a side model carries it trained (and, after the
        warm-up, the two held-out errors), kept for :meth:`update`; other replies neither."""
        if row not in self.sent:
            return unasked(msg)
        side = msg.content.array_records.get(SIDE)
        held, problem = side_problem(self.stage in (GUARD, WATCH), side, spec,
                                     msg.content.array_records.get(VALIDATION))
        if problem is None:
            assert side is not None
            self.back[cid] = (self.host.flat.flatten(side).to(self.host.device), held)
        return problem

    def update(self, server_round: int, rows: torch.Tensor, diverged: bool = False) -> None:
        """The guard's side of a round: the side models of the clients whose replies were
        used (within the same update bound), summed in the warm-up, then the two
        hypernetworks' steps on them and, after the guard's last round, the choice (in the
        watch, where the run's own hypernetwork ``diverged``, the way back to pFedHN)."""
        host, p = self.host, self.host.flat.num_params
        ids = host.client_ids
        rows = torch.tensor([r for r in rows.tolist() if r in self.sent and ids[r] in self.back],
                            dtype=torch.long)
        back = [self.back[ids[r]] for r in rows.tolist()]
        params = torch.stack([b[0] for b in back])[:, :p] if back else \
            torch.zeros(0, p, device=host.device)
        sent = torch.stack([self.sent[r][1] for r in rows.tolist()])[:, :p] if back else params
        keep = (params - sent).norm(dim=1) <= host.update_bound(sent.norm(dim=1))
        for r in rows[~keep.cpu()].tolist():
            log(WARNING, "Round %d: client %s's side model is left out: its update exceeds "
                "max-update-ratio", server_round, ids[r])
        rows, params, s = rows[keep.cpu()], params[keep], host.own
        arms = torch.tensor([self.sent[r][0] for r in rows.tolist()], dtype=torch.long)
        if self.stage == WARMUP:
            assert self.warmup is not None and self.initial is not None
            self.warmup.add(rows, params, self.initial[:p])
            if server_round < host.warmup_rounds:
                return
            self.inferred = infer_graph(host, server_round, self.warmup)
            self.warmup = None
            self.arms, self.stage = self.make_arms(self.inferred), GUARD
            arms = torch.zeros(len(rows), dtype=torch.long)  # both step on the warm-up's models
            self.arms[NONE].steps(rows, params, int(s.panacea_server_steps),
                                  float(s.panacea_server_clip), 0.0, host.pair_gen)
        elif self.stage == WATCH:
            self._watch(server_round, rows, params, diverged)
            return
        else:
            self._record(server_round, arms, [self.back[ids[r]][1] for r in rows.tolist()])
            mask = (arms == 1).to(params.device)
            self.arms[NONE].steps(rows[arms == 1], params[mask], int(s.panacea_server_steps),
                                  float(s.panacea_server_clip), 0.0, host.pair_gen)
            rows, params = rows[arms == 0], params[~mask]
        self.arms[GRAPH].steps(rows, params, int(s.panacea_server_steps),
                               float(s.panacea_server_clip), s.panacea_lambda_d, host.pair_gen)
        broken = [name for name, arm in self.arms.items() if not arm.finite()]
        if broken:  # the run (pFedHN) is intact: the side is dropped, the run goes on
            self.decide(server_round, diverged=broken)
        elif self.stage == GUARD and server_round >= host.warmup_rounds + host.guard_rounds:
            self.decide(server_round)

    def _record(self, server_round: int, arms: torch.Tensor,
                held: list[torch.Tensor | None]) -> None:
        """A guard (or watch) round's mean held-out errors of both hypernetworks (in the
        watch: the run's on the graph, and the no-graph path's), logged and kept."""
        have = [i for i, h in enumerate(held) if h is not None]
        kept = [h for h in held if h is not None]
        losses = torch.stack(kept) if kept else torch.zeros(0, 2, dtype=torch.float64)
        means: dict = {"round": server_round, **round_means(arms[have], losses)}
        if self.stage == WATCH:
            means["stage"] = WATCH
        self.record.append(means)
        log(INFO, "Round %d: %s: mean error on held-out rows of %d clients: inferred graph "
            "%.4g, no graph%s %.4g", server_round, self.stage, means["clients"], means[GRAPH],
            " (pFedHN)" if self.stage == WATCH else "", means[NONE])

    def _watch(self, server_round: int, rows: torch.Tensor, params: torch.Tensor,
               diverged: bool) -> None:
        """A watch round (the graph took over): the no-graph path's steps (at its settings) on
        the side models trained, both errors recorded and, where the graph's run has fallen
        behind the no-graph path on the held-out rows or ``diverged``, the run back on that
        path (the run stops where both diverged)."""
        host = self.host
        held = [self.back[host.client_ids[r]][1] for r in rows.tolist()]
        # every client trained the no-graph path's model and tested the run's as the other
        self._record(server_round, torch.ones(len(rows), dtype=torch.long), held)
        path = host.path[0]
        self.arms[NONE].steps(rows, params, int(path.panacea_server_steps),
                              float(path.panacea_server_clip), 0.0, host.pair_gen)
        note = host.history.notes.setdefault("graph_guard", {})
        note["rounds"] = self.record
        if not self.arms[NONE].finite():  # the run (the graph's) is intact: it goes on alone
            note["watch_ended"] = {"round": server_round, "why": (
                "the watched no-graph path's hypernetwork diverged (its parameters or a model "
                "it generates no longer finite)")}
            log(WARNING, "Round %d: the watched no-graph path (pFedHN) diverged: the watch "
                "ends, the run goes on with the inferred graph", server_round)
            self.stage, self.arms = "", {}
            if diverged:
                raise RunCannotGoOn(
                    f"round {server_round}: the inferred graph's hypernetwork and the pFedHN "
                    "path watched beside it both diverged (their parameters or the models they "
                    "generate no longer finite): lower panacea-server-lr or "
                    "panacea-server-steps (the last checkpoint is intact)")
            return
        if falls_behind([r for r in self.record if r.get("stage") == WATCH]):
            self.switch_back(server_round)
        elif diverged:  # the graph's run diverged: the pFedHN path watched takes it back
            self.switch_back(server_round, diverged=True)

    def switch_back(self, server_round: int, diverged: bool = False) -> None:
        """The graph's run fell behind on the held-out rows (or ``diverged``: its
        hypernetwork's parameters or a model it generates are no longer finite): the run goes
        on as the no-graph path (pFedHN) it kept training on the side, at its settings, to
        the end."""
        self.host.run_on(self.arms[NONE], self.host.path[0], None, False, 0)
        self.decided, self.stage, self.arms = NONE, "", {}
        note = self.host.history.notes.setdefault("graph_guard", {})
        note["switched_back"] = {"round": server_round, "why": (
            "the inferred graph's run diverged (its hypernetwork's parameters or a model it "
            "generates no longer finite)" if diverged else
            "the inferred graph's run had a higher mean held-out error than the no-graph "
            "path's (pFedHN, trained on the side since the graph took over) over the last two "
            "watch rounds")}
        log(WARNING, "Round %d: the inferred graph's run %s: the run goes back to pFedHN from "
            "the next round (trained on the side since round %d)", server_round,
            "diverged" if diverged else "fell behind the no-graph path (pFedHN) on the "
            "clients' held-out rows", int(note.get("round", 0)) + 1)

    def decide(self, server_round: int, diverged: list[str] | None = None) -> None:
        """The guard's end: the graph's hypernetwork takes over the run if it won; else the
        run goes on as the pFedHN it has been (at once where a side hypernetwork
        ``diverged``: its parameters or a model it generates no longer finite)."""
        host = self.host
        chosen = self.decided = NONE if diverged else choose(self.record)
        host.history.notes["graph_guard"] = {
            "round": server_round, "chosen": chosen, "held_out_share": GUARD_SHARE,
            "criterion": f"mean error (classification: 1 - accuracy; regression: MSE) on the "
                         f"clients' held-out training rows (each round's {TRIM:.0%} highest and "
                         f"lowest left out), the graph's over no graph's, averaged over the last "
                         f"two guard rounds: the graph takes over if below {1 - GUARD_MARGIN:g}",
            "rounds": self.record,
            **({"diverged": diverged} if diverged else {})}
        graph, self.stage, self.arms, self.warmup = self.arms.get(GRAPH), "", {}, None
        if chosen == GRAPH:
            assert graph is not None and self.inferred is not None and host.main is not None
            # the no-graph path the run has been (pFedHN) goes on training on the side, watched
            watched = Arm(host.main.net, host.main.optimizer, None, False)
            host.run_on(graph, host.own, self.inferred, host.wants_generator,
                        host.own.panacea_gnn_layers)
            log(INFO, "Round %d: the inferred graph beat no graph by more than %g%% on the "
                "clients' held-out rows: Panacea on it takes over the run, watched to the end "
                "against pFedHN (trained on the side; the run goes back to it if the graph "
                "falls behind)", server_round, 100 * GUARD_MARGIN)
            self.stage, self.arms = WATCH, {NONE: watched}
        elif diverged:
            log(WARNING, "Round %d: the guard's side hypernetwork of %s diverged (its "
                "parameters or a model it generates no longer finite): the side is dropped, the "
                "run goes on as pFedHN (no graph), as it has trained since round 1",
                server_round, " and ".join(diverged))
        else:
            log(WARNING, "Round %d: the inferred graph did not beat no graph by more than %g%% "
                "on the clients' held-out rows: the run goes on as pFedHN (no graph), as it "
                "has trained since round 1", server_round, 100 * GUARD_MARGIN)

    def add_client(self, gen: torch.Generator, like: torch.Tensor) -> None:
        """One more client: a row of the warm-up's sums, or in each side hypernetwork an
        embedding of its own draw (``gen``; shaped and placed as a row of ``like``) and no
        edges."""
        if self.warmup is not None:
            self.warmup.grow()
        for arm in self.arms.values():
            grow(arm.net, arm.optimizer, torch.randn(1, like.shape[1], generator=gen).to(like))
            if arm.adj is not None:
                arm.adj = grown(arm.adj)
        if self.inferred is not None:
            self.inferred = grown(self.inferred)

    def state(self) -> dict:
        """The checkpoint's ``graph_guard``: the stage, the choice, the record, the graph on
        trial, the side hypernetworks and their optimizers, and in the warm-up its sums."""
        state: dict = {"stage": self.stage, "decided": self.decided or "",
                       "record": list(self.record), "inferred": self.inferred,
                       "arms": {name: {"hnet": arm.net.state_dict(),
                                       "optimizer": arm.optimizer.state_dict()}
                                for name, arm in self.arms.items()}}
        if self.stage == WARMUP and self.warmup is not None:
            state.update(sums=self.warmup.sums.clone(), counts=self.warmup.counts)
        return state

    def load_stage(self, state: dict) -> None:
        """A checkpoint's stage, choice, record and graph on trial (before the host builds
        its hypernetwork: after a choice of the graph, it is the graph's)."""
        self.stage, self.decided = state["stage"], state["decided"] or None
        self.record, self.inferred = list(state["record"]), state["inferred"]

    def load(self, state: dict) -> None:
        """A run cut in the guard's rounds goes on with its warm-up sums or its side
        hypernetworks (after :meth:`start`)."""
        if self.stage == WARMUP and "sums" in state:
            assert self.warmup is not None
            self.warmup.load(state["sums"], state["counts"])
        if self.stage in (GUARD, WATCH):
            path = self.host.path[0]
            self.arms = self.make_arms(state["inferred"]) if self.stage == GUARD else {
                NONE: Arm(*_new_net(self.host, path.sizes(0), False, path), None, False)}
            for name, arm in self.arms.items():
                arm.net.load_state_dict(state["arms"][name]["hnet"])
                arm.optimizer.load_state_dict(state["arms"][name]["optimizer"])


def guard_rows(guard: GraphGuard) -> tuple[list[list], list[list], list[list]]:
    """Where the checkpoint's ``graph_guard`` holds a row of each client: the warm-up's sums
    and counts, and its embeddings and their momentum in each side hypernetwork; and a row
    and column (the graph on trial)."""
    arms = [path for name, arm in guard.arms.items()
            for path in embedding_rows(["graph_guard", "arms", name], arm.net)]
    return [["graph_guard", "sums"], ["graph_guard", "counts"]], arms, [["graph_guard",
                                                                          "inferred"]]


def graph_use(guard: GraphGuard) -> str:
    """What the run does with the inferred graph, for its page and cards."""
    notes = guard.host.history.notes.get("graph_guard", {})
    back = notes.get("switched_back")
    if guard.stage == GUARD:
        return (f"on trial: the guard decides after round "
                f"{guard.host.warmup_rounds + guard.host.guard_rounds}")
    if guard.stage == WATCH:
        return "used by the run, watched against pFedHN on the clients' held-out rows"
    if back:
        return (f"used until round {back['round']}, then dropped: " + (
            "it diverged" if "diverged" in str(back.get("why", "")) else
            "pFedHN did better on the clients' held-out rows"))
    if guard.decided == NONE:
        return ("not used: a hypernetwork of the guard diverged" if notes.get("diverged") else
                "not used: it did not beat no graph on the clients' held-out rows")
    return "used by the run"
