"""A graph task of one's own from GRDA's public generator, as an npz file for ``dataset = "npz"``.

    python -m experiments.grda_task --clients 60 --seed 7 --out /tmp/dg60-s7.npz

GRDA's spiral generator (``Wang-ML-Lab/GRDA``, ``dataset_generator/dataset_generator.py``,
re-implemented in :func:`tasks.federated.make_fl60_grda`) at another seed and size, with the
step FL-60 ``grda`` leaves out: the source's normalisation of the points by their global mean
and standard deviation. Its ``adjacency`` is the generator's graph (an edge with probability
cos(a_u - a_v) where that is at least 0.2). Keys: ``x``, ``y``, ``client``, ``adjacency``
(:func:`tasks.federated.load_npz`). Data is never committed: the file is made where it is used.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tasks.federated import make_fl60_grda


def write(clients: int, seed: int, out: Path, per_class: int = 50,
          edge_threshold: float = 0.2) -> Path:
    """Generate the task and write it to ``out`` (``per_class`` points of each class a client:
    the fewer, the more a client needs its neighbours)."""
    data = make_fl60_grda(clients, seed, per_class=per_class, edge_threshold=edge_threshold)
    x = np.concatenate([np.concatenate([s.x, t.x]) for s, t in zip(data.train, data.test)])
    y = np.concatenate([np.concatenate([s.y, t.y]) for s, t in zip(data.train, data.test)])
    client = np.concatenate([np.full(len(s.y) + len(t.y), c)
                             for c, (s, t) in enumerate(zip(data.train, data.test))])
    x = (x - x.mean(axis=0)) / x.std(axis=0)  # the source's normalisation
    assert data.adjacency is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, x=x.astype(np.float32), y=y.astype(np.int64), client=client.astype(np.int64),
             adjacency=data.adjacency.astype(np.float32))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=60)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--per-class", type=int, default=50,
                   help="points of each class a client (default 50; fewer: the graph matters more)")
    p.add_argument("--edge-threshold", type=float, default=0.2)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    print(write(a.clients, a.seed, a.out, a.per_class, a.edge_threshold))


if __name__ == "__main__":
    main()
