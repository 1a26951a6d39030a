"""How much training one traffic sensor's GRU needs alone: the floor of the traffic tables.

On the generated stand-in (``tasks.traffic.make_traffic_standin``, on a real road graph), each
chosen sensor's GRU encoder-decoder (the tasks' model) is trained alone on its own training
windows with the tasks' local training (Adam 1e-3, batch 32), and its test MSE printed after
each number of steps, beside forecasting the last reading (persistence), the baseline any
forecaster must beat. It says what budget a federated table needs before the methods can
separate. Run:

    python -m experiments.traffic_alone --graph metr-la --sensors 0,50,100 \\
        --steps 50,200,500,1000,2000
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.models import GRUSeq2Seq
from tasks.traffic import STEPS_OUT, make_traffic_standin
from tasks.train import evaluate, train

GRAPHS = {"metr-la": "metr_la_adjacency.npz", "pems-bay": "pems_bay_adjacency.npz"}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", choices=sorted(GRAPHS), default="metr-la")
    p.add_argument("--data-dir", default="../shared/data/sensor_graphs",
                   help="folder of the road graphs (the sensor_graphs .npz files)")
    p.add_argument("--sensors", default="0,50,100", help="sensor indices, comma-separated")
    p.add_argument("--steps", default="50,200,500,1000,2000",
                   help="steps after which to test, comma-separated, increasing")
    p.add_argument("--days", type=int, default=35)
    p.add_argument("--stride", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    data = make_traffic_standin(Path(args.data_dir) / GRAPHS[args.graph], days=args.days,
                                seed=args.seed, stride=args.stride)
    steps = sorted(int(s) for s in args.steps.split(","))
    rows: list[dict[str, Any]] = []
    for sensor in (int(s) for s in args.sensors.split(",")):
        tr, te = data.train[sensor], data.test[sensor]
        x, y = torch.as_tensor(tr.x), torch.as_tensor(tr.y)
        xt, yt = torch.as_tensor(te.x), torch.as_tensor(te.y)
        persistence = float(((te.x[:, -1:] - te.y) ** 2).mean())
        torch.manual_seed(args.seed)
        model, done, mse = GRUSeq2Seq(STEPS_OUT), 0, {}
        for target in steps:
            train(model, x, y, epochs=1, batch_size=32, learning_rate=1e-3, steps=target - done,
                  seed=args.seed)
            done = target
            mse[target] = float(evaluate(model, xt, yt).loss)  # regression: the MSE
        rows.append({"sensor": sensor, "persistence": persistence, "mse": mse})
        name = data.names[sensor] if data.names else sensor
        print(f"sensor {sensor} ({name}): persistence {persistence:.5f}; "
              + ", ".join(f"{s} steps {mse[s]:.5f}" for s in steps), flush=True)
    mean = {s: float(np.mean([r["mse"][s] for r in rows])) for s in steps}
    print(f"mean over {len(rows)} sensors: persistence "
          f"{np.mean([r['persistence'] for r in rows]):.5f}; "
          + ", ".join(f"{s} steps {mean[s]:.5f}" for s in steps))
    return rows


if __name__ == "__main__":
    main()
