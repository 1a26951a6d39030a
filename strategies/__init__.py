"""Strategies: one module per method, found by name in :data:`STRATEGIES`.

Flower's own FedAvg, FedProx, FedMedian, FedTrimmedAvg and Krum are used as
they are, with :class:`strategies.base.TrackedStrategy` in front of them for
reply checks, scenarios and per-client records (:mod:`strategies.flower`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .apfl import APFL
from .base import PersonalizedStrategy, RunHistory, TrackedStrategy, discover_clients, mean_metrics
from .fedamp import FedAMP, HeurFedAMP, fedamp_weights, heurfedamp_weights
from .flower import FedAvg, FedAvgFT, FedMedian, FedProx, FedProxFT, FedTrimmedAvg, Krum
from .nonconvex import NonConvex, nonconvex_weights
from .panacea import GraphHyperNetwork, Panacea, server_step
from .per_fedavg import PerFedAvg
from .pfedme import PFedMe
from .scaffold import Scaffold
from .separate import Separate


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


def _panacea_kwargs(s: dict[str, Any], graph: bool, generator: bool) -> dict[str, Any]:
    if graph and s["adjacency"] is None:
        raise ValueError("run config 'graph' = 'none' is invalid for Panacea and Panacea-GN; "
                         "allowed: task, file, groups (pfedhn needs no graph)")
    return dict(adjacency=s["adjacency"] if graph else None, generator=generator,
                embed_dim=s["panacea_embed_dim"], gnn_layers=s["panacea_gnn_layers"],
                hidden=s["panacea_hidden"], mlp_layers=s["panacea_mlp_layers"],
                lambda_d=s["panacea_lambda_d"], server_lr=s["panacea_server_lr"],
                server_momentum=s["panacea_server_momentum"],
                server_steps=s["panacea_server_steps"], client_lr=s["panacea_client_lr"],
                **_personal_kwargs(s))


# Strategies that use the client graph (the ServerApp builds it only for them).
GRAPH_STRATEGIES = ("panacea", "panacea-gn")

# name -> factory(settings) -> strategy; settings are the validated run config
# (fedamp_flwr.server_app.strategy_settings()).
STRATEGIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "separate": lambda s: Separate(**_personal_kwargs(s)),
    "fedavg": lambda s: FedAvg(**_flower_kwargs(s)),
    "fedprox": lambda s: FedProx(proximal_mu=s["fedprox_mu"], **_flower_kwargs(s)),
    "fedavg-ft": lambda s: FedAvgFT(finetune_epochs=s["finetune_epochs"], **_flower_kwargs(s)),
    "fedprox-ft": lambda s: FedProxFT(finetune_epochs=s["finetune_epochs"],
                                      proximal_mu=s["fedprox_mu"], **_flower_kwargs(s)),
    "scaffold": lambda s: Scaffold(param_keys=s["param_keys"], **_flower_kwargs(s)),
    "apfl": lambda s: APFL(alpha=s["apfl_alpha"], **_flower_kwargs(s)),
    "nonconvex": lambda s: NonConvex(c=s["nonconvex_c"], **_flower_kwargs(s)),
    "per-fedavg": lambda s: PerFedAvg(alpha=s["per_fedavg_alpha"], **_flower_kwargs(s)),
    "pfedme": lambda s: PFedMe(lam=s["pfedme_lambda"], inner_steps=s["pfedme_inner_steps"],
                               personal_lr=s["pfedme_personal_lr"], beta=s["pfedme_beta"],
                               **_flower_kwargs(s)),
    "fedmedian": lambda s: FedMedian(**_flower_kwargs(s)),
    "fedtrimmedavg": lambda s: FedTrimmedAvg(beta=s["fedtrimmedavg_beta"], **_flower_kwargs(s)),
    "krum": lambda s: Krum(num_malicious_nodes=s["num_attackers"], **_flower_kwargs(s)),
    "fedamp": lambda s: FedAMP(sigma=s["fedamp_sigma"], **_fedamp_kwargs(s), **_personal_kwargs(s)),
    "heurfedamp": lambda s: HeurFedAMP(
        sigma=s["heurfedamp_sigma"], self_weight=s["heurfedamp_self_weight"],
        **_fedamp_kwargs(s), **_personal_kwargs(s)),
    "panacea": lambda s: Panacea(**_panacea_kwargs(s, graph=True, generator=True)),
    "panacea-gn": lambda s: Panacea(**_panacea_kwargs(s, graph=True, generator=False)),
    "pfedhn": lambda s: Panacea(**_panacea_kwargs(s, graph=False, generator=False)),
}


def build_strategy(name: str, settings: dict[str, Any]):
    """Return a new strategy ``name`` configured from ``settings``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy '{name}'; allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](settings)


__all__ = [
    "APFL", "GRAPH_STRATEGIES", "STRATEGIES", "FedAMP", "FedAvg", "FedAvgFT", "FedMedian",
    "FedProx", "FedProxFT", "FedTrimmedAvg", "GraphHyperNetwork", "Krum", "NonConvex", "PFedMe", "PerFedAvg", "Scaffold",
    "Separate", "nonconvex_weights",
    "HeurFedAMP", "Panacea", "PersonalizedStrategy", "server_step",
    "RunHistory", "TrackedStrategy", "build_strategy", "discover_clients", "fedamp_weights",
    "heurfedamp_weights",
]
