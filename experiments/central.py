"""The reference of a federated task: one model of the clients' shape, trained centrally.

Pools every client's training data of a federated task (TPT-48, FL-60), trains
the task's model (TPT-48: the MLP 6-64-64-6 every client holds; FL-60: the
2-16-2 MLP) with Adam on the pool, and reports the mean over the clients of
their own test metric (MSE, or accuracy in %), the metric of the federated
runs, after every block of epochs: what one shared model of that shape can
do with all the data in one place, the yardstick of FedAvg. Run:

    python -m experiments.central --dataset tpt48 --variant time --data-dir ../shared/data/tpt48
    python -m experiments.central --dataset fl60 --variant grda --epochs 200 --every 20
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import tasks
from tasks.loading import load_federated
from tasks.train import evaluate, train

CLIENTS = {"tpt48": 48, "fl60": 60}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="tpt48", choices=sorted(CLIENTS))
    p.add_argument("--variant", default="time",
                   help="TPT-48: the split (time, random); FL-60: the variant (text, grda)")
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/tpt48"))
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument("--every", type=int, default=20, help="report every this many epochs")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    variant = {"tpt48": {"tpt48_split": args.variant}, "fl60": {"fl60_variant": args.variant}}
    dc = tasks.DataConfig(args.dataset, args.data_dir if args.dataset == "tpt48" else "",
                          CLIENTS[args.dataset], args.seed, **variant[args.dataset])
    fed = load_federated(dc)
    x = torch.from_numpy(np.concatenate([s.x for s in fed.train]))
    y = torch.from_numpy(np.concatenate([s.y for s in fed.train]))
    tests = [(torch.from_numpy(s.x), torch.from_numpy(s.y)) for s in fed.test]
    regression = torch.is_floating_point(y)
    torch.manual_seed(args.seed)
    model = tasks.build_model(dc)
    better = min if regression else max
    best, curve = (float("inf") if regression else 0.0), []
    for block in range(args.epochs // args.every):
        train(model, x, y, epochs=args.every, batch_size=args.batch_size, learning_rate=args.lr,
              seed=args.seed + block)
        results = [evaluate(model, xt, yt) for xt, yt in tests]
        values = [r.mse if regression else r.accuracy for r in results]
        value = float(np.mean([float(v) for v in values if v is not None]))
        value = value if regression else 100 * value
        best = better(best, value)
        curve.append(value)
        name = "MSE" if regression else "accuracy (%)"
        print(f"epoch {(block + 1) * args.every:4d}: mean test {name} over clients {value:.5g} "
              f"(best {best:.5g})", flush=True)
    print(f"{args.dataset} ({args.variant}), central {type(model).__name__} (Adam {args.lr:g}, "
          f"batch {args.batch_size}): best mean test {'MSE' if regression else 'accuracy'} "
          f"{best:.5g}")
    return {"best": best, "curve": curve}


if __name__ == "__main__":
    main()
