"""A member's node keeps the model it just tested, as an evaluate message asks: written
to its own ``model-dir`` with its card, never leaving its machine (what is kept and who
writes it: :mod:`fedamp_flwr.server.delivery`; its card: :mod:`fedamp_flwr.cards`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.supercore import log
from torch import nn

import tasks
from strategies.core.protocol import (
    ACCURACY,
    GRAPH_EDGES,
    GRAPH_USED,
    LEARNED_FROM,
    LEARNED_SELF,
    LEARNED_WEIGHTS,
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
from tasks.export import CARD, write_model
from tasks.scores import of_model
from tasks.scores import said as said_scores

from ..cards import ANALYST, MODEL_DIR, model_card
from ..config import RUN_NAME_MOST, ConfigError, RunConfig

__all__ = ["SaveRequest", "keep_tested_model"]


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


