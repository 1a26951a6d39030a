"""What each member takes home, against the logistic regression it would fit itself.

    python -m experiments.kept --out /tmp/kept --datasets wine breast_cancer digits --seeds 0 1 2

Each of scikit-learn's tables is cut into three members with their own class mixes
(:func:`experiments.tabular.members`: raw columns, a text label, 70% of each member's rows
for training). A run (``--strategy``, FedAMP by default) goes at its defaults, every key
unset but the members' schema, in the in-process engine (the real ServerApp and
ClientApps); every member's node writes the model it takes home and its card (node
config ``model-dir``; its own rule for the model it keeps at its defaults:
fedamp_flwr/member/member_choice.py). From each card: the kept model, and its test rows' scores
(scored once, after the choice). The reference is what the member would fit itself:
scikit-learn's ``LogisticRegression()`` on all of its training rows standardized by their
own statistics, scored on the same test rows (AUC one-vs-rest, averaged over the classes
present, where there are more than two). A member passes where the kept model's accuracy
is at least the logistic's less one test row and its AUC at least the logistic's less
0.01. Needs scikit-learn (the ``dev`` extra). The measured table: docs/federation.md.
With ``--set validation-fraction=F`` the cards' scores are on validation rows (held out
of the training rows), not the test rows the reference is scored on: compare the kept
and federated columns there, not the reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from experiments.tabular import DATASETS, members
from tasks.files import strict_json


def logistic(path: str, classes: list[str]) -> dict[str, float]:
    """scikit-learn's logistic regression on a member's training rows (own scaling): its
    accuracy and AUC (:func:`tasks.scores.classification_scores`'s, checked against
    scikit-learn's in tests/test_scores.py) on the member's test rows, and their count."""
    import pandas as pd
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from tasks.scores import classification_scores

    frame = pd.read_csv(path)
    cols = [c for c in frame.columns if c not in ("label", "split")]
    train, test = frame[frame.split == "train"], frame[frame.split == "test"]
    scaler = StandardScaler().fit(train[cols])
    model = LogisticRegression(max_iter=5000).fit(scaler.transform(train[cols]), train.label)
    names = [str(n) for n in model.classes_]  # (the schema's class indices: ``classes``)
    p = np.zeros((len(test), len(classes)))
    p[:, [classes.index(n) for n in names]] = model.predict_proba(scaler.transform(test[cols]))
    y = np.array([classes.index(str(v)) for v in test.label])
    scores = classification_scores(p, y)
    return {"accuracy": scores["accuracy"], "auc": scores["auc"],
            "log_loss": scores["log_loss"], "rows": len(y)}


def run(dataset: str, seed: int, out: Path, strategy: str, rounds: int | None,
        extra: dict | None = None) -> list[dict]:
    """One run of ``strategy`` over ``dataset``'s members: a row per member."""
    from fedamp_flwr.tools.inprocess import run_inprocess

    folder = out / dataset / f"seed-{seed}"
    nodes, schema = members(dataset, folder, seed)
    names = schema["member-class-names"].split(",")
    models = folder / "models"
    nodes = [{**n, "model-dir": str(models)} for n in nodes]
    config = {**schema, "strategy": strategy, "seed": seed, "results-dir": str(folder),
              "run-name": strategy, "overwrite": True, "min-nodes": 3,
              **({"num-server-rounds": rounds} if rounds else {}), **(extra or {})}
    run_inprocess(config, 3, node_configs=nodes)
    rows = []
    for node in nodes:
        member = node["client-id"]
        card = json.loads((models / strategy / f"{member}.json").read_text())
        choice = card["choice"]
        kept = choice["test"][choice["kept"]]
        reference = logistic(node["data-path"], names)
        row = {"dataset": dataset, "seed": seed, "member": member, "kept": choice["kept"],
               "metric": choice["metric"], "test_rows": reference["rows"],
               "accuracy": kept["accuracy"], "auc": kept["auc"], "log_loss": kept["log_loss"],
               "federated_accuracy": choice["test"]["federated"]["accuracy"],
               "federated_auc": choice["test"]["federated"]["auc"],
               "logistic_accuracy": reference["accuracy"], "logistic_auc": reference["auc"],
               "logistic_log_loss": reference["log_loss"]}
        row["passes"] = bool(row["accuracy"] >= row["logistic_accuracy"] - 1 / row["test_rows"]
                             - 1e-12 and (row["logistic_auc"] is None or (
                                 row["auc"] is not None
                                 and row["auc"] >= row["logistic_auc"] - 0.01 - 1e-12)))
        rows.append(row)
    return rows


def _mean(values) -> float:
    """The mean of the values that are numbers (a diverged model's log loss is none)."""
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else float("nan")


def _n(value: float | None, form: str = ".3f") -> str:
    return "none" if value is None else format(value, form)


def table(rows: list[dict]) -> str:
    """The Markdown table: a row per dataset, seed and member (an AUC of test rows of one
    class: none, which passes)."""
    lines = ["| table | seed | member | test rows | kept | kept: accuracy / AUC / log loss | "
             "federated: accuracy / AUC | logistic alone: accuracy / AUC / log loss | passes |",
             "|---|---:|---|---:|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['member']} | {r['test_rows']} | "
                     f"{r['kept']} | {100 * r['accuracy']:.1f} / {_n(r['auc'])} / "
                     f"{_n(r['log_loss'])} | "
                     f"{100 * r['federated_accuracy']:.1f} / {_n(r['federated_auc'])} | "
                     f"{100 * r['logistic_accuracy']:.1f} / {_n(r['logistic_auc'])} / "
                     f"{r['logistic_log_loss']:.3f} | "
                     f"{'yes' if r['passes'] else '**no**'} |")
    passed = sum(r["passes"] for r in rows)
    lines.append(f"\n{passed} of {len(rows)} members pass (accuracy >= the logistic's less one "
                 "test row, AUC >= the logistic's less 0.01).")
    kinds = {k: sum(r["kept"] == k for r in rows) for k in dict.fromkeys(r["kept"] for r in rows)}
    lines.append("Kept: " + ", ".join(f"{k} {v}" for k, v in kinds.items()) + "; mean test log "
                 f"loss of the kept models {_mean(r['log_loss'] for r in rows):.3f}, of "
                 f"the logistic regressions {np.mean([r['logistic_log_loss'] for r in rows]):.3f}"
                 f"; mean accuracy {100 * np.mean([r['accuracy'] for r in rows]):.2f} and "
                 f"{100 * np.mean([r['logistic_accuracy'] for r in rows]):.2f}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.kept",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--strategy", default="fedamp")
    parser.add_argument("--rounds", type=int, default=None,
                        help="num-server-rounds (default: the run config's own)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config values for every run (Flower's syntax), e.g. "
                             "'model=\"linear\"'")
    args = parser.parse_args(argv)
    from flwr.common.config import parse_config_args

    extra = parse_config_args([" ".join(args.set)]) if args.set else {}
    rows = [row for dataset in args.datasets for seed in args.seeds
            for row in run(dataset, seed, args.out, args.strategy, args.rounds, extra)]
    # strict JSON: a diverged model's score is none, never NaN
    (args.out / "kept.json").write_text(json.dumps(strict_json(rows), indent=1, allow_nan=False))
    print(table(rows))
    return 0 if all(r["passes"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
