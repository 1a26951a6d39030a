"""The records of a run: per round, per client (the ``metrics.json`` of a run)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import Message
from flwr.supercore import log

from .protocol import ACCURACY, ALONE_LINEAR, ALONE_MODEL, DP_EPSILON, LOSS, MSE, TRAIN_LOSS
from .replies import metrics_of

METRICS = (ACCURACY, MSE, LOSS)


def best_of_rounds(rounds: Iterable[Mapping[str, Any]], regression: bool,
                   novel: bool = False) -> float | None:
    """A run's headline from its per-round records: the BMTA (best mean test accuracy over
    the rounds, in percent: the FedAMP paper's metric) or the best (lowest) mean test MSE;
    ``novel``: the novel clients' means. None where no round has a mean. The one place
    the headline is computed (``metrics.json`` and the experiment tables)."""
    key = ("novel_" if novel else "") + ("mean_mse" if regression else "mean_accuracy")
    values = [float(r[key]) for r in rounds
              if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    if not values:
        return None
    return min(values) if regression else 100.0 * max(values)


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
    ``global_norm`` (the global model's norm, strategies that keep one); and,
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
        rec["trained_clients"] = sorted(client_of(m) for m in replies)
        rec["train_loss"] = float(np.mean(losses)) if losses else None
        spent = {client_of(m): float(v) for m in replies
                 if (v := metrics_of(m).get(DP_EPSILON)) is not None}
        if spent:  # each member's epsilon as it reported it (run config dp)
            rec["client_dp_epsilon"] = {c: spent[c] for c in sorted(spent, key=client_order)}
        for cid in rec["trained_clients"]:
            self.trained[cid] = self.trained.get(cid, 0) + 1

    def record_norm(self, server_round: int, norm: float) -> None:
        """Record the norm of the round's global model (strategies with one)."""
        self._round(server_round)["global_norm"] = norm

    def times_trained(self, client_id: int) -> int:
        """In how many rounds so far the client's training reply was used."""
        return self.trained.get(client_id, 0)

    def record_absent(self, server_round: int, phase: str, absent: dict[int, str],
                      rejected: dict[int, str]) -> None:
        """Record the clients of a ``phase`` ("train"/"evaluate") that did not take part."""
        if not absent and not rejected:
            return
        rec = self._round(server_round)
        suffix = "clients" if phase == "train" else "evaluation"
        if absent:
            rec.setdefault(f"absent_{suffix}", {}).update(absent)
            rec[f"absent_{suffix}"] = dict(sorted(rec[f"absent_{suffix}"].items()))
        if rejected:
            key = "rejected" if phase == "train" else "rejected_evaluation"
            rec.setdefault(key, {}).update(rejected)
            rec[key] = dict(sorted(rec[key].items()))

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
            rec = {k: (ids(v) if k.startswith(("client_", "absent_", "rejected")) else v)
                   for k, v in rec.items()}
            self.rounds[int(rec["round"])] = rec
        self.xi = {int(r): m for r, m in state.get("xi", {}).items()}
        self.xi_client_ids = list(state.get("xi_client_ids", []))
        self.xi_rounds = [int(r) for r in state.get("xi_rounds", [])]
        self.notes = dict(state.get("notes", {}))
        self.trained = {}
        for rec in self.rounds.values():
            for cid in rec.get("trained_clients", []):
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
                                                                  ("model", ALONE_MODEL))
                     if key in metrics}
            if alone:  # a member's scores alone: once per run, the latest said
                self.notes.setdefault("alone", {})[str(cid)] = alone
        rec = self._round(server_round)
        means: dict[str, float] = {}
        for m, by_client in values.items():
            if not by_client:
                continue
            rec[f"client_{m}"] = dict(sorted(by_client.items()))
            benign = [v for c, v in by_client.items() if c not in self.novel | self.attackers]
            novel = [v for c, v in by_client.items() if c in self.novel]
            if benign:
                means[f"mean_{m}"] = rec[f"mean_{m}"] = float(np.mean(benign))
            if novel:
                means[f"novel_mean_{m}"] = rec[f"novel_mean_{m}"] = float(np.mean(novel))
        main = ACCURACY if values[ACCURACY] else MSE
        if f"mean_{main}" in rec:
            vals = values[main]
            who = "benign training clients" if self.novel | self.attackers else "clients"
            # accuracy in percent, as in BMTA; MSE as it is
            scale, unit = (100.0, "%") if main == ACCURACY else (1.0, "")
            extra = (f", novel clients {scale * rec[f'novel_mean_{main}']:.4g}{unit}"
                     if f"novel_mean_{main}" in rec else "")
            log(INFO, "Round %d: mean test %s over %d %s %.4g%s (min %.4g%s, max %.4g%s)%s",
                server_round, main, len(set(vals) - (self.novel | self.attackers)), who,
                scale * rec[f"mean_{main}"], unit, scale * min(vals.values()), unit,
                scale * max(vals.values()), unit, extra)
        return means

    def record_xi(self, server_round: int, client_ids: list[int], xi: torch.Tensor) -> None:
        """Record the collaboration weights of one round (rows and columns: ``client_ids``)."""
        self.xi_client_ids = list(client_ids)
        if self.xi_sink is None:
            self.xi[server_round] = xi.detach().cpu().double().tolist()
        elif self.xi_sink(server_round, list(client_ids), xi):
            self.xi_rounds.append(server_round)

    def bmta(self) -> float | None:
        """Best mean test accuracy over all rounds, in percent (the paper's metric)."""
        return best_of_rounds(self.rounds.values(), regression=False)

    def best_mean_mse(self) -> float | None:
        """Lowest mean test MSE over all rounds (regression tasks)."""
        return best_of_rounds(self.rounds.values(), regression=True)

    def coverage(self, num_clients: int) -> dict[str, Any]:
        """Whom the headline score covers: the round of the best mean, how many clients that
        mean is over (``clients_in_best_round``), out of how many it could be over
        (``benign_clients``: neither novel nor attackers, of ``num_clients``), and every
        client that never produced an evaluation, with the last reason it was left out."""
        main = "mse" if any("client_mse" in r for r in self.rounds.values()) else "accuracy"
        scored = [(k, r) for k, r in sorted(self.rounds.items()) if r.get(f"mean_{main}") is not None]
        excluded = {c for c in self.novel | self.attackers if 0 <= c < num_clients}
        out: dict[str, Any] = {"num_clients": num_clients,
                               "benign_clients": num_clients - len(excluded)}
        if scored:
            pick = max if main == "accuracy" else min
            best, rec = pick(scored, key=lambda kr: kr[1][f"mean_{main}"])
            out["best_round"] = best
            out["clients_in_best_round"] = len(
                set(rec[f"client_{main}"]) - self.novel - self.attackers)
        evaluated = {c for r in self.rounds.values() for c in r.get(f"client_{main}", {})}
        never: dict[int, str] = {}
        for cid in range(num_clients):
            if cid in evaluated or cid in self.novel:
                continue
            reasons = [r.get(key, {}).get(cid) for r in self.rounds.values()
                       for key in ("absent_clients", "absent_evaluation")]
            known = [why for why in reasons if why]
            never[cid] = known[-1] if known else "never evaluated"
        out["never_evaluated"] = never
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready records."""
        out: dict[str, Any] = {"rounds": [self.rounds[r] for r in sorted(self.rounds)]}
        for regression, key in ((False, "bmta"), (True, "best_mean_mse")):
            best = best_of_rounds(self.rounds.values(), regression)
            if best is not None:
                out[key] = best
                novel = best_of_rounds(self.rounds.values(), regression, novel=True)
                if novel is not None:
                    out[f"novel_{key}"] = novel
        out.update(self.notes)
        out["novel_clients"] = sorted(self.novel)
        out["attackers"] = sorted(self.attackers)
        if self.xi:
            out["xi"] = {"client_ids": self.xi_client_ids,
                         "rounds": {str(r): m for r, m in sorted(self.xi.items())}}
        elif self.xi_rounds:  # the matrices are in files (fedamp_flwr.results.XiFiles)
            out["xi"] = {"client_ids": self.xi_client_ids, "recorded_rounds": list(self.xi_rounds),
                         "folder": "xi"}
        return out

