"""Turn runs (their ``metrics.json``) into ``results.csv``, ``table.md`` and PNG plots.

    python -m experiments.report RESULTS_DIR_OR_METRICS_JSON... [-o OUT_DIR] [--order fedamp,fedavg]
                                 [--add [--digest ROUNDS_JSON]]

or, from the experiment runner, ``report.write_report(runs, out_dir, strategy_order)``.
The pieces: :mod:`experiments.scores` (reading runs: :class:`RunRecord`; their
scores and settings), :mod:`experiments.tables`, :mod:`experiments.plots`.

An earlier report in ``OUT_DIR`` is never lost: where its ``results.csv`` holds runs the
paths do not, the command refuses, writing nothing, unless ``--add`` keeps them (a grid run
in pieces, the earlier pieces' run folders gone): their rows stay in ``results.csv`` as they
were, and the table counts them from their rows; the convergence plot draws their rounds
where ``--digest`` (``experiments.round_digest``'s file) holds them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import round_digest
from .plots import plot_client_accuracy, plot_convergence, plot_versus, plot_xi_all
from .scores import COMPLETED, STATUS_FILE, SWEEP_KEYS, RunRecord, complete, load_runs
from .tables import read_csv, write_csv, write_table

__all__ = ["COMPLETED", "STATUS_FILE", "RunRecord", "keep_earlier", "load_runs", "main",
           "write_report"]


def write_report(runs: Sequence[RunRecord], out_dir: str | Path,
                 strategy_order: Sequence[str] | None = None,
                 kept: Sequence[Mapping[str, str]] = (),
                 digest: Mapping[str, Mapping] | None = None) -> list[Path]:
    """Write ``results.csv``, ``table.md`` and the PNG plots of the runs into ``out_dir``.

    ``results.csv`` has a row for every run, with its ``finished`` flag and
    Flower's ``status``; the table and the plots show only the runs that
    finished all their rounds (:func:`complete`), and the table says how many
    were left out. Plots without data are skipped: ``convergence.png``, ``client_accuracy.png``,
    ``xi_<setting>_<strategy>.png`` and ``vs_<key>.png`` for each key of
    :data:`SWEEP_KEYS` that some setting varies. They are written beside and moved in once
    all are: a report that fails half way replaces none of the last one's files.

    Parameters
    ----------
    runs : Sequence[RunRecord]
        Parsed ``metrics.json`` dicts (see :func:`load_runs`).
    out_dir : str | Path
        Folder for the outputs; created if missing.
    strategy_order : Sequence[str] | None
        Preferred order of the strategies (table rows, legends); others follow
        by first appearance.
    kept : Sequence[Mapping[str, str]]
        An earlier ``results.csv``'s rows to keep beside ``runs`` (``--add``): in the CSV
        as they were (but those of a name ``runs`` has), in the table and plots as
        :meth:`RunRecord.from_row` reads them back.
    digest : Mapping[str, Mapping] | None
        A round digest (``experiments.round_digest``: run name -> its ``rounds``) that gives
        the kept runs their rounds for the convergence plot. It holds no client's own
        numbers: with kept runs, ``client_accuracy.png`` (the runs' clients side by side) is
        not written (an earlier one is left as it was), and FedAMP's xi plots are the new
        runs' alone.

    Returns
    -------
    list[Path]
        The files written.

    Raises
    ------
    ValueError
        A kept row that cannot be read back (:meth:`RunRecord.from_row`), before anything
        is written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = {r.run_name for r in runs}
    kept = [row for row in kept if row["run_name"] not in names]
    earlier = [RunRecord.from_row(row, (digest or {}).get(row["run_name"], {}).get("rounds", ()))
               for row in kept]
    # written beside, then moved in: a report that fails half way replaces none of the last
    with tempfile.TemporaryDirectory(dir=out, prefix=".report-") as folder:
        files = _write_all(runs, earlier, kept, Path(folder), strategy_order)
        for f in files:
            os.replace(f, out / f.name)
    return [out / f.name for f in files]


def _write_all(runs: Sequence[RunRecord], earlier: Sequence[RunRecord],
               kept: Sequence[Mapping[str, str]], out: Path,
               strategy_order: Sequence[str] | None) -> list[Path]:
    """:func:`write_report`'s files, into ``out``."""
    written: list[Path | None] = [write_csv(runs, out / "results.csv", kept)]
    everything = [*earlier, *runs]
    runs = [r for r in everything if complete(r)]
    written += [
        write_table(runs, out / "table.md", strategy_order, left_out=len(everything) - len(runs)),
        plot_convergence(runs, out / "convergence.png", strategy_order),
        # its runs side by side, each client's own numbers, which a kept row does not hold
        None if earlier else plot_client_accuracy(runs, out / "client_accuracy.png",
                                                  strategy_order),
        *plot_xi_all(runs, out, strategy_order),
        *(plot_versus(runs, k, out / f"vs_{k}.png", strategy_order) for k in SWEEP_KEYS)]
    return [p for p in written if p is not None]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``report.py PATH... [-o OUT_DIR] [--order a,b,c] [--add [--digest F]]``.

    Parameters
    ----------
    argv : Sequence[str] | None
        Arguments; None: ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="metrics.json files or folders holding them")
    parser.add_argument("-o", "--out", default="report", help="output folder (default: report)")
    parser.add_argument("--order", default="", help="comma-separated strategy order")
    parser.add_argument("--add", action="store_true",
                        help="keep the runs of an earlier results.csv in --out that the paths "
                             "do not hold (a grid run in pieces); without it the command "
                             "refuses to drop them")
    parser.add_argument("--digest", type=Path,
                        help="with --add: a round digest (experiments.round_digest) giving the "
                             "kept runs their rounds for the convergence plot")
    args = parser.parse_args(argv)
    if args.digest and not args.add:
        parser.error("--digest gives the rounds of the runs --add keeps: give --add too")
    digest = round_digest.load(args.digest, "--digest") if args.digest else None
    runs = load_runs(args.paths)
    kept = _earlier_rows(Path(args.out) / "results.csv", {r.run_name for r in runs}, args.add)
    order = [s for s in args.order.split(",") if s] or None
    try:
        written = write_report(runs, args.out, order, kept, digest)
    except ValueError as ex:  # a kept row that cannot be read back
        raise SystemExit(f"{Path(args.out) / 'results.csv'}: {ex}; nothing written") from ex
    for path in written:
        print(path)
    if kept:
        print(f"{len(kept)} earlier run(s) kept beside these {len(runs)}")


