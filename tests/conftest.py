"""Shared test helpers: where the real data is, and starting/stopping Flower processes."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from simulation import stop_tree

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FEDAMP_SHARED_DATA", ROOT.parent / "shared" / "data"))


def needs_data(name: str) -> Path:
    """Return ``../shared/data/<name>``, skipping the test when it is absent."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data folder {path} not found")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Processes a test started; stopped at teardown with what they started, by process ids."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ)
        self.env.update({
            "FLWR_HOME": str(tmp / "flwr-home"),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
        })

    def start(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, env=self.env, cwd=self.tmp, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def stop(self) -> None:
        """Stop each process with everything it started (see ``simulation.stop_tree``)."""
        for proc in reversed(self.procs):
            stop_tree(proc.pid, timeout=20)
            proc.wait()


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop()
