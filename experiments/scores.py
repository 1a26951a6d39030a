"""A run's numbers: the one schema the report reads (:class:`RunRecord`), scores, settings.

A run is what its ``metrics.json`` says (see ``fedamp_flwr/server_app.py``
and ``strategies.core.records.RunFile``), with the runner's
``status.json``. Runs are grouped by *setting* (:func:`data_setting_of`: dataset,
partitioning and the scenario keys the runs vary) and by strategy.
Classification runs are scored by BMTA (best mean test accuracy over the
rounds, in %, higher is better), regression runs by the best mean test MSE
(lower is better). Means are over the benign training clients (neither novel
nor attackers), as in the runs' own records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strategies.core.records import (
    HEADLINES,
    VERSION,
    RunFile,
    best_of_rounds,
    client_key,
    mean_key,
    score_of,
)
from tasks import CLASSIFICATION, REGRESSION

logger = logging.getLogger(__name__)

#: The headline numbers a run records itself.
RECORDED = HEADLINES
#: Scenario run-config keys: (label used in setting names, value when the key is missing).
SCENARIOS: dict[str, tuple[str, Any]] = {
    "drop-rate": ("drop", 0.0),
    "heterogeneous-epochs": ("het. epochs", False),
    "attack-ratio": ("attack", 0.0),
    "novel-client-fraction": ("novel", 0.0),
    "fl60-variant": ("", "text"),
    "tpt48-split": ("split", "time"),
    "traffic-graph": ("", "metr-la"),
}
#: Scenario keys that get a ``vs_<key>.png`` plot when a dataset has two or more values.
SWEEP_KEYS = ("drop-rate", "attack-ratio", "novel-client-fraction")
#: The file the runner writes beside a run's metrics.json: Flower's run id and status.
STATUS_FILE = "status.json"
#: the run config's keys that results.csv gives a column of their own, beside the scenario keys
_CONFIG_COLUMNS = ("strategy", "dataset", "partitioning", "seed")
#: the run config's keys that a report counts with (``budget.budget_of``): whole numbers
_WHOLE = ("num-server-rounds", "local-steps")
#: Flower's status of a run that ended well.
COMPLETED = "finished:completed"


def _of_file(read: Callable[[RunFile], Any]) -> property:
    """A :class:`RunRecord`'s fact that is its file's (``run.strategy`` is
    ``run.file.strategy``)."""
    return property(lambda self: read(self.file), doc="The run's, as its metrics.json says.")


@dataclass
class RunRecord:
    """One run, as its ``metrics.json`` (``file``, a :class:`RunFile`) and the runner's
    ``status.json`` say: the one schema the report reads.

    The file's facts are read through it (``run_name``, ``strategy``, ``label``,
    ``dataset``, ``seed``, ``num_clients``, ``rounds``, ``config``, ``finished``,
    ``wall_time_s``, ``novel_clients``, ``attackers``, ``xi``; ``recorded``: the headline
    numbers the run recorded itself, ``bmta``, ``novel_bmta``, ``best_mean_mse``,
    ``novel_best_mean_mse``). A ``metrics.json`` without ``finished`` (written by hand, or
    by an older version) counts as finished. Beside them, what is read from them:

    ``kind`` is the task's (``classification``: scored by BMTA; ``regression``: by the
    best mean test MSE), which the ServerApp writes as ``task_kind``; for an older
    ``metrics.json`` without it, it is read from which metrics the rounds hold.
    ``partitioning``: the file's, or a federated task's (which records none) its
    config's. ``sigma``: each FedAMP method's. ``status``, ``timed_out``,
    ``flower_run_id``: ``status.json``'s. ``directory``: where the file was found.
    """

    file: RunFile = field(default_factory=RunFile)
    kind: str = CLASSIFICATION
    partitioning: str = "?"
    sigma: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    timed_out: bool | None = None
    flower_run_id: str | None = None
    directory: str = ""

    run_name = _of_file(lambda f: f.run_name)
    strategy = _of_file(lambda f: f.strategy)
    label = _of_file(lambda f: f.label)
    dataset = _of_file(lambda f: f.dataset)
    seed = _of_file(lambda f: f.seed)
    num_clients = _of_file(lambda f: f.num_clients)
    rounds = _of_file(lambda f: f.rounds)
    config = _of_file(lambda f: f.config)
    finished = _of_file(lambda f: f.finished)
    wall_time_s = _of_file(lambda f: f.wall_time_s)
    novel_clients = _of_file(lambda f: f.novel_clients)
    attackers = _of_file(lambda f: f.attackers)

    @property
    def xi(self) -> dict[str, Any] | None:
        """Where FedAMP's weights are (None: the run kept none)."""
        return self.file.xi or None

    @property
    def recorded(self) -> dict[str, float]:
        """The headline numbers the run recorded itself."""
        return self.file.headlines

    @classmethod
    def from_json(cls, data: Mapping[str, Any], directory: str = "",
                  status: Mapping[str, Any] | None = None) -> RunRecord:
        """The record of a parsed ``metrics.json`` (``status``: the parsed ``status.json``)."""
        run = RunFile.from_dict(data)
        if run.records_version > VERSION:
            logger.warning("%s: records of version %d, newer than this code's %d: keys it "
                           "does not know are left out", directory or "a metrics.json",
                           run.records_version, VERSION)
        kind = run.task_kind
        if kind not in (CLASSIFICATION, REGRESSION):  # an older metrics.json
            kind = REGRESSION if run.score.metric != score_of(False).metric else CLASSIFICATION
        return cls(
            file=run, kind=kind,
            # a federated task's metrics.json records no partitioning: its config's (unused)
            partitioning=str(run.partitioning or run.config.get("partitioning") or "?"),
            sigma=_sigmas(run), status=None if status is None else status.get("status"),
            timed_out=None if status is None else status.get("timed_out"),
            flower_run_id=None if status is None else status.get("run_id"),
            directory=directory)

    @classmethod
    def from_row(cls, row: Mapping[str, str],
                 rounds: Sequence[Mapping[str, Any]] = ()) -> RunRecord:
        """The record of an earlier report's ``results.csv`` row (its run's folder gone, a grid
        run in pieces: ``experiments.report --add``), for the table and the plots: who ran
        what (as text), its config (``config.<key>`` cells, read back by :func:`cell_value`),
        its headline numbers (which give its kind), finished and status; its rounds only
        where a round digest (``experiments.round_digest``) gives them (``rounds``)."""
        value = {k: cell_value(v) for k, v in row.items() if k}
        config = {**{k: value[k] for k in (*_CONFIG_COLUMNS, *SCENARIOS)
                     if value.get(k) is not None},  # config keys with a column of their own
                  **{k.removeprefix("config."): v for k, v in value.items()
                     if k.startswith("config.")}}
        text = {k: row.get(k) or None for k in ("run_name", "strategy", "dataset",
                                                 "partitioning")}
        data = {**text, "label": row.get("config.label") or "", "seed": value.get("seed"),
                "num_clients": value.get("num_clients"), "config": config,
                "finished": value.get("finished") is True,
                "wall_time_s": value.get("wall_time_s"), "rounds": [dict(r) for r in rounds],
                **{k: value[k] for k in HEADLINES if value.get(k) is not None}}
        for key in _WHOLE:  # what the table's budget line counts with
            if not (config.get(key) is None or type(config[key]) is int):
                raise ValueError(f"the row of run {text['run_name']!r} has config.{key} = "
                                 f"{row.get('config.' + key)!r}, not a whole number")
        status = {"status": value.get("status"), "timed_out": value.get("timed_out"),
                  "run_id": value.get("flower_run_id")}
        return cls.from_json({k: v for k, v in data.items() if v is not None}, "", status)


