"""Turn finished runs (their ``metrics.json``) into ``results.csv``, ``table.md`` and PNG plots.

    python experiments/report.py RESULTS_DIR_OR_METRICS_JSON... [-o OUT_DIR] [--order fedamp,fedavg]

or, from the experiment runner, ``report.write_report(runs, out_dir, strategy_order)``.

A run is the parsed ``metrics.json`` the ServerApp writes (see
``fedamp_flwr/server_app.py`` and ``strategies.history.RunHistory.to_dict``).
Runs are grouped by *setting* (:func:`setting_of`: dataset, partitioning and
the scenario keys the runs vary) and by strategy; the seeds of a group are
summarised by their mean and population standard deviation (numpy's default,
``ddof=0``). Classification runs are scored by BMTA (best mean test accuracy
over the rounds, in %, higher is better), regression runs by the best mean
test MSE (lower is better). Means are over the benign training clients
(neither novel nor attackers), as in the runs' own records.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

Run = dict[str, Any]
logger = logging.getLogger(__name__)

#: Scenario run-config keys: (label used in setting names, value when the key is missing).
SCENARIOS: dict[str, tuple[str, Any]] = {
    "drop-rate": ("drop", 0.0),
    "heterogeneous-epochs": ("het. epochs", False),
    "attack-ratio": ("attack", 0.0),
    "novel-client-fraction": ("novel", 0.0),
    "fl60-variant": ("", "text"),
    "tpt48-split": ("split", "time"),
}
#: Scenario keys that get a ``vs_<key>.png`` plot when a dataset has two or more values.
SWEEP_KEYS = ("drop-rate", "attack-ratio", "novel-client-fraction")
#: The first columns of ``results.csv``; every other config key follows as ``config.<key>``.
CSV_COLUMNS = ["run_name", "strategy", "dataset", "partitioning", "seed", "num_clients",
               *SCENARIOS, "bmta", "novel_bmta", "best_mean_mse", "novel_best_mean_mse",
               "final_mean", "num_rounds", "sigma", "wall_time_s", "finished", "status",
               "timed_out", "flower_run_id"]
#: The file the runner writes beside a run's metrics.json: Flower's run id and status.
STATUS_FILE = "status.json"
#: Flower's status of a run that ended well.
COMPLETED = "finished:completed"
MISSING = "–"


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


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
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
    list[Run]
        The parsed runs, in the order found; ``status`` (Flower's status,
        e.g. ``finished:failed``), ``timed_out`` and ``flower_run_id`` come
        from ``status.json``.
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
        run = _read_json(f)
        if run is None:
            continue
        status = _read_json(f.parent / STATUS_FILE) if f.name != STATUS_FILE and (
            f.parent / STATUS_FILE).is_file() else (run if f.name == STATUS_FILE else None)
        if f.name == STATUS_FILE:  # no metrics.json: the run never finished a round
            run = {"run_name": run.get("run_name"), **(run.get("run") or {}), "finished": False}
        if status is not None:
            run.update(status=status.get("status"), timed_out=status.get("timed_out"),
                       flower_run_id=status.get("run_id"))
        run["_dir"] = str(f.parent)  # where the run's other files are (xi/)
        runs.append(run)
    return runs


def complete(run: Run) -> bool:
    """Whether a run finished all its rounds (and Flower says it completed, where it says).

    A ``metrics.json`` without ``finished`` (written by hand, or by an older version) counts
    as finished; the ServerApp writes ``finished: false`` until its last round."""
    return bool(run.get("finished", True)) and run.get("status", COMPLETED) in (COMPLETED, None)


def is_regression(run: Run) -> bool:
    """Whether the run is scored by MSE (regression) rather than accuracy.

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``.
    """
    if "bmta" in run or "novel_bmta" in run:
        return False
    if "best_mean_mse" in run or "novel_best_mean_mse" in run:
        return True
    return any("client_mse" in r or "mean_mse" in r for r in run.get("rounds", []))


def round_means(run: Run, novel: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-round mean test accuracy (%) or MSE of a run.

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``.
    novel : bool
        The novel clients' mean instead of the benign training clients'.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        Round numbers and values, only for rounds that have the mean.
    """
    reg = is_regression(run)
    key = ("novel_" if novel else "") + ("mean_mse" if reg else "mean_accuracy")
    pairs = [(r.get("round", i + 1), r[key]) for i, r in enumerate(run.get("rounds", []))
             if isinstance(r.get(key), (int, float))]
    rounds = np.array([p[0] for p in pairs], dtype=float)
    values = np.array([p[1] for p in pairs], dtype=float)
    return rounds, values if reg else 100.0 * values


