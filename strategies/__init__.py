"""Strategies: one module per method, found by name in :data:`STRATEGIES`.

Each method's module holds all of it: its settings (the run-config keys it owns,
a :class:`strategies.core.settings.Settings` dataclass), the server's strategy
(registered with :func:`strategies.core.registry.register_strategy`) and,
where the method needs client-side behaviour, its client update (registered
with :func:`strategies.core.client.register_client_update`), which the generic
ClientApp runs when a message names it. Importing this package imports every
method module, and so registers them all; a new method is a new module and
one line below. The machinery they share is :mod:`strategies.core`.

Flower's own FedAvg, FedProx, FedMedian, FedTrimmedAvg and Krum are used as
they are, each held by a :class:`strategies.core.base.FlowerStrategy`
for reply checks, scenarios and per-client records (:mod:`strategies.flower`).
"""

from __future__ import annotations

from . import (  # noqa: F401 - importing a method's module registers it
    apfl,
    fedamp,
    flower,
    nonconvex,
    panacea,
    per_fedavg,
    pfedme,
    scaffold,
    separate,
    sfl,
)
from .apfl import APFL
from .core.base import FlowerStrategy, PersonalizedStrategy
from .core.client import CLIENT_UPDATES, ClientJob, ClientUpdate, register_client_update
from .core.history import RunHistory
from .core.registry import STRATEGIES, RunSetup, build_strategy, register_strategy
from .core.replies import mean_metrics
from .core.roster import ClientInfo
from .core.settings import ConfigError, Settings
from .fedamp import FedAMP, HeurFedAMP
from .fedamp_math import fedamp_weights, heurfedamp_weights
from .flower import FedAvg, FedAvgFT, FedMedian, FedProx, FedProxFT, FedTrimmedAvg, Krum
from .hypernetwork import GraphHyperNetwork, server_step
from .nonconvex import NonConvex, nonconvex_weights
from .panacea import Panacea
from .per_fedavg import PerFedAvg
from .pfedme import PFedMe
from .scaffold import Scaffold
from .separate import Separate
from .sfl import SFLStrategy, sfl_propagation

__all__ = [
    "APFL", "CLIENT_UPDATES", "STRATEGIES", "ClientInfo", "ClientJob", "ClientUpdate",
    "ConfigError", "FedAMP", "FedAvg", "FedAvgFT", "FedMedian", "FedProx", "FedProxFT",
    "FedTrimmedAvg", "GraphHyperNetwork", "HeurFedAMP", "Krum", "NonConvex", "PFedMe",
    "Panacea", "PerFedAvg", "PersonalizedStrategy", "RunHistory", "RunSetup", "Scaffold",
    "SFLStrategy", "Separate", "Settings", "FlowerStrategy", "build_strategy", "fedamp_weights",
    "heurfedamp_weights", "mean_metrics", "nonconvex_weights", "register_client_update",
    "register_strategy", "server_step", "sfl_propagation",
]
