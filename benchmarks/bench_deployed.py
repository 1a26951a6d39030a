"""A deployed round against Flower's own floor, on one loopback fleet.

For each config it starts, with its own FLWR_HOME and free ports, a deployment
SuperLink and N SuperNodes on 127.0.0.1 (``--node-config partition-id=i
num-partitions=N``; Flower's default subprocess isolation: a fresh
``flwr-clientapp`` process per message; their SuperExec looks for new tasks
every ``--task-poll`` seconds; each ClientApp process trains with the machine's
cores divided among the nodes, ``OMP_NUM_THREADS``), and runs on that same fleet,
one after the other:

* the floor: ``benchmarks/noop_app``, a Flower app whose ServerApp sends a train
  and an evaluate message to every node each round and pulls the replies every
  0.1 s (as this project's ServerApp does), and whose ClientApp imports only
  Flower and answers at once;
* this project's app with the config's run config.

It reads both ServerApps' "Round k done in s" lines and reports the mean of the
rounds after the first (steady state: the nodes' data cache is warm) and their
ratio, app / floor. Then it times, phase by phase, what one message's ClientApp
process of this app does before and during its work (interpreter, Flower,
torch, the app's modules, the client's data from the node's cache, the model,
one training step), in a fresh process like the ones the SuperNode starts.

    python -m benchmarks.bench_deployed [--configs default fmnist] [--data-dir ../shared/data]

Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from experiments.processes import SuperLink, free_port, stop_tree
from fedamp_flwr.server.results import strict_json

ROOT = Path(__file__).resolve().parents[1]

NOOP_APP = ROOT / "benchmarks" / "noop_app"
# name -> (number of clients, run config)
CONFIGS = {
    "default": (2, "num-server-rounds=6"),
    "fmnist": (4, "dataset='fmnist' partitioning='practical' local-epochs=2 "
                  "num-server-rounds=4 data-dir='{data}/fashion_mnist'"),
}
ROUND = re.compile(r"Round (\d+) done in ([0-9.]+)s")

# One message's ClientApp process of this app, phase by phase (the clock starts once the
# interpreter runs this code; the parent measures the interpreter's own start).
PHASES = r"""
import json, sys, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
import flwr.app, flwr.clientapp
mark("flower")
import torch
mark("torch")
from fedamp_flwr import client_app
mark("app modules")
from fedamp_flwr.config import RunConfig
import tasks
cfg = RunConfig.from_run_config(json.loads(sys.argv[1]))
dc = cfg.data_config(int(sys.argv[2]))
data = tasks.load_client_data(dc, 0)
mark("client data")
model = tasks.model_for(dc, cfg.model)
mark("model")
from tasks.train import train
train(model, data.x_train, data.y_train, epochs=1, batch_size=int(cfg.batch_size),
      learning_rate=float(cfg.learning_rate), optimizer=cfg.optimizer, steps=1)
mark("one training step")
print(json.dumps({b[0]: b[1] - a[1] for a, b in zip(marks, marks[1:])}, allow_nan=False))
"""


def round_seconds(log: str) -> dict[int, float]:
    """The ServerApp's per-round seconds, from its log."""
    return {int(r): float(s) for r, s in ROUND.findall(log)}


