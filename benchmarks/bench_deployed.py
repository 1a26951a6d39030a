"""A deployed round against a simulated one: the same run config on a loopback
SuperLink with SuperNodes and on Flower's simulation engine, in one run.

For each config it starts, with their own FLWR_HOME and free ports,

* a simulation SuperLink and ``flwr run . --federation-config num-supernodes=N``;
* a deployment SuperLink, N SuperNodes (`FLWR_SUPEREXEC_TASK_POLL_INTERVAL`
  from `--task-poll`) (``--node-config partition-id=i
  num-partitions=N``, Flower's default subprocess isolation: a fresh
  ``flwr-clientapp`` process per message) and ``flwr run .``;

reads the ServerApp's "Round k done in s" lines, and reports the seconds of
round 1 (the nodes' data cache is cold) and the mean of the later rounds
(steady state) for each, and their ratio. It also times the cold start of one
message's ClientApp process on its own (interpreter, imports, the client's
data from the node's cache, and without the cache).

    python benchmarks/bench_deployed.py [--configs default fmnist] [--data-dir ../shared/data]

Nothing else should run on the machine meanwhile: the two runs are timed one
after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.processes import SuperLink, free_port, stop_tree  # noqa: E402
from fedamp_flwr.results import strict_json  # noqa: E402

# name -> (number of clients, run config); fmnist: the deployment target
CONFIGS = {
    "default": (2, "num-server-rounds=4"),
    "fmnist": (4, "dataset='fmnist' partitioning='practical' local-epochs=2 "
                  "num-server-rounds=4 data-dir='{data}/fashion_mnist'"),
}
ROUND = re.compile(r"Round (\d+) done in ([0-9.]+)s")


def round_seconds(log: str) -> dict[int, float]:
    """The ServerApp's per-round seconds, from its log."""
    return {int(r): float(s) for r, s in ROUND.findall(log)}


def flwr_run(link: SuperLink, run_config: str, extra: list[str], timeout: float) -> str:
    args = [shutil.which("flwr") or "flwr", "run", str(ROOT), "--stream",
            "--run-config", run_config, *extra]
    out = subprocess.run(args, env=link.env, cwd=link.home, capture_output=True, text=True,
                         timeout=timeout)
    return out.stdout + out.stderr


def one(kind: str, n: int, run_config: str, work: Path, timeout: float,
        args_poll: float) -> dict[int, float]:
    """Seconds per round of one run, ``kind`` 'simulated' or 'deployed' (its SuperNodes'
    SuperExec looks for new ClientApp tasks every ``args_poll`` seconds)."""
    home = work / kind
    cfg = f"{run_config} results-dir='{work / 'results'}' run-name='{kind}'"
    with SuperLink(home, simulation=kind == "simulated") as link:
        nodes = []
        try:
            if kind == "deployed":
                env = dict(link.env, FLWR_SUPEREXEC_TASK_POLL_INTERVAL=str(args_poll))
                for pid in range(n):
                    log = open(home / f"supernode{pid}.log", "w")
                    nodes.append(subprocess.Popen(
                        [shutil.which("flower-supernode") or "flower-supernode", "--insecure",
                         "--superlink", f"127.0.0.1:{link.port}", "--port", str(free_port()),
                         "--node-config", f"partition-id={pid} num-partitions={n}"],
                        env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True))
                extra = []
            else:
                extra = ["--federation-config", f"num-supernodes={n} client-resources-num-cpus=1"]
            out = flwr_run(link, cfg, extra, timeout)
        finally:
            for proc in nodes:
                stop_tree(proc.pid, timeout=20)
                proc.wait()
    seconds = round_seconds(out)
    if not seconds:
        raise RuntimeError(f"{kind} run logged no rounds; its output ends:\n{out[-3000:]}")
    return seconds


def cold_start(run_config: str, n: int, cache: str) -> float:
    """Seconds for a fresh process to import the ClientApp and get client 0's data."""
    code = ("import sys\n"
            "from fedamp_flwr import client_app\n"
            "from fedamp_flwr.config import RunConfig\n"
            "import tasks\n"
            "cfg = RunConfig.from_run_config(eval(sys.argv[1]))\n"
            "tasks.load_client_data(cfg.data_config(int(sys.argv[2])), 0)\n")
    values = dict(kv.split("=", 1) for kv in re.findall(r"\S+='[^']*'|\S+=\S+", run_config))
    as_python = {k: (v.strip("'") if v.startswith("'") else json.loads(v)) for k, v in values.items()}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, repr(as_python), str(n)], cwd=ROOT,
                   env=dict(os.environ, FEDAMP_CACHE_DIR=cache), capture_output=True,
                   text=True, check=True)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--timeout", type=float, default=900, help="seconds per flwr run")
    p.add_argument("--task-poll", type=float, default=0.1,
                   help="the SuperNodes' FLWR_SUPEREXEC_TASK_POLL_INTERVAL (Flower's default: 1)")
    p.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = p.parse_args()
    report = {}
    for name in args.configs:
        n, run_config = CONFIGS[name]
        run_config = run_config.format(data=Path(args.data_dir).resolve())
        with tempfile.TemporaryDirectory(prefix=f"bench-deployed-{name}-") as tmp:
            work = Path(tmp)
            os.environ["FEDAMP_CACHE_DIR"] = str(work / "node-cache")  # cold at round 1
            row = {}
            for kind in ("simulated", "deployed"):
                s = one(kind, n, run_config, work, args.timeout, args.task_poll)
                later = [v for r, v in sorted(s.items()) if r > 1]
                row[kind] = {"round_1": s[1], "later_mean": statistics.mean(later), "rounds": s}
                print(f"{name} {kind}: round 1 {s[1]:.2f}s, rounds 2+ {row[kind]['later_mean']:.2f}s",
                      flush=True)
            row["ratio_later"] = row["deployed"]["later_mean"] / row["simulated"]["later_mean"]
            row["cold_start_cached"] = cold_start(run_config, n, str(work / "node-cache"))
            row["cold_start_uncached"] = cold_start(run_config, n, "off")
        report[name] = row
    print("\n| config | clients | simulated s/round | deployed s/round | ratio | deployed round 1 "
          "| cold start, cached / uncached |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in report.items():
        print(f"| {name} | {CONFIGS[name][0]} | {row['simulated']['later_mean']:.2f} | "
              f"{row['deployed']['later_mean']:.2f} | {row['ratio_later']:.2f}x | "
              f"{row['deployed']['round_1']:.2f} | {row['cold_start_cached']:.2f} s / "
              f"{row['cold_start_uncached']:.2f} s |")
    if args.out:  # strict JSON: a missing number is null, never NaN
        args.out.write_text(json.dumps(strict_json(report), indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
