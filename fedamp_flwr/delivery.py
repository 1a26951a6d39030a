"""Each client's model delivered: to the member's own machine, or to the run's folder.

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
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import nn

import tasks
from strategies.core.base import RoundStrategy
from strategies.core.history import RunHistory
from strategies.core.protocol import (
    ACCURACY,
    CLIENT_INDEX,
    CONFIG,
    GRAPH_EDGES,
    GRAPH_USED,
    LEARNED_FROM,
    LEARNED_SELF,
    LEARNED_WEIGHTS,
    LOSS,
    MODEL,
    MODEL_KEPT,
    MSE,
    NUM_EXAMPLES,
    SAVE_IF_BETTER,
    SAVE_MODEL,
    SAVE_REASON,
    SAVE_TOKEN,
    SERVER_ROUND,
    STARTED_FROM,
    WARM_DIGEST,
    WARM_ROUND,
    WARM_RUN,
    as_float,
    as_int,
    is_name,
)
from strategies.core.records import ABSENT, client_scores, score_of
from strategies.core.replies import ArraySpec, arrays_problem, evaluate_reply_problem, metrics_of
from tasks.export import CARD, PREPROCESSING, package_version, schema_record, write_model
from tasks.scores import of_model
from tasks.scores import said as said_scores

from .config import RUN_NAME_MOST, ConfigError, RunConfig

__all__ = ["MODEL_DIR", "ModelDelivery", "SaveRequest", "keep_tested_model",
           "model_card", "new_token"]

#: the node config key naming where a node writes its models
MODEL_DIR = "model-dir"


def new_token() -> str:
    """A run's token: its models' cards carry it, so that no run overwrites another's."""
    return uuid.uuid4().hex[:16]


def data_schema(cfg: RunConfig, dc: tasks.DataConfig) -> tasks.MemberSchema:
    """The schema of the run's data: the members' (run config), else the task's shape."""
    schema = cfg.member_schema()
    if schema is not None:
        return schema
    info = tasks.data_info(dc)
    return tasks.MemberSchema(info.input_shape, info.kind, info.num_outputs)


