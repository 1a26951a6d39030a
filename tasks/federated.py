"""Naturally federated tasks, whose clients and graph come with the data.

* :func:`make_fl60`: the Panacea paper's synthetic FL-60 task (Sec. 4).
* :func:`load_tpt48`: TPT-48, next-6-months temperature forecasting for the
  48 contiguous US states, with the state adjacency graph.
* :func:`load_npz`: bring-your-own federated data in one ``.npz`` file.

Each returns a :class:`FederatedData`: per-client train and test splits and,
when the task defines one, the client relation graph (symmetric 0/1 adjacency).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import Split


@dataclass(frozen=True)
class FederatedData:
    """Per-client splits (index = client id) and the task's graph (or None)."""

    train: list[Split]
    test: list[Split]
    adjacency: np.ndarray | None = None
    names: list[str] | None = None
    extras: dict | None = None

    @property
    def num_clients(self) -> int:
        """Number of clients the data defines."""
        return len(self.train)


def split_80_20(split: Split, rng: np.random.Generator | None) -> tuple[Split, Split]:
    """80/20 train/test split: shuffled with ``rng``, or in order (time series) if None."""
    n = len(split.y)
    order = np.arange(n) if rng is None else rng.permutation(n)
    cut = min(max(int(round(0.8 * n)), 1), n - 1)  # at least one row on each side
    return split.subset(order[:cut]), split.subset(order[cut:])


def make_fl60(num_clients: int = 60, seed: int = 0, samples: int = 100,
              noise_std: float = 1.0) -> FederatedData:
    """FL-60 (Panacea paper, Sec. 4), for ``num_clients`` clients.

    Client t draws a random 2-D unit vector [a_t, b_t]; omega_t = atan2(b_t,
    a_t) (the paper writes arcsin(b_t / a_t), undefined where |b_t| > |a_t|);
    labels are balanced Bernoulli(0.5); positives come from N(mu_t1, s^2 I),
    negatives from N(mu_t0, s^2 I), mu_t1 = (omega_t / pi) [a_t, b_t], mu_t0 =
    -mu_t1, s = ``noise_std`` (paper: 1); ``samples`` per client, split 80/20.
    The graph: A_uv ~ Bernoulli(0.5 a_u a_v + 0.5 b_u b_v + 0.5) for u != v,
    symmetric. Everything depends only on ``seed``.
    """
    rng = np.random.default_rng([30_011, seed])
    angles = rng.uniform(-np.pi, np.pi, size=num_clients)
    ab = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    omega = np.arctan2(ab[:, 1], ab[:, 0])
    mu1 = (omega / np.pi)[:, None] * ab
    train, test = [], []
    for t in range(num_clients):
        y = rng.integers(0, 2, size=samples)
        x = np.where(y[:, None] == 1, mu1[t], -mu1[t]) + noise_std * rng.normal(size=(samples, 2))
        tr, te = split_80_20(Split(x.astype(np.float32), y.astype(np.int64)), rng)
        train.append(tr)
        test.append(te)
    p = 0.5 * ab @ ab.T + 0.5
    upper = np.triu(rng.uniform(size=(num_clients, num_clients)) < p, k=1)
    adjacency = (upper | upper.T).astype(np.float32)
    return FederatedData(train, test, adjacency, extras={"mu1": mu1, "noise_std": noise_std})


def fl60_oracle_accuracy(data: FederatedData) -> float:
    """Mean test accuracy of the Bayes classifiers sign(mu_t1 . x), one per client.

    The ceiling any method can reach on this FL-60 draw: the two classes of a
    client overlap unless ||mu_t1|| = |omega_t| / pi is large against the noise.
    """
    mu1 = data.extras["mu1"]
    accs = [((t.x @ mu1[c] > 0).astype(np.int64) == t.y).mean() for c, t in enumerate(data.test)]
    return float(np.mean(accs))


TPT48_WINDOW = 6


