"""1,000 clients on the default task: seconds per round and peak memory, per strategy.

Each strategy runs in a fresh process with the app's in-process engine (the
real ServerApp and ClientApp functions, without Flower's transport: on 2
cores, 1,000 Ray workers would measure Ray), on the default run config
(synthetic data, practical partitioning, its MLP) with ``--clients`` clients
for ``--rounds`` rounds. Reported per strategy: the seconds of each round
(the ServerApp's "Round k done in" lines: all clients' training and
evaluation plus the server's work), the process's peak resident memory
(server and every client's data together) and, for the strategies that keep
a per-client store, that store's size (clients x parameters x 4 bytes), and
the size of the round's xi file. FedAvg is the baseline: its peak memory
holds everything but a store.

    python -m benchmarks.bench_scale [--clients 1000] [--rounds 2]
        [--strategies fedavg fedamp heurfedamp panacea]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from strategies.core.records import ACCURACY_SCORE, RunFile, mean_score

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
from fedamp_flwr.tools.inprocess import run_inprocess
cfg, n = json.loads(sys.argv[2]), int(sys.argv[3])
started = time.perf_counter()
run_inprocess(cfg, n, None)
print(json.dumps({"wall_s": time.perf_counter() - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
                 allow_nan=False))
"""
ROUND = re.compile(r"Round (\d+) done in ([0-9.]+)s")


def run_child(run_config: dict, n: int) -> dict:
    """Run ``run_config`` on ``n`` clients in a fresh process; its seconds per round, peak
    memory, metrics.json (``metrics``) and the sizes of its outputs."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        cfg = {"results-dir": tmp, "run-name": "run", "min-nodes": n, **run_config}
        args = [sys.executable, "-c", CHILD, str(ROOT), json.dumps(cfg, allow_nan=False), str(n)]
        out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"{run_config}: {out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["round_s"] = [float(s) for _, s in ROUND.findall(out.stderr + out.stdout)]
        folder = Path(tmp) / "run"
        row["metrics"] = RunFile.read(folder / "metrics.json")
        xi_files = sorted((folder / "xi").glob("round-*.npy"))
        row["xi_file_mb"] = xi_files[-1].stat().st_size / 2**20 if xi_files else None
        row["metrics_json_kb"] = (folder / "metrics.json").stat().st_size / 1024
    return row


def run(strategy: str, n: int, rounds: int) -> dict:
    cfg = {"strategy": strategy, "num-server-rounds": rounds, "local-epochs": 1,
           **({"graph": "groups"} if strategy == "panacea" else {})}
    row = run_child(cfg, n)
    row["final_mean_accuracy"] = mean_score(row.pop("metrics").rounds[-1], ACCURACY_SCORE)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--strategies", nargs="+", default=["fedavg", "fedamp", "heurfedamp", "panacea"])
    args = p.parse_args()
    import tasks
    from fedamp_flwr.config import RunConfig

    cfg = RunConfig.from_run_config({})
    info = tasks.data_info(cfg.data_config(args.clients))
    params = sum(p.numel() for p in tasks.get_task(cfg.dataset).build_model(info).parameters())
    store_mb = args.clients * params * 4 / 2**20
    print(f"{args.clients} clients, model of {params:,} parameters: a store of clients x "
          f"parameters x 4 bytes = {store_mb:.1f} MB")
    rows = {}
    for s in args.strategies:
        rows[s] = run(s, args.clients, args.rounds)
        print(s, json.dumps(rows[s], allow_nan=False), flush=True)
    base = rows.get("fedavg", {}).get("peak_rss_mb")
    print("\n| strategy | rounds | seconds per round | peak memory (MB) | over FedAvg (MB) "
          "| final mean accuracy | xi file per round (MB) | metrics.json (KB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s, r in rows.items():
        over = f"{r['peak_rss_mb'] - base:+.0f}" if base else ""
        xi = f"{r['xi_file_mb']:.2f}" if r["xi_file_mb"] else ""
        per_round = ", ".join(f"{v:.1f}" for v in r["round_s"])
        print(f"| {s} | {len(r['round_s'])} | {per_round} | {r['peak_rss_mb']:.0f} | {over} | "
              f"{100 * r['final_mean_accuracy']:.2f} | {xi} | {r['metrics_json_kb']:.0f} |")


if __name__ == "__main__":
    main()
