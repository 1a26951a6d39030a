"""Accuracy against epsilon, from the runs of the "dp-tradeoff" and "dp-panacea" presets.

``python -m experiments.dp_tradeoff RESULTS [RESULTS ...] --out docs/privacy`` reads every run
under the given ``simulation.py --output`` folders and writes

* ``accuracy-epsilon.png``: each method's BMTA (or best mean MSE) against the epsilon its
  members reported spent (the largest of any member, from ``client_dp_epsilon`` in
  ``metrics.json``, never a number computed here), runs without DP at the right as
  "none";
* ``xi-epsilon-<epsilon>.png``: FedAMP's collaboration weights of the last round, for each
  epsilon, and (printed) the share of each client's weight within its group, FedAMP's and
  HeurFedAMP's, where the data setting has groups;

and prints the table (markdown) with the noise multiplier of each run.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from strategies.core.records import DP_SPENT

from .group_weight import group_shares
from .plots import plot_xi
from .scores import RunRecord, is_regression, load_runs, score


def spent(run: RunRecord) -> float:
    """The largest epsilon any member of ``run`` reported (inf: a run without DP)."""
    values = [v for r in run.rounds for v in (r.get(DP_SPENT) or {}).values()]
    return max(values) if values else math.inf


def rows(runs: Sequence[RunRecord]) -> list[dict]:
    """One row per finished run: method, data setting, noise multiplier, epsilon, score."""
    out = []
    for run in runs:
        if not run.finished or not run.rounds:
            continue
        dp = run.config.get("dp", "none")
        out.append({"method": run.label or run.strategy,
                    "setting": f"{run.dataset}/{run.partitioning}",
                    "dp": dp, "noise": run.config.get("dp-noise-multiplier") if dp != "none"
                    else None, "epsilon": spent(run), "score": score(run),
                    "regression": is_regression(run), "run": run})
    return sorted(out, key=lambda r: (r["setting"], r["method"], -r["epsilon"]))


def table(found: Sequence[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| setting | method | dp | noise multiplier | epsilon spent (largest member) | "
             "score |", "|---|---|---|---:|---:|---:|"]
    for r in found:
        eps = "none (no DP)" if math.isinf(r["epsilon"]) else f"{r['epsilon']:.3g}"
        noise = "" if r["noise"] is None else f"{r['noise']:g}"
        unit = "best mean MSE" if r["regression"] else "BMTA %"
        lines.append(f"| {r['setting']} | {r['method']} | {r['dp']} | {noise} | {eps} | "
                     f"{r['score']:.4g} ({unit}) |")
    return "\n".join(lines) + "\n"


def plot(found: Sequence[dict], path: Path) -> Path:
    """Score against epsilon, one line per method and setting (log x; no DP at the right)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in found:
        groups.setdefault((r["setting"], r["method"]), []).append(r)
    finite = [r["epsilon"] for r in found if math.isfinite(r["epsilon"])]
    right = max(finite) * 4 if finite else 1.0
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (setting, method), rs in sorted(groups.items()):
        xs = [r["epsilon"] if math.isfinite(r["epsilon"]) else right for r in rs]
        ax.plot(xs, [r["score"] for r in rs], marker="o", label=f"{method} ({setting})")
    ax.set_xscale("log")
    ticks = sorted({round(x, 2) for x in finite}) + [right]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks[:-1]] + ["none"])
    ax.set(xlabel="epsilon spent (largest member, delta 1e-5)",
           ylabel="BMTA %" if not any(r["regression"] for r in found) else "score",
           title="Accuracy against epsilon (DP-SGD on each member)")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.dp_tradeoff", description=__doc__)
    p.add_argument("results", nargs="+", type=Path, help="simulation.py --output folders (or "
                   "any folders holding runs' metrics.json)")
    p.add_argument("--out", type=Path, default=Path("docs/privacy"))
    args = p.parse_args(argv)
    runs = load_runs(args.results)
    found = rows(runs)
    if not found:
        raise SystemExit(f"error: no finished run under {', '.join(map(str, args.results))}")
    print(table(found))
    print(f"wrote {plot(found, args.out / 'accuracy-epsilon.png')}")
    for r in found:
        if r["method"] in ("fedamp", "heurfedamp") and r["run"].xi:
            name = "none" if math.isinf(r["epsilon"]) else f"{r['epsilon']:.3g}"
            shares = group_shares(r["run"])
            if shares:  # does xi still find the groups through the noise?
                last = max(shares)
                print(f"{r['method']}, epsilon {name}: {shares[last][0]:.1f}% of each client's "
                      f"weight within its group in round {last} (self {shares[last][1]:.1f}%)")
            if r["method"] == "fedamp":
                written = plot_xi(r["run"], args.out / f"xi-epsilon-{name}.png",
                                  f"FedAMP, epsilon {name}:")
                if written:
                    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
