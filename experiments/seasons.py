"""Two seasons of one consortium: what a warm start gives the returning members, and what
each first model gives a newcomer.

Season 1: the first ``n - newcomers - 1`` members' files of a task (written by
``experiments.make_sites``) and one more that leaves after it train ``--rounds`` rounds.
Season 2 runs ``--rounds2`` rounds with the members that stay and ``--newcomers`` new ones,
four ways: cold (``warm-start = ""``), warm with the method's newcomer start (FedAMP: the
initial model; Panacea: the embedding placed by the newcomer's graph neighbours), warm with
the other start (FedAMP: the mean of the returning members' models; Panacea: the embedding's
own N(0, 1) draw, the paper's novel clients). Prints each season-2 round's mean test
accuracy (MSE) of the returning members and of the newcomers. Run:

    python -m experiments.seasons --dataset mnist --data-dir ../shared/data/mnist \\
        --clients 6 --newcomers 1 --strategy fedamp
    python -m experiments.seasons --dataset fl60 --clients 60 --newcomers 12 \\
        --strategy panacea --rounds 10 --set panacea-server-lr=0.01 --set panacea-client-lr=0.1
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

import tasks
from experiments.make_sites import member_name, write_sites
from fedamp_flwr.tools.inprocess import run_inprocess
from strategies.core.base import PersonalizedStrategy
from strategies.core.records import client_scores
from strategies.fedamp import FedAMP
from strategies.panacea import Panacea


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _scores(metrics: dict[str, Any], names: list[str]) -> list[float]:
    """Each round's mean test score over the clients named ``names``."""
    ids = {str(metrics["client_names"].index(n)) for n in names}
    return [float(np.mean([v for c, v in client_scores(r).items() if c in ids]))
            for r in metrics["rounds"]]


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir", default="")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--newcomers", type=int, default=1)
    p.add_argument("--strategy", default="fedamp", choices=("fedamp", "heurfedamp", "sfl",
                                                             "panacea", "panacea-gn"))
    p.add_argument("--rounds", type=int, default=5, help="season 1's rounds")
    p.add_argument("--rounds2", type=int, default=4, help="season 2's rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], help="key=value for both seasons")
    p.add_argument("--out", default="/tmp/seasons")
    args = p.parse_args(argv)
    n, k = args.clients, args.newcomers
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    dc = tasks.DataConfig(dataset=args.dataset, data_dir=args.data_dir, num_clients=n,
                          seed=args.seed)
    config = write_sites(dc, out / "sites")
    nodes = [{"data-path": str(out / "sites" / f"{member_name(i, n)}.npz"),
              "client-id": member_name(i, n)} for i in range(n)]
    first, new = nodes[: n - k], nodes[n - k:]  # the last of the first season's leaves
    stay = [node["client-id"] for node in first[:-1]]
    common = {**config, "strategy": args.strategy, "seed": args.seed, "results-dir": str(out),
              "server-device": "cpu", "data-dir": args.data_dir,
              **{kv.split("=", 1)[0]: _value(kv.split("=", 1)[1]) for kv in args.set}}
    if args.strategy.startswith("panacea"):
        common.update({"graph": "file", "graph-file": str(_graph_file(dc, out))})
    run_inprocess({**common, "num-server-rounds": args.rounds, "run-name": "season-1",
                   "min-nodes": len(first)}, len(first), node_configs=first)
    other = ("the others' mean" if not args.strategy.startswith("panacea")
             else "its own N(0, 1) draw")
    found: dict[str, dict[str, list[float]]] = {}
    for label, warm, flip in (("cold", False, False), ("warm", True, False),
                              (f"warm, newcomer from {other}", True, True)):
        cls: type[PersonalizedStrategy] = Panacea if args.strategy.startswith("panacea") \
            else FedAMP
        flag = "PLACE_NEWCOMERS" if cls is Panacea else "JOINER_FROM_MEAN"
        before = getattr(cls, flag)
        setattr(cls, flag, before != flip)
        try:
            name = label.split(",")[0] + ("-other" if flip else "")
            season = {**common, "num-server-rounds": args.rounds2, "run-name": name,
                      "min-nodes": len(stay) + k,
                      "warm-start": str(out / "season-1") if warm else ""}
            run_inprocess(season, len(stay) + k, node_configs=first[:-1] + new)
        finally:
            setattr(cls, flag, before)
        metrics = json.loads((out / name / "metrics.json").read_text())
        found[label] = {"returning": _scores(metrics, stay),
                        "newcomers": _scores(metrics, [m["client-id"] for m in new])}
    print(f"{args.strategy} on {args.dataset}: season 1 {len(first)} members x {args.rounds} "
          f"rounds; season 2: {len(stay)} returning, {k} new, {args.rounds2} rounds")
    for label, rows in found.items():
        for who, values in rows.items():
            print(f"  {label:<40} {who:<10} " + "  ".join(f"{v:.3f}" for v in values))
    return found


def _graph_file(dc: tasks.DataConfig, out: Path) -> Path:
    """The task's client graph as an edge list of member names (``graph = "file"``)."""
    adjacency, n = tasks.load_federated(dc).adjacency, dc.num_clients
    if adjacency is None:
        raise SystemExit(f"--dataset {dc.dataset}: the task has no client graph; allowed: a "
                         "task with one (fl60, tpt48) for a graph method")
    path = out / "graph.csv"
    edges = [f"{member_name(u, n)},{member_name(v, n)}" for u, v in zip(*np.nonzero(
        np.triu(np.asarray(adjacency))), strict=True)]
    path.write_text("u,v\n" + "\n".join(edges) + "\n")
    return path


if __name__ == "__main__":
    main()
