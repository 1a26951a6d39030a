"""Share of FedAMP's collaboration weight that stays in each client's practical group.

    python -m experiments.group_weight results/fmnist/fedamp/metrics.json

For each recorded round it prints the mean over clients of sum_{j in group(i),
j != i} xi_ij: how much of a client's cloud model comes from the other clients
of its own group (the structure of the FedAMP paper's Fig. 3), and the mean
self weight. The groups are those of the run's data setting.
"""

import json
import sys
from pathlib import Path

import numpy as np

import tasks
from experiments.plots import xi_matrices
from experiments.scores import RunRecord

path = Path(sys.argv[1])
run = RunRecord.from_json(json.loads(path.read_text()), str(path.parent))
ids, rounds = xi_matrices(run)
of_client = tasks.client_groups(run.dataset, run.partitioning, len(ids))
if of_client is None:
    sys.exit(f"{run.dataset}/{run.partitioning} has no groups of clients")
groups = np.array([of_client[c] for c in ids])
same = (groups[:, None] == groups[None, :]) & ~np.eye(len(ids), dtype=bool)
for r, xi in sorted(rounds.items()):
    print(f"round {r}: {100 * (xi * same).sum(1).mean():.1f}% of the weight within the group, "
          f"self weight {100 * xi.diagonal().mean():.1f}%")
