"""The tests' fixtures and their environment; the helpers are in tests/helpers.py."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Clients' prepared data (tasks.cache) goes to a folder of this test session, never to the
# user's ~/.cache; Flower processes started by the tests inherit it.
# Members' keys (fedamp_flwr/identity.py) likewise: never in the user's ~/.local/state.
# Folders this session made are removed when it ends. The session's lock files likewise (one
# folder for every pytest-xdist worker: the workers inherit this process's environment).
for _env, _prefix in (("FEDAMP_CACHE_DIR", "fedamp-test-cache-"),
                      ("FEDAMP_STATE_DIR", "fedamp-test-state-"),
                      ("FEDAMP_TEST_LOCKS", "fedamp-test-locks-")):
    if not os.environ.get(_env):
        os.environ[_env] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_env], True)
# One CPU thread per process: the tests' models are tiny, and a second thread only spins (it
# took a third more CPU time for the same wall time here); two test workers (pytest -n 2,
# pyproject.toml) and a fleet's processes share the cores instead. Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# The Flower processes a test starts (a ClientApp process per message on a SuperNode) keep
# the app's compiled modules between them instead of compiling them again each time.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# A simulation starts its own Ray, never one a `ray start` left on this machine
# (tests/test_ray_cluster.py's cluster, or a user's): Ray attaches to the newest cluster it
# finds unless RAY_ADDRESS says otherwise. A test of a cluster passes its address.
os.environ.setdefault("RAY_ADDRESS", "local")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
# Flower's telemetry: every Flower process (a ClientApp's per message) would wait at its exit
# for a request this offline machine cannot send.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import pytest  # noqa: E402 - after the environment the app's modules read

from fedamp_flwr.tools.inprocess import task_identity as inprocess_task_identity  # noqa: E402

from .helpers import MembersFleet, Processes  # noqa: E402


@pytest.fixture(autouse=True)
def declared_defaults(request):
    """In process, "auto" takes the declared and the tasks' values, not the tuned ones of
    ``strategies/tuned.json``: a new tuning changes what a run of a tuned setting (the
    default task's among them) does, not what a test of a mechanism checks. A test of the
    tuned values themselves, or of what a user's run of the default task does, is marked
    ``tuned``. (Flower processes a test starts read the file: they get the tuned values.)"""
    from strategies.core.registry import untuned

    if request.node.get_closest_marker("tuned") is not None:
        yield
        return
    with untuned():
        yield


@pytest.fixture(autouse=True)
def task_identity():
    """Messages made outside a Flower process need a run and node id (the app's own helper)."""
    with inprocess_task_identity():
        yield


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop()


@pytest.fixture(scope="session")
def members_fleet(tmp_path_factory):
    """The test session's loopback fleet of members (:class:`tests.helpers.MembersFleet`),
    started once for every fleet test that can share it (a test that stops or kills a node
    starts its own). Under pytest -n, each worker that runs one of its tests starts its own."""
    procs = Processes(tmp_path_factory.mktemp("members-fleet"))
    try:
        yield MembersFleet(procs)
    finally:
        procs.stop()


@pytest.fixture(scope="session")
def simulation_link(tmp_path_factory):
    """The test session's SuperLink with the simulation engine (its ``Processes``, whose env
    names it as the default connection), shared by the tests that only submit runs to it:
    each run its own name, results folder and federation config. Under pytest -n, each
    worker that runs one of those tests starts its own."""
    procs = Processes(tmp_path_factory.mktemp("simulation-link"))
    procs.superlink(simulation=True)
    try:
        yield procs
    finally:
        procs.stop()


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers
def pytest_collection_modifyitems(items):
    """A test that starts Flower processes (marked ``flower``) is a slow one too; the slow
    tests first: with two workers (pytest -n), a long test started last would keep one worker
    busy after the other is done."""
    for item in items:
        if item.get_closest_marker("flower") is not None:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def one_flower_test_at_a_time(request):
    """Every test that starts Flower processes (marked ``flower``: a SuperLink, SuperNodes,
    ``flwr run``, Ray, a grid's jobs) runs while no other one does, whichever pytest-xdist
    worker it is on: one lock file for the test session's workers. Two such tests at once on
    2 cores made each 2-5x slower and pushed ClientApp starts past Flower's 30 s task claim: CI of
    2026-11-28 failed so (load average 4.9). (xdist's ``xdist_group`` would not do: pytest
    9.2 no longer reads the node id that xdist 3.8 rewrites for it.) CI runs them apart from
    the in-process tests, with ``-n 0`` (``.ci/run``; docs/testing.md)."""
    if request.node.get_closest_marker("flower") is None:
        yield
        return
    import fcntl

    with open(Path(os.environ["FEDAMP_TEST_LOCKS"]) / "flower.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