def cell_value(text: str | None) -> Any:
    """A ``results.csv`` cell read back as ``tables.write_csv`` wrote it: empty is None,
    ``True``/``False`` a bool, a number a number, a JSON list or object itself, else the
    text."""
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[0] in "[{":
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            pass
    return text


# ---------------------------------------------------------------------------
# Reading runs and their numbers
# ---------------------------------------------------------------------------
def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        logger.warning("Skipping %s: %s", path, err)
        return None
    if not isinstance(data, dict):
        logger.warning("Skipping %s: not a JSON object", path)
        return None
    return data


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Read runs: their ``metrics.json`` and, where the runner wrote one, ``status.json``.

    Parameters
    ----------
    paths : Iterable[str | Path]
        ``metrics.json`` files, or folders searched recursively for them
        (in sorted path order). A run folder whose ``status.json`` has no
        ``metrics.json`` beside it (a run that failed before its first
        round) is read from its ``status.json``. Unreadable or malformed
        files are skipped with a warning.

    Returns
    -------
    list[RunRecord]
        The runs, in the order found; ``status`` (Flower's status, e.g.
        ``finished:failed``), ``timed_out`` and ``flower_run_id`` come from
        ``status.json``.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            files.append(p)
            continue
        found = {f.parent: f for f in p.rglob(STATUS_FILE)}
        found.update({f.parent: f for f in p.rglob("metrics.json")})  # metrics.json first
        files.extend(found[d] for d in sorted(found))
    runs = []
    for f in files:
        data = _read_json(f)
        if data is None:
            continue
        status = data if f.name == STATUS_FILE else (
            _read_json(f.parent / STATUS_FILE) if (f.parent / STATUS_FILE).is_file() else None)
        if f.name == STATUS_FILE:  # no metrics.json: the run never finished a round
            data = {"run_name": data.get("run_name"), **(data.get("run") or {}),
                    "finished": False}
        runs.append(RunRecord.from_json(data, str(f.parent), status))
    return runs


