"""The report's tables: ``results.csv`` (a row per run) and ``table.md`` (a row per strategy).

Seeds of a (setting, strategy) are summarised by their mean and population
standard deviation (numpy's default, ``ddof=0``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from strategies.core.records import HEADLINES
from tasks.files import strict_json

from .budget import budget_of, describe
from .paper_numbers import paper_line, variant_of
from .scores import (
    SCENARIOS,
    RunRecord,
    final_mean,
    first_seen,
    group_runs,
    is_regression,
    mean_std,
    scenario_value,
    score,
)

#: The first columns of ``results.csv``; every other config key follows as ``config.<key>``.
CSV_COLUMNS = ["run_name", "strategy", "dataset", "partitioning", "seed", "num_clients",
               *SCENARIOS, *HEADLINES,
               "final_mean", "num_rounds", "local_steps", "steps_per_client", "sigma",
               "wall_time_s", "finished", "status", "timed_out", "flower_run_id"]
MISSING = "–"


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(strict_json(value), allow_nan=False)
    if isinstance(value, float):  # 12 significant digits: 69.8, not 69.80000000000001
        return float(f"{value:.12g}")
    return value


def csv_rows(runs: Sequence[RunRecord]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of ``results.csv``.

    Parameters
    ----------
    runs : Sequence[RunRecord]
        All runs of the report, one row each.

    Returns
    -------
    tuple[list[str], list[dict[str, Any]]]
        :data:`CSV_COLUMNS` then ``config.<key>`` for every other config key
        (by first appearance), and one dict per run (None for missing values).
    """
    config_keys = list(first_seen(k for r in runs for k in r.config
                                   if k not in CSV_COLUMNS))
    rows = []
    for run in runs:
        cfg = run.config
        strategy = run.strategy
        row: dict[str, Any] = {
            "run_name": run.run_name, "strategy": strategy,
            "dataset": run.dataset, "partitioning": run.partitioning,
            "seed": _seed_of(run),
            "num_clients": run.num_clients,
            **{k: scenario_value(run, k) for k in SCENARIOS},
            **{k: run.recorded.get(k) for k in HEADLINES},
            "final_mean": None if (last := final_mean(run)) is None else float(f"{last:.10g}"),
            "num_rounds": len(run.rounds),
            "local_steps": budget_of(cfg)["local_steps"] if cfg else None,
            "steps_per_client": budget_of(cfg)["steps_per_client"] if cfg else None,
            "sigma": run.sigma.get(strategy),
            "wall_time_s": run.wall_time_s, "finished": run.finished,
            "status": run.status, "timed_out": run.timed_out,
            "flower_run_id": run.flower_run_id,
        }
        row.update({f"config.{k}": cfg.get(k) for k in config_keys})
        rows.append(row)
    return CSV_COLUMNS + [f"config.{k}" for k in config_keys], rows


def write_csv(runs: Sequence[RunRecord], path: str | Path,
              kept: Sequence[Mapping[str, str]] = ()) -> Path:
    """Write ``results.csv``: a row per run (see :func:`csv_rows`), empty cells for missing values.

    Parameters
    ----------
    runs : Sequence[RunRecord]
        All runs of the report.
    path : str | Path
        The CSV file to write.
    kept : Sequence[Mapping[str, str]]
        An earlier ``results.csv``'s rows to keep as they are (:func:`read_csv`,
        ``experiments.report --add``), first and in their order, but those of a name that
        ``runs`` has (replaced); their columns that ``runs`` have not after the others.
    """
    path = Path(path)
    columns, rows = csv_rows(runs)
    names = {row["run_name"] for row in rows}
    kept = [row for row in kept if row["run_name"] not in names]
    columns += [c for c in first_seen(c for row in kept for c in row) if c not in columns]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([row.get(c, "") for c in columns] for row in kept)
        writer.writerows([_cell(row.get(c)) for c in columns] for row in rows)
    return path


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """An earlier ``results.csv``'s rows (column -> cell), refused with the reason where it is
    not one that :func:`write_csv` writes (no ``run_name`` column, a column twice, a row of
    another width than the header)."""
    try:
        with Path(path).open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as ex:
        raise ValueError(f"{path} cannot be read as results.csv: {ex}") from ex
    if columns and "run_name" not in columns:
        raise ValueError(f"{path} has no run_name column: not a report's results.csv")
    if len(set(columns)) < len(columns):
        twice = sorted({c for c in columns if columns.count(c) > 1})
        raise ValueError(f"{path} has column(s) twice ({', '.join(twice[:3])}): not a "
                         "report's results.csv")
    if any(None in row or None in row.values() for row in rows):
        raise ValueError(f"{path} has a row of another width than its header: not a report's "
                         "results.csv")
    return rows


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


def seed_label(seeds: Iterable[int | None]) -> str:
    """``"seed 0"``, ``"seeds 0–2"`` (consecutive) or ``"seeds 0, 2"``; a run that names no
    seed is ``?``."""
    seeds = list(seeds)
    known = sorted(s for s in seeds if s is not None)
    names = [*map(str, known), *(["?"] if None in seeds else [])]
    if len(names) == 1:
        return f"seed {names[0]}"
    if len(known) == len(names) and known == list(range(known[0], known[-1] + 1)):
        return f"seeds {known[0]}–{known[-1]}"
    return "seeds " + ", ".join(names)


def _seed_of(run: RunRecord) -> Any:
    """The run's seed: its file's, else its config's (None if neither names one)."""
    return run.seed if run.seed is not None else run.config.get("seed")


def _seeds_of(runs: Sequence[RunRecord], novel: bool) -> frozenset:
    """The seeds of the runs that have a score (None for a run that names no whole seed)."""
    seeds = (_seed_of(r) for r in runs if score(r, novel) is not None)
    return frozenset(s if type(s) is int else None for s in seeds)


