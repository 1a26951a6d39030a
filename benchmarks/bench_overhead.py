"""FedAMP's and HeurFedAMP's cost against FedAvg's, side by side in one run.

The same clients (Fashion-MNIST practical, 20 clients, 3 rounds of 1 local
epoch, the paper's Adam 1e-3 and batch 100, by default) train with FedAvg,
FedAMP and HeurFedAMP, alternated ``--repeats`` times (each repeat starting with the next
strategy, so that none always runs first), each run in a fresh
process with the app's in-process engine (the real ServerApp and ClientApp
functions). Reported: each strategy's run time (the sum of its rounds' "done
in" seconds: clients' training and evaluation and the server's work) as the
best of its repeats, and its ratio to FedAvg's: of the best, and the median of the
repeats' own ratios (each repeat's runs meet the same load). Checkpoints are off for all
(``checkpoint-every = 0``): FedAMP's holds every client's model (the log's
"checkpoint written" line gives its size and seconds), FedAvg's one model.

    python -m benchmarks.bench_overhead [--data-dir ../shared/data] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.bench_scale import ROOT, run_child


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--strategies", nargs="+", default=["fedavg", "fedamp", "heurfedamp"])
    args = p.parse_args()
    base = {"dataset": "fmnist", "partitioning": "practical", "local-epochs": 1,
            "num-server-rounds": args.rounds, "batch-size": 100, "learning-rate": 1e-3,
            "optimizer": "adam", "checkpoint-every": 0,
            "data-dir": str(Path(args.data_dir).resolve() / "fashion_mnist")}
    times: dict[str, list[float]] = {s: [] for s in args.strategies}
    k = len(args.strategies)
    for rep in range(args.repeats):  # each repeat starts with the next strategy: no one
        order = args.strategies[rep % k:] + args.strategies[:rep % k]  # is always first
        for s in order:
            row = run_child({**base, "strategy": s}, args.clients)
            times[s].append(sum(row["round_s"]))
            rounds = ", ".join(f"{v:.2f}" for v in row["round_s"])
            print(f"repeat {rep + 1}: {s} {times[s][-1]:.2f}s ({rounds})", flush=True)
    first = args.strategies[0]
    best = {s: min(v) for s, v in times.items()}
    print(f"\n| strategy | run time, best of {args.repeats} (s) | mean (s) | ratio to {first} "
          f"(best) | ratio to {first} (median of the repeats' ratios) |")
    print("|---|---:|---:|---:|---:|")
    for s in args.strategies:
        paired = statistics.median(a / b for a, b in zip(times[s], times[first]))
        print(f"| {s} | {best[s]:.2f} | {statistics.mean(times[s]):.2f} | "
              f"{best[s] / best[first]:.3f} | {paired:.3f} |")


if __name__ == "__main__":
    main()
