"""The server's part of delivering each client's model: asked for in the rounds that keep
them, written where a partitioned run's node replies it, and delivered after the last
round to clients absent from it; a member's node keeps its own
(:mod:`fedamp_flwr.member.keeping`).

Each client's model delivered: to the member's own machine, or to the run's folder.

What is kept (run config ``save-models``): the model whose score the run
records for a client in a round, i.e. the model the client tests in its
evaluate message (FedAMP/HeurFedAMP: its personalized cloud model; Panacea and
pFedHN: its generated model; FedAvg-FT/FedProx-FT: the fine-tuned one; APFL:
the mixed one; pFedMe: theta; the global methods: the global model):

* ``final`` (default): in the last round;
* ``every-checkpoint``: in every round that writes a checkpoint (the file is
  replaced: one model per client, the latest);
* ``best-validation``: with ``validation-fraction > 0``, in each round where the
  client's validation score beats its best of the earlier rounds (never a test score);
* ``none``.

Who writes it:

* a node whose node config names a ``model-dir`` (a member's SuperNode) writes
  ``<model-dir>/<run>/<client-id>.safetensors`` and its card itself; nothing
  leaves its machine. Without a ``model-dir`` a member's node writes nothing and
  says so once in its log;
* a node of a partitioned run (simulation, or a fleet of partitions) without a
  ``model-dir`` replies the model, and the server writes it under
  ``<results-dir>/<run>/models/``.

The server asks for the models in the evaluate messages of those rounds (keys
of :mod:`strategies.core.protocol`: ``save-model``, ...); a reply's model is
checked like every reply (keys, shapes, dtypes, finite) and written only if the
run recorded that client's evaluation. A member absent from the last round's
evaluation still gets its model: after the last round every connected client
without one is sent the model the server holds for it (its card says so).
The file format and the card: :mod:`tasks.export`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

import tasks
from strategies.core.base import RoundStrategy
from strategies.core.history import RunHistory
from strategies.core.protocol import (
    CLIENT_INDEX,
    CONFIG,
    GRAPH_EDGES,
    GRAPH_USED,
    LEARNED_FROM,
    LEARNED_SELF,
    LEARNED_WEIGHTS,
    MODEL,
    MODEL_KEPT,
    SAVE_IF_BETTER,
    SAVE_MODEL,
    SAVE_REASON,
    SAVE_TOKEN,
    STARTED_FROM,
    WARM_DIGEST,
    WARM_ROUND,
    WARM_RUN,
    as_int,
)
from strategies.core.records import ABSENT, client_scores, score_of
from strategies.core.replies import ArraySpec, arrays_problem, evaluate_reply_problem, metrics_of
from tasks.export import write_model

from ..cards import model_card
from ..config import RunConfig

__all__ = ["ModelDelivery", "new_token"]


def new_token() -> str:
    """A run's token: its models' cards carry it, so that no run overwrites another's."""
    return uuid.uuid4().hex[:16]


def _write_model(folder: Path, stem: str, state: dict, card: dict[str, Any]) -> None:
    """The server's write of a client's model (on the writer's thread): a failure is said,
    and the run goes on."""
    try:
        write_model(folder, stem, state, card)
    except Exception as err:
        log(ERROR, "Model of client %s not written to %s: %s", card.get("client_id"), folder, err)


