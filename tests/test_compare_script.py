"""experiments/compare.sh runs on a SuperLink of its own: free ports, its own FLWR_HOME."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("flwr") is None, reason="flwr is not installed")


def test_compare_runs_while_flowers_fixed_ports_are_taken(tmp_path):
    """With Flower's fixed local ports (39091, 39093) held by someone else, the script still
    runs: it never touches them."""
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
            ["bash", str(ROOT / "experiments" / "compare.sh"), "2", str(tmp_path / "out"),
             "num-server-rounds=1 local-epochs=1", "fedavg"],
            env=env, capture_output=True, text=True, timeout=600)
    finally:
        for s in held:
            s.close()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (tmp_path / "out" / "fedavg" / "metrics.json").is_file()
    assert "fedavg" in out.stdout and "BMTA" in out.stdout
