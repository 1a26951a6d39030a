"""Faults on real Flower processes: a SuperNode killed and restarted, a ServerApp killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from experiments.processes import stop_tree

from .helpers import FLWR, app_files, flwr_run, free_port, start_superlink

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]


def _wait_for(path: Path, until, timeout: float, what: str, tmp: Path) -> dict:
    """Poll metrics.json until ``until(metrics)``; return it. The limits are generous (a
    passing test never waits them out; on CI's 2-core machine, beside CPU-bound neighbours, a
    one-round run of three members' nodes took 322 s); on a timeout, the tails of the test's
    process logs in ``tmp`` say why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            metrics = json.loads(path.read_text())
            if until(metrics):
                return metrics
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    logs = sorted(tmp.glob("*.log"))
    tails = "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-1500:]}" for log in logs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def _assert_same_rounds(resumed_path: Path, whole_path: Path) -> None:
    """A resumed run finished with every recorded number of the uninterrupted one."""
    resumed, whole = (json.loads(p.read_text()) for p in (resumed_path, whole_path))
    assert resumed["finished"] and whole["finished"]
    keys = ("client_accuracy", "client_loss", "train_loss", "trained_clients")
    assert [{k: r[k] for k in keys} for r in resumed["rounds"]] ==\
        [{k: r[k] for k in keys} for r in whole["rounds"]]


def _supernode(processes, port: int, pid: int, n: int, name: str):
    return processes.start(
        ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
         "--port", str(free_port()), "--node-config", f"partition-id={pid} num-partitions={n}"],
        name)


