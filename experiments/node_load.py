"""A member's node under load: how many ClientApp processes does it keep, and why?

    python -m experiments.node_load --load 8 --out /tmp/node-load

Flower 1.41 runs every message a SuperNode receives in a fresh ``flwr-clientapp`` process
that its SuperExec starts once it claims the message's task; the claim holds for 30 s
(``HEARTBEAT_DEFAULT_INTERVAL``), within which the process must send its first heartbeat,
or the task goes back to pending and the SuperExec starts another process for it (the
first one is not stopped: it fails later with ``Runtime task-token authentication
failed``). This drill measures, on this machine with ``--load`` CPU-bound neighbours
(``python -c "while True: pass"``, at ``--load-nice``):

1. the start of a ClientApp process: Python and Flower's imports up to its first heartbeat
   (``flwr.supernode.runtime.run_clientapp``), and this app's imports after it
   (``fedamp_flwr.client_app``), each the median wall time of ``--repeats`` fresh processes;
2. a loopback fleet (a SuperLink and three members' SuperNodes, each with its own file): a
   FedAMP run of ``--rounds`` rounds, then resumed to twice as many rounds while a fourth
   member joins; every 0.25 s it counts each SuperNode's ``flwr-clientapp`` processes (the
   most at once), and at the end the processes each node started (each one's first log
   line) against the messages it handled, and the token failures in its log.

Prints one line per measure and exits 1 where a node kept more than ``--most`` ClientApp
processes at once or a run did not finish. The measured numbers: docs/federation.md
("A node under load").
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psutil

from strategies.core.records import RunFile

from .flower_cli import app_snapshot
from .processes import SuperLink, free_port, stop_tree

ROOT = Path(__file__).resolve().parents[1]
FLOWER_START = "import flwr.supernode.cli, flwr.supernode.runtime.run_clientapp"
APP_START = FLOWER_START + "; import fedamp_flwr.client_app"
TOKEN_FAILED = "task-token authentication failed"
RECEIVED = "Received successfully"  # a SuperNode's log line for each message it pulls
STARTED = "Start `flwr-clientapp` process"  # each ClientApp process's first log line


def start_seconds(code: str, repeats: int, env: dict[str, str]) -> float:
    """The median wall time of ``python -c code`` in a fresh process."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                       capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def member_file(path: Path, seed: int) -> Path:
    """A member's own data: 3 classes around centres of its own, 6 features."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(3, 6))
    y = rng.integers(0, 3, size=150)
    x = (centres[y] + rng.normal(size=(150, 6))).astype(np.float32)
    np.savez(path, x=x[:120], y=y[:120], x_test=x[120:], y_test=y[120:])
    return path


def _clientapp(process: psutil.Process) -> bool:
    return "flwr-clientapp" in " ".join(process.cmdline())


class Watch:
    """Every 0.25 s, the ``flwr-clientapp`` processes under each SuperNode: the most at once
    and every process id seen."""

    def __init__(self) -> None:
        self.nodes: dict[str, psutil.Process] = {}
        self.most: dict[str, int] = {}
        self.seen: dict[str, set[int]] = {}
        self._apps: dict[int, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, name: str, pid: int) -> None:
        self.nodes[name] = psutil.Process(pid)
        self.most.setdefault(name, 0)
        self.seen.setdefault(name, set())

    def _is_app(self, process: psutil.Process) -> bool:
        """Whether ``process`` is a ClientApp process, remembered by process id: a process
        that has just exited (a zombie until its SuperExec reaps it) no longer shows its
        command line, and must neither be missed nor spoil the other processes' sample."""
        if process.pid not in self._apps:
            try:
                self._apps[process.pid] = _clientapp(process)
            except psutil.Error:
                return False
        return self._apps[process.pid]

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for name, node in list(self.nodes.items()):
                try:
                    tree = {p.pid: p for p in node.children(recursive=True)}
                except psutil.Error:
                    continue
                apps = []
                for pid, process in tree.items():
                    try:
                        parent = process.ppid()
                    except psutil.Error:
                        parent = None
                    if self._is_app(process) and not (
                            parent in tree and self._is_app(tree[parent])):  # not its forks
                        apps.append(pid)
                self.most[name] = max(self.most[name], len(apps))
                self.seen[name].update(apps)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.node_load",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=8, help="CPU-bound neighbours")
    parser.add_argument("--load-nice", type=int, default=0, help="their nice value")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=900.0,
                        help="seconds a run may take before the drill calls it stalled")
    parser.add_argument("--most", type=int, default=3,
                        help="the most ClientApp processes a node may keep at once")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    # stopped (SIGTERM): the neighbours and the fleet are stopped too (the finally below)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    link = SuperLink(out / "flwr-home", simulation=False)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                preexec_fn=lambda: os.nice(args.load_nice))
               for _ in range(args.load)]
    fleet = Fleet(out, link)
    found: list[str] = []
    try:
        flower = start_seconds(FLOWER_START, args.repeats, link.env)
        app = start_seconds(APP_START, args.repeats, link.env) - flower
        print(f"load {args.load} (nice {args.load_nice}) on {os.cpu_count()} cores, load "
              f"average {os.getloadavg()[0]:.1f}: a ClientApp process reaches its first "
              f"heartbeat after {flower:.2f} s (Python and Flower's imports); this app's "
              f"imports take {app:.2f} s more")
        link.__enter__()
        with Watch() as watch:
            found += fleet.runs(args, watch)
        found += fleet.counts(watch, args.most)
    finally:
        fleet.stop()
        link.__exit__(None, None, None)
        for burner in burners:
            burner.kill()
            burner.wait()
        signal.signal(signal.SIGTERM, previous)
    for problem in found:
        print(f"NOT SO: {problem}")
    return 1 if found else 0


