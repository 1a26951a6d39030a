"""A consortium over seasons: a run that starts from another run's last state, by member name
(``warm-start``), and the record of the members a run has forgotten (``fedamp-flwr forget``,
:mod:`fedamp_flwr.tools.erasure`).

A warm start reads the newest intact checkpoint of the run folder ``warm-start`` names, as a
resume reads its own (its digest or the coordinator's seal, finite tensors), checks that it
fits this run before round 1 (the task, the members' schema, the model's keys and shapes, the
method's kind of state), and hands the strategy that run's state with the row of each
returning member (:meth:`strategies.core.base.StrategyBase.warm_start`). Everything else is
new: the run's name, seed, rounds, history, and the server's optimizer state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.supercore import log

from strategies.core.base import StrategyBase
from strategies.core.layout import dtypes_of, with_dtypes
from strategies.core.roster import ClientInfo
from tasks.export import sha256_of

from ..config import ConfigError, RunConfig
from .checkpoint import Checkpoint, read_state
from .manifest import holds_forgotten, no_link
from .manifest import read as read_manifest
from .results import (
    FORGOTTEN,
    checkpoint_files,
    hold_folder,
    read_checkpoint,
    warn_unversioned,
)

#: what two seasons must share: the task, the members' data schema, the model
SEASON_KEYS = ("dataset", "model", "member-input-shape", "member-task", "member-outputs",
               "member-class-names", "member-label-column", "member-feature-columns",
               "member-categories", "member-scaling")


def forgotten_names(run_dir: Path) -> list[str]:
    """The names a run's ``forgotten.json`` records (none: the file is absent)."""
    path = run_dir / FORGOTTEN
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get("forgotten", [])
        return [str(e["member"]) for e in entries]
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise ConfigError(f"{path} cannot be read ({type(err).__name__}: {err}); it records the "
                          "members erased from the run") from None


def family(strategy: StrategyBase, name: str) -> str:
    """The kind of state a method keeps (its :attr:`~StrategyBase.STATE_KIND`); a method
    whose kind is its own (a hypernetwork) starts only from a run of the same method."""
    kind = strategy.STATE_KIND
    return f"{kind} of {name}" if strategy.STATE_KIND_OWN else kind


def state_family(checkpoint: Checkpoint) -> str:
    """:func:`family` of a checkpoint (written with it; an older one: its strategy's own)."""
    return checkpoint.state_kind or f"the state of {checkpoint.config.get('strategy', '?')}"


@dataclass
class WarmStart:
    """The run a warm start starts from: its folder's name, the sha256 of the checkpoint
    read, and that checkpoint."""

    run: str
    digest: str
    checkpoint: Checkpoint

    @property
    def round(self) -> int:
        return self.checkpoint.round

    @property
    def names(self) -> list[str]:
        """That run's clients by row (a forgotten member's is "")."""
        return self.checkpoint.names()

    def rows(self, names: Sequence[str]) -> list[int | None]:
        """Each of this run's clients' row in that run (by name), None for one new to it."""
        where = {n: r for r, n in enumerate(self.names) if n}
        return [where.get(n) for n in names]

    def record(self, names: Sequence[str]) -> dict[str, Any]:
        """metrics.json's and the checkpoint's ``warm_start``."""
        rows = self.rows(names)
        return {"run": self.run, "round": self.round, "sha256": self.digest,
                "returning": [n for n, r in zip(names, rows, strict=True) if r is not None],
                "new": [n for n, r in zip(names, rows, strict=True) if r is None]}


def read_warm_start(cfg: RunConfig, secret: bytes | None,
                    fits: Callable[[dict[str, Any]], str | None]) -> WarmStart:
    """The newest intact checkpoint of the run folder ``warm-start`` names, checked against
    this run (``fits``: the model's keys and shapes); a ConfigError names the key and what
    does not fit."""
    key = f"run config 'warm-start' = {cfg.warm_start!r}"
    folder = no_link(Path(cfg.warm_start), key)
    files = checkpoint_files(folder) if folder.is_dir() else []
    if not files:
        raise ConfigError(f"{key}: {folder} holds no checkpoint (checkpoint/round-*.pt); "
                          "allowed: the folder of a run that wrote one (checkpoint-every > 0)")
    lock = hold_folder(folder)  # not while that run goes on, or forget rewrites it
    if lock is None:
        raise ConfigError(f"{key}: run {folder.name!r} is live (its ServerApp, or fedamp-flwr "
                          "forget, holds the folder); allowed: once it has stopped")
    try:
        return _read(cfg, key, folder, files, secret, fits)
    finally:
        lock.close()


