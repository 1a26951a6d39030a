"""Turn runs (their ``metrics.json``) into ``results.csv``, ``table.md`` and PNG plots.

    python -m experiments.report RESULTS_DIR_OR_METRICS_JSON... [-o OUT_DIR] [--order fedamp,fedavg]

or, from the experiment runner, ``report.write_report(runs, out_dir, strategy_order)``.
The pieces: :mod:`experiments.scores` (reading runs: :class:`RunRecord`; their
scores and settings), :mod:`experiments.tables`, :mod:`experiments.plots`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .plots import plot_client_accuracy, plot_convergence, plot_versus, plot_xi_all
from .scores import COMPLETED, STATUS_FILE, SWEEP_KEYS, RunRecord, complete, load_runs
from .tables import write_csv, write_table

__all__ = ["COMPLETED", "STATUS_FILE", "RunRecord", "load_runs", "main", "write_report"]


def write_report(runs: Sequence[RunRecord], out_dir: str | Path,
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
    runs : Sequence[RunRecord]
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
    written: list[Path | None] = [
        write_csv(everything, out / "results.csv"),
        write_table(runs, out / "table.md", strategy_order, left_out=len(everything) - len(runs)),
        plot_convergence(runs, out / "convergence.png", strategy_order),
        plot_client_accuracy(runs, out / "client_accuracy.png", strategy_order),
        *plot_xi_all(runs, out, strategy_order),
        *(plot_versus(runs, k, out / f"vs_{k}.png", strategy_order) for k in SWEEP_KEYS)]
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