def load_tpt48(folder: Path) -> FederatedData:
    """TPT-48 from ``folder`` (``../shared/data/tpt48``).

    Clients are the 48 states in alphabetical order of their codes. Monthly
    mean temperatures (deg F, 2008-2019, 144 months per state) are min-max
    normalized over all states and months to [0, 1]: T' = (T - T_min) /
    (T_max - T_min). Samples are sliding windows: the previous 6 months in,
    the next 6 months out (133 windows per state); the first 80% of a state's
    windows (in time) are for training, the last 20% for testing. The graph is
    the state adjacency (105 edges).
    """
    temps = folder / "tpt48_monthly_avg_temp_F_2008_2019.csv"
    edges = folder / "tpt48_adjacency_edges.csv"
    for path in (temps, edges):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (TPT-48 needs the files of shared/data/tpt48)")
    series: dict[str, list[tuple[int, int, float]]] = {}
    with open(temps, newline="") as f:
        for row in csv.DictReader(f):
            series.setdefault(row["state"], []).append(
                (int(row["year"]), int(row["month"]), float(row["tavg_F"])))
    names = sorted(series)
    values = np.array([[v for _, _, v in sorted(series[s])] for s in names], dtype=np.float64)
    lo, hi = values.min(), values.max()
    values = (values - lo) / (hi - lo)
    w = TPT48_WINDOW
    starts = range(values.shape[1] - 2 * w + 1)
    train, test = [], []
    for s in range(len(names)):
        x = np.stack([values[s, i : i + w] for i in starts]).astype(np.float32)
        y = np.stack([values[s, i + w : i + 2 * w] for i in starts]).astype(np.float32)
        tr, te = split_80_20(Split(x, y), None)
        train.append(tr)
        test.append(te)
    index = {s: i for i, s in enumerate(names)}
    adjacency = np.zeros((len(names), len(names)), dtype=np.float32)
    with open(edges, newline="") as f:
        for row in csv.DictReader(f):
            a, b = row["state_a"], row["state_b"]
            if a not in index or b not in index:
                raise ValueError(f"{edges}: edge {a}-{b} names a state without data")
            adjacency[index[a], index[b]] = adjacency[index[b], index[a]] = 1.0
    return FederatedData(train, test, adjacency, names)


def load_npz(path: Path, seed: int = 0) -> FederatedData:
    """Bring-your-own federated data from one ``.npz`` file (loaded without pickle).

    Keys: ``x`` (N x F float), ``y`` (N: integers for classification, floats
    for regression), ``client`` (N integer ids 0..C-1, each present) and an
    optional ``adjacency`` (C x C). Each client's rows are split 80/20 at
    random (seeded).
    """
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a folder; the npz task needs the path of one .npz file")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    with np.load(path, allow_pickle=False) as data:
        missing = [k for k in ("x", "y", "client") if k not in data.files]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}; needs x, y, client (and optional adjacency)")
        x, y, client = data["x"], data["y"], data["client"]
        adjacency = data["adjacency"] if "adjacency" in data.files else None
    if x.ndim != 2:
        raise ValueError(f"{path}: x must be N x F, got shape {x.shape}")
    if len(y) != len(x) or len(client) != len(x) or y.ndim != 1 or client.ndim != 1:
        raise ValueError(
            f"{path}: inconsistent lengths: x {x.shape}, y {y.shape}, client {client.shape}"
        )
    if not np.issubdtype(client.dtype, np.integer) or client.min() < 0:
        raise ValueError(f"{path}: client must hold integer ids 0..C-1")
    num_clients = int(client.max()) + 1
    absent = sorted(set(range(num_clients)) - set(np.unique(client).tolist()))
    if absent:
        raise ValueError(f"{path}: client ids {absent[:10]} have no rows (ids must be 0..C-1)")
    y = y.astype(np.int64) if np.issubdtype(y.dtype, np.integer) else y.astype(np.float32)
    rng = np.random.default_rng([40_009, seed])
    train, test = [], []
    for c in range(num_clients):
        rows = np.flatnonzero(client == c)
        if len(rows) < 2:
            raise ValueError(f"{path}: client {c} has {len(rows)} row(s); needs at least 2 "
                             "(one for training, one for testing)")
        tr, te = split_80_20(Split(x[rows].astype(np.float32), y[rows]), rng)
        train.append(tr)
        test.append(te)
    if adjacency is not None and adjacency.shape != (num_clients, num_clients):
        raise ValueError(f"{path}: adjacency is {adjacency.shape}, expected {(num_clients, num_clients)}")
    return FederatedData(train, test, None if adjacency is None else adjacency.astype(np.float32))
