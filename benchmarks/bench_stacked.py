"""One round's local training of every client's model: one after another in a plain PyTorch
loop (the floor: :func:`tasks.train.train`, no Flower, no app) against all of them stacked
(:func:`tasks.stacked.train_stacked`), in the same process, on the same data, models and
batches; then the same for their tests (:func:`tasks.train.evaluate` against
:func:`tasks.stacked.evaluate_stacked`).

The clients are the generated stand-in over a road graph's sensors (``--task traffic``, the
default: ``traffic-generated``, 207 on METR-LA's graph, 325 on PEMS-BAY's; each a GRU, with
the task's "auto" local work, one epoch of batch 32, Adam at 1e-3), or ``--clients`` clients of
FMNIST or MNIST in the practical partition (``--task fmnist``: each the McMahan CNN, Adam at
1e-3, batches of 100, ``--local-steps`` steps: 5 by default, as the task's 5 epochs one by one
take minutes here). Reported: seconds of each (the best of ``--repeat``, each repeat on fresh
copies of the models), their ratio, milliseconds per client-step, and the largest relative
difference of a client's training loss and of its test score between the two. The stacked CNN
is measured here on any device; a run stacks it on a GPU only (on a CPU it is the slower,
:data:`tasks.stacked.ONE_BY_ONE_ON_CPU`).

With ``--against FILE`` (another version of ``tasks/stacked.py``, e.g. ``git show
HEAD~1:tasks/stacked.py > /tmp/old.py``) it times that version's stacked training against this
tree's instead, in one process, alternating, ``--pairs`` pairs (the machine's speed drifts
between runs by more than a change makes): each pair's new / old and their median, and the
largest relative difference of a client's loss between the two.

    python -m benchmarks.bench_stacked [--graph metr-la] [--device cpu] [--repeat 2]
    python -m benchmarks.bench_stacked --task fmnist --clients 100 [--device cuda]
    python -m benchmarks.bench_stacked --against /tmp/old.py [--pairs 6]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

import tasks
from fedamp_flwr.config import RunConfig
from tasks import stacked
from tasks.train import Fit, Test, num_steps

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = {"metr-la": 207, "pems-bay": 325}
#: each task's folder in ../shared/data
FOLDERS = {"traffic": "sensor_graphs", "fmnist": "fashion_mnist", "mnist": "mnist"}


def _clients(args: argparse.Namespace) -> tuple[list[Fit], list[tasks.ClientData]]:
    folder = Path(args.data_dir or ROOT.parent / "shared" / "data" / FOLDERS[args.task])
    if args.task == "traffic":
        n, given = CLIENTS[args.graph], {"dataset": "traffic-generated",
                                         "traffic-graph": args.graph}
    else:
        n, given = args.clients, {"dataset": args.task, "local-steps": args.local_steps}
    cfg = RunConfig.from_run_config({**given, "data-dir": str(folder.resolve())})
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


def _largest_difference(alone: list, stacked_: list, scores: list, stacked_scores: list
                        ) -> str:
    """The largest relative difference of a client's training loss, and of its test score
    (MSE; for classification its test loss, and the largest difference of its accuracy)."""
    loss = max(abs(a - b) / abs(a) for a, b in zip(alone, stacked_) if a)
    if scores[0].mse is not None:
        mse = max(abs(a.mse - b.mse) / a.mse for a, b in zip(scores, stacked_scores))
        return f"training loss {loss:.1e}, test MSE {mse:.1e}"
    accuracy = max(abs(a.accuracy - b.accuracy) for a, b in zip(scores, stacked_scores))
    test_loss = max(abs(a.loss - b.loss) / a.loss for a, b in zip(scores, stacked_scores))
    return (f"training loss {loss:.1e}, test loss {test_loss:.1e}, test accuracy {accuracy:.1e} "
            "(absolute)")


def _paired(fits: list[Fit], against: str, pairs: int) -> None:
    """The stacked training of ``against`` (a version of tasks/stacked.py) and of this tree's,
    alternating, on fresh copies of the models."""
    spec = importlib.util.spec_from_file_location("tasks._stacked_against", against)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {against}: not a Python file")
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # its relative imports: this tree's tasks package
    spec.loader.exec_module(old)
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    losses: dict[str, list[float]] = {}
    for i in range(pairs):
        for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
            copies = [Fit(**{**vars(f), "model": copy.deepcopy(f.model)}) for f in fits]
            module = old if name == "old" else stacked
            s, losses[name] = _timed(lambda: module.train_stacked(copies))  # noqa: B023
            seconds[name].append(s)
    ratios = [n / o for n, o in zip(seconds["new"], seconds["old"])]
    print(f"{len(fits)} clients' stacked training, {against} (old) against this tree's (new), "
          f"{pairs} pairs, alternating")
    print("old s: " + ", ".join(f"{v:.2f}" for v in seconds["old"]))
    print("new s: " + ", ".join(f"{v:.2f}" for v in seconds["new"]))
    print("new / old: " + ", ".join(f"{r:.3f}" for r in ratios)
          + f"; median {statistics.median(ratios):.3f}")
    print("largest relative difference of a client's loss: "
          f"{max(abs(a - b) / abs(a) for a, b in zip(losses['old'], losses['new']) if a):.1e}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=["traffic", "fmnist", "mnist"], default="traffic")
    p.add_argument("--graph", choices=sorted(CLIENTS), default="metr-la", help="--task traffic")
    p.add_argument("--clients", type=int, default=100, help="--task fmnist or mnist")
    p.add_argument("--local-steps", type=int, default=5, help="--task fmnist or mnist")
    p.add_argument("--data-dir", default=None,
                   help="default: ../shared/data's sensor_graphs, fashion_mnist or mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--against", help="another tasks/stacked.py: time its stacked training "
                                     "against this tree's, paired")
    p.add_argument("--pairs", type=int, default=6, help="with --against")
    args = p.parse_args()
    if args.against and not Path(args.against).is_file():
        p.error(f"--against {args.against}: no such file (a version of tasks/stacked.py)")
    fits, data = _clients(args)
    if args.against:
        return _paired(fits, args.against, args.pairs)
    steps = sum(num_steps(len(f.x), f.batch_size, f.epochs, f.steps) for f in fits)
    rows: dict[str, list[float]] = {"one by one": [], "stacked": [], "tests one by one": [],
                                    "tests stacked": []}
    for _ in range(args.repeat):
        alone, losses, scores, stacked_scores = _one_repeat(fits, data, args.device, rows)
    best = {k: min(v) for k, v in rows.items()}
    what = (f"{len(fits)} sensors' GRUs (traffic-generated on {args.graph}'s road graph)"
            if args.task == "traffic" else
            f"{len(fits)} {args.task} clients' CNNs (practical partition)")
    parts, side = stacked.chunks(fits, list(range(len(fits))), max(len(f.x) for f in fits),
                                 steps=max(num_steps(len(f.x), f.batch_size, f.epochs, f.steps)
                                           for f in fits))
    print(f"{what}, one round's local work: {steps} client-steps, on {args.device}, torch "
          f"threads {torch.get_num_threads()}, stacked in {len(parts)} chunks of at most "
          f"{max(len(c) for c in parts)}, {side} side by side; best of {args.repeat}\n")
    print("| | one by one (plain loop) | stacked | stacked / one by one |")
    print("|---|---:|---:|---:|")
    print(f"| training, s | {best['one by one']:.2f} | {best['stacked']:.2f} | "
          f"{best['stacked'] / best['one by one']:.3f} |")
    print(f"| ms per client-step | {1000 * best['one by one'] / steps:.2f} | "
          f"{1000 * best['stacked'] / steps:.2f} | |")
    print(f"| tests, s | {best['tests one by one']:.2f} | {best['tests stacked']:.2f} | "
          f"{best['tests stacked'] / best['tests one by one']:.3f} |")
    print(f"\nlargest relative difference: "
          f"{_largest_difference(alone, losses, scores, stacked_scores)} (the stacked tests are "
          "of the one-by-one models)")


if __name__ == "__main__":
    main()
