"""Strategies: one module per method, found by name in :data:`STRATEGIES`.

Each method's module holds both of its halves: the server's strategy
(registered with :func:`strategies.registry.register_strategy`) and, where the
method needs client-side behaviour, its client update (registered with
:func:`strategies.client.register_client_update`), which the generic
ClientApp runs when a message names it. Importing this package imports every
method module, and so registers them all; a new method is a new module and
one line below.

Flower's own FedAvg, FedProx, FedMedian, FedTrimmedAvg and Krum are used as
they are, with :class:`strategies.base.TrackedStrategy` in front of them for
reply checks, scenarios and per-client records (:mod:`strategies.flower`).
"""

from __future__ import annotations

from . import (  # noqa: F401  (registers)
    apfl,
    fedamp,
    flower,
    nonconvex,
    panacea,
    per_fedavg,
    pfedme,
    scaffold,
    separate,
)
from .apfl import APFL
from .base import PersonalizedStrategy, TrackedStrategy
from .client import CLIENT_UPDATES, ClientJob, ClientUpdate, register_client_update
from .discovery import ClientInfo, discover_clients, discover_members
from .fedamp import FedAMP, HeurFedAMP, fedamp_weights, heurfedamp_weights
from .flower import FedAvg, FedAvgFT, FedMedian, FedProx, FedProxFT, FedTrimmedAvg, Krum
from .history import RunHistory
from .nonconvex import NonConvex, nonconvex_weights
from .panacea import GraphHyperNetwork, Panacea, server_step
from .per_fedavg import PerFedAvg
from .pfedme import PFedMe
from .registry import STRATEGIES, RunSetup, build_strategy, register_strategy
from .replies import mean_metrics
from .scaffold import Scaffold
from .separate import Separate


__all__ = [
    "APFL", "CLIENT_UPDATES", "ClientInfo", "discover_members", "STRATEGIES", "ClientJob", "ClientUpdate", "FedAMP", "FedAvg",
    "FedAvgFT", "FedMedian", "FedProx", "FedProxFT", "FedTrimmedAvg", "GraphHyperNetwork",
    "HeurFedAMP", "Krum", "NonConvex", "PFedMe", "Panacea", "PerFedAvg", "PersonalizedStrategy",
    "RunHistory", "RunSetup", "Scaffold", "Separate", "TrackedStrategy", "build_strategy",
    "discover_clients", "fedamp_weights", "heurfedamp_weights", "mean_metrics",
    "nonconvex_weights", "register_client_update", "register_strategy", "server_step",
]
