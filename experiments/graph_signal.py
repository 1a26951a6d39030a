"""What the clients' updates say about their graph: the edges inferred from them against the
task's own graph, by warm-up length, k and similarity (docs/methods.md, "Why an inferred graph
can be worse than none").

    python -m experiments.graph_signal --task tpt48 --data-dir ../shared/data --rounds 8 \\
        --out /tmp/signal

For each task the real app runs in process (``fedamp_flwr.tools.inprocess``): Panacea with
``graph = "inferred"`` and a warm-up of ``--rounds`` rounds (every client trains from the same
initial model each round), and pFedHN (no graph) for ``--rounds`` rounds, whose generated
models and updates are the signal a graph refreshed during training would have. Each round's
updates (trained - sent) and pFedHN's generated models are taken as the strategy sees them.
Then, for every warm-up length W <= ``--rounds``, k in ``--ks`` and similarity
(:data:`tasks.graphs.SIMILARITIES`: the cosine of the raw vectors, or of the vectors less
their mean over clients), the precision and recall of the inferred edges against the task's
graph. Written: ``<out>/<task>.json`` (one row per choice) and ``<out>/<task>.png``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from fedamp_flwr.tools.inprocess import run_inprocess
from strategies.panacea import Panacea
from tasks.files import strict_json
from tasks.graphs import SIMILARITIES, cosine_knn_graph, edge_agreement

TASKS: dict[str, dict[str, object]] = {
    "fl60-grda": {"dataset": "fl60", "fl60-variant": "grda", "clients": 60},
    "fl60-text": {"dataset": "fl60", "fl60-variant": "text", "clients": 60},
    "tpt48": {"dataset": "tpt48", "tpt48-split": "time", "clients": 48},
    "npz": {"dataset": "npz"},
}


class Spy:
    """Each round's updates (trained - sent), by client row, and the generated models."""

    def __init__(self) -> None:
        self.updates: list[np.ndarray] = []  # per round: clients x params (nan: did not train)
        self.models: list[np.ndarray] = []
        self.truth: np.ndarray | None = None

    def __enter__(self) -> Spy:
        original, spy = Panacea.update, self

        def update(strategy: Panacea, server_round: int, rows: torch.Tensor,
                   trained: torch.Tensor) -> None:
            p = strategy.flat.num_params
            sent = strategy.held_models(rows)[:, :p].double().cpu()
            delta = np.full((len(strategy.client_ids), p), np.nan)
            delta[rows.cpu().numpy()] = (trained[:, :p].double().cpu() - sent).numpy()
            spy.updates.append(delta)
            spy.models.append(strategy.held_models()[:, :p].double().cpu().numpy())
            if strategy.true_adjacency is not None:
                spy.truth = strategy.true_adjacency.numpy()
            original(strategy, server_round, rows, trained)

        self._original = original
        setattr(Panacea, "update", update)  # noqa: B010 (a spy, for this experiment only)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(Panacea, "update", self._original)  # noqa: B010


def capture(task: dict, strategy: str, rounds: int, seed: int, folder: Path) -> Spy:
    """Run ``strategy`` for ``rounds`` rounds (Panacea: all of them warm-up) and spy on it."""
    n = int(str(task["clients"]))
    cfg = {**{k: v for k, v in task.items() if k != "clients"}, "strategy": strategy,
           "seed": seed, "num-server-rounds": rounds + 1, "results-dir": str(folder),
           "run-name": f"{strategy}-{seed}", "min-nodes": n}
    if strategy == "panacea":
        cfg.update({"graph": "inferred", "graph-warmup-rounds": rounds + 1,
                    "num-server-rounds": rounds + 2, "graph-guard-rounds": 0})
    with Spy() as spy:
        run_inprocess(cfg, n)
    spy.updates, spy.models = spy.updates[:rounds], spy.models[:rounds]
    return spy


