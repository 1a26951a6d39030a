"""Run several strategies one after another with `flwr run` and print their scores.

    python -m experiments.compare NUM_CLIENTS RESULTS_DIR "RUN CONFIG" STRATEGY...

e.g. Fashion-MNIST, practical setting, 20 clients:

    python -m experiments.compare 20 "$PWD/results/fmnist" \\
      "dataset='fmnist' data-dir='$PWD/../shared/data/fashion_mnist' num-server-rounds=3" \\
      fedamp heurfedamp fedavg fedprox

Each strategy is one run of this app on Flower's simulation engine, on a
SuperLink of this script's own (free ports, a fresh ``FLWR_HOME``), stopped
with everything it started, by process id, when the script ends. A run counts
only if Flower says it completed (``flwr ls``: ``finished:completed``):
``flwr run`` exits 0 even when the ServerApp fails. The script prints every
run's status and a table of the BMTA (classification) or best mean test MSE
(regression) of the runs that completed, and exits 1 if any run did not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from experiments.flower_cli import COMPLETED, FlowerCliError, FlowerRun, app_snapshot
from experiments.processes import SuperLink
from strategies.core.records import RunFile, mean_score

ROOT = Path(__file__).resolve().parents[1]


def table(out: Path, names: Sequence[str]) -> str:
    """A Markdown table of the runs' headline numbers and their per-round means."""
    runs = {s: RunFile.read(out / s / "metrics.json") for s in names}
    score = next(iter(runs.values())).score
    col = "BMTA (%)" if score.higher_is_better else "best mean MSE"
    lines = [f"| strategy | {col} | per round |", "|---|---:|---|"]
    for s, m in runs.items():
        per = ", ".join(f"{score.scale * v:.4g}" for r in m.rounds
                        if (v := mean_score(r, score)) is not None)
        lines.append(f"| {s} | {m.headlines.get(score.headline, float('nan')):.4g} | {per} |")
    return "\n".join(lines)


def _show_progress(line: str) -> None:
    if "mean test" in line:
        print(line.rstrip(), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("num_clients", type=int, help="simulated SuperNodes (clients)")
    p.add_argument("out", type=Path, help="results folder: one subfolder per strategy")
    p.add_argument("run_config", help="run-config overrides for every run, as `flwr run` takes "
                                      "them: \"k1=v1 k2='text'\"")
    p.add_argument("strategies", nargs="+", help="strategy names")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    completed: list[str] = []
    failed: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as home, SuperLink(Path(home)) as link, \
                app_snapshot(ROOT) as app:  # every run the same code, its FAB built once
            for s in args.strategies:
                print(f"== {s}", flush=True)
                run_config = (f"strategy='{s}' min-nodes={args.num_clients} run-name='{s}' "
                              f"results-dir='{out}' overwrite=true {args.run_config}")
                run = FlowerRun(link.env, app, run_config, f"num-supernodes={args.num_clients}",
                                out / f"{s}.log", _show_progress)
                try:
                    outcome = run.run(args.timeout)
                    status = outcome.status + (" (timed out)" if outcome.timed_out else "")
                except FlowerCliError as err:
                    status = f"not started: {err}"
                ok = status == COMPLETED and (out / s / "metrics.json").is_file()
                (completed if ok else failed).append(s)
                print(f"{s}: {status}" + ("" if ok else f", see {out / f'{s}.log'}"), flush=True)
    except FlowerCliError as err:  # the app's FAB could not be built: no run started
        raise SystemExit(f"error: {err}") from None
    if completed:
        print("\n" + table(out, completed))
    if failed:
        print(f"\n{len(failed)} run(s) did not complete: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
