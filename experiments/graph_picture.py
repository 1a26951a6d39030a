"""Inferred client graphs beside the task's own: one row per run of ``graph = "inferred"``.

    python -m experiments.graph_picture RUN_DIR... -o docs/graphs/inferred.png

Each row shows the task's graph (or its groups' graph), the graph the run inferred from
its warm-up updates (``metrics.json``'s ``inferred_graph``), and their agreement: edges in
both (black), only inferred (red), only the task's (light grey); the title gives the
precision and recall of the inferred edges.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fedamp_flwr.config import RunConfig
from fedamp_flwr.server_app import true_graph
from strategies.core.records import RunFile


def graphs_of(run_dir: Path) -> tuple[str, np.ndarray, np.ndarray | None, dict]:
    """A run's label, its inferred adjacency, the truth it was measured against (or None),
    and its ``inferred_graph`` record."""
    metrics = RunFile.read(run_dir / "metrics.json")
    note = metrics.extra.get("inferred_graph")
    if not note:
        raise SystemExit(f"{run_dir}: no inferred_graph in metrics.json (not a graph = "
                         "'inferred' run, or its warm-up did not end)")
    n = int(metrics.num_clients or 0)
    found = np.zeros((n, n))
    for u, v in note["edges"]:
        found[u, v] = found[v, u] = 1
    cfg = RunConfig.from_run_config(metrics.config)
    truth = true_graph(cfg, cfg.data_config(n))
    label = f"{metrics.run_name} (k = {note['k']}, after round {note['round']})"
    return label, found, None if truth is None else truth.numpy(), note


def draw(run_dirs: Sequence[Path], out: Path) -> Path:
    """One row per run: the truth, the inferred graph, their agreement."""
    fig, axes = plt.subplots(len(run_dirs), 3, figsize=(10.5, 3.6 * len(run_dirs)),
                             squeeze=False)
    for row, run_dir in zip(axes, run_dirs):
        label, found, truth, note = graphs_of(Path(run_dir))
        agree = note.get("against_truth", {})
        row[0].imshow(truth if truth is not None else np.zeros_like(found), cmap="Greys")
        row[0].set_title("the task's graph" if truth is not None else "no true graph")
        row[1].imshow(found, cmap="Greys")
        row[1].set_title(f"inferred: {int(found.sum()) // 2} edges")
        both = np.zeros((*found.shape, 3)) + 1.0
        if truth is not None:
            both[(truth > 0) & (found == 0)] = (0.85, 0.85, 0.85)
            both[(truth > 0) & (found > 0)] = (0.0, 0.0, 0.0)
            both[(truth == 0) & (found > 0)] = (0.85, 0.1, 0.1)
        row[2].imshow(both)
        row[2].set_title(f"precision {agree.get('precision', float('nan')):.2f}, recall "
                         f"{agree.get('recall', float('nan')):.2f}")
        row[0].set_ylabel(label, fontsize=8)
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders of graph = 'inferred' runs")
    p.add_argument("-o", "--out", type=Path, default=Path("inferred.png"))
    args = p.parse_args(argv)
    print(draw(args.runs, args.out))


if __name__ == "__main__":
    main()
