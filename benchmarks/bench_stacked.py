"""One round's local training of every traffic sensor's GRU: one after another in a plain
PyTorch loop (the floor: :func:`tasks.train.train`, no Flower, no app) against all of them
stacked (:func:`tasks.stacked.train_stacked`), in the same process, on the same data, models
and batches; then the same for their tests (:func:`tasks.train.evaluate` against
:func:`tasks.stacked.evaluate_stacked`).

The clients are the generated stand-in over a road graph's sensors (``traffic-generated``,
207 on METR-LA's graph, 325 on PEMS-BAY's), with the task's "auto" local work (one epoch of
batch 32, Adam at 1e-3). Reported: seconds of each (the best of ``--repeat``, each repeat on
fresh copies of the models), their ratio, milliseconds per client-step, and the largest
relative difference of a client's training loss and of its test MSE between the two.

    python -m benchmarks.bench_stacked [--graph metr-la] [--device cpu] [--repeat 2]
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

import tasks
from fedamp_flwr.config import RunConfig
from tasks import stacked
from tasks.train import Fit, Test, num_steps

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = {"metr-la": 207, "pems-bay": 325}


def _clients(args: argparse.Namespace) -> tuple[list[Fit], list[tasks.ClientData]]:
    n = CLIENTS[args.graph]
    cfg = RunConfig.from_run_config({"dataset": "traffic-generated", "traffic-graph": args.graph,
                                     "data-dir": str(Path(args.data_dir).resolve())})
    dc = cfg.data_config(n)
    data = [tasks.load_client_data(dc, i) for i in range(n)]
    torch.manual_seed(0)
    fits = [Fit(tasks.build_model(dc, cfg.model), d.x_train, d.y_train, epochs=cfg.local_epochs,
                batch_size=int(cfg.batch_size), learning_rate=float(cfg.learning_rate),
                optimizer=cfg.optimizer, proximal_mu=0.0, grad_correction=None,
                steps=int(cfg.local_steps), momentum=0.0, weight_decay=0.0, clip_norm=0.0,
                device=args.device, seed=i) for i, d in enumerate(data)]
    return fits, data


def _timed(fn) -> tuple[float, list]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started, out


def _one_repeat(fits: list[Fit], data: list[tasks.ClientData], device: str,
                rows: dict[str, list[float]]) -> tuple[list, list, list, list]:
    """Both ways, on fresh copies of the models; each one's seconds added to ``rows``."""
    plain = [Fit(**{**vars(f), "model": copy.deepcopy(f.model)}) for f in fits]
    together = [Fit(**{**vars(f), "model": copy.deepcopy(f.model)}) for f in fits]
    s, alone = _timed(lambda: [f.alone() for f in plain])
    rows["one by one"].append(s)
    s, losses = _timed(lambda: stacked.train_stacked(together))
    rows["stacked"].append(s)
    tests = [Test(f.model, d.x_test, d.y_test, 500, device) for f, d in zip(plain, data)]
    s, scores = _timed(lambda: [t.alone() for t in tests])
    rows["tests one by one"].append(s)
    s, stacked_scores = _timed(lambda: stacked.evaluate_stacked(tests))
    rows["tests stacked"].append(s)
    return alone, losses, scores, stacked_scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", choices=sorted(CLIENTS), default="metr-la")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "sensor_graphs"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    fits, data = _clients(args)
    steps = sum(num_steps(len(f.x), f.batch_size, f.epochs, f.steps) for f in fits)
    rows: dict[str, list[float]] = {"one by one": [], "stacked": [], "tests one by one": [],
                                    "tests stacked": []}
    for _ in range(args.repeat):
        alone, losses, scores, stacked_scores = _one_repeat(fits, data, args.device, rows)
    loss_diff = max(abs(a - b) / abs(a) for a, b in zip(alone, losses))
    mse_diff = max(abs(a.mse - b.mse) / a.mse for a, b in zip(scores, stacked_scores))
    best = {k: min(v) for k, v in rows.items()}
    print(f"{len(fits)} sensors' GRUs (traffic-generated on {args.graph}'s road graph), one "
          f"round's local work: {steps} client-steps, on {args.device}, torch threads "
          f"{torch.get_num_threads()}; best of {args.repeat}\n")
    print("| | one by one (plain loop) | stacked | stacked / one by one |")
    print("|---|---:|---:|---:|")
    print(f"| training, s | {best['one by one']:.2f} | {best['stacked']:.2f} | "
          f"{best['stacked'] / best['one by one']:.3f} |")
    print(f"| ms per client-step | {1000 * best['one by one'] / steps:.2f} | "
          f"{1000 * best['stacked'] / steps:.2f} | |")
    print(f"| tests, s | {best['tests one by one']:.2f} | {best['tests stacked']:.2f} | "
          f"{best['tests stacked'] / best['tests one by one']:.3f} |")
    print(f"\nlargest relative difference: training loss {loss_diff:.1e}, test MSE "
          f"{mse_diff:.1e} (the stacked tests are of the one-by-one models)")


if __name__ == "__main__":
    main()