def _read(cfg: RunConfig, key: str, folder: Path, files: list[Path], secret: bytes | None,
          fits: Callable[[dict[str, Any]], str | None]) -> WarmStart:
    manifest = read_manifest(folder, secret, folder.name, key)  # a rollback: refused here
    warn_unversioned(folder, manifest)
    gone = set(forgotten_names(folder))
    refused = []
    for path in files:
        state, problem = read_checkpoint(path, secret, folder.name, manifest)
        checkpoint, problem = read_state(state, problem, key, path)
        if problem is None:
            problem = fits(state)
        names = (checkpoint.client_names or []) if checkpoint is not None else []
        # forgotten.json deleted, or not: the manifest remembers
        if problem is None and (gone & set(names) or
                                holds_forgotten(names, manifest, secret, folder.name)):
            problem = ("it still holds a member the run has forgotten (forgotten.json, "
                       "the manifest)")
        if problem is None:
            assert checkpoint is not None
            break
        refused.append(f"{path.name}: {problem}")
        log(WARNING, "Warm start: checkpoint %s refused: %s; trying the one before", path, problem)
    else:
        raise ConfigError(f"{key}: no intact checkpoint ({'; '.join(refused)})")
    assert checkpoint is not None
    theirs = checkpoint.config
    differ = [k for k in SEASON_KEYS if cfg.value(k) != theirs.get(k, cfg.value(k))]
    if differ:
        raise ConfigError(f"{key}: that run does not fit this one: " + ", ".join(
            f"'{k}' = {cfg.value(k)!r} here, {theirs.get(k)!r} there" for k in differ)
            + "; allowed: the same task, members' schema and model")
    return WarmStart(folder.name, sha256_of(path), checkpoint)


def check_family(warm: WarmStart, strategy: StrategyBase, name: str, key: str) -> None:
    """The method can start from that run's kind of state; a ConfigError says what differs."""
    mine, theirs = family(strategy, name), state_family(warm.checkpoint)
    if not warm.checkpoint.state_kind and warm.checkpoint.config.get("strategy") == name:
        return  # a checkpoint of an older version: the same method keeps the same state
    if mine != theirs:
        raise ConfigError(f"{key}: run {warm.run!r} keeps {theirs}, strategy {name!r} "
                          f"{mine}; allowed: a run of a method that keeps {mine}")


class Season:
    """Where a run's clients start (a new season's run starts from another run's last state):
    the warm start read (``warm``; None: a fresh or resumed run) and its record of the members
    who return to it and who are new (``record``: metrics.json's and the checkpoint's
    ``warm_start``; a resumed run's, from its checkpoint), grown as members join."""

    def __init__(self, cfg: RunConfig, warm: WarmStart | None,
                 record: dict[str, Any] | None) -> None:
        self.key = f"run config 'warm-start' = {cfg.warm_start!r}"
        self.strategy_name, self.warm, self.record = cfg.strategy, warm, record

    def start(self, strategy: StrategyBase, names: list[str], initial: ArrayRecord
              ) -> ArrayRecord:
        """Start ``strategy`` from the warm start's state: each returning client's by name
        (``names``: this run's, by client id); the global model it had."""
        warm = self.warm
        assert warm is not None
        try:
            strategy.warm_start(warm.checkpoint.strategy, warm.rows(names), initial)
        except (ValueError, KeyError, RuntimeError, IndexError) as err:
            raise ConfigError(f"{self.key}: run {warm.run!r} does not fit this run's "
                              f"strategy {self.strategy_name!r}: {err}") from None
        arrays = with_dtypes(ArrayRecord(warm.checkpoint.arrays), dtypes_of(initial))
        self.record = warm.record(names)
        log(INFO, "Warm start from run '%s' (round %d, checkpoint sha256 %s...): returning %s; "
            "new %s", warm.run, warm.round, warm.digest[:12], self.record["returning"],
            self.record["new"])
        return arrays

    def join(self, strategy: StrategyBase, info: ClientInfo) -> None:
        """A member that joins under way: returning (its own row of the warm start's run) or
        new to the run, in the warm start's record."""
        if self.warm is None or self.record is None or not info.name:
            return
        (old,) = self.warm.rows([info.name])
        if old is not None:
            strategy.warm_row(self.warm.checkpoint.strategy, old, info.client_id)
        self.record["returning" if old is not None else "new"].append(info.name)

    def card_starts(self, started_from: dict[int, str], names: list[str]
                    ) -> dict[int, dict[str, Any]]:
        """Client id -> how its model started, for its card (a warm start's run, round and
        digest; ``started_from``: the strategy's word on its first model), ``names`` this
        run's by client id."""
        record = self.record
        warm = {k: record[k] for k in ("run", "round", "sha256")} if record else {}
        seasoned = {c for c, n in enumerate(names)
                    if record and n in record["returning"] + record["new"]}
        return {cid: {**(warm if cid in seasoned else {}),
                      **({"from": started_from[cid]} if cid in started_from else {})}
                for cid in set(started_from) | seasoned}
