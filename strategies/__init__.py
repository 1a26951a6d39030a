"""Strategies: one module per method, found by name in :data:`STRATEGIES`.

Flower's own FedAvg and FedProx are used as they are, with
:class:`strategies.base.TrackedStrategy` in front of them for reply checks and
per-client records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.serverapp import strategy as flwr_strategy

from .base import PersonalizedStrategy, RunHistory, TrackedStrategy, discover_clients, mean_metrics
from .fedamp import FedAMP, HeurFedAMP, fedamp_weights, heurfedamp_weights


class FedAvg(TrackedStrategy, flwr_strategy.FedAvg):
    """Flower's FedAvg with this project's reply checks and records."""


class FedProx(TrackedStrategy, flwr_strategy.FedProx):
    """Flower's FedProx with this project's reply checks and records."""


def _flower_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    n = s["num_clients"]
    return dict(
        fraction_train=s["fraction_train"], fraction_evaluate=1.0,
        min_train_nodes=max(1, int(s["fraction_train"] * n)), min_evaluate_nodes=n,
        min_available_nodes=n, train_metrics_aggr_fn=mean_metrics,
        evaluate_metrics_aggr_fn=mean_metrics,
    )


def _personal_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    return dict(fraction_train=s["fraction_train"], param_keys=s["param_keys"],
                device=s["device"], seed=s["seed"])


def _fedamp_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    return dict(alpha_k=s["fedamp_alpha_k"], alpha_decay=s["fedamp_alpha_decay"],
                alpha_decay_every=s["fedamp_alpha_decay_every"], lam=s["fedamp_lambda"])


# name -> factory(settings) -> strategy; settings are the validated run config
# (fedamp_flwr.config.RunConfig.strategy_settings()).
STRATEGIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "fedavg": lambda s: FedAvg(**_flower_kwargs(s)),
    "fedprox": lambda s: FedProx(proximal_mu=s["fedprox_mu"], **_flower_kwargs(s)),
    "fedamp": lambda s: FedAMP(sigma=s["fedamp_sigma"], **_fedamp_kwargs(s), **_personal_kwargs(s)),
    "heurfedamp": lambda s: HeurFedAMP(
        sigma=s["heurfedamp_sigma"], self_weight=s["heurfedamp_self_weight"],
        **_fedamp_kwargs(s), **_personal_kwargs(s)),
}


def build_strategy(name: str, settings: dict[str, Any]):
    """Return a new strategy ``name`` configured from ``settings``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy '{name}'; allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](settings)


__all__ = [
    "STRATEGIES", "FedAMP", "FedAvg", "FedProx", "HeurFedAMP", "PersonalizedStrategy",
    "RunHistory", "TrackedStrategy", "build_strategy", "discover_clients", "fedamp_weights",
    "heurfedamp_weights",
]
