"""Processes of a Flower run: free ports, a local SuperLink, and stopping process trees.

Portable (Linux, macOS): the process tree is read with psutil, never from
``/proc``. Used by the experiment runner (``simulation.py``), the comparison
script (``experiments/compare.py``), the benchmarks and the tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None,
                  host: str = "127.0.0.1") -> bool:
    """Wait until something listens on ``host:port``; False after ``timeout`` seconds or as soon
    as ``proc`` (the process that should listen) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.1)
    return False


def process_tree(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs (a zombie does not)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_tree(pid: int, timeout: float = 30.0, grace: float = 5.0) -> None:
    """Stop process ``pid`` and everything it started, by their process ids
    (:func:`stop_trees` of ``[pid]``)."""
    stop_trees([pid], timeout, grace)


def stop_trees(pids: list[int], timeout: float = 30.0, grace: float = 5.0) -> None:
    """Stop each process of ``pids`` and everything it started, by their process ids.

    The trees are taken once (psutil), before anything is stopped: Flower's
    SuperLink starts a SuperExec in a session of its own, which starts the
    simulation and its Ray processes, so stopping the SuperLink's process group
    alone would leave them running. Each of ``pids`` gets SIGTERM first, alone, and
    up to ``grace`` seconds (all of them together) to end by itself while what it
    started still runs: a SuperNode then leaves its SuperLink (it deactivates and
    unregisters). Signalled at once with its SuperExec, it sometimes did not, and the
    SuperLink held the node as connected until its heartbeat ran out (about 30 s
    here), which the next run's first message to every node waited for. Then every
    process of the trees gets SIGTERM; on POSIX, so does every process group of the
    trees (never this process's own), which also reaches a group member whose parent
    has already exited. What is still alive after ``timeout`` seconds gets SIGKILL.
    """
    tree = [p for pid in pids for p in process_tree(pid)]
    if not tree:
        return
    wanted = set(pids)
    roots = [p for p in tree if p.pid in wanted]
    if grace > 0:
        for root in roots:
            try:
                root.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        psutil.wait_procs(roots, timeout=grace)  # ended, or past their grace: all below
    groups: set[int] = set()
    if hasattr(os, "killpg"):
        for p in tree:
            try:
                groups.add(os.getpgid(p.pid))
            except OSError:
                pass
        groups.discard(os.getpgrp())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in tree:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        for group in groups:
            try:
                os.killpg(group, sig)
            except OSError:
                pass
        _, left = psutil.wait_procs(tree, timeout=timeout)
        if not [p for p in left if alive(p)]:
            return


def processes_with_env(key: str, value: str) -> list[int]:
    """Process ids of the live processes (of this user) whose environment has ``key=value``.

    How the tests and the runner check that nothing of a run is left: every
    process a SuperLink starts inherits its ``FLWR_HOME``.
    """
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(key) == value and alive(p):
                found.append(p.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
    return found


def flower_env(home: Path) -> dict[str, str]:
    """The environment of Flower processes with their own ``FLWR_HOME``: no dependency
    installation per run, no update check, unbuffered output."""
    return dict(os.environ, FLWR_HOME=str(home), PYTHONUNBUFFERED="1",
                FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                FLWR_DISABLE_UPDATE_CHECK="1")


#: Ray addresses on this machine's loopback interface (a cluster whose nodes run here).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


class SuperLink:
    """A local ``flower-superlink`` with its own ``FLWR_HOME`` and free ports.

    Used as a context manager; stopped, with every process it started, by
    their process ids (:func:`stop_tree`). Its CLI connection is written to
    ``<home>/config.toml`` as the default one, so that ``flwr`` commands run
    with :attr:`env` reach this SuperLink and no other.

    Parameters
    ----------
    home : Path
        Its ``FLWR_HOME``.
    ray_address : str or None
        Passed to the simulation as ``RAY_ADDRESS`` (attach to a running Ray cluster);
        on loopback (``127.0.0.1:PORT``) the simulation's Ray driver stays on loopback.
    simulation : bool
        True: ``--simulation`` (Flower's Ray engine runs the ClientApps); False: a
        deployment SuperLink, which SuperNodes join at ``127.0.0.1:<port>``.
    database : Path or None
        Its state in this file (``--database``; a restart keeps its runs and nodes),
        else in memory.
    """

    def __init__(self, home: Path, ray_address: str | None = None, simulation: bool = True,
                 database: Path | None = None) -> None:
        self.home, self.simulation, self.database = Path(home), simulation, database
        self.port = 0  # the SuperLink's HTTP port: SuperNodes and the CLI connect here
        self.env = flower_env(self.home)
        if ray_address:
            self.env["RAY_ADDRESS"] = ray_address
            if ray_address.rpartition(":")[0] in LOOPBACK_HOSTS:
                # Ray turns 127.0.0.1 into the machine's network address before it
                # connects (ray._private.services.resolve_ip_for_localhost); a cluster
                # whose nodes run on loopback is reached on loopback only without that
                self.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        self.proc: subprocess.Popen | None = None
        self._log: IO[str] | None = None

    def __enter__(self) -> SuperLink:
        exe = shutil.which("flower-superlink")
        if exe is None:
            raise RuntimeError("flower-superlink is not on PATH: activate the virtual environment")
        self.home.mkdir(parents=True, exist_ok=True)
        # Flower 1.41 serves the Fleet, Control and runtime APIs on one HTTP port
        self.port = self.port or free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        log_path = self.home / "superlink.log"
        self._log = open(log_path, "a")
        self.proc = subprocess.Popen(
            [exe, "--insecure", *(["--simulation"] if self.simulation else []),
             "--isolation", "subprocess", "--host", "127.0.0.1", "--port", str(self.port),
             *(["--database", str(self.database)] if self.database else [])],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_for_port(self.port, 60, self.proc):
            self.__exit__(None, None, None)
            raise RuntimeError(f"the SuperLink did not start; see {log_path}")
        return self

    def restart(self, same_port: bool = False) -> None:
        """Stop this SuperLink with everything it started, and start a fresh one (on the same
        port: its SuperNodes come back to it)."""
        self.__exit__(None, None, None)
        if not same_port:
            self.port = 0
        self.__enter__()

    @property
    def alive(self) -> bool:
        """Whether its process runs."""
        return self.proc is not None and self.proc.poll() is None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            stop_tree(self.proc.pid)
            self.proc.wait()
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
