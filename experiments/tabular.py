"""Members' own tables, raw: is each member's federated model at least as good as what it
fits alone?

    python -m experiments.tabular --out /tmp/tabular --seeds 0 1 2

A real table whose columns are on very different scales (scikit-learn's wine table: 178
rows, 13 columns from about 0.1 to 1,680, 3 classes; ``--dataset breast_cancer``: 569 rows,
30 columns, 2 classes) is cut into three members, each with its own class mix (a member
draws most of its rows from one class), written as each member's CSV with raw columns, a
text label and a ``split`` column (70% train). Each method runs at its defaults in the
in-process engine (``fedamp_flwr.tools.inprocess``: the real ServerApp and ClientApps), once
per way of standardizing the members' columns (``member-scaling``: pooled, own, none), for
``--rounds`` rounds; the table gives each member's test accuracy in the last round (the
model it takes home), and what it fits alone: scikit-learn's logistic regression on its
own training rows, standardized by its own statistics (the reference a hospital would
fit itself), and the linear model and the run's model alone that each member's node
reported (``metrics.json``'s ``alone``). Means over the members, then over the seeds.
Needs scikit-learn (the ``dev`` extra). The measured table: docs/federation.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from strategies.core.records import RunFile, client_scores

STRATEGIES = ("fedamp", "heurfedamp", "separate")
#: scikit-learn's tables (``load_<name>``)
DATASETS = ("wine", "breast_cancer", "digits")
SCALINGS = ("pooled", "own", "none")
#: each member's class mix: member m draws a row of class c with probability MIX[m][c % 3] / ...
MIX = ((0.7, 0.2, 0.1), (0.15, 0.7, 0.15), (0.1, 0.2, 0.7))


def members(dataset: str, folder: Path, seed: int) -> tuple[list[dict], dict]:
    """The members' CSV files of ``dataset`` cut with ``seed``: their node configs, and the
    run config's schema keys."""
    from sklearn import datasets

    data = getattr(datasets, f"load_{dataset}")(as_frame=True)
    x, y = data.data, data.target.to_numpy()
    names = [str(n).replace(" ", "_") for n in data.target_names]
    classes = len(names)
    mix = np.array([[row[c % 3] for c in range(classes)] for row in MIX], dtype=float)
    rng = np.random.default_rng(seed)
    owner = np.array([rng.choice(3, p=mix[:, c] / mix[:, c].sum()) for c in y])
    folder.mkdir(parents=True, exist_ok=True)
    nodes = []
    for m in range(3):
        rows = np.flatnonzero(owner == m)
        rng.shuffle(rows)
        frame = x.iloc[rows].copy()
        frame.columns = [str(c).replace("/", "_").replace(" ", "_") for c in frame.columns]
        frame["label"] = [names[c] for c in y[rows]]
        cut = int(round(0.7 * len(rows)))
        frame["split"] = ["train"] * cut + ["test"] * (len(rows) - cut)
        path = folder / f"site-{m}.csv"
        frame.to_csv(path, index=False)
        nodes.append({"data-path": str(path), "client-id": f"site-{m}"})
    schema = {"dataset": "members", "member-input-shape": str(x.shape[1]),
              "member-outputs": classes, "member-class-names": ",".join(names)}
    return nodes, schema


def logistic_alone(path: str) -> float:
    """scikit-learn's logistic regression on a member's own training rows, standardized by
    their own statistics, tested on its test rows."""
    import pandas as pd
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    frame = pd.read_csv(path)
    cols = [c for c in frame.columns if c not in ("label", "split")]
    train, test = frame[frame.split == "train"], frame[frame.split == "test"]
    scaler = StandardScaler().fit(train[cols])
    model = LogisticRegression(max_iter=5000).fit(scaler.transform(train[cols]), train.label)
    return float(model.score(scaler.transform(test[cols]), test.label))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.tabular",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dataset", default="wine", choices=DATASETS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config values for every run, e.g. local-steps=20")
    args = parser.parse_args(argv)
    from flwr.common.config import parse_config_args

    extra = parse_config_args([" ".join(args.set)]) if args.set else {}
    from fedamp_flwr.tools.inprocess import run_inprocess

    rows: dict[tuple[str, str], list[float]] = {}
    alone: dict[str, list[float]] = {"logistic (sklearn, own scaling)": [],
                                     "linear (node)": [], "its model (node)": []}
    per_member: dict[str, list[list[float]]] = {}
    for seed in args.seeds:
        folder = args.out / f"seed-{seed}"
        nodes, schema = members(args.dataset, folder, seed)
        reference = [logistic_alone(n["data-path"]) for n in nodes]
        alone["logistic (sklearn, own scaling)"].append(float(np.mean(reference)))
        per_member.setdefault("logistic (sklearn, own scaling)", []).append(reference)
        for scaling in args.scalings:
            for strategy in args.strategies:
                name = f"{strategy}-{scaling}"
                run_inprocess({**schema, "strategy": strategy, "member-scaling": scaling,
                               "num-server-rounds": args.rounds, "seed": seed,
                               "results-dir": str(folder), "run-name": name, "overwrite": True,
                               "min-nodes": 3, "server-device": "cpu", **extra}, 3,
                              node_configs=nodes)
                metrics = RunFile.read(folder / name / "metrics.json")
                last = client_scores(metrics.rounds[-1])
                scores = [float(last[str(i)]) for i in range(3)]
                rows.setdefault((strategy, scaling), []).append(float(np.mean(scores)))
                per_member.setdefault(f"{strategy} ({scaling})", []).append(scores)
                if strategy == args.strategies[0] and scaling == args.scalings[0]:
                    own = metrics.alone or {}
                    for key, label in (("linear", "linear (node)"),
                                       ("model", "its model (node)")):
                        values = [float(own[str(i)][key]) for i in range(3)]
                        alone[label].append(float(np.mean(values)))
                        per_member.setdefault(label, []).append(values)
    print_tables(args, rows, alone, per_member)
    return 0


def print_tables(args: argparse.Namespace, rows: dict[tuple[str, str], list[float]],
                 alone: dict[str, list[float]], per_member: dict[str, list[list[float]]]) -> None:
    """The methods by member-scaling beside each member alone, then member by member."""
    print(f"{args.dataset}: 3 members, {args.rounds} rounds, seeds {args.seeds}"
          + (f", {' '.join(args.set)}" if args.set else "") + "; test accuracy "
          "in the last round (%), mean over the members, then over the seeds (min-max over "
          "the seeds)\n")
    print("| method | " + " | ".join(f"member-scaling = {s}" for s in args.scalings) + " |")
    print("|---|" + "---:|" * len(args.scalings))
    for strategy in args.strategies:
        cells = []
        for scaling in args.scalings:
            v = 100 * np.array(rows[(strategy, scaling)])
            cells.append(f"{v.mean():.1f} ({v.min():.1f}-{v.max():.1f})")
        print(f"| {strategy} | " + " | ".join(cells) + " |")
    for label, values in alone.items():
        v = 100 * np.array(values)
        print(f"| alone: {label} | {v.mean():.1f} ({v.min():.1f}-{v.max():.1f}) |"
              + " |" * (len(args.scalings) - 1))
    print("\nPer member (mean over the seeds, %):\n")
    print("| | site-0 | site-1 | site-2 |\n|---|---:|---:|---:|")
    for label, by_seed in per_member.items():
        v = 100 * np.array(by_seed).mean(0)
        print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in v) + " |")


if __name__ == "__main__":
    sys.exit(main())
