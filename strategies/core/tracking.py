"""What a strategy tracks of its run: a :class:`Tracker` of its clients (:class:`Roster`),
the screening of their replies (:class:`ReplyScreen`), the scenario that shapes each round
(:class:`Scenario`) and the records (:class:`RunHistory`); :class:`RunTracking` is what the
run gives a strategy to start it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.app import ConfigRecord
from flwr.supercore import log

from tasks.scenarios import Roles

from .history import RunHistory
from .policy import ApartPolicy
from .protocol import CLIENT_INDEX, LOCAL_EPOCHS, LOCAL_STEPS, TRAINED_ROUNDS, as_int
from .roster import ClientInfo, Roster
from .screening import EVALUATE, TRAIN, ReplyScreen, error_reason

__all__ = ["EVALUATE", "TRAIN", "ReplyScreen", "Roster", "RunTracking", "Scenario", "Tracker",
           "error_reason"]


@dataclass(frozen=True)
class RunTracking:
    """What a strategy is given of the run to track it, beside its settings: the clients
    found (node id -> what each said), the scenario's ``roles``, the update-norm bound (a
    training reply w is left out when ``||w - w_sent||`` exceeds ``max_update_ratio`` x
    ``max(||w_sent||, 1)`` + ``update_noise``, what a member's own noise may add:
    ``dp = "update"``, :func:`tasks.dp.noise_allowance`), whether a refusal is an
    absence (a run of members, where a member may refuse what its node does not allow)
    rather than a fault that stops the run, and where FedAMP's weight matrices go
    (``xi_sink``; None: kept in the history); ``apart``: the pairs of members the run's
    collaboration policy keeps apart (:mod:`strategies.core.policy`; None: no policy)."""

    clients: dict[int, ClientInfo] = field(default_factory=dict)
    roles: Roles | None = None
    max_update_ratio: float = 100.0
    update_noise: float = 0.0
    refusals_are_absences: bool = False
    xi_sink: Callable | None = None
    apart: ApartPolicy | None = None


class Scenario:
    """What the run's scenario (``roles``: novel clients, drop-outs, per-client epochs) asks
    of a round: who trains (:meth:`sample_training`) and each client's config
    (:meth:`client_config`, :meth:`evaluate_config`); ``history``: how often each trained."""

    def __init__(self, roles: Roles, history: RunHistory) -> None:
        self.roles, self.history = roles, history

    def sample_training(self, server_round: int, client_ids: Iterable[int], fraction: float,
                        seed: int) -> list[int]:
        """The clients that train in ``server_round``, one rule for every strategy: of the
        given (connected) ``client_ids``, those that train at all (not novel), a seeded
        sample of ``max(1, round(fraction x their number))``, less those that drop out
        (``drop-rate``). In client-id order."""
        pool = sorted(c for c in client_ids if c not in self.roles.novel)
        if not pool:
            return []
        k = max(1, int(round(fraction * len(pool))))
        rng = np.random.default_rng([seed, server_round])
        sampled = sorted(int(c) for c in rng.choice(pool, size=k, replace=False))
        return self.participants(server_round, sampled)

    def participants(self, server_round: int, client_ids: Iterable[int]) -> list[int]:
        """The sampled ``client_ids`` that train in ``server_round``: not novel, not dropped out."""
        training = [c for c in client_ids if c not in self.roles.novel]
        kept = self.roles.participants(server_round, training)
        if len(kept) < len(training):
            log(INFO, "Round %d: clients %s drop out (drop-rate %.2f)", server_round,
                sorted(set(training) - set(kept)), self.roles.drop_rate)
        return kept

    def client_config(self, server_round: int, client_id: int, config: ConfigRecord) -> ConfigRecord:
        """``config`` for one client: its id in the run (``client-index``), how often it
        trained before (so that it can tell a lost state), and its own local epochs (or
        steps) under ``heterogeneous-epochs``."""
        own = ConfigRecord(dict(config))
        own[CLIENT_INDEX] = client_id
        own[TRAINED_ROUNDS] = self.history.times_trained(client_id)
        if self.roles.heterogeneous_epochs:
            key = LOCAL_STEPS if as_int(config.get(LOCAL_STEPS, 0), LOCAL_STEPS) > 0 \
                else LOCAL_EPOCHS
            if key in config:
                own[key] = self.roles.local_units(server_round, client_id,
                                                  as_int(config[key], key))
        return own

    def evaluate_config(self, client_id: int, config: ConfigRecord) -> ConfigRecord:
        """``config`` for one client's evaluation: its id in the run (``client-index``)."""
        own = ConfigRecord(dict(config))
        own[CLIENT_INDEX] = client_id
        return own


class Tracker:
    """A strategy's view of its run: who the clients are (``roster``), the screening of
    their replies (``replies``), the scenario (``scenario``, its ``roles``) and the records
    (``history``, metrics.json's rounds). A strategy holds one (``strategy.tracker``)."""

    def __init__(self, clients: dict[int, ClientInfo] | None = None,
                 roles: Roles | None = None) -> None:
        self.roles = roles or Roles(frozenset(), frozenset())
        self.history = RunHistory(novel=self.roles.novel, attackers=self.roles.attackers)
        self.roster = Roster(clients)
        self.replies = ReplyScreen(self.roster, self.history, self.roles.novel)
        self.scenario = Scenario(self.roles, self.history)
