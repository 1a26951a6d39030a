"""What a run's config is checked against before the ServerApp waits for any node.

:meth:`fedamp_flwr.config.RunConfig.from_run_config` checks every key's value and
the keys together; :func:`check_before_clients` then reads what the config names on
the coordinator's machine (the collaboration policy, the graph file, an npz task's
file, the dashboards' packages) and what the model rules out, so that a mistake is one
line in the first seconds of a run, not after the clients are found.
:func:`check_with_clients` is what only the run's size decides (``graph-k``, a
graph's clients), which the ServerApp checks once it knows its clients and
``fedamp-flwr check-config --clients N`` checks offline.
"""

from __future__ import annotations

import strategies
import tasks
from tasks.dp import has_batch_statistics
from tasks.graphs import GraphError, build_graph, check_graph_file

from ..config import ConfigError, RunConfig
from ..sizes import check_server_memory
from .dashboards import check_packages


def check_before_clients(cfg: RunConfig) -> None:
    """Everything of ``cfg`` the coordinator can check before a node connects: a ConfigError
    (or GraphError) naming the key, the value and what is allowed."""
    check_server_memory(cfg, max(cfg.min_nodes, 2))
    check_packages(cfg)  # the dashboards asked for
    cfg.apart_policy()  # the collaboration policy's file, read and checked
    check_server_data(cfg)
    entry = strategies.STRATEGIES[cfg.strategy]
    if entry.uses_graph and cfg.graph == "file":
        try:
            check_graph_file(cfg.graph_file, named=cfg.dataset == tasks.MEMBERS)
        except (GraphError, OSError, ValueError) as err:
            raise ConfigError(f"run config 'graph-file' = {cfg.graph_file!r}: {err}",
                              key="graph-file", value=cfg.graph_file,
                              kind=_kind_of(err)) from None
    if entry.uses_graph and cfg.graph == "task" and tasks.get_task(cfg.dataset).has_graph is None \
            and tasks.task_graph(cfg.data_config(1)) is None:
        allowed = [g for g in cfg.graph_choices() if g != "task"]
        raise ConfigError(f"run config 'graph' = 'task' is invalid: data-dir {cfg.data_dir!r} "
                          f"holds no 'adjacency'; allowed: {', '.join(allowed)}", key="graph",
                          value="task", allowed=", ".join(allowed), kind="conflict")
    if cfg.dp == "dp-sgd":
        model = tasks.build_model(cfg.data_config(1), cfg.model)
        if has_batch_statistics(model):
            raise ConfigError(f"run config 'dp' = 'dp-sgd' is invalid for the model "
                              f"{type(model).__name__} of {cfg.data_label!r} (model = "
                              f"{cfg.model!r}): its BatchNorm mixes the examples of a batch, so "
                              "per-example gradients are not defined; allowed: update, or a "
                              "model without BatchNorm", key="dp", value="dp-sgd",
                              allowed="update, or a model without BatchNorm", kind="conflict")


def check_server_data(cfg: RunConfig) -> None:
    """Read the data the server needs itself (the npz task's file, for the model's shape)
    once, before any client is asked: a bad file is one line naming it, not one per client."""
    spec = tasks.get_task(cfg.dataset)
    if spec.info is not None or not spec.needs_data_dir:
        return
    try:
        tasks.data_info(cfg.data_config(1))
    except (ValueError, OSError) as err:
        raise ConfigError(cfg.data_dir_problem(err), key="data-dir",
                          value=cfg.data_dir, kind=_kind_of(err)) from None


def check_with_clients(cfg: RunConfig, num_clients: int) -> None:
    """What only the run's size decides, for a partitioned run of ``num_clients`` clients:
    ``graph-k`` below it, and the client graph the run would build (its groups' edges, a
    graph file's ids). Members' runs are sized by who joins: nothing to check."""
    if cfg.dataset == tasks.MEMBERS or num_clients < 1:
        return
    entry = strategies.STRATEGIES[cfg.strategy]
    if not entry.uses_graph:
        return
    if cfg.graph == "inferred":
        cfg.graph_k_for(num_clients)
        return
    dc = cfg.data_config(num_clients)
    try:  # a GraphError says what is wrong with the graph itself
        build_graph(cfg.graph, num_clients, tasks.task_graph(dc) if cfg.graph == "task" else None,
                    cfg.graph_file, cfg.dataset, cfg.groups(num_clients))
    except OSError as err:
        raise ConfigError(f"run config 'graph' = {cfg.graph!r} with {num_clients} clients: "
                          f"{err}", key="graph", value=cfg.graph, kind=_kind_of(err)) from None


def _kind_of(err: Exception) -> str:
    """The :class:`ConfigError` kind of a file the run names that could not be read: "missing"
    where it is not there, else "invalid"."""
    return "missing" if isinstance(err, FileNotFoundError) else "invalid"
