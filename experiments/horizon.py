"""Where collaboration pays: the fedamp-horizon preset's curves, gaps and xi heatmaps.

    python -m experiments.horizon /tmp/m15/horizon/runs -o docs/horizon

Reads every run's metrics.json under the folder and writes

* ``convergence.png``: mean test accuracy per round of every method;
* ``gap.png``: each method's accuracy minus Separate's, per round;
* ``xi_<method>_round<k>.png``: FedAMP-family weights at rounds 1, 5 and the last;

and prints a markdown table: BMTA, the accuracy at rounds 5, 10, 20 and 30,
the gap to Separate there, and the share of the weight that FedAMP-family
clients put on their own practical group at rounds 1, 5 and the last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.ticker
import numpy as np

import tasks
from experiments import plots, report, scores

MARKS = (5, 10, 20, 30)


def own_group_share(run: scores.RunRecord, xi: np.ndarray, ids: list[int]) -> float:
    """Mean over clients of the weight on the other clients of their own group."""
    groups = tasks.client_groups(run.dataset, run.partitioning, len(ids))
    if groups is None:
        raise ValueError(f"{run.dataset}/{run.partitioning} has no groups of clients")
    g = np.array([groups[c] for c in ids])
    same = (g[:, None] == g[None, :]) & ~np.eye(len(ids), dtype=bool)
    return float((xi * same).sum(1).mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, help="a folder of runs (each with its metrics.json)")
    p.add_argument("-o", "--out", type=Path, default=Path("docs/horizon"))
    args = p.parse_args(argv)
    runs = report.load_runs(sorted(args.runs.glob("*/metrics.json")))
    if not runs:
        sys.exit(f"no metrics.json under {args.runs}")
    args.out.mkdir(parents=True, exist_ok=True)
    import matplotlib.pyplot as plt

    plots.plot_convergence(runs, args.out / "convergence.png")
    curves = {scores.method_of(r): scores.round_means(r) for r in runs}
    base = curves.get("separate")
    if base is not None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m, (x, y) in curves.items():
            if m == "separate":
                continue
            common, ia, ib = np.intersect1d(x, base[0], return_indices=True)
            ax.plot(common, y[ia] - base[1][ib], label=m)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel="round", ylabel="accuracy minus Separate's (points)",
               title="gap to training alone")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(args.out / "gap.png", dpi=120)
        plt.close(fig)
    print("| method | rounds | BMTA | " + " | ".join(f"round {k}" for k in MARKS)
          + " | gap to Separate at " + ", ".join(map(str, MARKS))
          + " | own-group weight, rounds 1 / 5 / last |")
    print("|---|---:|---:|" + "---:|" * len(MARKS) + "---|---|")
    for r in runs:
        m = scores.method_of(r)
        x, y = curves[m]
        at = {int(k): v for k, v in zip(x, y)}
        cells = [f"{at[k]:.2f}" if k in at else "" for k in MARKS]
        gaps = []
        if base is not None:
            b = {int(k): v for k, v in zip(*base)}
            gaps = [f"{at[k] - b[k]:+.2f}" if k in at and k in b else "–" for k in MARKS]
        ids, xis = plots.xi_matrices(r)
        share = ""
        if xis:
            picks = [k for k in (1, 5, max(xis)) if k in xis]
            share = " / ".join(f"{own_group_share(r, xis[k], ids):.2f}" for k in picks)
            for k in picks:
                plots.plot_xi(r, args.out / f"xi_{plots.safe_name(m)}_round{k}.png", m, k)
        best = scores.score(r)
        print(f"| {m} | {len(x)} | {best if best is not None else float('nan'):.2f} | "
              + " | ".join(cells) + f" | {', '.join(gaps)} | {share} |")


if __name__ == "__main__":
    main()