def complete(run: RunRecord) -> bool:
    """Whether a run finished all its rounds (and Flower says it completed, where it says)."""
    return run.finished and run.status in (COMPLETED, None)


def is_regression(run: RunRecord) -> bool:
    """Whether the run is scored by MSE (regression) rather than accuracy."""
    return run.kind == REGRESSION


def round_means(run: RunRecord, novel: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-round mean test accuracy (%) or MSE of a run.

    Parameters
    ----------
    run : RunRecord
        One run.
    novel : bool
        The novel clients' mean instead of the benign training clients'.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        Round numbers and values, only for rounds that have the mean.
    """
    reg = is_regression(run)
    key = mean_key(score_of(reg).metric, novel)
    pairs = [(r.get("round", i + 1), r[key]) for i, r in enumerate(run.rounds)
             if isinstance(r.get(key), (int, float))]
    rounds = np.array([p[0] for p in pairs], dtype=float)
    values = np.array([p[1] for p in pairs], dtype=float)
    return rounds, values if reg else 100.0 * values


def score(run: RunRecord, novel: bool = False) -> float | None:
    """The run's headline number: BMTA (%) or best mean MSE.

    Parameters
    ----------
    run : RunRecord
        One run.
    novel : bool
        The novel clients' BMTA / best MSE instead.

    Returns
    -------
    float | None
        The recorded value, else the one computed from the rounds, else None.
    """
    reg = is_regression(run)
    key = ("novel_" if novel else "") + score_of(reg).headline
    if isinstance(run.recorded.get(key), (int, float)):
        return float(run.recorded[key])
    return best_of_rounds(run.rounds, reg, novel)  # an older metrics.json: from its rounds


def final_mean(run: RunRecord) -> float | None:
    """Mean test accuracy (%) or MSE of the last round that has one.

    Parameters
    ----------
    run : RunRecord
        One run.
    """
    _, values = round_means(run)
    return float(values[-1]) if values.size else None


def best_round_clients(run: RunRecord) -> np.ndarray:
    """Per-client test accuracy (%) or MSE at the run's best round (by mean).

    Parameters
    ----------
    run : RunRecord
        One run. Novel clients and attackers are left
        out, like in the mean.

    Returns
    -------
    np.ndarray
        One value per benign client; empty when no round has a mean.
    """
    reg = is_regression(run)
    metric = score_of(reg).metric
    mean, clients = mean_key(metric), client_key(metric)
    rounds = [r for r in run.rounds
              if isinstance(r.get(mean), (int, float)) and r.get(clients)]
    if not rounds:
        return np.array([])
    means = np.array([r[mean] for r in rounds], dtype=float)
    best = rounds[int(means.argmin() if reg else means.argmax())]
    left_out = {str(c) for c in [*run.novel_clients, *run.attackers]}
    values = np.array([v for c, v in best[clients].items()
                       if str(c) not in left_out and isinstance(v, (int, float))], dtype=float)
    return values if reg else 100.0 * values


# ---------------------------------------------------------------------------
# Settings and grouping
# ---------------------------------------------------------------------------
def scenario_value(run: RunRecord, key: str) -> Any:
    """A scenario key's value (float, or bool for heterogeneous-epochs), default if missing.

    Parameters
    ----------
    run : RunRecord
        One run.
    key : str
        One of :data:`SCENARIOS`.
    """
    default = SCENARIOS[key][1]
    value = run.config.get(key, default)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, str):
        return str(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def scenario_keys(runs: Sequence[RunRecord]) -> list[str]:
    """Scenario keys worth naming in settings: varied by the runs or non-default in one.

    Parameters
    ----------
    runs : Sequence[RunRecord]
        All runs of the report.
    """
    keys = []
    for key, (_, default) in SCENARIOS.items():
        values = {scenario_value(r, key) for r in runs}
        if len(values) > 1 or values - {default}:
            keys.append(key)
    return keys


def _sigmas(run: RunFile) -> dict[str, Any]:
    """Each FedAMP method's sigma: the configured or paper's (``sigma``), else the one the run
    chose from the data (``<method>_sigma``)."""
    raw = run.extra.get("sigma")
    out = dict(raw) if isinstance(raw, Mapping) else {}
    for method in ("fedamp", "heurfedamp"):
        chosen = run.extra.get(f"{method}_sigma")
        if out.get(method) is None and isinstance(chosen, Mapping):
            out[method] = chosen.get("value")
    return out


def data_setting_of(run: RunRecord, keys: Iterable[str] | None = None) -> str:
    """The run's setting, e.g. ``"fmnist/practical"`` or ``"fmnist/practical, drop 0.3"``.

    Parameters
    ----------
    run : RunRecord
        One run.
    keys : Iterable[str] | None
        Scenario keys to name (numbers always, heterogeneous-epochs only when
        on); None: those with a non-default value in this run.
    """
    keys = set(keys) if keys is not None else {
        k for k, (_, d) in SCENARIOS.items() if scenario_value(run, k) != d}
    parts = []
    for key, (label, _) in SCENARIOS.items():
        if key not in keys:
            continue
        value = scenario_value(run, key)
        if isinstance(value, bool):
            if value:
                parts.append(label)
        elif isinstance(value, str):
            parts.append(f"{label} {value}".strip())
        else:
            parts.append(f"{label} {value:g}")
    base = f"{run.dataset}/{run.partitioning}"
    return ", ".join([base, *parts])


def first_seen(items: Iterable[Any]) -> dict[Any, int]:
    order: dict[Any, int] = {}
    for item in items:
        order.setdefault(item, len(order))
    return order


def method_of(run: RunRecord) -> str:
    """The row a run goes in: its ``label`` (a variant of a strategy, e.g.
    ``fedamp@paper``), else its strategy."""
    return run.label or run.strategy


def strategies_of(runs: Sequence[RunRecord], strategy_order: Sequence[str] | None = None) -> list[str]:
    """The strategies present, those in ``strategy_order`` first, the rest by first appearance.

    Parameters
    ----------
    runs : Sequence[RunRecord]
        All runs of the report.
    strategy_order : Sequence[str] | None
        Preferred order of the rows; strategies without runs are left out.
    """
    present = list(first_seen(method_of(r) for r in runs))
    wanted = [s for s in (strategy_order or []) if s in present]
    return list(dict.fromkeys(wanted)) + [s for s in present if s not in wanted]


def group_runs(runs: Sequence[RunRecord], strategy_order: Sequence[str] | None = None,
               exclude: Iterable[str] = ()
               ) -> tuple[list[str], list[str], dict[tuple[str, str], list[RunRecord]]]:
    """Group runs by setting and strategy.

    A run's setting names the scenario keys that :func:`scenario_keys` finds
    among the runs of its dataset and partitioning.

    Parameters
    ----------
    runs : Sequence[RunRecord]
        All runs of the report.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies (see :func:`strategies_of`).
    exclude : Iterable[str]
        Scenario keys never to name (e.g. the x axis of :func:`plot_versus`).

    Returns
    -------
    tuple[list[str], list[str], dict[tuple[str, str], list[RunRecord]]]
        Settings (datasets and partitionings by first appearance, scenario
        values ascending), strategies, and the runs of each (setting, strategy).
    """
    exclude = set(exclude)
    pairs: dict[tuple[Any, Any], list[RunRecord]] = {}
    for run in runs:
        pairs.setdefault((run.dataset, run.partitioning), []).append(run)
    keys = {pair: [k for k in scenario_keys(rs) if k not in exclude] for pair, rs in pairs.items()}
    datasets = first_seen(d for d, _ in pairs)
    order: dict[str, tuple] = {}
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for i, (pair, pair_runs) in enumerate(pairs.items()):
        for run in pair_runs:
            name = data_setting_of(run, keys[pair])
            order.setdefault(name, (datasets[pair[0]], i,
                                    *(scenario_value(run, k) for k in SCENARIOS)))
            groups.setdefault((name, method_of(run)), []).append(run)
    settings = sorted(order, key=order.__getitem__)
    return settings, strategies_of(runs, strategy_order), groups


def mean_std(values: Sequence[float | None]) -> tuple[float, float, int] | None:
    """Mean, population std and count of the non-missing values; None if there are none."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    return (float(arr.mean()), float(arr.std()), arr.size) if arr.size else None


# ---------------------------------------------------------------------------
# results.csv and table.md
# ---------------------------------------------------------------------------
