"""Time FedAMP/HeurFedAMP message passing: one Gram matrix vs a pairwise loop.

For ``--clients`` models of the CNN's size (1,663,370 parameters) and
ResNet-18's (11,173,962, CIFAR stem, 10 classes), it times, on the GPU when
there is one:

* vectorised: ``fedamp_weights`` / ``heurfedamp_weights`` (one Gram matrix
  accumulated in float64) plus every cloud model ``u = xi @ W`` (one matrix
  product into a buffer reused from round to round, as the strategy does);
* loop: the same maths with a Python loop over pairs of clients (distances,
  cosines) and over clients for the mix, the way a direct transcription of
  the paper would do it. With ``--loop-rows k`` only the first k clients' rows
  are looped and the time is scaled by clients / k (said in the output).

and prints the ratio loop / vectorised. Usage:

    python -m benchmarks.bench_message_passing [--clients 100] [--sizes cnn resnet18]
    python -m benchmarks.bench_message_passing --params 200000   # the 20x bar
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import torch

from strategies.fedamp import FedAMP, FedAMPSettings
from strategies.fedamp_math import cloud_models, heurfedamp_weights

SIZES = {"cnn": 1_663_370, "resnet18": 11_173_962}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


_CLOUDS: dict[str, torch.Tensor] = {}  # the cloud models' buffer, reused as the strategy does
#: (method, sigma): FedAMP with sigma large against the distances (weights nearly uniform,
#: the CIFAR-100 setting's 1e6) and small (distances / sigma = 10 here, as with the paper's
#: sigmas and trained models), HeurFedAMP
CASES = (("fedamp", 1e6), ("fedamp", 100.0), ("heurfedamp", 10.0))
ALPHA_K = 1e4


class Strategy:
    """The weights as the strategy computes them, round after round, and every cloud
    model."""

    def __init__(self, kind: str, sigma: float) -> None:
        self.kind, self.sigma, self.round = kind, sigma, 0
        self.fedamp = FedAMP(FedAMPSettings(fedamp_alpha_k=ALPHA_K), sigma=sigma)

    def __call__(self, models: torch.Tensor) -> torch.Tensor:
        self.round += 1
        key = f"{self.kind}{self.sigma}"
        if self.kind == "fedamp":
            xi, _ = self.fedamp.weights(self.round, models, None)  # rows rescaled at 1e4
        else:
            xi = heurfedamp_weights(models, sigma=self.sigma, self_weight=0.1)
        _CLOUDS[key] = cloud_models(xi, models, _CLOUDS.get(key))
        return _CLOUDS[key]


def loop(models: torch.Tensor, kind: str, sigma: float, rows: int) -> torch.Tensor:
    m = models.shape[0]
    out = []
    for i in range(rows):
        w = torch.zeros(m, dtype=torch.float64)
        for j in range(m):
            if j == i:
                continue
            if kind == "fedamp":
                d2 = float(((models[i] - models[j]) ** 2).sum())
                w[j] = ALPHA_K * math.exp(-d2 / sigma) / sigma
            else:
                cos = float(torch.nn.functional.cosine_similarity(models[i], models[j], dim=0))
                w[j] = sigma * cos
        if kind == "fedamp":
            s = w.sum()
            w = w / s if s > 1 else w
            w[i] = max(0.0, 1.0 - float(w.sum()))
        else:
            w[i] = float("-inf")
            w = 0.9 * torch.softmax(w, 0)
            w[i] = 0.1
        u = torch.zeros_like(models[0])
        for j in range(m):
            u += float(w[j]) * models[j]
        out.append(u)
    return torch.stack(out)


def timed(fn, device: torch.device, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--params", type=int, default=0,
                        help="models of this many parameters instead of --sizes")
    parser.add_argument("--loop-rows", type=int, default=0,
                        help="loop over only this many rows and scale (0 = all rows)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.clients} clients")
    print(f"{'model':9} {'params':>11} {'method':10} {'sigma':>6} "
          f"{'vectorised s':>12} {'loop s':>10} {'ratio':>8}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    sizes = {f"{args.params:,}": args.params} if args.params else {s: SIZES[s] for s in args.sizes}
    for size, d in sizes.items():
        models = (0.05 * torch.randn(args.clients, d, generator=gen)).to(device)
        rows = args.loop_rows or args.clients
        for kind, sigma in CASES:
            strategy = Strategy(kind, sigma)
            fast = timed(functools.partial(strategy, models), device, args.repeat)
            slow = timed(functools.partial(loop, models, kind, sigma, rows), device, 1)
            slow *= args.clients / rows
            got, ref = strategy(models)[:rows], loop(models, kind, sigma, min(rows, 2))
            assert torch.allclose(got[: len(ref)], ref, rtol=1e-3, atol=1e-5), "results differ"
            note = "" if rows == args.clients else f"  (loop timed on {rows} rows, scaled)"
            print(f"{size:9} {d:>11,} {kind:10} {sigma:6g} {fast:12.3f} "
                  f"{slow:10.2f} {slow / fast:8.1f}{note}", flush=True)

if __name__ == "__main__":
    main()
