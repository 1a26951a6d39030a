"""Share of FedAMP's collaboration weight that stays in each client's practical group.

    python -m experiments.group_weight results/fmnist/fedamp/metrics.json

For each recorded round it prints the mean over clients of sum_{j in group(i),
j != i} xi_ij: how much of a client's cloud model comes from the other clients
of its own group (the structure of the FedAMP paper's Fig. 3), and the mean
self weight. The groups are those of the run's data setting.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import tasks
from experiments.plots import xi_matrices
from experiments.scores import RunRecord


def group_shares(run: RunRecord) -> dict[int, tuple[float, float]] | None:
    """Round -> (% of each client's weight within its group, mean self weight %), averaged
    over the clients; None where the run's data setting has no groups."""
    ids, rounds = xi_matrices(run)
    of_client = tasks.client_groups(run.dataset, run.partitioning, len(ids))
    if of_client is None:
        return None
    groups = np.array([of_client[c] for c in ids])
    same = (groups[:, None] == groups[None, :]) & ~np.eye(len(ids), dtype=bool)
    return {r: (100 * float((xi * same).sum(1).mean()), 100 * float(xi.diagonal().mean()))
            for r, xi in sorted(rounds.items())}


def main(argv: Sequence[str] | None = None) -> int:
    path = Path((sys.argv[1:] if argv is None else argv)[0])
    run = RunRecord.from_json(json.loads(path.read_text()), str(path.parent))
    shares = group_shares(run)
    if shares is None:
        sys.exit(f"{run.dataset}/{run.partitioning} has no groups of clients")
    for r, (within, own) in shares.items():
        print(f"round {r}: {within:.1f}% of the weight within the group, self weight {own:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
