"""The ServerApp: validate the run config, find the clients, run the strategy, write metrics.json."""

from __future__ import annotations

import json
import random
import time
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

import strategies
import tasks
from strategies.protocol import BATCH_SIZE, LOCAL_EPOCHS, LOCAL_STEPS, LR, OPTIMIZER
from tasks.graphs import build_graph

from .config import ConfigError, RunConfig

app = ServerApp()


def server_device(cfg: RunConfig) -> str:
    """Where the server keeps and mixes models: ``server-device``, "auto" = cuda if present."""
    if cfg.server_device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.server_device.startswith("cuda"):
        try:
            torch.empty(0, device=cfg.server_device)
        except (RuntimeError, AssertionError) as err:
            raise ConfigError(f"run config 'server-device' = {cfg.server_device!r} is not usable "
                              f"here ({err}); allowed: auto, cpu or an available cuda device") from None
    return cfg.server_device


def run_setup(cfg: RunConfig, num_clients: int, param_keys: list[str],
              adjacency: torch.Tensor | None = None) -> strategies.RunSetup:
    """What the run determines beside its config: clients, parameter keys, device, graph."""
    return strategies.RunSetup(
        num_clients=num_clients, param_keys=list(param_keys), device=server_device(cfg),
        adjacency=adjacency, num_attackers=len(cfg.roles(num_clients).attackers),
    )


def client_graph(cfg: RunConfig, dc: tasks.DataConfig) -> torch.Tensor | None:
    """The validated client graph of the run (only for strategies that use one).

    Rows are client ids 0..n-1 (:func:`strategies.discover_clients` ensures
    that every partition id has its node).
    """
    if not strategies.STRATEGIES[cfg.strategy].uses_graph or cfg.graph == "none":
        return None
    task_adj = tasks.load_federated(dc).adjacency if cfg.graph == "task" else None
    adj = build_graph(cfg.graph, dc.num_clients, task_adj, cfg.graph_file, cfg.dataset)
    log(INFO, "Client graph '%s': %d clients, %d edges", cfg.graph, dc.num_clients,
        int(adj.sum()) // 2)
    return torch.from_numpy(adj)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` rounds of the configured strategy and write metrics.json."""
    cfg = RunConfig.from_run_config(context.run_config)
    out_dir = cfg.results_path()
    log(INFO, "Run '%s': strategy %s, dataset %s, partitioning %s; results in %s",
        cfg.name, cfg.strategy, cfg.dataset, cfg.partitioning, out_dir)

    clients = strategies.discover_clients(grid, cfg.min_nodes)
    n = len(clients)
    dc = cfg.data_config(n)
    adjacency = client_graph(cfg, dc)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)  # Flower's strategies sample nodes with the random module
    model = tasks.build_model(dc)
    param_keys = [name for name, _ in model.named_parameters()]
    strategy = strategies.build_strategy(cfg.strategy, cfg,
                                         run_setup(cfg, n, param_keys, adjacency))
    roles = cfg.roles(n)
    if roles.novel or roles.attackers or roles.drop_rate or roles.heterogeneous_epochs:
        log(INFO, "Scenario: novel clients %s, attackers %s, drop-rate %.2f, heterogeneous "
            "epochs %s", sorted(roles.novel), sorted(roles.attackers), roles.drop_rate,
            roles.heterogeneous_epochs)
    strategy.setup_tracking(clients, roles)

    train_config = ConfigRecord({
        LOCAL_EPOCHS: cfg.local_epochs, LOCAL_STEPS: cfg.local_steps,
        BATCH_SIZE: cfg.batch_size, LR: cfg.learning_rate, OPTIMIZER: cfg.optimizer,
    })
    evaluate_config = ConfigRecord({BATCH_SIZE: cfg.batch_size})
    started = time.time()
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=cfg.num_server_rounds, train_config=train_config,
        evaluate_config=evaluate_config,
    )

    record = {
        "run_name": cfg.name, "strategy": cfg.strategy, "dataset": cfg.dataset,
        "partitioning": cfg.partitioning, "num_clients": n,
        "seed": cfg.seed, "config": cfg.to_dict(),
        "sigma": {"fedamp": cfg.sigma("fedamp"), "heurfedamp": cfg.sigma("heurfedamp")},
        "wall_time_s": round(time.time() - started, 2),
        **strategy.history.to_dict(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(record, indent=1))
    if "bmta" in record:
        log(INFO, "BMTA %.2f%% over %d rounds", record["bmta"], cfg.num_server_rounds)
    if "best_mean_mse" in record:
        log(INFO, "Best mean test MSE %.4g over %d rounds", record["best_mean_mse"],
            cfg.num_server_rounds)
    log(INFO, "Wrote %s", out_dir / "metrics.json")
