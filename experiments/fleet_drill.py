"""A fault drill on a loopback fleet: SuperNodes killed mid-run and some restarted, and every
absence the run records checked against what happened.

    python -m experiments.fleet_drill --nodes 12 --kill 3 --restart 2 --out /tmp/drill

A deployment SuperLink and ``--nodes`` SuperNodes (partition i of n) on this machine;
a run of ``--rounds`` rounds (FedAMP, synthetic data, one local epoch). Once round
``--kill-after`` is written, ``--kill`` SuperNodes die (SIGKILL, with the ClientApps they
started: no goodbye), and once the round after it is written, ``--restart`` of them start
again (new node ids). At the end every absence in ``metrics.json`` (training and
evaluation, every round) must have a true reason: a killed client is ``node unavailable``
or ``node not connected``, never a timeout (the rounds are shorter than
``round-timeout``); no other client is absent; a restarted client trains again; the log
drops no reply. Prints the absences by round and exits 1 naming what is not so.

What the tests run at a smaller scale (4 SuperNodes): tests/test_faults_e2e.py; the
drill's result on a 2-core machine is in docs/survival.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from strategies.core.records import ABSENT, TRAINED, RunFile

from .processes import SuperLink, free_port, stop_tree

ROOT = Path(__file__).resolve().parents[1]
TRUE_REASONS = ("node unavailable", "node not connected")


def _metrics(path: Path) -> RunFile | None:
    try:
        return RunFile.read(path)
    except (OSError, ValueError):
        return None


def _wait(path: Path, until, timeout: float, what: str, run: subprocess.Popen) -> RunFile:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = _metrics(path)
        if metrics is not None and until(metrics):
            return metrics
        if run.poll() is not None and (metrics is None or not until(metrics)):
            raise SystemExit(f"the run ended before {what}; see its log")
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def problems(metrics: RunFile, killed: set[int], restarted: set[int], timeout: float,
             log: str) -> list[str]:
    """What in a finished drill's records is not as it happened (empty: every reason true)."""
    found = []
    rounds = metrics.rounds
    for rec in rounds:
        for key in ABSENT.values():
            for cid, why in rec.get(key, {}).items():
                if int(cid) not in killed:
                    found.append(f"round {rec['round']}: client {cid} in {key} but never "
                                 f"killed: {why}")
                elif not str(why).startswith(TRUE_REASONS):
                    found.append(f"round {rec['round']}: client {cid} in {key}: {why!r} "
                                 f"(rounds are shorter than the timeout, {timeout:g} s)")
    last = rounds[-1] if rounds else {}
    for cid in sorted(restarted):
        if cid not in last.get(TRAINED, []):
            found.append(f"client {cid} was restarted and did not train in the last round")
    if not metrics.finished:
        found.append("the run did not finish")
    if "dropped: that node was not sent" in log:
        found.append("the log dropped a reply it could not match to a message")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.fleet_drill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--kill", type=int, default=3)
    parser.add_argument("--restart", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kill-after", type=int, default=1)
    parser.add_argument("--round-timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, required=True, help="a folder for the drill's files")
    args = parser.parse_args(argv)
    if not 0 < args.kill < args.nodes or not 0 <= args.restart <= args.kill or \
            not 1 <= args.kill_after < args.rounds - 1:
        parser.error("allowed: 0 < kill < nodes, 0 <= restart <= kill, 1 <= kill-after < "
                     "rounds - 1")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    link = SuperLink(out / "flwr-home", simulation=False).__enter__()
    nodes: dict[int, subprocess.Popen] = {}
    logs = []

    def supernode(pid: int, tag: str) -> subprocess.Popen:
        log = open(out / f"supernode{pid}{tag}.log", "w")
        logs.append(log)
        return subprocess.Popen(
            ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link.port}",
             "--port", str(free_port()), "--node-config",
             f"partition-id={pid} num-partitions={args.nodes}"],
            env=link.env, cwd=out, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    killed = set(range(1, args.nodes, max(1, (args.nodes - 1) // args.kill)))
    killed = set(sorted(killed)[:args.kill])
    restarted = set(sorted(killed)[:args.restart])
    run_log = open(out / "run.log", "w")
    started = time.monotonic()
    try:
        metrics = _drill(args, out, link, supernode, nodes, killed, restarted, run_log)
    finally:
        for proc in nodes.values():
            stop_tree(proc.pid, timeout=10)
        link.__exit__(None, None, None)
        for log in [*logs, run_log]:
            log.close()
    print(f"{args.nodes} SuperNodes, {args.rounds} rounds in {time.monotonic() - started:.0f} s "
          f"(round-timeout {args.round_timeout:g} s)")
    return _said(metrics, killed, restarted, args.round_timeout, out)


def _drill(args: argparse.Namespace, out: Path, link: SuperLink, supernode, nodes: dict,
           killed: set[int], restarted: set[int], run_log) -> RunFile:
    """The run, with ``killed`` nodes killed after round ``--kill-after`` and ``restarted``
    ones started again a round later; its final metrics.json."""
    run = None
    try:
        for pid in range(args.nodes):
            nodes[pid] = supernode(pid, "")
        results = out / "results"
        run = subprocess.Popen(
            ["flwr", "run", str(ROOT), "--stream", "--run-config",
             f"num-server-rounds={args.rounds} local-epochs=1 min-nodes={args.nodes} "
             f"round-timeout={args.round_timeout:g} results-dir='{results}' run-name='drill' "
             "overwrite=true"],
            env=link.env, cwd=out, stdout=run_log, stderr=subprocess.STDOUT,
            start_new_session=True)
        path = results / "drill" / "metrics.json"
        budget = 600 + 300 * args.rounds
        _wait(path, lambda m: m.completed_rounds >= args.kill_after, budget,
              f"round {args.kill_after}", run)
        for pid in sorted(killed):
            os.killpg(nodes[pid].pid, signal.SIGKILL)
        print(f"after round {args.kill_after}: killed clients {sorted(killed)} (SIGKILL)")
        _wait(path, lambda m: m.completed_rounds >= args.kill_after + 1, budget,
              f"round {args.kill_after + 1}", run)
        for pid in sorted(restarted):
            nodes[pid] = supernode(pid, "-again")
        print(f"after round {args.kill_after + 1}: restarted clients {sorted(restarted)}")
        metrics = _wait(path, lambda m: m.finished, budget, "the end of the run", run)
        run.wait(timeout=120)
        return metrics
    finally:
        if run is not None:
            stop_tree(run.pid, timeout=10)


def _said(metrics: RunFile, killed: set[int], restarted: set[int], round_timeout: float,
          out: Path) -> int:
    """Each round's absences as recorded, and whether every reason is true (0) or not (1)."""
    for rec in metrics.rounds:
        absent = {k: rec.get(k, {}) for k in ABSENT.values()}
        phase = {key: name for name, key in ABSENT.items()}
        said = "; ".join(f"{phase[k]} {c}: {why[:60]}" for k, v in absent.items()
                         for c, why in sorted(v.items(), key=lambda i: int(i[0]))) or "none"
        print(f"round {rec['round']}: trained {len(rec[TRAINED])}, absent: {said}")
    found = problems(metrics, killed, restarted, round_timeout, (out / "run.log").read_text())
    for p in found:
        print(f"NOT TRUE: {p}")
    print("every absence's reason is true" if not found else f"{len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
