"""Strategies by name: each method's module registers a factory with :func:`register_strategy`.

A factory receives the typed, validated run config (``fedamp_flwr.config.RunConfig``)
and the :class:`RunSetup`, what the run itself determines (clients, the
model's parameter keys, the server device, the client graph), and returns
the strategy:

.. code:: python

    @register_strategy("fedprox")
    def _fedprox(cfg: RunConfig, run: RunSetup) -> FedProx:
        return FedProx(proximal_mu=cfg.fedprox_mu, **flower_kwargs(cfg, run))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .replies import mean_metrics

if TYPE_CHECKING:  # the run config imports this package to check strategy names
    from fedamp_flwr.config import RunConfig


@dataclass(frozen=True)
class RunSetup:
    """What the run determines beside its config.

    Attributes
    ----------
    num_clients : int
        Clients found in the query round.
    param_keys : list[str]
        State-dict keys of the model's trainable parameters.
    device : str
        Where the server keeps and mixes models.
    adjacency : torch.Tensor | None
        The client graph (rows in client-id order), for strategies registered
        with ``graph=True``.
    num_attackers : int
        Clients that the ``attack-ratio`` scenario makes attackers (Krum's f).
    """

    num_clients: int
    param_keys: list[str]
    device: str = "cpu"
    adjacency: torch.Tensor | None = None
    num_attackers: int = 0


Factory = Callable[["RunConfig", RunSetup], Any]


@dataclass(frozen=True)
class StrategyEntry:
    """A registered strategy: its factory, whether it needs the client graph, and its own
    values of the run config's "auto" settings (``fedamp_flwr.config.auto_settings``)."""

    name: str
    factory: Factory
    uses_graph: bool = False
    auto: dict[str, Any] = field(default_factory=dict)


STRATEGIES: dict[str, StrategyEntry] = {}


def register_strategy(name: str, *, graph: bool = False,
                      auto: dict[str, Any] | None = None) -> Callable[[Factory], Factory]:
    """Decorator: register ``factory(cfg, run)`` as the strategy ``name``.

    ``graph=True``: the ServerApp builds the client graph (``graph`` run-config
    key) and passes it as ``run.adjacency``. ``auto``: the strategy's own values
    of run-config settings left at "auto" (e.g. ``{"panacea-client-lr": 5e-3}``).
    """
    def add(factory: Factory) -> Factory:
        current = STRATEGIES.get(name)
        if current is not None and current.factory is not factory:
            raise ValueError(f"strategy {name!r} is already registered")
        STRATEGIES[name] = StrategyEntry(name, factory, graph, dict(auto or {}))
        return factory
    return add


def unregister_strategy(name: str) -> None:
    """Remove the strategy ``name`` (tests and plugins)."""
    STRATEGIES.pop(name, None)


def build_strategy(name: str, cfg: "RunConfig", run: RunSetup):
    """Return a new strategy ``name`` configured from the run config and setup."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy '{name}'; allowed: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name].factory(cfg, run)


def flower_kwargs(cfg: "RunConfig", run: RunSetup) -> dict[str, Any]:
    """Arguments of Flower's FedAvg family: every connected client evaluates, metrics are
    client means. The ``min_*_nodes`` are 1: the round loop hands the strategy only the
    connected clients (:class:`strategies.rounds.OnlineClients`), and Flower's sampler would
    wait for ever for a node that is gone."""
    return dict(
        fraction_train=cfg.fraction_train, fraction_evaluate=1.0,
        min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1,
        train_metrics_aggr_fn=mean_metrics, evaluate_metrics_aggr_fn=mean_metrics,
    )


def personal_kwargs(cfg: "RunConfig", run: RunSetup) -> dict[str, Any]:
    """Arguments of :class:`strategies.base.PersonalizedStrategy`."""
    return dict(fraction_train=cfg.fraction_train, param_keys=run.param_keys,
                device=run.device, seed=cfg.seed)