@contextlib.contextmanager
def fleet(n: int, home: Path, task_poll: float) -> Iterator[SuperLink]:
    """A deployment SuperLink with ``n`` SuperNodes on loopback; all stopped by pid at exit."""
    with SuperLink(home, simulation=False) as link:
        nodes = []
        try:
            # the machine's cores shared among its SuperNodes, as a fleet of one machine
            # per member would not need: each ClientApp process trains with its share
            threads = max(1, (os.cpu_count() or 1) // n)
            env = dict(link.env, FLWR_SUPEREXEC_TASK_POLL_INTERVAL=str(task_poll),
                       OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            for pid in range(n):
                log = open(home / f"supernode{pid}.log", "w")
                nodes.append(subprocess.Popen(
                    [shutil.which("flower-supernode") or "flower-supernode", "--insecure",
                     "--superlink", f"127.0.0.1:{link.port}", "--port", str(free_port()),
                     "--node-config", f"partition-id={pid} num-partitions={n}"],
                    env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
            yield link
        finally:
            for proc in nodes:
                stop_tree(proc.pid, timeout=20)
                proc.wait()


def flwr_run(link: SuperLink, app: Path, run_config: str, timeout: float) -> dict[int, float]:
    """Seconds per round of one ``flwr run`` of ``app`` on ``link``'s fleet."""
    args = [shutil.which("flwr") or "flwr", "run", str(app), "--stream",
            "--run-config", run_config]
    out = subprocess.run(args, env=link.env, cwd=link.home, capture_output=True, text=True,
                         timeout=timeout)
    seconds = round_seconds(out.stdout + out.stderr)
    if not seconds:
        raise RuntimeError(f"{app.name} logged no rounds; its output ends:\n"
                           f"{(out.stdout + out.stderr)[-3000:]}")
    return seconds


def as_python(run_config: str) -> dict:
    """A ``--run-config`` string as a dict."""
    values = dict(kv.split("=", 1) for kv in re.findall(r"\S+='[^']*'|\S+=\S+", run_config))
    return {k: (v.strip("'") if v.startswith("'") else json.loads(v)) for k, v in values.items()}


def clientapp_phases(run_config: str, n: int, cache: str, repeats: int = 3) -> dict[str, float]:
    """Seconds of each phase of a fresh ClientApp process of this app (the fastest of
    ``repeats`` processes by total), the interpreter's start included."""
    best: dict[str, float] | None = None
    for _ in range(repeats):
        started = time.perf_counter()
        empty = subprocess.run([sys.executable, "-c", "pass"], check=True)
        interpreter = time.perf_counter() - started
        cfg = json.dumps(as_python(run_config), allow_nan=False)
        out = subprocess.run([sys.executable, "-c", PHASES, cfg, str(n)], cwd=ROOT,
                             env=dict(os.environ, FEDAMP_CACHE_DIR=cache),
                             capture_output=True, text=True)
        if out.returncode != 0 or empty.returncode != 0:
            raise RuntimeError(f"the ClientApp phases failed: {out.stderr[-3000:]}")
        phases = {"interpreter": interpreter, **json.loads(out.stdout.strip().splitlines()[-1])}
        if best is None or sum(phases.values()) < sum(best.values()):
            best = phases
    assert best is not None
    return best


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
        rounds = as_python(run_config)["num-server-rounds"]
        with tempfile.TemporaryDirectory(prefix=f"bench-deployed-{name}-") as tmp:
            work = Path(tmp)
            os.environ["FEDAMP_CACHE_DIR"] = str(work / "node-cache")  # cold at round 1
            row: dict = {}
            with fleet(n, work / "fleet", args.task_poll) as link:
                runs = {"floor": (NOOP_APP, f"num-server-rounds={rounds} min-nodes={n}"),
                        "app": (ROOT, f"{run_config} results-dir='{work / 'results'}' "
                                      f"run-name='{name}'")}
                for kind, (app, cfg) in runs.items():
                    s = flwr_run(link, app, cfg, args.timeout)
                    later = [v for r, v in sorted(s.items()) if r > 1]
                    row[kind] = {"round_1": s[1], "later_mean": statistics.mean(later),
                                 "rounds": s}
                    print(f"{name} {kind}: round 1 {s[1]:.2f}s, rounds 2+ "
                          f"{row[kind]['later_mean']:.2f}s", flush=True)
            row["ratio"] = row["app"]["later_mean"] / row["floor"]["later_mean"]
            row["clientapp_phases"] = clientapp_phases(run_config, n, str(work / "node-cache"))
        report[name] = row
    print("\n| config | nodes | Flower's floor s/round | this app s/round | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, row in report.items():
        print(f"| {name} | {CONFIGS[name][0]} | {row['floor']['later_mean']:.2f} | "
              f"{row['app']['later_mean']:.2f} | {row['ratio']:.2f}x |")
    print("\nOne ClientApp process of this app, phase by phase (s):")
    for name, row in report.items():
        phases = row["clientapp_phases"]
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + f"; total {sum(phases.values()):.2f}")
    if args.out:  # strict JSON: a missing number is null, never NaN
        args.out.write_text(json.dumps(strict_json(report), indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
