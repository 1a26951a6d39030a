"""Write one data file per member from a partitioned task, to run it as a real federation.

    python -m experiments.make_sites --dataset fmnist --data-dir ../shared/data/fashion_mnist \\
        --num-clients 20 --seed 0 --out sites/

writes ``sites/client-00.npz`` ... ``sites/client-19.npz`` (each ``x``, ``y``,
``x_test``, ``y_test``: exactly the tensors client i of the partitioned
simulation trains and tests on), ``sites/graph.csv`` when the task defines a
client graph (edges by member name), and ``sites/run-config.txt``: the run
config of a ``dataset = "members"`` run that gives the same numbers as the
partitioned simulation with the same seed (with the task's own "auto" values,
e.g. FL-60's 20 local steps of batch 16; a strategy's values tuned for the
task are not carried and must be given), as ``flwr run --run-config`` takes it:
``--run-config "$(cat sites/run-config.txt) strategy='fedamp' ..."``. Member
``client-i`` gets client id
i (members are numbered in the order of their names), so its training draws
the same mini-batches. Each member's SuperNode then reads only its own file:

    flower-supernode ... --node-config "data-path='sites/client-03.npz' client-id='client-03'"
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import tasks
from fedamp_flwr.config import GENERIC_AUTO, TABLE_AUTO
from tasks.models import MODEL_OF_TASK

ROOT = Path(__file__).resolve().parents[1]


def member_name(i: int, n: int) -> str:
    """The name of client i of n: ``client-<i>``, zero-padded so that names sort as ids do."""
    return f"client-{i:0{len(str(n - 1))}d}"


def write_sites(dc: tasks.DataConfig, out: Path) -> dict[str, object]:
    """Write the members' files of ``dc`` into ``out``; return the members run's config."""
    fed = tasks.load_federated(dc)
    n = fed.num_clients
    info = tasks.data_info(dc)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        tr, te = fed.train[i], fed.test[i]
        np.savez(out / f"{member_name(i, n)}.npz", x=tr.x, y=tr.y, x_test=te.x, y_test=te.y)
    run_config: dict[str, object] = {
        "dataset": "members", "seed": dc.seed, "min-nodes": n,
        "member-input-shape": ",".join(map(str, info.input_shape)),
        "member-task": info.kind, "member-outputs": info.num_outputs,
        "model": MODEL_OF_TASK.get(dc.dataset, "auto"),
        # the partitioned task's inputs as they are (a members run standardizes vectors by
        # default, which the simulation does not): the same numbers as the simulation
        "member-scaling": "none",
        # the partitioned task's batch size and learning rate (a members table's "auto"
        # values are others: TABLE_AUTO)
        **{key: GENERIC_AUTO[key] for key in TABLE_AUTO},
        # the task's own values of settings left at "auto" (a strategy's own tuned values
        # for this task, TaskSpec.auto[<strategy>], are not carried: set them explicitly)
        **tasks.get_task(dc.dataset).auto,
    }
    if fed.adjacency is not None:
        with open(out / "graph.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["u", "v"])
            for u, v in zip(*np.nonzero(np.triu(fed.adjacency, k=1))):
                writer.writerow([member_name(int(u), n), member_name(int(v), n)])
        run_config.update({"graph": "file", "graph-file": str((out / "graph.csv").resolve())})
    (out / "run-config.txt").write_text(run_config_text(run_config) + "\n")
    return run_config


def run_config_text(run_config: dict[str, object]) -> str:
    """``k1=v1 k2="v2"``: the run config as ``flwr run --run-config`` takes it."""
    return " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="a partitioned task: synthetic, mnist, fmnist, "
                   "emnist, cifar10, cifar100, fl60, tpt48, npz")
    p.add_argument("--data-dir", default="", help="the task's data folder (as data-dir)")
    p.add_argument("--num-clients", type=int, default=0,
                   help="clients (fl60: 60 by default, tpt48: 48)")
    p.add_argument("--partitioning", default="practical")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--test-samples", type=int, default=100)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="another data setting (dirichlet-alpha, fl60-variant, tpt48-split, ...)")
    p.add_argument("--out", type=Path, required=True, help="folder for the members' files")
    args = p.parse_args(argv)
    fixed = {"fl60": 60, "tpt48": 48}
    n = args.num_clients or fixed.get(args.dataset, 0)
    if n < 1:
        p.error("--num-clients is required for this dataset")
    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        field = key.strip().replace("-", "_")
        current = getattr(tasks.DataConfig, field, None)
        extra[field] = type(current)(value) if current is not None else value
    dc = tasks.DataConfig(dataset=args.dataset, data_dir=args.data_dir, num_clients=n,
                          seed=args.seed, partitioning=args.partitioning,
                          test_samples=args.test_samples, **extra)
    run_config = write_sites(dc, args.out)
    print(f"Wrote {n} members' files to {args.out}")
    print(f"Run config (also in {args.out / 'run-config.txt'}):")
    print("  " + run_config_text(run_config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