class ModelDelivery:
    """The server's part: asks for the models in the rounds that keep them, writes those a
    partitioned run's nodes reply, and delivers the last model to clients absent at the end.

    Parameters
    ----------
    cfg, dc : RunConfig, tasks.DataConfig
        The run's config and data config.
    run, token : str
        The run's name and token (kept across a resume: its checkpoint holds it).
    folder : Path
        Where the server writes the models nodes reply (``<run folder>/models``).
    spec : ArraySpec
        What a model must look like (the run's model).
    history : RunHistory
        The run's records: which clients' evaluations were recorded, their scores.
    names : Callable[[], list[str]]
        The members' names by client id (empty: a partitioned run).
    submit : Callable[[Callable[[], None]], None]
        Queues a file write (the ServerApp's background writer).
    learned : Callable[[], dict[int, tuple[list[int], list[float], float]]]
        Client id -> whom its model learned from, now (the strategy's ``learned_from``).
    started : Callable[[], dict[int, dict[str, Any]]]
        Client id -> how its model started (:func:`model_card`'s ``started``).
    """

    def __init__(self, cfg: RunConfig, dc: tasks.DataConfig, run: str, token: str,
                 folder: Path, spec: ArraySpec, history: RunHistory,
                 names: Callable[[], list[str]], submit: Callable[[Callable[[], None]], None],
                 learned: Callable[[], dict[int, tuple[list[int], list[float], float]]]
                 = dict, started: Callable[[], dict[int, dict[str, Any]]] = dict,
                 edges: Callable[[], tuple[dict[int, list[int]], str] | None] = lambda: None
                 ) -> None:
        self.cfg, self.dc, self.run, self.token = cfg, dc, run, token
        self.folder, self.spec, self.history = folder, spec, history
        self.names, self.submit, self.learned, self.started = names, submit, learned, started
        self.edges = edges
        self.mode = cfg.save_models
        self.kept: dict[int, dict[str, Any]] = {}  # client id -> its latest model, where

    def keeps(self, server_round: int) -> str | None:
        """Why this round's models are kept, or None."""
        last = server_round == self.cfg.num_server_rounds
        if self.mode == "final" or (self.mode == "every-checkpoint" and not self.cfg.checkpoint_every):
            return "the last round" if last else None
        if self.mode == "every-checkpoint":
            if last or server_round % self.cfg.checkpoint_every == 0:
                return "a checkpoint round" + (" (the last)" if last else "")
            return None
        if self.mode == "best-validation":
            return "its best validation score so far"
        return None

    def _best_before(self, server_round: int, client_id: int) -> float | None:
        score = score_of(tasks.data_info(self.dc).kind != tasks.CLASSIFICATION)
        values = [mine[client_id] for k, r in self.history.rounds.items()
                  if k < server_round and client_id in (mine := client_scores(r, score))]
        return score.best(values) if values else None

    def instruct(self, server_round: int, messages: Iterable[Message],
                 why: str | None = None) -> list[Message]:
        """The round's evaluate messages, asking for the tested models where they are kept."""
        messages = list(messages)
        why = why or self.keeps(server_round)
        if why is None:
            return messages
        learned, started, graph = self.learned_by_name(), self.started(), self.graph_by_name()
        for m in messages:
            c = ConfigRecord(dict(m.content.config_records[CONFIG]))
            c[SAVE_MODEL], c[SAVE_TOKEN], c[SAVE_REASON] = self.run, self.token, why
            mine = learned.get(as_int(c.get(CLIENT_INDEX, -1), CLIENT_INDEX))
            if mine is not None:  # whom its model learned from: names and weights only
                c[LEARNED_FROM] = [o["member"] for o in mine["others"]]
                c[LEARNED_WEIGHTS] = [o["weight"] for o in mine["others"]]
                c[LEARNED_SELF] = mine["own_model"]
            start = started.get(as_int(c.get(CLIENT_INDEX, -1), CLIENT_INDEX), {})
            if "run" in start:
                c[WARM_RUN], c[WARM_ROUND], c[WARM_DIGEST] = (start["run"], start["round"],
                                                              start["sha256"])
            if "from" in start:
                c[STARTED_FROM] = start["from"]
            edges = graph.get(as_int(c.get(CLIENT_INDEX, -1), CLIENT_INDEX))
            if edges is not None:  # its own edges in the inferred graph: names only
                if edges["edges"]:
                    c[GRAPH_EDGES] = edges["edges"]
                c[GRAPH_USED] = edges["used"]
            if self.mode == "best-validation":
                best = self._best_before(server_round, as_int(c.get(CLIENT_INDEX, -1),
                                                              CLIENT_INDEX))
                if best is not None:
                    c[SAVE_IF_BETTER] = best
            m.content[CONFIG] = c
        return messages

    def graph_by_name(self) -> dict[int, dict[str, Any]]:
        """Client id -> its edges in the run's inferred graph (members by name, else client
        ids) and whether the run uses it: a card's ``inferred_graph``."""
        found = self.edges()
        if found is None:
            return {}
        names, (edges, used) = self.names(), found
        return {cid: {"edges": [names[o] if o < len(names) else str(o) for o in others][:200],
                      "used": used} for cid, others in edges.items()}

    def learned_by_name(self) -> dict[int, dict[str, Any]]:
        """Client id -> whom its model learned from (a member by name, else its client id)
        and with what weight, and its own model's weight: a card's ``learned_from``."""
        names = self.names()
        return {cid: {"own_model": own, "others": [
            {"member": names[o] if o < len(names) else str(o), "weight": w}
            for o, w in zip(others, weights, strict=True)]}
            for cid, (others, weights, own) in self.learned().items() if others}

    @staticmethod
    def take(replies: Iterable[Message]) -> tuple[list[Message], dict[int, tuple[ArrayRecord, dict]]]:
        """The replies without their model records; those records, with the reply's
        metrics, by sender node."""
        replies = list(replies)
        models: dict[int, tuple[ArrayRecord, dict]] = {}
        for msg in replies:
            if not msg.has_error() and MODEL in msg.content.array_records:
                models[msg.metadata.src_node_id] = (msg.content.array_records[MODEL],
                                                    metrics_of(msg))
                del msg.content[MODEL]
        return replies, models

    def after_evaluation(self, server_round: int, replies: list[Message],
                         models: dict[int, tuple[ArrayRecord, dict]],
                         client_of: Callable[[int], int | str], why: str | None = None) -> None:
        """Write the models replied in a round that asked for them (a partitioned run's), of
        the clients whose evaluation the run recorded (``why`` given: models delivered after
        the run, whose replies the caller checked); note which members' nodes kept theirs.
        A model no one asked for, or a member's, is never written."""
        asked = why or self.keeps(server_round)
        if models and (asked is None or self.cfg.dataset == tasks.MEMBERS):
            log(WARNING, "Round %d: %d model(s) replied unasked dropped", server_round, len(models))
            models = {}
        for msg in replies:
            cid = client_of(msg.metadata.src_node_id)
            said = metrics_of(msg).get(MODEL_KEPT) if not msg.has_error() else None
            if asked is not None and isinstance(cid, int) and said in (0, 1):
                self.kept[cid] = {"round": server_round, "on": "its node (model-dir)",
                                  "kept": bool(said), "why": asked}
        rec = self.history.rounds.get(server_round, {})
        learned = self.learned_by_name() if models else {}
        started = self.started() if models else {}
        graph = self.graph_by_name() if models else {}
        names = self.names()
        for node, (record, scores) in sorted(models.items()):
            cid = client_of(node)
            if not isinstance(cid, int):
                continue
            recorded = cid in client_scores(rec)
            if why is None and not recorded:
                continue  # its evaluation was rejected: so is its model
            problem = arrays_problem(record, self.spec)
            if problem is not None:
                log(WARNING, "Round %d: client %d's model not written: %s", server_round, cid,
                    problem)
                continue
            member = names[cid] if cid < len(names) else None
            card = model_card(self.cfg, self.dc, run=self.run, token=self.token, client_id=cid,
                              member=member, server_round=server_round, why=asked or "",
                              scores=scores, learned_from=learned.get(cid),
                              started=started.get(cid), graph=graph.get(cid))
            state = {k: v.clone() for k, v in record.to_torch_state_dict().items()}
            self.submit(functools.partial(_write_model, self.folder, member or str(cid), state,
                                          card))
            self.kept[cid] = {"round": server_round, "on": "the run folder (models/)",
                              "kept": True, "why": asked}

    def record(self) -> dict[str, Any]:
        """What metrics.json says of the models: the mode, and each client's latest."""
        return {"save_models": self.mode,
                "clients": {cid: self.kept[cid] for cid in sorted(self.kept)}}

    def deliver_rest(self, strategy: RoundStrategy, grid: Grid, view: Any, arrays: ArrayRecord,
                     config: ConfigRecord, timeout: float,
                     send: Callable[[Grid, list[Message], float], list[Message]]) -> None:
        """After the last round: every connected client (``view``: the connected clients'
        grid) absent from its evaluation, but for a rejected reply, gets the model the
        server holds for it (its score then is not in the run's records). A failure here
        is said and does not fail the finished run."""
        last = self.cfg.num_server_rounds
        if self.mode not in ("final", "every-checkpoint"):
            return
        tracker = strategy.tracker
        rec = self.history.rounds.get(last, {})
        done = set(client_scores(rec))
        rejected = {c for c, why in rec.get(ABSENT["evaluate"], {}).items()
                    if str(why).startswith("rejected")}
        try:
            messages = [m for m in strategy.configure_evaluate(last, arrays, config, view)
                        if tracker.roster.client_of_node(m.metadata.dst_node_id) not in done | rejected]
            if not messages:
                return
            why = f"after the run: the client was absent from round {last}'s evaluation"
            log(INFO, "Delivering their models to %d client(s) absent from round %d's "
                "evaluation", len(messages), last)
            replies, models = self.take(send(grid, self.instruct(last, messages, why),
                                             min(timeout, 300.0)))
            good = []
            for msg in replies:
                cid = tracker.roster.client_of_node(msg.metadata.src_node_id)
                problem = (evaluate_reply_problem(msg, tracker.roster.info(cid).num_test, cid, last)
                           if isinstance(cid, int) else "from an unknown node")
                if problem is not None:
                    log(WARNING, "Model of client %s not delivered: %s", cid, problem)
                    models.pop(msg.metadata.src_node_id, None)
                else:
                    good.append(msg)
            self.after_evaluation(last, good, models, tracker.roster.client_of_node, why=why)
        except Exception as err:  # the run is done: its models' delivery must not undo that
            log(ERROR, "Delivering the models of absent clients failed: %s", err)
