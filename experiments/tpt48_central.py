"""The reference ceiling on TPT-48: one model of the federated model's shape, trained centrally.

Pools the 48 states' training windows, trains the task's MLP (6-64-64-6, the
model every client holds) with Adam, and reports the mean over the states of
their test MSE (the metric of the federated runs) after every epoch block:
what no federated method can beat by much with this model. Run:

    python experiments/tpt48_central.py --data-dir ../shared/data/tpt48 [--split time|random]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tasks
from tasks.federated import load_tpt48
from tasks.train import evaluate, train


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/tpt48"))
    p.add_argument("--split", default="time", choices=("time", "random"))
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument("--every", type=int, default=20, help="report every this many epochs")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    fed = load_tpt48(Path(args.data_dir).expanduser(), args.split, args.seed)
    x = torch.from_numpy(np.concatenate([s.x for s in fed.train]))
    y = torch.from_numpy(np.concatenate([s.y for s in fed.train]))
    tests = [(torch.from_numpy(s.x), torch.from_numpy(s.y)) for s in fed.test]
    torch.manual_seed(args.seed)
    model = tasks.build_model(tasks.DataConfig("tpt48", args.data_dir, 48, args.seed))
    best, curve = float("inf"), []
    for block in range(args.epochs // args.every):
        train(model, x, y, epochs=args.every, batch_size=args.batch_size, lr=args.lr,
              seed=args.seed + block)
        mse = float(np.mean([evaluate(model, xt, yt).mse for xt, yt in tests]))
        best = min(best, mse)
        curve.append(mse)
        print(f"epoch {(block + 1) * args.every:4d}: mean test MSE over states {mse:.5f} "
              f"(best {best:.5f})", flush=True)
    print(f"TPT-48, {args.split} split, central MLP 6-64-64-6 (Adam {args.lr:g}, batch "
          f"{args.batch_size}): best mean test MSE {best:.5f}")
    return {"best": best, "curve": curve}


if __name__ == "__main__":
    main()
