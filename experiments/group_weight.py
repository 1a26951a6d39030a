"""Share of FedAMP's collaboration weight that stays in each client's practical group.

    python experiments/group_weight.py results/fmnist/fedamp/metrics.json

For each round it prints the mean over clients of sum_{j in group(i), j != i}
xi_ij: how much of a client's cloud model comes from the other clients of its
own group (the structure of the FedAMP paper's Fig. 3).
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tasks.partitioners import client_group  # noqa: E402

metrics = json.loads(Path(sys.argv[1]).read_text())
ids = metrics["xi"]["client_ids"]
groups = np.array([client_group(c, len(ids)) for c in ids])
same = (groups[:, None] == groups[None, :]) & ~np.eye(len(ids), dtype=bool)
for r, matrix in metrics["xi"]["rounds"].items():
    xi = np.asarray(matrix)
    print(f"round {r}: {100 * (xi * same).sum(1).mean():.1f}% of the weight within the group, "
          f"self weight {100 * xi.diagonal().mean():.1f}%")