def test_a_supernode_killed_mid_run_and_restarted(processes):
    """Client 1's SuperNode dies (SIGKILL, no goodbye) and client 2's is stopped (SIGTERM: it
    leaves the federation) after round 1. For the killed node the SuperLink answers with
    Flower's node-unavailable error (its sender is the SuperLink), for the stopped one the
    SuperLink takes no message at all: both are recorded as node unavailable (or, once the
    round starts without them, not connected) in every later round and phase, never as a
    timeout; client 1, restarted after round 2, is back by round 4. What only processes
    show: Flower's own unavailable-node error and a node that comes back with a new id (the
    same faults scripted in process: tests/test_survival.py)."""
    port = start_superlink(processes, simulation=False)
    nodes = {pid: _supernode(processes, port, pid, 3, f"supernode{pid}") for pid in range(3)}
    results = processes.tmp / "results"
    log = open(processes.tmp / "run.log", "w")
    run = subprocess.Popen(
        [FLWR, "run", str(app_files()), "--stream", "--run-config",
         f"num-server-rounds=4 local-epochs=1 min-nodes=3 round-timeout=300 "
         f"results-dir='{results}' run-name='fault'"],
        env=processes.env, cwd=processes.tmp, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    path = results / "fault" / "metrics.json"
    try:
        _wait_for(path, lambda m: m["completed_rounds"] >= 1, 600, "round 1", processes.tmp)
        os.killpg(nodes[1].pid, signal.SIGKILL)  # client 1's SuperNode dies, with its children
        os.killpg(nodes[2].pid, signal.SIGTERM)  # client 2's leaves the federation
        nodes[1].wait(timeout=10)
        nodes[2].wait(timeout=30)
        _wait_for(path, lambda m: m["completed_rounds"] >= 2, 600, "round 2", processes.tmp)
        _supernode(processes, port, 1, 3, "supernode1-again")  # and comes back, as a new node
        metrics = _wait_for(path, lambda m: m["finished"], 900, "the end of the run", processes.tmp)
        run.wait(timeout=60)
    finally:
        stop_tree(run.pid, timeout=10)
        log.close()
    rounds = {r["round"]: r for r in metrics["rounds"]}
    missed = [r for r, rec in rounds.items() if 1 in [int(c) for c in rec.get("absent_clients", {})]]
    assert missed and min(missed) == 2, rounds  # absent from the round it died in
    assert rounds[4]["trained_clients"] == [0, 1]  # back, and training again
    assert "1" in rounds[4]["client_accuracy"]
    for r in missed:
        assert rounds[r]["trained_clients"] == [0]
        assert "1" in rounds[r]["absent_evaluation"], rounds[r]
    for r in (2, 3, 4):
        assert "2" in rounds[r]["absent_clients"] and "2" in rounds[r]["absent_evaluation"]
    reasons = [why for rec in rounds.values() for key in ("absent_clients", "absent_evaluation")
               for why in rec.get(key, {}).values()]
    assert reasons and all(why.startswith(("node unavailable", "node not connected"))
                           for why in reasons), reasons
    assert rounds[2]["absent_clients"]["1"].startswith("node unavailable"), rounds[2]
    said = (processes.tmp / "run.log").read_text()
    assert "Client 1 is back, on node" in said
    assert "dropped: that node was not sent" not in said, said


def test_a_server_killed_mid_run_and_resumed_gives_identical_metrics(processes):
    """What only a process shows: the SuperLink, with its ServerApp and Ray's engine, dies
    mid-run; a new SuperLink and `flwr run ... resume=true` finish with the numbers of an
    uninterrupted run. Every method's resume to the same numbers, Panacea's hypernetwork
    among them, is tested in process (tests/test_survival.py
    ``test_a_serverapp_killed_and_resumed_gives_the_uninterrupted_numbers``)."""
    link = processes.superlink(simulation=True)
    n = 3
    results = processes.tmp / "results"
    config = (f"strategy='fedamp' num-server-rounds=6 local-epochs=3 min-nodes=3 "
              f"results-dir='{results}'")
    federation = ["--federation-config", f"num-supernodes={n} client-resources-num-cpus=1"]
    flwr_run(processes, f"{config} run-name='whole'", federation)
    subprocess.run([FLWR, "run", str(app_files()), "--run-config", f"{config} run-name='cut'",
                    *federation],
                   env=processes.env, cwd=processes.tmp, capture_output=True, timeout=120)
    path = results / "cut" / "metrics.json"
    _wait_for(path, lambda m: m["completed_rounds"] >= 2, 600, "round 2", processes.tmp)
    # the server machine dies: the SuperLink with its ServerApp, mid-run, all at once
    stop_tree(link.proc.pid, timeout=10, grace=0)
    half = json.loads(path.read_text())
    assert not half["finished"] and half["completed_rounds"] < 6
    start_superlink(processes, simulation=True)  # a new SuperLink
    flwr_run(processes, f"{config} run-name='cut' resume=true", federation)
    _assert_same_rounds(path, results / "whole" / "metrics.json")


def test_a_run_outlives_its_superlink_killed_and_restarted_on_its_database(processes):
    """The SuperLink (with its ServerApp) is killed mid-round 2 and restarted on the same
    database and port; the SuperNodes come back to it; experiments.watch sees that the run
    ended because its SuperLink went away, waits for it, and submits the run again with
    resume = true: no manual step; the rounds before the kill kept as they were and the run
    finished. That a resumed run gives the numbers of an uninterrupted one is shown in process
    for every method (tests/test_survival.py) and through Flower's engine
    (``test_a_server_killed_mid_run_and_resumed_gives_identical_metrics``); here, what only
    processes show: a SuperLink killed and restarted on its database, its SuperNodes coming
    back to it, and the watcher."""
    link = processes.superlink(simulation=False, database=processes.tmp / "superlink.db")
    for pid in range(3):
        _supernode(processes, link.port, pid, 3, f"supernode{pid}")
    results = processes.tmp / "results"
    config = (f"strategy='fedamp' num-server-rounds=2 local-epochs=2 min-nodes=3 "
              f"results-dir='{results}'")
    watcher = processes.start(
        [str(Path(FLWR).parent / "python"), "-m", "experiments.watch", str(app_files()),
         "--run-config",
         f"{config} run-name='cut'", "--superlink-wait", "300", "--log",
         str(processes.tmp / "cut.log")], "watch")
    path = results / "cut" / "metrics.json"
    before = _wait_for(path, lambda m: m["completed_rounds"] >= 1, 600, "round 1",
                       processes.tmp)
    os.killpg(link.proc.pid, signal.SIGKILL)  # the SuperLink dies, its ServerApp with it
    link.proc.wait(timeout=10)
    time.sleep(3)
    link.restart(same_port=True)  # on the same database: it knows the run and the nodes
    assert _wait_exit(watcher, 900) == 0, processes.log("watch")[-3000:]
    said = processes.log("watch")
    assert "its SuperLink went away" in said and "with resume = true (1 of at most 5)" in said
    after = json.loads(path.read_text())
    assert after["finished"] and [r["round"] for r in after["rounds"]] == [1, 2]
    done = before["completed_rounds"]
    assert after["rounds"][:done] == before["rounds"][:done]  # kept as they were
    assert all(r["trained_clients"] == [0, 1, 2] for r in after["rounds"])


def _wait_exit(proc, timeout: float):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
