"""Robustness scenarios: which clients are novel, which attack, who drops out, how long each trains.

Both the server and every client compute the same roles from the run config
(``novel-client-fraction``, ``attack-ratio``, ``seed``) and the number of
clients, so no message needs to carry them. Drop-outs and per-client epochs
are drawn by the server (every strategy) and sent in the messages.

* Novel clients (Panacea paper, Sec. 4; paper fraction 0.2) never train;
  at evaluation they get a model as every client does (for Panacea one
  generated from their untrained embedding through the graph) and their mean
  metric is recorded apart.
* Attackers, a share ``attack-ratio`` of the training clients, replace their
  labels by uniformly random labels in every round they train (label
  flipping at random); metrics are reported over the benign clients.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Roles:
    """The scenario of a run: novel clients, attackers, drop-outs, per-client epochs.

    Parameters
    ----------
    novel, attackers : frozenset[int]
        Client ids of the novel clients and of the attackers.
    drop_rate : float
        Share of the clients sampled for training that drop out in each round.
    heterogeneous_epochs : bool
        Whether each client draws its number of local epochs per round.
    seed : int
        Seed of the drop-outs and epoch draws (with the round and client id).
    """

    novel: frozenset[int]
    attackers: frozenset[int]
    drop_rate: float = 0.0
    heterogeneous_epochs: bool = False
    seed: int = 0

    def participants(self, server_round: int, client_ids: list[int]) -> list[int]:
        """The clients of ``client_ids`` that do not drop out in ``server_round`` (at least one)."""
        n_drop = min(int(round(self.drop_rate * len(client_ids))), len(client_ids) - 1)
        if n_drop <= 0:
            return list(client_ids)
        rng = np.random.default_rng([70_001, self.seed, server_round])
        dropped = set(rng.choice(sorted(client_ids), size=n_drop, replace=False).tolist())
        return [c for c in client_ids if c not in dropped]

    def local_units(self, server_round: int, client_id: int, base: int) -> int:
        """Local epochs (or steps) of ``client_id`` in ``server_round``: ``base``, or
        uniform in 1..2*base-1 with ``heterogeneous-epochs``."""
        if not self.heterogeneous_epochs or base <= 1:
            return base
        rng = np.random.default_rng([90_001, self.seed, server_round, client_id])
        return int(rng.integers(1, 2 * base))


@functools.lru_cache(maxsize=16)  # a ClientApp asks in every message; Roles is immutable
def scenario_roles(num_clients: int, seed: int, novel_fraction: float = 0.0,
                   attack_ratio: float = 0.0, drop_rate: float = 0.0,
                   heterogeneous_epochs: bool = False) -> Roles:
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
    return Roles(frozenset(int(c) for c in novel), frozenset(int(c) for c in attackers),
                 drop_rate, heterogeneous_epochs, seed)


def flip_labels(y: torch.Tensor, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """Uniformly random labels in [0, num_classes) replacing ``y`` (label flipping)."""
    return torch.randint(0, num_classes, y.shape, generator=generator, dtype=y.dtype)
