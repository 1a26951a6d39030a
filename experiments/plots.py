"""The report's plots: convergence, per-client results, collaboration weights, sweeps."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .scores import (
    RunRecord,
    best_round_clients,
    group_runs,
    is_regression,
    mean_std,
    round_means,
    scenario_value,
    score,
)


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


def plot_convergence(runs: Sequence[RunRecord], path: str | Path,
                     strategy_order: Sequence[str] | None = None) -> Path | None:
    """Mean test accuracy (%) or MSE (log scale) per round, a subplot per setting.

    One line per strategy: the mean over seeds, with the min–max band when there are several.

    Parameters
    ----------
    runs : Sequence[RunRecord]
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


def plot_client_accuracy(runs: Sequence[RunRecord], path: str | Path,
                         strategy_order: Sequence[str] | None = None) -> Path | None:
    """Boxplots of per-client test accuracy (%) or MSE at each run's best round (by mean).

    One subplot per setting, one box per strategy, pooling the benign clients of all seeds.

    Parameters
    ----------
    runs : Sequence[RunRecord]
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


def xi_matrices(run: RunRecord) -> tuple[list[int], dict[int, np.ndarray]]:
    """A run's collaboration weights: client ids and the matrix of each recorded round,
    from the files beside its metrics.json (``xi/``), or from metrics.json itself."""
    xi = run.xi or {}
    if xi.get("rounds"):  # kept in the records (strategies used without the ServerApp)
        return list(xi.get("client_ids") or []), {int(r): np.asarray(m, dtype=float)
                                                  for r, m in xi["rounds"].items() if m}
    if xi.get("recorded_rounds") and run.directory:
        from fedamp_flwr.server.results import load_xi

        return load_xi(run.directory)
    return [], {}


def plot_xi(run: RunRecord, path: str | Path, title: str = "", round_: int | None = None) -> Path | None:
    """Heatmap of one recorded round's collaboration weights xi of one run (default: the last).

    Parameters
    ----------
    run : RunRecord
        One run (FedAMP / HeurFedAMP).
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


def plot_xi_all(runs: Sequence[RunRecord], out_dir: str | Path,
                strategy_order: Sequence[str] | None = None) -> list[Path]:
    """``xi_<setting>_<strategy>.png`` for every (setting, strategy) with xi, from its lowest seed.

    Parameters
    ----------
    runs : Sequence[RunRecord]
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
            with_xi = [r for r in groups.get((setting, m), []) if r.xi]
            if not with_xi:
                continue
            run = min(with_xi, key=lambda r: (r.seed is None, r.seed or 0))
            path = Path(out_dir) / f"xi_{safe_name(setting)}_{safe_name(m)}.png"
            if plot_xi(run, path, f"{m}, {setting}, seed {run.seed}:"):
                written.append(path)
    return written


def plot_versus(runs: Sequence[RunRecord], key: str, path: str | Path,
                strategy_order: Sequence[str] | None = None) -> Path | None:
    """BMTA (or best MSE) against a scenario key, a subplot per setting that has two or more values.

    Settings here leave ``key`` out; lines are per strategy, mean over seeds
    with the (population) std as error bars.

    Parameters
    ----------
    runs : Sequence[RunRecord]
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
            stats = [st for v in x if (st := mean_std(ys[xs == v])) is not None]
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
