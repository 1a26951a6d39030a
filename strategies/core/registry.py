"""Strategies by name: each method's module registers a factory with :func:`register_strategy`.

A factory receives the method's own settings (an instance of the
:class:`strategies.core.settings.Settings` class it registered, checked and
with its "auto" values resolved) and the :class:`RunSetup`, what the run
determines (clients, the model's parameter keys, the server device, the
client graph, the data setting), and returns the strategy:

.. code:: python

    @register_strategy("fedprox", settings=ProximalSettings)
    def _fedprox(settings: ProximalSettings, run: RunSetup) -> FedProx:
        return FedProx(proximal_mu=settings.fedprox_mu, **flower_kwargs(run))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .replies import mean_metrics
from .settings import NoSettings, Settings, type_name
from .tracking import RunTracking


@dataclass(frozen=True)
class RunSetup:
    """What the run determines beside the method's settings.

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
        with the graphs they take (``register_strategy(graph=...)``).
    num_attackers : int
        Clients that the ``attack-ratio`` scenario makes attackers (Krum's f).
    fraction_train : float
        Share of the clients sampled for training each round.
    seed : int
        The run's seed (client sampling, the server's own randomness).
    dataset, data_setting : str
        The data (``dataset``) and its setting (the partitioning of a pool
        dataset, ``federated`` for a task whose data defines its clients).
    groups : Sequence[int] | None
        Each client's group of same-distribution clients, where the setting has them.
    graph_k, graph_warmup_rounds : int
        ``graph = "inferred"``: the strategy builds its client graph itself, the
        ``graph_k``-nearest-neighbour graph of the clients' updates in the first
        ``graph_warmup_rounds`` rounds (0, 0: it is given ``adjacency``, or none).
    graph_guard_rounds : int
        > 0: after the warm-up, the inferred graph and no graph both train this many rounds,
        and the one with the lower loss on the clients' held-out training rows goes on.
    graph_similarity : str
        How the updates are compared (:data:`tasks.graphs.SIMILARITIES`).
    graph_guard_path : tuple | None
        The guard's no-graph path: pFedHN's settings as this run config runs it, and its
        ``local-steps``, ``local-epochs`` and ``batch-size``.
    true_adjacency : torch.Tensor | None
        With an inferred graph, the task's own graph (or its groups' graph) where it
        has one: the inferred edges' precision and recall are measured against it.
    tracking : RunTracking
        The clients found, the scenario and the reply checks: every strategy is built
        with them (``flower_kwargs``, ``personal_kwargs``).
    """

    num_clients: int
    param_keys: list[str]
    device: str = "cpu"
    adjacency: torch.Tensor | None = None
    num_attackers: int = 0
    fraction_train: float = 1.0
    seed: int = 0
    dataset: str = ""
    data_setting: str = ""
    groups: Sequence[int] | None = None
    graph_k: int = 0
    graph_warmup_rounds: int = 0
    graph_guard_rounds: int = 0
    graph_similarity: str = "cosine"
    graph_guard_path: tuple[Any, Mapping[str, Any]] | None = None
    true_adjacency: torch.Tensor | None = None
    tracking: RunTracking = field(default_factory=RunTracking)


Factory = Callable[[Any, RunSetup], Any]


@dataclass(frozen=True)
class StrategyEntry:
    """A registered strategy: its factory, its settings class, whether it needs the client
    graph, and its own values of "auto" settings (for every task, and per task)."""

    name: str
    factory: Factory
    settings: type[Settings] = NoSettings
    #: the values of run config ``graph`` it takes (empty: it uses no client graph)
    graphs: tuple[str, ...] = ()
    auto: Mapping[str, Any] = field(default_factory=dict)
    task_auto: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tune: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    #: why the method's replies cannot be made differentially private, by ``dp`` mode
    not_private: Mapping[str, str] = field(default_factory=dict)
    #: it honours a collaboration policy by its own weights (FedAMP's xi) or by weighing no
    #: one (Separate); a graph method honours it through its client graph
    keeps_apart: bool = False
    #: it mixes what clients learn (False: each client trains alone, as Separate; its
    #: closing words then never speak of federation doing worse)
    federates: bool = True

    @property
    def uses_graph(self) -> bool:
        """Whether the method uses a client graph (the ``graph`` key)."""
        return bool(self.graphs)


#: where a client graph comes from (run config ``graph``, :mod:`tasks.graphs`)
GRAPHS = ("task", "file", "groups", "inferred", "none")
#: what a method that needs a graph it is given takes (``register_strategy(graph=True)``)
GIVEN_GRAPHS = ("task", "file", "groups")

STRATEGIES: dict[str, StrategyEntry] = {}

#: why DP-SGD cannot train a method whose local training is its own loop (``not_private``)
OWN_LOOP = ("its local training is its own loop ({}), not the generic one DP-SGD runs; "
            "dp = 'update' protects its reply")


def _check_keys(name: str, settings: type[Settings]) -> None:
    """A key declared by two settings classes must be one field (the same type and default)."""
    for other in STRATEGIES.values():
        if other.settings is settings or other.name == name:
            continue
        theirs = other.settings.keys()
        for key, f in settings.keys().items():
            g = theirs.get(key)
            if g is not None and (type_name(g.type), g.default) != (type_name(f.type), f.default):
                raise ValueError(f"strategy {name!r}: run-config key {key!r} of "
                                 f"{settings.__name__} differs from {other.settings.__name__}'s "
                                 f"(strategy {other.name!r}); a key has one type and default")


def register_strategy(name: str, *, settings: type[Settings] = NoSettings,
                      graph: bool | tuple[str, ...] = False,
                      auto: Mapping[str, Any] | None = None,
                      task_auto: Mapping[str, Mapping[str, Any]] | None = None,
                      tune: Mapping[str, tuple[float, ...]] | None = None,
                      not_private: Mapping[str, str] | None = None,
                      keeps_apart: bool = False,
                      federates: bool = True) -> Callable[[Factory], Factory]:
    """Decorator: register ``factory(settings, run)`` as the strategy ``name``.

    ``settings``: the class of the method's own run-config keys. ``graph``: the
    values of the ``graph`` run-config key the method takes (:data:`GRAPHS`; True:
    :data:`GIVEN_GRAPHS`, a graph it is given): the ServerApp builds the client graph
    and passes it as ``run.adjacency`` ("inferred": the method infers it, "none": it
    runs without), and any other value is refused before any work. ``auto``: the
    strategy's own values of settings left at "auto" (e.g. pFedHN's reference trainer);
    ``task_auto``: its values for one task (dataset name -> values, e.g. Panacea's on
    TPT-48) or one model named in the run config (``"model:<name>"`` -> values, e.g.
    Panacea's with the traffic GRU in a members run). ``tune``: its search space for
    ``simulation.py --tune`` beside the generic one (key ->
    factors of the run's value; ``()`` leaves a generic key out, e.g. a
    learning rate the method does not use); every key must take "auto".
    ``not_private``: by ``dp`` mode, why the method cannot be made differentially private
    that way (e.g. SCAFFOLD's control variates; a method whose training is its own loop,
    not the generic one DP-SGD runs), refused before any work. ``keeps_apart``: it honours
    a collaboration policy (``collaboration-policy``, :mod:`strategies.core.policy`) by its
    own weights or by weighing no one; a graph method honours it through its graph.
    ``federates``: False for a method whose clients each train alone (Separate).
    """
    def add(factory: Factory) -> Factory:
        current = STRATEGIES.get(name)
        if current is not None and current.factory is not factory:
            raise ValueError(f"strategy {name!r} is already registered")
        _check_keys(name, settings)
        graphs = GIVEN_GRAPHS if graph is True else tuple(graph or ())
        unknown = set(graphs) - set(GRAPHS)
        if unknown:
            raise ValueError(f"strategy {name!r}: graph values {sorted(unknown)} are unknown; "
                             f"allowed: {', '.join(GRAPHS)}")
        STRATEGIES[name] = StrategyEntry(name, factory, settings, graphs, dict(auto or {}),
                                         {k: dict(v) for k, v in (task_auto or {}).items()},
                                         {k: tuple(v) for k, v in (tune or {}).items()},
                                         dict(not_private or {}), keeps_apart, federates)
        return factory
    return add


#: Values chosen by ``simulation.py --tune`` (docs/tuning.md), by strategy and data setting
#: (``<dataset>/<variant>``): what "auto" gives where a tuning run chose it. Its
#: ``budgets`` hold the values chosen under a ``--budget`` (:func:`budget_tuned`): they spend
#: that budget (e.g. FedAvg's one SGD step a round for 1,200 rounds), and "auto" never
#: gives them to a run of the preset's own rounds.
TUNED_FILE = Path(__file__).resolve().parents[1] / "tuned.json"


def tuned_values(strategy: str, setting: str) -> dict[str, Any]:
    """The tuned values of ``strategy`` for the data setting ``setting`` (``{}`` where none
    were tuned, or inside :func:`untuned`), from :data:`TUNED_FILE`."""
    if _IGNORED:
        return {}
    return dict(_tuned().get(strategy, {}).get(setting, {}).get("values", {}))


def budget_tuned(budget: str) -> dict[str, Any]:
    """The values :data:`TUNED_FILE` holds for runs under ``--budget`` ``budget``, as a
    ``tuned.json`` of their own (``{"budget": ..., "strategies": ...}``; none: ``{}``)."""
    data = json.loads(TUNED_FILE.read_text()) if TUNED_FILE.is_file() else {}
    entry = data.get("budgets", {}).get(budget)
    return {"budget": budget, "strategies": entry["strategies"]} if entry else {}


@contextlib.contextmanager
def untuned() -> Iterator[None]:
    """Within it, "auto" ignores :data:`TUNED_FILE` (a tuning run starts from the defaults,
    whatever an earlier tuning chose)."""
    _IGNORED.append(True)
    try:
        yield
    finally:
        _IGNORED.pop()


_TUNED: dict[str, Any] = {}
_IGNORED: list[bool] = []


def _tuned() -> dict[str, Any]:
    if not _TUNED and TUNED_FILE.is_file():
        data = json.loads(TUNED_FILE.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{TUNED_FILE}: expected an object of strategies")
        _TUNED.update(data.get("strategies", {}))
    return _TUNED


def unregister_strategy(name: str) -> None:
    """Remove the strategy ``name`` (tests and plugins)."""
    STRATEGIES.pop(name, None)


def settings_classes() -> list[type[Settings]]:
    """Every registered settings class, once, in registration order."""
    return list(dict.fromkeys(e.settings for e in STRATEGIES.values()))


def method_keys() -> dict[str, dataclasses.Field]:
    """Every run-config key that a registered method declares, with its field."""
    out: dict[str, dataclasses.Field] = {}
    for cls in settings_classes():
        out.update(cls.keys())
    return out


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def key_rows(keys: Mapping[str, dataclasses.Field], auto: Sequence[str] = (),
             users: Callable[[str], str] | None = None) -> list[str]:
    """A configuration reference's table of ``keys``, from their declarations: key, default,
    allowed, meaning (and ``users(key)``, e.g. the strategies that use it); ``auto``: the
    keys that take "auto"."""
    head = "| key | default | allowed | meaning |" + (" strategies |" if users else "")
    rows = [head, "|---" * head.count(" |") + "|"]
    for key, f in sorted(keys.items()):
        allowed = f.metadata.get("allowed") or type_name(f.type)
        if (f.default == "auto" or key in auto) and '"auto"' not in allowed:
            allowed = f'"auto" or {allowed}'
        rows.append(f"| `{key}` | {_cell(f.default)} | {allowed} | {f.metadata.get('doc', '')} |"
                    + (f" {users(key)} |" if users else ""))
    return rows


def method_reference() -> str:
    """The configuration reference's table of the methods' keys, from their declarations
    (docs/configuration.md holds it; ``tests/test_structure.py`` checks it is current)."""
    return "\n".join(key_rows(method_keys(), users=lambda key: ", ".join(
        f"`{e.name}`" for e in STRATEGIES.values() if key in e.settings.keys()))) + "\n"


def build_strategy(name: str, settings: Settings, run: RunSetup) -> Any:
    """Return a new strategy ``name`` made by its factory from its settings and the run setup."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy '{name}'; allowed: {', '.join(sorted(STRATEGIES))}")
    entry = STRATEGIES[name]
    if not isinstance(settings, entry.settings):
        raise TypeError(f"strategy {name!r} takes {entry.settings.__name__}, "
                        f"not {type(settings).__name__}")
    return entry.factory(settings, run)


def flower_kwargs(run: RunSetup) -> dict[str, Any]:
    """Arguments of Flower's FedAvg family: every connected client evaluates, metrics are
    client means. The ``min_*_nodes`` are 1: the round loop hands the strategy only the
    connected clients (``fedamp_flwr.server.rounds.online_view``), and Flower's sampler would
    wait for ever for a node that is gone."""
    return dict(
        # Flower's sampler takes every client the run's rule chose (Scenario.sample_training)
        fraction_train=1.0, fraction_evaluate=1.0,
        sample_fraction=run.fraction_train, sample_seed=run.seed,
        min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1,
        train_metrics_aggr_fn=mean_metrics, evaluate_metrics_aggr_fn=mean_metrics,
        tracking=run.tracking,
    )


def personal_kwargs(run: RunSetup) -> dict[str, Any]:
    """Arguments of :class:`strategies.core.base.PersonalizedStrategy`."""
    return dict(fraction_train=run.fraction_train, param_keys=run.param_keys,
                device=run.device, seed=run.seed, tracking=run.tracking)