def scores(vectors: np.ndarray, truth: np.ndarray, k: int, similarity: str) -> dict:
    """The inferred graph's agreement with ``truth`` (``chance``: a random graph's precision,
    added by :func:`table`)."""
    return edge_agreement(cosine_knn_graph(np.nan_to_num(vectors), k, similarity=similarity),
                          truth)


def table(warm: Spy, hn: Spy, ks: list[int]) -> list[dict]:
    """One row per signal, length, k and similarity."""
    assert warm.truth is not None
    n = len(warm.truth)
    chance = float(np.triu(warm.truth > 0, 1).sum()) / (n * (n - 1) / 2)
    rows = []
    sums = np.cumsum([np.nan_to_num(u) for u in warm.updates], axis=0)
    for w in range(1, len(warm.updates) + 1):
        for k in ks:
            for sim in SIMILARITIES:
                rows.append({"signal": "warm-up updates", "rounds": w, "k": k, "similarity": sim,
                             **scores(sums[w - 1], warm.truth, k, sim)})
    for r in range(1, len(hn.models) + 1):
        for k in ks:
            for sim in SIMILARITIES:
                rows.append({"signal": "pFedHN's models", "rounds": r, "k": k,
                             "similarity": sim, **scores(hn.models[r - 1], warm.truth, k, sim)})
                rows.append({"signal": "pFedHN's updates", "rounds": r, "k": k,
                             "similarity": sim,
                             **scores(hn.updates[r - 1], warm.truth, k, sim)})
    return [{**r, "chance": chance} for r in rows]


def plot(rows: list[dict], title: str, out: Path) -> None:
    """Precision and recall by rounds, one panel per signal; dotted: a random graph's
    precision (the task's share of pairs that are edges)."""
    signals = sorted({r["signal"] for r in rows})
    fig, axes = plt.subplots(1, len(signals), figsize=(4.6 * len(signals), 3.6), squeeze=False)
    for ax, signal in zip(axes[0], signals):
        for k in sorted({r["k"] for r in rows}):
            for sim, style in zip(SIMILARITIES, ("-", "--")):
                line = [r for r in rows if r["signal"] == signal and r["k"] == k
                        and r["similarity"] == sim]
                ax.plot([r["rounds"] for r in line], [r["precision"] for r in line], style,
                        marker="o", label=f"precision, k={k}, {sim}")
                ax.plot([r["rounds"] for r in line], [r["recall"] for r in line], style,
                        marker="x", alpha=0.5, label=f"recall, k={k}, {sim}")
        ax.axhline(rows[0]["chance"], color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{title}: {signal}", fontsize=9)
        ax.set_xlabel("rounds")
        ax.set_ylim(0, 1)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--data-dir", default="", help="tpt48: the folder holding tpt48/; npz: "
                   "the .npz file")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--ks", default="3,10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    task: dict[str, object] = dict(TASKS[a.task])
    if a.task == "tpt48":
        task["data-dir"] = str(Path(a.data_dir) / "tpt48")
    elif a.task == "npz":
        task["data-dir"] = a.data_dir
        task["clients"] = int(np.load(a.data_dir)["client"].max()) + 1
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        warm = capture(task, "panacea", a.rounds, a.seed, Path(tmp))
        hn = capture(task, "pfedhn", a.rounds, a.seed, Path(tmp))
    rows = table(warm, hn, [int(k) for k in a.ks.split(",")])
    (a.out / f"{a.task}.json").write_text(json.dumps(strict_json(rows), indent=1, allow_nan=False))
    plot(rows, a.task, a.out / f"{a.task}.png")
    for r in rows:
        if r["rounds"] in (1, 2, a.rounds // 2, a.rounds):
            print(f"{r['signal']:18} W={r['rounds']:2} k={r['k']:2} {r['similarity']:8} "
                  f"precision {r['precision']:.3f} recall {r['recall']:.3f}")


if __name__ == "__main__":
    main()
