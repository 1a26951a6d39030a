"""Robustness scenarios: which clients are novel and which attack.

Both the server and every client compute the same roles from the run config
(``novel-client-fraction``, ``attack-ratio``, ``seed``) and the number of
clients, so no message needs to carry them.

* Novel clients (Panacea paper, Sec. 4; paper fraction 0.2) never train;
  at evaluation they get a model as every client does (for Panacea one
  generated from their untrained embedding through the graph) and their mean
  metric is recorded apart.
* Attackers, a share ``attack-ratio`` of the training clients, replace their
  labels by uniformly random labels in every round they train (label
  flipping at random); metrics are reported over the benign clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Roles:
    """Client ids of the novel clients and of the attackers."""

    novel: frozenset[int]
    attackers: frozenset[int]


def scenario_roles(num_clients: int, seed: int, novel_fraction: float = 0.0,
                   attack_ratio: float = 0.0) -> Roles:
    """Draw the novel clients, then the attackers among the others (seeded).

    ``round(novel_fraction * n)`` clients are novel (at least one client
    keeps training) and ``round(attack_ratio * (n - novel))`` of the training
    clients attack.
    """
    rng = np.random.default_rng([50_021, seed])
    order = rng.permutation(num_clients)
    n_novel = min(int(round(novel_fraction * num_clients)), num_clients - 1)
    novel = order[:n_novel]
    training = order[n_novel:]
    n_attack = int(round(attack_ratio * len(training)))
    attackers = rng.permutation(training)[:n_attack]
    return Roles(frozenset(int(c) for c in novel), frozenset(int(c) for c in attackers))


def flip_labels(y: torch.Tensor, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """Uniformly random labels in [0, num_classes) replacing ``y`` (label flipping)."""
    return torch.randint(0, num_classes, y.shape, generator=generator, dtype=y.dtype)