def _mark_column(cells: dict[str, str], means: dict[str, float], seeds: dict[str, frozenset],
                 lower_is_better: bool) -> bool:
    """Bold the best cell of a column in place, among cells over the same seeds; where the
    column's cells are over different seeds, append each cell's seeds. Returns whether it mixed.

    A seed set held by one cell alone gets no bold: it has nothing to be compared with.
    """
    sets = set(seeds.values())
    mixed = len(sets) > 1
    for same in sets:
        members = [m for m in means if seeds[m] == same]
        values = np.array([means[m] for m in members])
        best = values.min() if lower_is_better else values.max()
        for m, v in zip(members, values):
            if len(sets) == 1 or len(members) > 1:
                cells[m] = f"**{cells[m]}**" if np.isclose(v, best) else cells[m]
            if mixed:
                cells[m] += f" ({seed_label(same)})"
    return mixed


def _description(regression: list[bool], stats: Mapping[Any, tuple[float, float, int] | None],
                 novel: bool, mixed: bool) -> str:
    """The line above the table: its metrics, whose numbers, over how many seeds."""
    counts = sorted({st[2] for st in stats.values() if st})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    metrics = []
    if not all(regression):
        metrics.append("BMTA (best mean test accuracy over the rounds, %, higher is better)")
    if any(regression):
        metrics.append("best mean test MSE over the rounds (columns marked MSE, lower is better)")
    who = "novel clients" if novel else "benign training clients"
    desc = " and ".join(metrics)
    line = (f"{desc[0].upper()}{desc[1:]} of the {who}; mean ± std (population) over "
            f"{seeds} seed(s); best per column in bold.")
    if mixed:
        line += (" Where a column's cells are over different seeds, each cell names its seeds "
                 "and the best is bold among the cells of the same seeds: a seed also draws "
                 "the data, so compare within a seed set.")
    return line


def markdown_table(runs: Sequence[RunRecord], strategy_order: Sequence[str] | None = None,
                   novel: bool = False) -> str | None:
    """One Markdown table: a row per strategy, a column per setting, the best of each column bold.

    Where a column's cells are means over different seeds (say three seeds for some methods
    and seed 0 alone for others), a seed's draw of the data can move every method of it
    together, so the cells are not compared across seed sets: each cell names its seeds and
    the best is bold among the cells of the same seeds (see :func:`_mark_column`).

    Parameters
    ----------
    runs : Sequence[RunRecord]
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
    stats = {key: mean_std([score(r, novel) for r in rs]) for key, rs in groups.items()}
    settings = [s for s in settings if any(stats.get((s, m)) for m in strategies)]
    if not settings:
        return None
    regression = {s: any(is_regression(r) for m in strategies for r in groups.get((s, m), []))
                  for s in settings}
    header = ["Method"] + [f"{s} (MSE)" if regression[s] else s for s in settings]
    body = {m: [format_cell(stats.get((s, m)), regression[s]) for s in settings]
            for m in strategies}
    mixed = False
    for j, s in enumerate(settings):
        means = {m: st[0] for m in strategies if (st := stats.get((s, m)))}
        column = {m: body[m][j] for m in means}
        mixed |= _mark_column(column, means,
                              {m: _seeds_of(groups[(s, m)], novel) for m in means},
                              regression[s])
        for m, cell in column.items():
            body[m][j] = cell
    strategies = [m for m in strategies if any(c != MISSING for c in body[m])]
    line = _description(list(regression.values()), stats, novel, mixed)
    lines = [line, "", "| " + " | ".join(header) + " |",
             "|---|" + "---:|" * len(settings)]
    lines += ["| " + " | ".join([m, *body[m]]) + " |" for m in strategies]
    return "\n".join(lines)


def budget_line(runs: Sequence[RunRecord], strategy_order: Sequence[str] | None = None
                ) -> str | None:
    """What the table's runs spent (:mod:`experiments.budget`): one budget for all, or each
    method's per setting where they differ; None without runs."""
    settings, strategies, groups = group_runs(runs, strategy_order)
    spent: dict[str, list[str]] = {}
    for (setting, method), rs in groups.items():
        for r in rs:
            spent.setdefault(describe(budget_of(r.config)), []).append(f"{method} ({setting})")
    if not spent:
        return None
    if len(spent) == 1:
        return f"Budget of every run: {next(iter(spent))}."
    return "Budgets (communication rounds x local gradient steps per client): " + "; ".join(
        f"{what}: {', '.join(dict.fromkeys(who))}" for what, who in spent.items()) + "."


def write_table(runs: Sequence[RunRecord], path: str | Path,
                strategy_order: Sequence[str] | None = None, left_out: int = 0) -> Path:
    """Write ``table.md``: the main table and, when there are novel clients, a second one for them.

    Parameters
    ----------
    runs : Sequence[RunRecord]
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
    budget = budget_line(runs, strategy_order)
    if budget:
        parts.append(budget)
    if left_out:
        parts.append(f"{left_out} run(s) that did not finish are left out (see results.csv: "
                     "`finished`, `status`).")
    parts += paper_lines(runs)
    novel = markdown_table(runs, strategy_order, novel=True)
    if novel:
        parts += ["## Novel clients", novel, *paper_lines(runs, novel=True)]
    path.write_text("\n\n".join(parts) + "\n")
    return path


def paper_lines(runs: Sequence[RunRecord], novel: bool = False) -> list[str]:
    """The published numbers of the runs' data settings (:mod:`experiments.paper_numbers`),
    one line each."""
    settings = dict.fromkeys((r.dataset, variant_of(r.dataset, r.config)) for r in runs)
    return [line for d, v in settings if (line := paper_line(d, v, novel))]


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------