def keep_earlier(out_dir: str | Path, names: set[str]) -> list[dict[str, str]]:
    """The rows of ``out_dir``'s earlier ``results.csv`` whose runs are not in ``names``: the
    experiment runner keeps them in its report, as ``--add`` does (an earlier piece of a grid
    run into the same folder, ``simulation.py --strategies ...``). An earlier file that cannot
    be read back is never overwritten: it is set aside as ``results.csv.unreadable``, said,
    and none of it is kept."""
    path = Path(out_dir) / "results.csv"
    if not path.is_file():
        return []
    try:
        kept = [row for row in read_csv(path) if row["run_name"] not in names]
        for row in kept:
            RunRecord.from_row(row)  # read back, or refused
    except ValueError as ex:
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        print(f"warning: the earlier {ex}: set aside as {aside}; its runs are not in this report")
        return []
    return kept


def _earlier_rows(path: Path, names: set[str], add: bool) -> list[dict[str, str]]:
    """The rows of an earlier ``results.csv`` at ``path`` whose runs ``names`` has not:
    kept with ``add``; without it, the command refuses where there are any."""
    if not path.exists():
        return []
    try:
        rows = read_csv(path)
    except ValueError as ex:
        raise SystemExit(f"{ex}: give another --out, or remove the file") from ex
    kept = [row for row in rows if row["run_name"] not in names]
    if kept and not add:
        shown = ", ".join(row["run_name"] for row in kept[:3]) + (", ..." if len(kept) > 3 else "")
        raise SystemExit(f"{path} holds {len(kept)} run(s) the paths do not ({shown}): give "
                         "--add to keep them beside these, or another --out")
    return kept


if __name__ == "__main__":
    main()