def score(run: Run, novel: bool = False) -> float | None:
    """The run's headline number: BMTA (%) or best mean MSE.

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``.
    novel : bool
        The novel clients' BMTA / best MSE instead.

    Returns
    -------
    float | None
        The recorded value, else the one computed from the rounds, else None.
    """
    reg = is_regression(run)
    key = ("novel_" if novel else "") + ("best_mean_mse" if reg else "bmta")
    if isinstance(run.get(key), (int, float)):
        return float(run[key])
    _, values = round_means(run, novel)
    if values.size == 0:
        return None
    return float(values.min() if reg else values.max())


def final_mean(run: Run) -> float | None:
    """Mean test accuracy (%) or MSE of the last round that has one.

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``.
    """
    _, values = round_means(run)
    return float(values[-1]) if values.size else None


def best_round_clients(run: Run) -> np.ndarray:
    """Per-client test accuracy (%) or MSE at the run's best round (by mean).

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``. Novel clients and attackers are left
        out, like in the mean.

    Returns
    -------
    np.ndarray
        One value per benign client; empty when no round has a mean.
    """
    reg = is_regression(run)
    mean_key, client_key = ("mean_mse", "client_mse") if reg else ("mean_accuracy",
                                                                   "client_accuracy")
    rounds = [r for r in run.get("rounds", [])
              if isinstance(r.get(mean_key), (int, float)) and r.get(client_key)]
    if not rounds:
        return np.array([])
    means = np.array([r[mean_key] for r in rounds], dtype=float)
    best = rounds[int(means.argmin() if reg else means.argmax())]
    left_out = {str(c) for c in [*run.get("novel_clients", []), *run.get("attackers", [])]}
    values = np.array([v for c, v in best[client_key].items()
                       if str(c) not in left_out and isinstance(v, (int, float))], dtype=float)
    return values if reg else 100.0 * values


