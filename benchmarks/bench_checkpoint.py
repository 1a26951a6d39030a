"""Checkpoint size and time: FedAMP's per-client store for 100 clients of the MNIST CNN.

Builds the state the ServerApp writes after a round (the strategy's state with
its 100 x 1,663,370 float32 store, the global model, the random state, the
history of 90 rounds with their weight matrices), writes it with
``RunFolder.save_checkpoint`` (a synced temporary file renamed over the old
one) and reads it back with ``load_checkpoint``, timing both; reports the size
against the store's own ``clients x parameters x 4`` bytes. Run:

    python -m benchmarks.bench_checkpoint [--clients 100] [--folder /tmp/ckpt]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

import strategies
import tasks
from fedamp_flwr.config import RunConfig
from fedamp_flwr.server.results import RunFolder
from fedamp_flwr.server_app import run_setup
from strategies.core.roster import ClientInfo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=90, help="rounds of history in the state")
    parser.add_argument("--folder", default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args()
    n = args.clients
    with tempfile.TemporaryDirectory() as tmp:
        results = args.folder or tmp
        cfg = RunConfig.from_run_config({"dataset": "mnist", "data-dir": "unused", "run-name": "bench",
                                         "results-dir": results, "server-device": "cpu",
                                         "num-server-rounds": args.rounds})
        torch.manual_seed(0)
        model = tasks.build_model(cfg.data_config(n))
        keys = [k for k, _ in model.named_parameters()]
        strategy = strategies.build_strategy("fedamp", cfg.settings, run_setup(cfg, n, keys))
        strategy.setup_tracking({100 + i: ClientInfo(100 + i, i, n, 500, 100) for i in range(n)})
        initial = __import__("flwr.app", fromlist=["ArrayRecord"]).ArrayRecord(model.state_dict())
        strategy._ensure_models(initial)
        strategy.models += 0.01 * torch.randn(strategy.models.shape)
        for r in range(1, args.rounds + 1):  # a full run's records, weights included
            strategy.history.record_xi(r, strategy.client_ids, torch.rand(n, n, dtype=torch.float64))
        state = {"round": args.rounds, "config": cfg.to_dict(), "num_clients": n,
                 "arrays": initial.to_torch_state_dict(), "random_state": random.getstate(),
                 "strategy": strategy.state_dict(), "wall_time_s": 0.0}
        folder = RunFolder(cfg)
        store = strategy.models.numel() * 4
        size, seconds = folder.save_checkpoint(state)
        size2, seconds2 = folder.save_checkpoint(state)  # replacing an existing one
        started = time.perf_counter()
        folder.load_checkpoint()
        load = time.perf_counter() - started
        print(f"{n} clients x {strategy.models.shape[1]:,} parameters (MNIST CNN), "
              f"{args.rounds} rounds of history; torch {torch.__version__}")
        print(f"store (clients x parameters x 4 bytes): {store / 1e6:.1f} MB")
        print(f"checkpoint: {size / 1e6:.1f} MB ({size / store:.3f} x the store)")
        print(f"write: {seconds:.2f} s (new), {seconds2:.2f} s (replacing); read: {load:.2f} s")


if __name__ == "__main__":
    main()
