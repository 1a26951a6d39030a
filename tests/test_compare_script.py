"""experiments/compare.py: a SuperLink of its own (free ports, its own FLWR_HOME), and a run
that fails is reported as failed (``flwr run`` exits 0 when the ServerApp fails)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from .helpers import ROOT

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(shutil.which("flwr") is None, reason="flwr is not installed")]


def test_compare_runs_on_its_own_ports_and_reports_a_failed_run(tmp_path):
    """With Flower's fixed local ports (39091, 39093) held by someone else, the script still
    runs; a strategy the ServerApp refuses is reported as failed, the other is tabulated."""
    held = []
    for port in (39091, 39093):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            pytest.skip(f"port {port} is in use on this machine")
        s.listen()
        held.append(s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_LOCAL_")}
    env.pop("FLWR_HOME", None)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "experiments.compare", "2", str(tmp_path / "out"),
             "num-server-rounds=1 local-epochs=1", "fedavg", "no-such-strategy"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        for s in held:
            s.close()
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert (tmp_path / "out" / "fedavg" / "metrics.json").is_file()
    assert "fedavg: finished:completed" in out.stdout
    assert "no-such-strategy: finished:failed" in out.stdout
    assert "| fedavg |" in out.stdout and "BMTA" in out.stdout
    assert "1 run(s) did not complete: no-such-strategy" in out.stdout
    assert "run config 'strategy' = 'no-such-strategy' is invalid" in (
        tmp_path / "out" / "no-such-strategy.log").read_text()
