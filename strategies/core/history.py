"""The records of a run: per round, per client (the ``metrics.json`` of a run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import Message
from flwr.supercore import log

from .protocol import (
    ACCURACY,
    ALONE_LINEAR,
    ALONE_MODEL,
    DP_EPSILON,
    HELD_OUT_GAIN,
    KEPT_MODEL,
    MSE,
    TRAIN_LOSS,
)
from .records import (
    ABSENT,
    DP_SPENT,
    GLOBAL_NORM,
    MEAN_TRAIN_LOSS,
    METRICS,
    REJECTED,
    SERVER_LOSSES,
    TRAINED,
    RunFile,
    client_key,
    client_scores,
    headlines,
    is_client_map,
    mean_key,
    mean_score,
    score_of,
)
from .replies import metrics_of


def client_order(client: int | str) -> tuple[int, int | str]:
    """Sort key: client ids in order, then anything else (unknown senders)."""
    return (0, client) if isinstance(client, int) else (1, str(client))


@dataclass
class RunHistory:
    """Per-round records of a run; serialised into ``metrics.json``.

    ``rounds[r]`` holds, for each metric the clients report (``accuracy``
    for classification, ``mse`` for regression, ``loss``), ``client_<m>``
    (client id to value) and ``mean_<m>``, the mean over the benign training
    clients (neither novel nor attackers); ``novel_mean_<m>`` over the novel
    clients when there are any; ``train_loss``; ``trained_clients``;
    ``client_dp_epsilon`` (client id to the epsilon it reported spent, with ``dp``);
    ``global_norm`` (the global model's norm, strategies that keep one); ``server_losses``
(a method's own losses on the server, by name: Panacea's); and,
    when clients did not take part, ``absent_clients`` (training) and
    ``absent_evaluation`` (client id to the reason: node unavailable, an
    error reply, no reply in time, or a rejected reply, which is also under
    ``rejected`` / ``rejected_evaluation``). A FedAMP round's collaboration
    weights go to ``xi_sink`` (the ServerApp writes them to files beside
    ``metrics.json``, which lists the rounds in ``xi``); without a sink they
    are kept in ``xi[r]``.

    Parameters
    ----------
    novel : Collection[int]
        Client ids of the novel clients (recorded apart).
    attackers : Collection[int]
        Client ids of the attackers (left out of the means).
    """

    novel: frozenset[int] = frozenset()
    attackers: frozenset[int] = frozenset()
    rounds: dict[int, dict[str, Any]] = field(default_factory=dict)
    xi: dict[int, list[list[float]]] = field(default_factory=dict)
    xi_client_ids: list[int] = field(default_factory=list)
    xi_rounds: list[int] = field(default_factory=list)  # rounds the sink wrote
    xi_sink: Callable[[int, list[int], torch.Tensor], bool] | None = None
    #: client id -> a member's name ("" in a partitioned run), for the round line
    names: Callable[[], dict[int, str]] | None = None
    trained: dict[int, int] = field(default_factory=dict)  # client id -> rounds trained
    #: what a method chose during the run (FedAMP's sigma from the data), in metrics.json
    notes: dict[str, Any] = field(default_factory=dict)

    def _round(self, server_round: int) -> dict[str, Any]:
        return self.rounds.setdefault(server_round, {"round": server_round})

    def record_train(self, server_round: int, replies: list[Message], client_of) -> None:
        """Record the mean training loss and the clients that trained."""
        rec = self._round(server_round)
        values = [metrics_of(m).get(TRAIN_LOSS) for m in replies]
        losses = [float(v) for v in values if v is not None]
        rec[TRAINED] = sorted(client_of(m) for m in replies)
        rec[MEAN_TRAIN_LOSS] = float(np.mean(losses)) if losses else None
        spent = {client_of(m): float(v) for m in replies
                 if (v := metrics_of(m).get(DP_EPSILON)) is not None}
        if spent:  # each member's epsilon as it reported it (run config dp)
            rec[DP_SPENT] = {c: spent[c] for c in sorted(spent, key=client_order)}
        for cid in rec[TRAINED]:
            self.trained[cid] = self.trained.get(cid, 0) + 1

    def record_norm(self, server_round: int, norm: float) -> None:
        """Record the norm of the round's global model (strategies with one)."""
        self._round(server_round)[GLOBAL_NORM] = norm

    def record_server_losses(self, server_round: int, losses: dict[str, float]) -> None:
        """Record the losses a method minimised on the server this round, by name."""
        self._round(server_round)[SERVER_LOSSES] = {k: float(v) for k, v in losses.items()}

    def times_trained(self, client_id: int) -> int:
        """In how many rounds so far the client's training reply was used."""
        return self.trained.get(client_id, 0)

    def record_absent(self, server_round: int, phase: str, absent: dict[int, str],
                      rejected: dict[int, str]) -> None:
        """Record the clients of a ``phase`` ("train"/"evaluate") that did not take part."""
        if not absent and not rejected:
            return
        rec = self._round(server_round)
        for key, new in ((ABSENT[phase], absent), (REJECTED[phase], rejected)):
            if new:
                rec[key] = dict(sorted({**rec.get(key, {}), **new}.items()))

    def to_state(self) -> dict[str, Any]:
        """Everything needed to continue the records after a resume (JSON-able)."""
        return {"rounds": [self.rounds[r] for r in sorted(self.rounds)],
                "xi": {str(r): m for r, m in self.xi.items()}, "xi_client_ids": self.xi_client_ids,
                "xi_rounds": list(self.xi_rounds), "notes": dict(self.notes)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`to_state` (client ids come back as ints)."""
        def ids(d):
            return {int(k): v for k, v in d.items()} if isinstance(d, dict) else d
        self.rounds = {}
        for rec in state["rounds"]:
            rec = {k: (ids(v) if is_client_map(k) else v) for k, v in rec.items()}
            self.rounds[int(rec["round"])] = rec
        self.xi = {int(r): m for r, m in state.get("xi", {}).items()}
        self.xi_client_ids = list(state.get("xi_client_ids", []))
        self.xi_rounds = [int(r) for r in state.get("xi_rounds", [])]
        self.notes = dict(state.get("notes", {}))
        self.trained = {}
        for rec in self.rounds.values():
            for cid in rec.get(TRAINED, []):
                self.trained[cid] = self.trained.get(cid, 0) + 1

    def record_evaluation(self, server_round: int, replies: list[Message],
                          client_of) -> dict[str, float]:
        """Record each client's test metrics; return the means over benign training clients.

        ``client_of`` maps a reply to its sender's client id (an int), or to
        something else for nodes that were not discovered, whose replies are skipped.
        """
        values: dict[str, dict[int, float]] = {m: {} for m in METRICS}
        for msg in sorted(replies, key=lambda m: client_order(client_of(m))):
            cid = client_of(msg)
            if msg.has_error() or not isinstance(cid, int):
                continue
            metrics = metrics_of(msg)
            for m in METRICS:
                if m in metrics:
                    values[m][cid] = float(metrics[m])
            alone = {name: float(metrics[key]) for name, key in (("linear", ALONE_LINEAR),
                                                                  ("model", ALONE_MODEL),
                                                                  ("kept", KEPT_MODEL),
                                                                  ("held_out_gain", HELD_OUT_GAIN))
                     if key in metrics}
            if alone:  # a member's scores alone: once per run, the latest said
                self.notes.setdefault("alone", {})[str(cid)] = alone
        rec = self._round(server_round)
        means: dict[str, float] = {}
        for m, by_client in values.items():
            if not by_client:
                continue
            rec[client_key(m)] = dict(sorted(by_client.items()))
            benign = [v for c, v in by_client.items() if c not in self.novel | self.attackers]
            novel = [v for c, v in by_client.items() if c in self.novel]
            if benign:
                means[mean_key(m)] = rec[mean_key(m)] = float(np.mean(benign))
            if novel:
                means[mean_key(m, novel=True)] = rec[mean_key(m, novel=True)] = float(
                    np.mean(novel))
        self._say_round(server_round, rec, values)
        return means

    def _say_round(self, server_round: int, rec: dict[str, Any],
                   values: dict[str, dict[int, float]]) -> None:
        """The round's mean test score in the log, with its range (and the novel clients')."""
        score = score_of(not values[ACCURACY])
        mean = mean_score(rec, score)
        if mean is None:
            return
        vals = values[score.metric]
        who = "benign training clients" if self.novel | self.attackers else "clients"
        scale, unit = score.scale, ("%" if score.scale == 100.0 else "")  # accuracy in percent
        novel = mean_score(rec, score, novel=True)
        extra = f", novel clients {scale * novel:.4g}{unit}" if novel is not None else ""
        names = self.names() if self.names is not None else {}
        benign = {c: v for c, v in vals.items() if c not in self.novel | self.attackers} or vals
        lo, hi = min(benign, key=benign.__getitem__), max(benign, key=benign.__getitem__)
        log(INFO, "Round %d: mean test %s over %d %s %.4g%s (min %.4g%s %s, max %.4g%s %s)%s",
            server_round, score.metric, len(set(vals) - (self.novel | self.attackers)), who,
            scale * mean, unit, scale * benign[lo], unit, _named(lo, names), scale * benign[hi],
            unit, _named(hi, names), extra)

    def record_xi(self, server_round: int, client_ids: list[int], xi: torch.Tensor) -> None:
        """Record the collaboration weights of one round (rows and columns: ``client_ids``)."""
        self.xi_client_ids = list(client_ids)
        if self.xi_sink is None:
            self.xi[server_round] = xi.detach().cpu().double().tolist()
        elif self.xi_sink(server_round, list(client_ids), xi):
            self.xi_rounds.append(server_round)

    def coverage(self, num_clients: int) -> dict[str, Any]:
        """Whom the headline score covers: the round of the best mean, how many clients that
        mean is over (``clients_in_best_round``), out of how many it could be over
        (``benign_clients``: neither novel nor attackers, of ``num_clients``), and every
        client that never produced an evaluation, with the last reason it was left out."""
        score = score_of(any(client_key(MSE) in r for r in self.rounds.values()))
        scored = [(k, r) for k, r in sorted(self.rounds.items())
                  if mean_score(r, score) is not None]
        excluded = {c for c in self.novel | self.attackers if 0 <= c < num_clients}
        out: dict[str, Any] = {"num_clients": num_clients,
                               "benign_clients": num_clients - len(excluded)}
        if scored:
            pick = max if score.higher_is_better else min
            best, rec = pick(scored, key=lambda kr: kr[1][mean_key(score.metric)])
            out["best_round"] = best
            out["clients_in_best_round"] = len(
                set(client_scores(rec, score)) - self.novel - self.attackers)
        evaluated = {c for r in self.rounds.values() for c in client_scores(r, score)}
        never: dict[int, str] = {}
        for cid in range(num_clients):
            if cid in evaluated or cid in self.novel:
                continue
            reasons = [r.get(key, {}).get(cid) for r in self.rounds.values()
                       for key in ABSENT.values()]
            known = [why for why in reasons if why]
            never[cid] = known[-1] if known else "never evaluated"
        out["never_evaluated"] = never
        return out

    def run_file(self, **run: Any) -> RunFile:
        """The run's metrics.json: these records, with ``run``'s fields of :class:`RunFile`
        (who ran what, how far; none: the records alone, for a strategy used on its own)."""
        notes = {**run.pop("extra", {}), **self.notes}
        alone = notes.pop("alone", None)
        if self.xi:
            xi: dict[str, Any] | None = {
                "client_ids": self.xi_client_ids,
                "rounds": {str(r): m for r, m in sorted(self.xi.items())}}
        elif self.xi_rounds:  # the matrices are in files (fedamp_flwr.server.results.XiFiles)
            xi = {"client_ids": self.xi_client_ids, "recorded_rounds": list(self.xi_rounds),
                  "folder": "xi"}
        else:
            xi = None
        return RunFile(**run, rounds=[self.rounds[r] for r in sorted(self.rounds)],
                       headlines=headlines(self.rounds.values()), alone=alone,
                       extra=notes,
                       novel_clients=sorted(self.novel), attackers=sorted(self.attackers), xi=xi)


def _named(client_id: int, names: dict[int, str]) -> str:
    """How the round line names a client: a member's name, else its id."""
    name = names.get(client_id, "")
    return f"'{name}'" if name else f"client {client_id}"