# ---------------------------------------------------------------------------
# Settings and grouping
# ---------------------------------------------------------------------------
def scenario_value(run: Run, key: str) -> Any:
    """A scenario key's value (float, or bool for heterogeneous-epochs), default if missing.

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``.
    key : str
        One of :data:`SCENARIOS`.
    """
    default = SCENARIOS[key][1]
    value = (run.get("config") or {}).get(key, default)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, str):
        return str(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def scenario_keys(runs: Sequence[Run]) -> list[str]:
    """Scenario keys worth naming in settings: varied by the runs or non-default in one.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    """
    keys = []
    for key, (_, default) in SCENARIOS.items():
        values = {scenario_value(r, key) for r in runs}
        if len(values) > 1 or values - {default}:
            keys.append(key)
    return keys


def setting_of(run: Run, keys: Iterable[str] | None = None) -> str:
    """The run's setting, e.g. ``"fmnist/practical"`` or ``"fmnist/practical, drop 0.3"``.

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json``.
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
    base = f"{run.get('dataset', '?')}/{run.get('partitioning', '?')}"
    return ", ".join([base, *parts])


def _first_seen(items: Iterable[Any]) -> dict[Any, int]:
    order: dict[Any, int] = {}
    for item in items:
        order.setdefault(item, len(order))
    return order


def method_of(run: Run) -> str:
    """The row a run goes in: its ``label`` (a variant of a strategy, e.g.
    ``fedamp@paper``), else its strategy."""
    return str(run.get("label") or run.get("strategy", "?"))


def strategies_of(runs: Sequence[Run], strategy_order: Sequence[str] | None = None) -> list[str]:
    """The strategies present, those in ``strategy_order`` first, the rest by first appearance.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    strategy_order : Sequence[str] | None
        Preferred order of the rows; strategies without runs are left out.
    """
    present = list(_first_seen(method_of(r) for r in runs))
    wanted = [s for s in (strategy_order or []) if s in present]
    return list(dict.fromkeys(wanted)) + [s for s in present if s not in wanted]


def group_runs(runs: Sequence[Run], strategy_order: Sequence[str] | None = None,
               exclude: Iterable[str] = ()
               ) -> tuple[list[str], list[str], dict[tuple[str, str], list[Run]]]:
    """Group runs by setting and strategy.

    A run's setting names the scenario keys that :func:`scenario_keys` finds
    among the runs of its dataset and partitioning.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies (see :func:`strategies_of`).
    exclude : Iterable[str]
        Scenario keys never to name (e.g. the x axis of :func:`plot_versus`).

    Returns
    -------
    tuple[list[str], list[str], dict[tuple[str, str], list[Run]]]
        Settings (datasets and partitionings by first appearance, scenario
        values ascending), strategies, and the runs of each (setting, strategy).
    """
    exclude = set(exclude)
    pairs: dict[tuple[Any, Any], list[Run]] = {}
    for run in runs:
        pairs.setdefault((run.get("dataset"), run.get("partitioning")), []).append(run)
    keys = {pair: [k for k in scenario_keys(rs) if k not in exclude] for pair, rs in pairs.items()}
    datasets = _first_seen(d for d, _ in pairs)
    order: dict[str, tuple] = {}
    groups: dict[tuple[str, str], list[Run]] = {}
    for i, (pair, pair_runs) in enumerate(pairs.items()):
        for run in pair_runs:
            name = setting_of(run, keys[pair])
            order.setdefault(name, (datasets[pair[0]], i,
                                    *(scenario_value(run, k) for k in SCENARIOS)))
            groups.setdefault((name, method_of(run)), []).append(run)
    settings = sorted(order, key=order.__getitem__)
    return settings, strategies_of(runs, strategy_order), groups


def _stats(values: Sequence[float | None]) -> tuple[float, float, int] | None:
    """Mean, population std and count of the non-missing values; None if there are none."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    return (float(arr.mean()), float(arr.std()), arr.size) if arr.size else None


# ---------------------------------------------------------------------------
# results.csv and table.md
# ---------------------------------------------------------------------------
def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    if isinstance(value, float):  # 12 significant digits: 69.8, not 69.80000000000001
        return float(f"{value:.12g}")
    return value


def csv_rows(runs: Sequence[Run]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of ``results.csv``.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report, one row each.

    Returns
    -------
    tuple[list[str], list[dict[str, Any]]]
        :data:`CSV_COLUMNS` then ``config.<key>`` for every other config key
        (by first appearance), and one dict per run (None for missing values).
    """
    config_keys = list(_first_seen(k for r in runs for k in (r.get("config") or {})
                                   if k not in CSV_COLUMNS))
    rows = []
    for run in runs:
        cfg = run.get("config") or {}
        strategy = run.get("strategy")
        row: dict[str, Any] = {
            "run_name": run.get("run_name"), "strategy": strategy,
            "dataset": run.get("dataset"), "partitioning": run.get("partitioning"),
            "seed": run.get("seed", cfg.get("seed")), "num_clients": run.get("num_clients"),
            **{k: scenario_value(run, k) for k in SCENARIOS},
            **{k: run.get(k) for k in ("bmta", "novel_bmta", "best_mean_mse",
                                       "novel_best_mean_mse")},
            "final_mean": None if (last := final_mean(run)) is None else float(f"{last:.10g}"),
            "num_rounds": len(run.get("rounds", [])),
            "sigma": (run.get("sigma") or {}).get(strategy),
            "wall_time_s": run.get("wall_time_s"), "finished": run.get("finished"),
            "status": run.get("status"), "timed_out": run.get("timed_out"),
            "flower_run_id": run.get("flower_run_id"),
        }
        row.update({f"config.{k}": cfg.get(k) for k in config_keys})
        rows.append(row)
    return CSV_COLUMNS + [f"config.{k}" for k in config_keys], rows


def write_csv(runs: Sequence[Run], path: str | Path) -> Path:
    """Write ``results.csv``: a row per run (see :func:`csv_rows`), empty cells for missing values.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    path : str | Path
        The CSV file to write.
    """
    path = Path(path)
    columns, rows = csv_rows(runs)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([_cell(row[c]) for c in columns] for row in rows)
    return path


def format_cell(stats: tuple[float, float, int] | None, regression: bool) -> str:
    """``"mean ± std"`` (BMTA: 2 decimals; MSE: 4 significant digits), the mean alone for one seed.

    Parameters
    ----------
    stats : tuple[float, float, int] | None
        Mean, std and number of seeds; None gives :data:`MISSING`.
    regression : bool
        Format as MSE rather than BMTA.
    """
    if stats is None:
        return MISSING
    mean, std, n = stats
    fmt = (lambda v: f"{v:.4g}") if regression else (lambda v: f"{v:.2f}")
    return fmt(mean) if n == 1 else f"{fmt(mean)} ± {fmt(std)}"


def markdown_table(runs: Sequence[Run], strategy_order: Sequence[str] | None = None,
                   novel: bool = False) -> str | None:
    """One Markdown table: a row per strategy, a column per setting, the best of each column bold.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    strategy_order : Sequence[str] | None
        Preferred order of the rows.
    novel : bool
        Tabulate the novel clients' BMTA / best MSE instead.

    Returns
    -------
    str | None
        The description line, a blank line and the table; None when no run
        has a value.
    """
    settings, strategies, groups = group_runs(runs, strategy_order)
    stats = {key: _stats([score(r, novel) for r in rs]) for key, rs in groups.items()}
    settings = [s for s in settings if any(stats.get((s, m)) for m in strategies)]
    if not settings:
        return None
    regression = {s: any(is_regression(r) for m in strategies for r in groups.get((s, m), []))
                  for s in settings}
    header = ["Method"] + [f"{s} (MSE)" if regression[s] else s for s in settings]
    body = {m: [format_cell(stats.get((s, m)), regression[s]) for s in settings]
            for m in strategies}
    for j, s in enumerate(settings):
        means = np.array([stats[(s, m)][0] if stats.get((s, m)) else np.nan for m in strategies])
        best = np.nanmin(means) if regression[s] else np.nanmax(means)
        for i in np.flatnonzero(np.isclose(means, best)):
            body[strategies[i]][j] = f"**{body[strategies[i]][j]}**"
    strategies = [m for m in strategies if any(c != MISSING for c in body[m])]
    counts = sorted({n for st in stats.values() if st for n in [st[2]]})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    metrics = []
    if not all(regression.values()):
        metrics.append("BMTA (best mean test accuracy over the rounds, %, higher is better)")
    if any(regression.values()):
        metrics.append("best mean test MSE over the rounds (columns marked MSE, lower is better)")
    who = "novel clients" if novel else "benign training clients"
    desc = " and ".join(metrics)
    line = (f"{desc[0].upper()}{desc[1:]} of the {who}; mean ± std (population) over "
            f"{seeds} seed(s); best per column in bold.")
    lines = [line, "", "| " + " | ".join(header) + " |",
             "|---|" + "---:|" * len(settings)]
    lines += ["| " + " | ".join([m, *body[m]]) + " |" for m in strategies]
    return "\n".join(lines)


def write_table(runs: Sequence[Run], path: str | Path,
                strategy_order: Sequence[str] | None = None, left_out: int = 0) -> Path:
    """Write ``table.md``: the main table and, when there are novel clients, a second one for them.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    path : str | Path
        The Markdown file to write.
    strategy_order : Sequence[str] | None
        Preferred order of the rows.
    left_out : int
        Runs not tabulated because they did not finish (said under the table).
    """
    path = Path(path)
    parts = [markdown_table(runs, strategy_order) or "No run has a result."]
    if left_out:
        parts.append(f"{left_out} run(s) that did not finish are left out (see results.csv: "
                     "`finished`, `status`).")
    novel = markdown_table(runs, strategy_order, novel=True)
    if novel:
        parts += ["## Novel clients", novel]
    path.write_text("\n\n".join(parts) + "\n")
    return path


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------
def safe_name(text: str) -> str:
    """``text`` as a file-name part: runs of other characters than ``[A-Za-z0-9.-]`` become ``_``.

    Parameters
    ----------
    text : str
        E.g. a setting or a strategy.
    """
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_") or "_"


def _figure(n: int, width: float = 5.0, height: float = 3.8) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure with ``n`` subplots, at most three per row."""
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _colors(strategies: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {s: cmap(i % 10) for i, s in enumerate(strategies)}


def _ylabel(regression: bool) -> str:
    return "mean test MSE" if regression else "mean test accuracy (%)"


def plot_convergence(runs: Sequence[Run], path: str | Path,
                     strategy_order: Sequence[str] | None = None) -> Path | None:
    """Mean test accuracy (%) or MSE (log scale) per round, a subplot per setting.

    One line per strategy: the mean over seeds, with the min–max band when there are several.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    path : str | Path
        The PNG file to write.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies (legend and colours).

    Returns
    -------
    Path | None
        The file, or None when no run has a per-round mean.
    """
    settings, strategies, groups = group_runs(runs, strategy_order)
    settings = [s for s in settings
                if any(round_means(r)[0].size for m in strategies for r in groups.get((s, m), []))]
    if not settings:
        return None
    colors = _colors(strategies)
    fig, axes = _figure(len(settings))
    for ax, setting in zip(axes, settings):
        regression = False
        for m in strategies:
            series = [round_means(r) for r in groups.get((setting, m), [])]
            series = [s for s in series if s[0].size]
            if not series:
                continue
            regression = is_regression(groups[(setting, m)][0])
            x = np.unique(np.concatenate([s[0] for s in series]))
            table = np.full((len(series), x.size), np.nan)
            for i, (rounds, values) in enumerate(series):
                table[i, np.searchsorted(x, rounds)] = values
            count = np.isfinite(table).sum(0)
            filled = np.where(np.isfinite(table), table, 0.0)
            mean = filled.sum(0) / count
            ax.plot(x, mean, color=colors[m], label=f"{m} (n={len(series)})",
                    marker="." if x.size < 30 else None)
            if len(series) > 1:
                ax.fill_between(x, np.nanmin(table, 0), np.nanmax(table, 0), color=colors[m],
                                alpha=0.2, linewidth=0)
        if regression:
            ax.set_yscale("log")
        ax.set(title=setting, xlabel="round", ylabel=_ylabel(regression))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, Path(path))


def plot_client_accuracy(runs: Sequence[Run], path: str | Path,
                         strategy_order: Sequence[str] | None = None) -> Path | None:
    """Boxplots of per-client test accuracy (%) or MSE at each run's best round (by mean).

    One subplot per setting, one box per strategy, pooling the benign clients of all seeds.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    path : str | Path
        The PNG file to write.
    strategy_order : Sequence[str] | None
        Preferred order of the boxes.

    Returns
    -------
    Path | None
        The file, or None when no run has per-client values.
    """
    settings, strategies, groups = group_runs(runs, strategy_order)
    pooled = {key: np.concatenate([best_round_clients(r) for r in rs])
              for key, rs in groups.items()}
    none = np.array([])
    settings = [s for s in settings if any(pooled.get((s, m), none).size for m in strategies)]
    if not settings:
        return None
    fig, axes = _figure(len(settings), width=max(5.0, 0.9 * len(strategies) + 1.5))
    for ax, setting in zip(axes, settings):
        names = [m for m in strategies if pooled.get((setting, m), none).size]
        ax.boxplot([pooled[(setting, m)] for m in names], showmeans=True)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
        regression = is_regression(groups[(setting, names[0])][0])
        ax.set(title=setting,
               ylabel="client test MSE" if regression else "client test accuracy (%)")
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, Path(path))


def xi_matrices(run: Run) -> tuple[list[int], dict[int, np.ndarray]]:
    """A run's collaboration weights: client ids and the matrix of each recorded round,
    from the files beside its metrics.json (``xi/``), or from metrics.json itself."""
    xi = run.get("xi") or {}
    if xi.get("rounds"):  # kept in the records (strategies used without the ServerApp)
        return list(xi.get("client_ids") or []), {int(r): np.asarray(m, dtype=float)
                                                  for r, m in xi["rounds"].items() if m}
    if xi.get("recorded_rounds") and run.get("_dir"):
        from fedamp_flwr.results import load_xi

        return load_xi(run["_dir"])
    return [], {}


def plot_xi(run: Run, path: str | Path, title: str = "", round_: int | None = None) -> Path | None:
    """Heatmap of one recorded round's collaboration weights xi of one run (default: the last).

    Parameters
    ----------
    run : Run
        One parsed ``metrics.json`` (FedAMP / HeurFedAMP).
    path : str | Path
        The PNG file to write.
    title : str
        Title prefix, e.g. the strategy and setting.
    round_ : int | None
        The round to draw (it must be recorded); None: the last recorded one.

    Returns
    -------
    Path | None
        The file, or None when the run has no xi matrix (for that round).
    """
    ids, rounds = xi_matrices(run)
    if not rounds or (round_ is not None and round_ not in rounds):
        return None
    last = max(rounds) if round_ is None else round_
    matrix = np.asarray(rounds[last], dtype=float)
    ids = list(ids or range(matrix.shape[0]))
    fig, ax = plt.subplots(figsize=(6, 5))
    image = ax.imshow(matrix, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="ξ")
    step = max(1, math.ceil(len(ids) / 20))
    ticks = np.arange(0, len(ids), step)
    ax.set_xticks(ticks, [str(ids[t]) for t in ticks])
    ax.set_yticks(ticks, [str(ids[t]) for t in ticks])
    ax.set(xlabel="client j", ylabel="client i", title=f"{title} ξ, round {last}".strip())
    return _save(fig, Path(path))


def plot_xi_all(runs: Sequence[Run], out_dir: str | Path,
                strategy_order: Sequence[str] | None = None) -> list[Path]:
    """``xi_<setting>_<strategy>.png`` for every (setting, strategy) with xi, from its lowest seed.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    out_dir : str | Path
        Folder for the PNG files.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies (only the order of the returned files).
    """
    settings, strategies, groups = group_runs(runs, strategy_order)
    written = []
    for setting in settings:
        for m in strategies:
            with_xi = [r for r in groups.get((setting, m), []) if r.get("xi")]
            if not with_xi:
                continue
            run = min(with_xi, key=lambda r: (r.get("seed") is None, r.get("seed") or 0))
            path = Path(out_dir) / f"xi_{safe_name(setting)}_{safe_name(m)}.png"
            if plot_xi(run, path, f"{m}, {setting}, seed {run.get('seed')}:"):
                written.append(path)
    return written


def plot_versus(runs: Sequence[Run], key: str, path: str | Path,
                strategy_order: Sequence[str] | None = None) -> Path | None:
    """BMTA (or best MSE) against a scenario key, a subplot per setting that has two or more values.

    Settings here leave ``key`` out; lines are per strategy, mean over seeds
    with the (population) std as error bars.

    Parameters
    ----------
    runs : Sequence[Run]
        All runs of the report.
    key : str
        A numeric scenario key, e.g. ``"drop-rate"``.
    path : str | Path
        The PNG file to write.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies.

    Returns
    -------
    Path | None
        The file, or None when no setting has two distinct values of ``key``.
    """
    settings, strategies, groups = group_runs(runs, strategy_order, exclude=[key])
    settings = [s for s in settings
                if len({scenario_value(r, key) for m in strategies
                        for r in groups.get((s, m), []) if score(r) is not None}) > 1]
    if not settings:
        return None
    colors = _colors(strategies)
    fig, axes = _figure(len(settings))
    for ax, setting in zip(axes, settings):
        regression = False
        for m in strategies:
            rs = [r for r in groups.get((setting, m), []) if score(r) is not None]
            if not rs:
                continue
            regression = is_regression(rs[0])
            xs = np.array([scenario_value(r, key) for r in rs])
            ys = np.array([score(r) for r in rs])
            x = np.unique(xs)
            stats = [_stats(ys[xs == v]) for v in x]
            ax.errorbar(x, [s[0] for s in stats], yerr=[s[1] for s in stats], color=colors[m],
                        marker="o", capsize=3, label=m)
        if regression:
            ax.set_yscale("log")
        ax.set(title=setting, xlabel=key,
               ylabel="best mean test MSE" if regression else "BMTA (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, Path(path))


# ---------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------
def write_report(runs: Sequence[Run], out_dir: str | Path,
                 strategy_order: Sequence[str] | None = None) -> list[Path]:
    """Write ``results.csv``, ``table.md`` and the PNG plots of the runs into ``out_dir``.

    ``results.csv`` has a row for every run, with its ``finished`` flag and
    Flower's ``status``; the table and the plots show only the runs that
    finished all their rounds (:func:`complete`), and the table says how many
    were left out. Plots without data are skipped: ``convergence.png``, ``client_accuracy.png``,
    ``xi_<setting>_<strategy>.png`` and ``vs_<key>.png`` for each key of
    :data:`SWEEP_KEYS` that some setting varies.

    Parameters
    ----------
    runs : Sequence[Run]
        Parsed ``metrics.json`` dicts (see :func:`load_runs`).
    out_dir : str | Path
        Folder for the outputs; created if missing.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies (table rows, legends); others follow
        by first appearance.

    Returns
    -------
    list[Path]
        The files written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    everything = list(runs)
    runs = [r for r in everything if complete(r)]
    written = [write_csv(everything, out / "results.csv"),
               write_table(runs, out / "table.md", strategy_order,
                           left_out=len(everything) - len(runs))]
    written.append(plot_convergence(runs, out / "convergence.png", strategy_order))
    written.append(plot_client_accuracy(runs, out / "client_accuracy.png", strategy_order))
    written += plot_xi_all(runs, out, strategy_order)
    written += [plot_versus(runs, k, out / f"vs_{k}.png", strategy_order) for k in SWEEP_KEYS]
    return [p for p in written if p is not None]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``report.py PATH... [-o OUT_DIR] [--order a,b,c]``.

    Parameters
    ----------
    argv : Sequence[str] | None
        Arguments; None: ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="metrics.json files or folders holding them")
    parser.add_argument("-o", "--out", default="report", help="output folder (default: report)")
    parser.add_argument("--order", default="", help="comma-separated strategy order")
    args = parser.parse_args(argv)
    runs = load_runs(args.paths)
    order = [s for s in args.order.split(",") if s] or None
    for path in write_report(runs, args.out, order):
        print(path)


if __name__ == "__main__":
    main()
