"""The traffic stand-in at the paper's scale: seconds per round, the server's share and peak
memory, per strategy, with one client per road sensor (PEMS-BAY's 325 by default).

Each strategy runs in a fresh process with the app's in-process engine (the real ServerApp
and ClientApp functions) on ``traffic-generated`` over the road graph ``--graph`` (its
``.npz`` in ``--data-dir``), ``--rounds`` rounds of the task's "auto" local work (one epoch
of batch 32, the GRU encoder-decoder). Reported per strategy: each round's seconds (the
ServerApp's "Round k done in" lines: every client's training and evaluation plus the
server's work), the server's seconds in them (time inside the strategy's configure and
aggregate calls: Panacea's hypernetwork steps and the generation of every client's model,
SFL's smoothing, FedAvg's average; summed over the rounds and divided by them), and the
process's peak resident memory. The floor is FedAvg's round in the same run: its server
does least. The server's time is taken in the base classes' calls: a strategy that overrides
them (pFedMe, SCAFFOLD, the non-convex combination) would be undercounted.

With ``--client-batching auto off`` every strategy runs once per mode (run config
``client-batching``: a round's clients trained as one stacked model, or one after another):
the table gives each mode's wall time, the ratio of the two, and the largest relative
difference of a round's mean test MSE between them.

    python -m benchmarks.bench_traffic [--graph pems-bay] [--rounds 2]
        [--strategies fedavg sfl panacea] [--device cpu] [--client-batching auto off]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
from strategies.core.base import FlowerStrategy, PersonalizedStrategy
server = [0.0]
def timed(cls, name):
    inner = getattr(cls, name)
    def wrapper(self, *a, **k):
        started = time.perf_counter()
        try:
            out = inner(self, *a, **k)
            return list(out) if name.startswith("configure") else out
        finally:
            server[0] += time.perf_counter() - started
    setattr(cls, name, wrapper)
for cls in (FlowerStrategy, PersonalizedStrategy):
    for name in ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate"):
        timed(cls, name)
from fedamp_flwr.tools.inprocess import run_inprocess
cfg, n = json.loads(sys.argv[2]), int(sys.argv[3])
started = time.perf_counter()
run_inprocess(cfg, n, None)
wall = time.perf_counter() - started
from pathlib import Path
rounds = json.loads((Path(cfg["results-dir"]) / "run" / "metrics.json").read_text())["rounds"]
print(json.dumps({"wall_s": wall, "server_s": server[0], "mse": [r["mean_mse"] for r in rounds],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
                 allow_nan=False))
"""
ROUND = re.compile(r"Round (\d+) done in ([0-9.]+)s")
CLIENTS = {"metr-la": 207, "pems-bay": 325}


def run(strategy: str, args: argparse.Namespace, batching: str = "auto") -> dict:
    """One strategy's run in a fresh process: its rounds' seconds, server seconds, memory,
    each round's mean test MSE."""
    n = CLIENTS[args.graph]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"strategy": strategy, "dataset": "traffic-generated", "traffic-graph": args.graph,
               "data-dir": str(Path(args.data_dir).resolve()), "num-server-rounds": args.rounds,
               "results-dir": tmp, "run-name": "run", "min-nodes": n, "checkpoint-every": 0,
               "save-models": "none", "server-device": args.device,
               "client-batching": batching}
        args_ = [sys.executable, "-c", CHILD, str(ROOT), json.dumps(cfg, allow_nan=False), str(n)]
        out = subprocess.run(args_, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"{strategy}: {out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["round_s"] = [float(s) for _, s in ROUND.findall(out.stderr + out.stdout)]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--graph", choices=sorted(CLIENTS), default="pems-bay")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "sensor_graphs"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--strategies", nargs="+", default=["fedavg", "sfl", "panacea"])
    p.add_argument("--device", default="cpu", help="the server's device (server-device)")
    p.add_argument("--client-batching", nargs="+", choices=["auto", "off"],
                   help="run each strategy in these modes and compare them (default: auto alone)")
    args = p.parse_args()
    if args.client_batching:
        return compare_batching(args)
    rows = {}
    for s in args.strategies:
        rows[s] = run(s, args)
        print(s, json.dumps(rows[s], allow_nan=False), flush=True)
    floor = rows.get("fedavg")
    print(f"\n{CLIENTS[args.graph]} clients (traffic-generated on {args.graph}'s road graph), "
          f"{args.rounds} rounds, server on {args.device}\n")
    print("| strategy | seconds per round | server seconds per round | round / FedAvg's | "
          "peak memory (MB) |")
    print("|---|---:|---:|---:|---:|")
    for s, r in rows.items():
        mean = sum(r["round_s"]) / max(len(r["round_s"]), 1)
        ratio = (f"{mean / (sum(floor['round_s']) / len(floor['round_s'])):.2f}"
                 if floor and floor["round_s"] else "")
        print(f"| {s} | {', '.join(f'{v:.1f}' for v in r['round_s'])} | "
              f"{r['server_s'] / args.rounds:.2f} | {ratio} | {r['peak_rss_mb']:.0f} |")


def compare_batching(args: argparse.Namespace) -> None:
    """Each strategy in each ``--client-batching`` mode: wall times, their ratio, and how far
    apart the rounds' mean test MSEs are."""
    modes, rows = args.client_batching, {}
    for s in args.strategies:
        for mode in modes:
            rows[s, mode] = run(s, args, mode)
            print(s, mode, json.dumps(rows[s, mode], allow_nan=False), flush=True)
    print(f"\n{CLIENTS[args.graph]} clients (traffic-generated on {args.graph}'s road graph), "
          f"{args.rounds} rounds, server on {args.device}\n")
    print("| strategy | " + " | ".join(f"{m}: wall s (rounds)" for m in modes)
          + " | wall ratio | largest relative MSE difference |")
    print("|---|" + "---:|" * (len(modes) + 2))
    for s in args.strategies:
        r = [rows[s, m] for m in modes]
        walls = " | ".join(f"{x['wall_s']:.1f} ({', '.join(f'{v:.1f}' for v in x['round_s'])})"
                           for x in r)
        diff = max(abs(a - b) / abs(b) for a, b in zip(r[0]["mse"], r[-1]["mse"]))
        print(f"| {s} | {walls} | {r[0]['wall_s'] / r[-1]['wall_s']:.3f} | {diff:.2e} |")


if __name__ == "__main__":
    main()