class Fleet:
    """The drill's member SuperNodes (their logs in ``out``) and its two runs."""

    def __init__(self, out: Path, link: SuperLink) -> None:
        self.out, self.link = out, link
        self.nodes: dict[str, subprocess.Popen] = {}
        self.logs: list = []

    def supernode(self, name: str) -> subprocess.Popen:
        log = open(self.out / f"{name}.log", "w")
        self.logs.append(log)
        data = member_file(self.out / f"{name}.npz", len(self.nodes))
        proc = subprocess.Popen(
            ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.link.port}",
             "--port", str(free_port()), "--node-config",
             f"data-path='{data}' client-id='{name}' identity-dir='{self.out / name}-id'"],
            env=self.link.env, cwd=self.out, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.nodes[name] = proc
        return proc

    def runs(self, args: argparse.Namespace, watch: Watch) -> list[str]:
        """Three members run ``--rounds`` rounds; then, with a fourth, the run resumes for as
        many more. What did not finish."""
        with app_snapshot(ROOT) as app:  # both runs the same code, its FAB built once
            return self._runs(args, watch, app)

    def _runs(self, args: argparse.Namespace, watch: Watch, app: Path) -> list[str]:
        """:meth:`runs`, of the app's files in ``app``."""
        out, results = self.out, self.out / "results"
        common = (f"dataset='members' member-input-shape='6' member-outputs=3 local-epochs=1 "
                  f"results-dir='{results}' run-name='load' round-timeout=600")
        for name in ("site-a", "site-b", "site-c"):
            watch.add(name, self.supernode(name).pid)
        found = []
        for step, config, rounds in (
                ("first", f"{common} min-nodes=3 num-server-rounds={args.rounds} "
                          "overwrite=true", args.rounds),
                ("resumed", f"{common} min-nodes=4 num-server-rounds={2 * args.rounds} "
                            "resume=true", 2 * args.rounds)):
            if step == "resumed":
                watch.add("site-d", self.supernode("site-d").pid)
            started = time.monotonic()
            with open(out / f"run-{step}.log", "w") as log:
                run = subprocess.Popen(["flwr", "run", str(app), "--stream", "--run-config",
                                        config], env=self.link.env, cwd=out, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    run.wait(timeout=args.run_timeout)
                except subprocess.TimeoutExpired:
                    print(f"{step} run: stalled for {args.run_timeout:.0f} s; ClientApp "
                          f"processes started so far { {n: len(s) for n, s in watch.seen.items()} }")
                stop_tree(run.pid, timeout=10)
            path = results / "load" / "metrics.json"
            metrics = RunFile.read(path) if path.is_file() else RunFile(finished=False)
            done = metrics.finished and metrics.completed_rounds == rounds
            print(f"{step} run: {'finished' if done else 'NOT finished'} in "
                  f"{time.monotonic() - started:.0f} s")
            if not done:
                found.append(f"the {step} run did not finish (see {out}/run-{step}.log)")
        return found

    def counts(self, watch: Watch, most: int) -> list[str]:
        """Each node's messages against its ClientApp processes; a node that kept more than
        ``most`` at once."""
        for log in self.logs:
            log.flush()
        found = []
        for name in self.nodes:
            text = (self.out / f"{name}.log").read_text()
            # the processes' own first lines count them; the 0.25 s sampler could miss one
            started = max(text.count(STARTED), len(watch.seen[name]))
            print(f"{name}: {text.count(RECEIVED)} messages received, {started} "
                  f"ClientApp processes started, at most {watch.most[name]} at once; "
                  f"{text.count(TOKEN_FAILED)} token failure(s) in its log")
            if watch.most[name] > most:
                found.append(f"{name} kept {watch.most[name]} ClientApp processes at once")
        return found

    def stop(self) -> None:
        for proc in self.nodes.values():
            stop_tree(proc.pid, timeout=10)
        for log in self.logs:
            log.close()


if __name__ == "__main__":
    sys.exit(main())
