"""Shared test helpers: real data, Flower processes, and an in-process Flower grid.

* :class:`LocalGrid`: a Flower ``Grid`` whose nodes are the real ClientApp
  functions, in this process, each node keeping its own ``Context`` (and so
  its ``context.state``) across rounds, as Flower does; or nodes that answer
  the query round with given infos.
* :func:`run_local`: the real ServerApp ``main`` on a LocalGrid.
* :func:`reply`: a reply to a train message, built by hand.
* :func:`setup_strategy`: a registered strategy set up for n clients, as the
  ServerApp does after the query round.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

import tasks
from experiments.processes import SuperLink, free_port, stop_tree
from fedamp_flwr.inprocess import InProcessGrid, run_inprocess
from fedamp_flwr.inprocess import task_identity as inprocess_task_identity

ROOT = Path(__file__).resolve().parents[1]
# Clients' prepared data (tasks.cache) goes to a folder of this test session, never to the
# user's ~/.cache; Flower processes started by the tests inherit it.
# Members' keys (fedamp_flwr/identity.py) likewise: never in the user's ~/.local/state.
# Folders this session made are removed when it ends.
for _env, _prefix in (("FEDAMP_CACHE_DIR", "fedamp-test-cache-"),
                      ("FEDAMP_STATE_DIR", "fedamp-test-state-")):
    if not os.environ.get(_env):
        os.environ[_env] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_env], True)
SHARED_DATA = Path(os.environ.get("FEDAMP_SHARED_DATA", ROOT.parent / "shared" / "data"))


def needs_data(name: str) -> Path:
    """Return ``../shared/data/<name>``, skipping the test when it is absent."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data folder {path} not found")
    return path


__all__ = ["free_port"]  # the app's own (experiments.processes), for the tests


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


# ---------------------------------------------------------------------------
# In-process Flower
# ---------------------------------------------------------------------------
class LocalGrid(InProcessGrid):
    """The app's in-process grid (``fedamp_flwr.inprocess``): node ``100 + i`` is client ``i``;
    it keeps the messages sent (``grid.sent``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{"keep_sent": True, **kwargs})


def run_local(tmp_path: Path, strategy: str, n: int = 3, **overrides) -> tuple[dict, LocalGrid]:
    """Run the real ServerApp for 2 rounds of 1 epoch on ``n`` in-process clients (the
    clients do not also train alone unless ``alone`` says so: a test of the run's own
    work pays for no more)."""
    run_config = {"strategy": strategy, "num-server-rounds": 2, "local-epochs": 1,
                  "min-nodes": n, "results-dir": str(tmp_path), "run-name": strategy,
                  "server-device": "cpu", "alone": False, **overrides}
    grid = run_inprocess(run_config, n, keep_sent=True)
    return json.loads((tmp_path / run_config["run-name"] / "metrics.json").read_text()), grid


def run_named(tmp_path: Path, name: str, run_config: dict, n: int,
              node_configs: list[dict] | None = None) -> dict:
    """Run the real ServerApp in process as run ``name`` (2 rounds unless ``run_config``
    says otherwise; members' nodes with ``node_configs``; a partitioned run's clients do
    not also train alone unless ``alone`` says so); its metrics.json."""
    alone = {} if node_configs else {"alone": False}  # members' tables: their own default
    cfg = {"num-server-rounds": 2, "results-dir": str(tmp_path), "run-name": name,
           "server-device": "cpu", "min-nodes": len(node_configs or []) or n, **alone,
           **run_config}
    run_inprocess(cfg, n, node_configs=node_configs)
    return json.loads((tmp_path / name / "metrics.json").read_text())


def member_sites(folder: Path, dataset: str, n: int, seed: int = 0) -> tuple[dict, list[dict]]:
    """Members' files of a partitioned task in ``folder``: the members run's config and the
    ``n`` node configs (``data-path``, ``client-id``)."""
    from experiments.make_sites import member_name, write_sites

    run_config = write_sites(tasks.DataConfig(dataset=dataset, data_dir="", num_clients=n,
                                              seed=seed), folder)
    return run_config, [{"data-path": str(folder / f"{member_name(i, n)}.npz"),
                         "client-id": member_name(i, n)} for i in range(n)]


def reply(node: int, arrays: dict | ArrayRecord | None = None, metrics: dict | None = None,
          message_type: str = MessageType.TRAIN, **records) -> Message:
    """A reply from ``node`` with the model ``arrays`` (a state dict), ``metrics`` and more records."""
    content = RecordDict()
    if arrays is not None:
        content["arrays"] = arrays if isinstance(arrays, ArrayRecord) else ArrayRecord(arrays)
    if metrics is not None:
        content["metrics"] = MetricRecord(metrics)
    for name, record in records.items():
        content[name.replace("_", "-")] = record
    sent = Message(RecordDict({"config": ConfigRecord()}), message_type=message_type, dst_node_id=node)
    return Message(content, reply_to=sent)


def client_infos(n: int, first_node: int = 10, **info) -> dict[int, dict]:
    """Query answers of ``n`` healthy clients on nodes ``first_node + i``."""
    base = {"num-partitions": n, "num-train": 5, "num-test": 5, **info}
    return {first_node + i: {**base, "client-id": i} for i in range(n)}


def setup_strategy(name: str, n: int = 3, roles=None, **run_config):
    """Strategy ``name`` for the default task with ``n`` clients, set up as the ServerApp does.

    Returns the strategy and a fresh model of the task (the initial arrays).
    """
    import strategies
    import tasks
    from fedamp_flwr.config import RunConfig
    from fedamp_flwr.discovery import discover_clients
    from fedamp_flwr.server_app import run_setup

    cfg = RunConfig.from_run_config({"strategy": name, "server-device": "cpu", **run_config})
    model = tasks.build_model(cfg.data_config(n))
    keys = [k for k, _ in model.named_parameters()]
    adjacency = None
    if strategies.STRATEGIES[name].uses_graph:
        import torch

        adjacency = torch.ones(n, n) - torch.eye(n)
    strategy = strategies.build_strategy(name, cfg.settings, run_setup(cfg, n, keys, adjacency))
    strategy.setup_tracking(discover_clients(LocalGrid(infos=client_infos(n)), n), roles)
    return strategy, model


# ---------------------------------------------------------------------------
# Real Flower processes
# ---------------------------------------------------------------------------
class Processes:
    """Processes a test started (and SuperLinks, the app's own
    :class:`experiments.processes.SuperLink`); stopped at teardown with what they started,
    by process ids."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.links: list[SuperLink] = []
        self.env = dict(os.environ)
        self.env.update({
            "FLWR_HOME": str(tmp / "flwr-home"),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
        })

    def start(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(args, env=self.env, cwd=self.tmp, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def superlink(self, simulation: bool, database: Path | None = None) -> SuperLink:
        """A SuperLink on free ports with this test's FLWR_HOME (its default connection), up
        and answering when this returns; its state in ``database`` if given."""
        link = SuperLink(Path(self.env["FLWR_HOME"]), simulation=simulation,
                         database=database).__enter__()
        self.links.append(link)
        return link

    def stop(self) -> None:
        """Stop each process with everything it started (``experiments.processes.stop_tree``)."""
        for proc in reversed(self.procs):
            stop_tree(proc.pid, timeout=20)
            proc.wait()
        for link in reversed(self.links):
            link.__exit__(None, None, None)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop()