def model_card(cfg: RunConfig, dc: tasks.DataConfig, *, run: str, token: str, client_id: int,
               member: str | None, server_round: int, why: str,
               scores: dict[str, Any], standardize: dict[str, Any] | None = None,
               alone: dict[str, Any] | None = None,
               learned_from: dict[str, Any] | None = None,
               started: dict[str, Any] | None = None,
               graph: dict[str, Any] | None = None,
               choice: dict[str, Any] | None = None,
               model_name: str | None = None) -> dict[str, Any]:
    """A model's card (:mod:`tasks.export`), but for the weights' name and hash;
    ``standardize``: the inputs' standardizing statistics (the model works on raw rows
    only with them: ``predict`` applies them); ``alone``: what the member scores alone;
    ``learned_from``: whom the model learned from (:meth:`SaveRequest.of`); ``started``: how
    it started (a warm start's run, round and sha256 as ``warm_start``; ``from``, the start
    itself, as ``started_from``); ``graph``: the client's edges in the run's inferred client
    graph and whether the run uses it (``inferred_graph``); ``choice``: the member's choice
    of the model it keeps, on its held-out rows (fedamp_flwr/member_choice.py);
    ``model_name``: the model's own architecture where it is not the run's (a member's
    linear model alone)."""
    schema = data_schema(cfg, dc)
    main = ACCURACY if ACCURACY in scores else MSE
    return {
        "member": member, "client_id": client_id, "run": run, "run_token": token,
        "strategy": cfg.strategy, "settings": cfg.settings.to_dict(),
        "training": {k: cfg.value(k) for k in ("local-epochs", "local-steps", "batch-size",
                                                "learning-rate", "optimizer", "seed")},
        "round": server_round, "why": why,
        "score": {main: scores.get(main), LOSS: scores.get(LOSS),
                  "num_examples": scores.get(NUM_EXAMPLES),
                  # the scores an analyst reads, on the same rows (tasks/scores.py)
                  **({ANALYST: scores[ANALYST]} if ANALYST in scores else {}),
                  "on": ("validation rows (validation-fraction = "
                         f"{cfg.validation_fraction:g})" if cfg.validation_fraction > 0
                         else "test rows")},
        # which of the member's rows the run trained and tested on (fedamp-flwr predict
        # --rows): the rows its file marks, else the seeded 80/20 split of its name and
        # seed; with validation-fraction, the held-out share of the training rows
        "rows": {"seed": cfg.seed, "member": member,
                 "validation_fraction": cfg.validation_fraction,
                 # the share of the training rows the member held out to choose its model
                 **({"held_out_fraction": choice["held_out_fraction"]}
                    if choice and "held_out_fraction" in choice else {}),
                 "validation_index": 0 if member is not None else client_id},
        "dataset": cfg.data_label, "schema": schema_record(schema),
        "preprocessing": {**PREPROCESSING, **({"standardize": standardize} if standardize
                                              else {})},
        **({"alone": alone} if alone else {}),
        **({"choice": choice} if choice else {}),
        **({"learned_from": learned_from} if learned_from else {}),
        **({"inferred_graph": graph} if graph else {}),
        **({"warm_start": {k: started[k] for k in ("run", "round", "sha256")}}
           if started and "run" in started else {}),
        **({"started_from": started["from"]} if started and "from" in started else {}),
        "model": {"name": model_name or tasks.model_name(dc, cfg.model),
                  "input_shape": list(schema.input_shape), "num_outputs": schema.num_outputs},
        "package": {"name": "fedamp-flwr", "version": package_version()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---------------------------------------------------------------------------
# The client's half
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SaveRequest:
    """What an evaluate message asks of the tested model (None: nothing)."""

    run: str
    token: str
    why: str
    better_than: float | None
    #: whom the model learned from, as the server says (None: it says nothing, or nothing
    #: this node takes: at most 20 names, weights in [0, 1])
    learned_from: dict[str, Any] | None = None
    #: how the model started, as the server says (:func:`_started`)
    started: dict[str, Any] | None = None
    #: its edges in the run's inferred client graph, as the server says (:func:`_graph`)
    graph: dict[str, Any] | None = None

    @classmethod
    def of(cls, config: ConfigRecord) -> SaveRequest | None:
        if SAVE_MODEL not in config:
            return None
        run = config[SAVE_MODEL]
        if not is_name(run, RUN_NAME_MOST):  # it names a folder on this machine: checked
            raise ConfigError(f"message config '{SAVE_MODEL}' = {str(run)[:80]!r} is not a run "
                              "name (letters, digits and - _ . @)")
        assert isinstance(run, str)
        better = config.get(SAVE_IF_BETTER)
        return cls(run, str(config.get(SAVE_TOKEN, "")), str(config.get(SAVE_REASON, "")),
                   None if better is None else as_float(better, SAVE_IF_BETTER),
                   _learned_from(config), _started(config), _graph(config))

    def wants(self, scores: dict[str, Any]) -> bool:
        """Whether the tested model is kept: always, or only if it beats the earlier best."""
        if self.better_than is None:
            return True
        if ACCURACY in scores:
            return float(scores[ACCURACY]) > self.better_than
        return float(scores[MSE]) < self.better_than


def _weight(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


def _learned_from(config: ConfigRecord) -> dict[str, Any] | None:
    """Whom the model learned from, from an evaluate message, checked (a server's word: at
    most 20 names, each a member name or a client id, weights in [0, 1]); a bad one is
    logged and left off the card, the model is kept all the same."""
    names, weights, own = (config.get(k) for k in (LEARNED_FROM, LEARNED_WEIGHTS,
                                                     LEARNED_SELF))
    if names is None and weights is None and own is None:
        return None
    if not (isinstance(names, list) and isinstance(weights, list) and 0 < len(names) <= 20
            and len(names) == len(weights) and all(is_name(n) for n in names)
            and len(set(names)) == len(names)
            and all(_weight(w) for w in weights) and isinstance(own, int | float)
            and _weight(own)):
        log(ERROR, "The message's '%s' is not a list of at most 20 distinct names with "
            "weights in [0, 1]: the whole list is left off the model's card", LEARNED_FROM)
        return None
    return {"own_model": float(own), "others": [
        {"member": str(n), "weight": as_float(w, LEARNED_WEIGHTS)}
        for n, w in zip(names, weights, strict=True)]}


def _started(config: ConfigRecord) -> dict[str, Any] | None:
    """How the model started, from an evaluate message, checked: a warm start's run name,
    round and sha256, and at most 120 printable characters of the start itself; a part that
    is not is left off the card."""
    out: dict[str, Any] = {}
    run, rnd, digest = (config.get(k) for k in (WARM_RUN, WARM_ROUND, WARM_DIGEST))
    if run is not None:
        if is_name(run, RUN_NAME_MOST) and isinstance(rnd, int) and not isinstance(rnd, bool) \
                and rnd >= 0 and isinstance(digest, str) and len(digest) == 64 \
                and all(c in "0123456789abcdef" for c in digest):
            out.update(run=run, round=rnd, sha256=digest)
        else:
            log(ERROR, "The message's '%s' is not a run name, a round and a sha256: left off "
                "the model's card", WARM_RUN)
    said = config.get(STARTED_FROM)
    if said is not None:
        if isinstance(said, str) and 0 < len(said) <= 120 and said.isprintable():
            out["from"] = said
        else:
            log(ERROR, "The message's '%s' is not a short line of text: left off the model's "
                "card", STARTED_FROM)
    return out or None


def _graph(config: ConfigRecord) -> dict[str, Any] | None:
    """The client's edges in the run's inferred graph, from an evaluate message, checked (a
    server's word: at most 200 distinct names, a short line on its use); a bad one is logged
    and left off the card."""
    edges, used = config.get(GRAPH_EDGES), config.get(GRAPH_USED)
    if edges is None and used is None:
        return None
    edges = [] if edges is None else edges
    if not (isinstance(edges, list) and len(edges) <= 200 and all(is_name(n) for n in edges)
            and len(set(edges)) == len(edges) and isinstance(used, str)
            and 0 < len(used) <= 120 and used.isprintable()):
        log(ERROR, "The message's '%s' is not a list of at most 200 distinct names with a "
            "short line on their use: left off the model's card", GRAPH_EDGES)
        return None
    return {"edges": [str(n) for n in edges], "used": used}


_TOLD = "fedamp-no-model-dir"
#: the card's scores an analyst reads (``score.analyst``)
ANALYST = "analyst"


def keep_tested_model(context: Context, cfg: RunConfig, dc: tasks.DataConfig, config: ConfigRecord,
                      model: nn.Module, client_id: int, member: str | None,
                      scores: dict[str, Any], test_rows: tuple[Any, Any] | None = None,
                      **card: Any) -> tuple[dict[str, ArrayRecord], dict[str, int]]:
    """Keep the model a client just tested, as the message asks: write it to the node's
    ``model-dir``, or return it as a reply record (a partitioned run's node without one).
    A member's node without a ``model-dir`` writes nothing and says so once. Returns the
    reply's extra records and metrics (``model-kept``: whether the node wrote it).
    ``test_rows``: the rows ``scores`` are on, where the node writes the model: the scores an
    analyst reads (:mod:`tasks.scores`) go on its card and in its log. ``card``: more for
    its card (:func:`model_card`'s ``standardize`` and ``alone``)."""
    try:
        request = SaveRequest.of(config)
    except (ConfigError, ValueError) as err:  # a message this node will not follow: said
        log(ERROR, "Model not kept: %s", err)
        return {}, {MODEL_KEPT: 0}
    if request is None or not request.wants(scores):
        return {}, {}
    if request.graph is not None:
        log(INFO, "This node's edges in the run's inferred client graph: %s (%s)",
            ", ".join(f"'{n}'" for n in request.graph["edges"]) or "none",
            request.graph["used"])
    folder = context.node_config.get(MODEL_DIR)
    if isinstance(folder, str) and folder.strip():
        base = Path(folder.strip()).expanduser().resolve()
        where = base / request.run
        if where.resolve().parent != base:  # a name is one folder inside model-dir, no more
            log(ERROR, "Model not kept: run name %r leaves the model-dir %s", request.run, base)
            return {}, {MODEL_KEPT: 0}
        stem = member or str(client_id)
        analyst = of_model(model, *test_rows) if test_rows is not None else None
        written = _write_on_node(where, stem, model, model_card(
            cfg, dc, run=request.run, token=request.token, client_id=client_id, member=member,
            server_round=as_int(config.get(SERVER_ROUND, 0), SERVER_ROUND), why=request.why,
            scores={**scores, **({ANALYST: analyst} if analyst else {})},
            learned_from=request.learned_from, started=request.started,
            graph=request.graph, **card))
        if written and analyst:
            log(INFO, "This model on the %s rows its score is on (%s): %s",
                scores.get(NUM_EXAMPLES, "?"), "validation" if cfg.validation_fraction > 0
                else "test", said_scores(analyst))
        if written and request.learned_from:
            log(INFO, "This model learned most from %s; its own model's weight %.3g",
                ", ".join(f"'{o['member']}' ({o['weight']:.3g})"
                          for o in request.learned_from["others"]),
                request.learned_from["own_model"])
        return {}, {MODEL_KEPT: int(written)}
    if cfg.dataset != tasks.MEMBERS:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        return {MODEL: ArrayRecord(state)}, {}
    if _TOLD not in context.state.config_records:
        context.state[_TOLD] = ConfigRecord({"told": True})
        log(WARNING, "This node's model of run '%s' is not written: its node config names no "
            "'%s' (start the SuperNode with --node-config \"... %s='/path/for/models'\")",
            request.run, MODEL_DIR, MODEL_DIR)
    return {}, {MODEL_KEPT: 0}


def _write_on_node(folder: Path, stem: str, model: nn.Module, card: dict[str, Any]) -> bool:
    """Write a member's model on its own machine, unless another run's files are there;
    whether it was written."""
    existing = folder / f"{stem}{CARD}"
    if existing.is_file():
        try:
            token = json.loads(existing.read_text()).get("run_token")
        except (OSError, ValueError, AttributeError):
            token = None
        if token != card["run_token"]:
            log(ERROR, "Model not written: %s holds a model of another run named '%s' (its "
                "token %r, this run's %r); move it away or give this run another run-name",
                existing, card["run"], token, card["run_token"])
            return False
    try:
        path = write_model(folder, stem, model.state_dict(), card)
    except Exception as err:  # a full disk, a broken model: said here, the run goes on
        log(ERROR, "Model not written to %s: %s", folder, err)
        return False
    log(INFO, "Model of round %d written to %s (%s)", card["round"], path, card["why"])
    return True


def _write_model(folder: Path, stem: str, state: dict, card: dict[str, Any]) -> None:
    """The server's write of a client's model (on the writer's thread): a failure is said,
    and the run goes on."""
    try:
        write_model(folder, stem, state, card)
    except Exception as err:
        log(ERROR, "Model of client %s not written to %s: %s", card.get("client_id"), folder, err)


# ---------------------------------------------------------------------------
# The server's half
# ---------------------------------------------------------------------------
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
