"""The tests' helpers, in one place: test modules import them from here, never from each
other (tests/test_structure.py checks it); the fixtures are in tests/conftest.py.

* :class:`LocalGrid`: a Flower ``Grid`` whose nodes are the real ClientApp
  functions, in this process, each node keeping its own ``Context`` (and so
  its ``context.state``) across rounds, as Flower does; or nodes that answer
  the query round with given infos. :class:`FaultyGrid` adds scripted faults,
  :class:`JoiningGrid` a member that joins a run under way.
* :func:`run_local` / :func:`run_named` / :func:`run_on_grid`: the real ServerApp
  ``main`` in process.
* :func:`reply`: a reply to a train message, built by hand.
* :func:`setup_strategy`: a registered strategy set up for n clients, as the
  ServerApp does after the query round.
* :class:`Processes`, :func:`start_superlink`, :func:`flwr_run`,
  :func:`member_supernode`: real Flower processes; :func:`app_files`: the app they run.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode

import tasks
from experiments.make_sites import member_name
from experiments.processes import SuperLink, free_port, stop_trees
from fedamp_flwr import server_app
from fedamp_flwr.tools.inprocess import InProcessGrid, run_inprocess, task_identity

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FEDAMP_SHARED_DATA", ROOT.parent / "shared" / "data"))


def needs_data(name: str) -> Path:
    """Return ``../shared/data/<name>``, skipping the test when it is absent."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data folder {path} not found")
    return path





# ---------------------------------------------------------------------------
# In-process Flower
# ---------------------------------------------------------------------------
class LocalGrid(InProcessGrid):
    """The app's in-process grid (``fedamp_flwr.tools.inprocess``): node ``100 + i`` is client ``i``;
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
    from experiments.make_sites import write_sites

    run_config = write_sites(tasks.DataConfig(dataset=dataset, data_dir="", num_clients=n,
                                              seed=seed), folder)
    return run_config, [{"data-path": str(folder / f"{member_name(i, n)}.npz"),
                         "client-id": member_name(i, n)} for i in range(n)]


#: three traffic sensors on a road, 773869 - 767541 - 767542 (their ids, not sorted)
SENSORS = ["773869", "767541", "767542"]


def sensor_sites(folder: Path) -> tuple[Path, dict[str, Path]]:
    """Traffic sensors as members (:data:`SENSORS`): the road graph as an edge list by
    sensor name, and each sensor's own file of windows of the generated stand-in."""
    from tasks.graphs import write_edge_list
    from tasks.traffic import make_traffic_standin

    road = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=np.float32)
    np.savez(folder / "road.npz", sensor_ids=np.array(SENSORS), adjacency=road)
    data = make_traffic_standin(folder / "road.npz", days=3, seed=0, stride=24)
    files = {}
    for i, sensor in enumerate(SENSORS):
        files[sensor] = folder / f"sensor-{sensor}.npz"
        np.savez(files[sensor], x=data.train[i].x, y=data.train[i].y, x_test=data.test[i].x,
                 y_test=data.test[i].y)
    graph = folder / "road.csv"
    assert write_edge_list(graph, data.adjacency, SENSORS) == 2
    return graph, files


#: the run config of a members' run on :func:`sensor_sites` (one round of a GRU forecaster)
SENSOR_CONFIG = {"dataset": "members", "member-task": "regression", "member-input-shape": "12",
                 "member-outputs": 12, "model": "gru", "member-scaling": "none",
                 "graph": "file", "local-epochs": 1, "batch-size": 16, "num-server-rounds": 1,
                 "alone": False}


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
    from fedamp_flwr.server.discovery import discover_clients
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
        """Stop every process with everything it started, all at once
        (``experiments.processes.stop_trees``), then the SuperLinks."""
        stop_trees([proc.pid for proc in self.procs], timeout=20)
        for proc in self.procs:
            proc.wait()
        for link in reversed(self.links):
            link.__exit__(None, None, None)


# ---------------------------------------------------------------------------
# Moved from the test modules that first needed them
# ---------------------------------------------------------------------------
FLWR = shutil.which("flwr")


@functools.cache
def app_files() -> Path:
    """The app's files that its FAB holds, built once for this test process
    (:func:`experiments.flower_cli.build_app`; removed when the process ends): what the
    tests give ``flwr run``. From the checkout, whose .venv Flower walks before it filters,
    each run would build the same FAB (the same hash) for about 7 s of CPU; one test runs
    ``flwr run`` on the checkout itself, as the README does
    (tests/test_flower_e2e.py ``test_strategies_by_config_alone_on_flowers_default_federation``)."""
    from experiments.flower_cli import build_app

    folder = Path(tempfile.mkdtemp(prefix="fedamp-test-app-"))
    atexit.register(shutil.rmtree, folder, True)
    return build_app(ROOT, folder / "app", FLWR)


def start_superlink(procs, simulation: bool) -> int:
    """A SuperLink on a free port (Flower 1.41 serves the Fleet, Control and runtime APIs
    there), the default connection of the test's FLWR_HOME; returns its port."""
    return procs.superlink(simulation).port


def flwr_run(procs, run_config: str, extra: list[str], timeout: float = 400) -> str:
    args = [FLWR, "run", str(app_files()), "--stream", "--run-config", run_config, *extra]
    out = subprocess.run(args, env=procs.env, cwd=procs.tmp, capture_output=True, text=True,
                         timeout=timeout)
    return out.stdout + out.stderr


FLEET_FEATURES, FLEET_CLASSES = 6, 3


FLEET_SCHEMA = (f"dataset='members' member-input-shape='{FLEET_FEATURES}' "
                f"member-outputs={FLEET_CLASSES} local-epochs=2 batch-size=20")


def member_file(path: Path, seed: int, features: int = FLEET_FEATURES) -> Path:
    """A member's own data: 3 classes around centres that differ from member to member."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(FLEET_CLASSES, features))
    y = rng.integers(0, FLEET_CLASSES, size=120)
    x = (centres[y] + rng.normal(size=(120, features))).astype(np.float32)
    np.savez(path, x=x[:100], y=y[:100], x_test=x[100:], y_test=y[100:])
    return path


def member_supernode(processes, port: int, data: Path, name: str, log: str,
                     keep: str = "better"):
    """A member's SuperNode: its own data, its own model-dir (``<tmp>/<log>-models``) and its
    own key (``<tmp>/<log>-identity``); ``keep``: its rule for the model it takes home
    ("federated": it trains on every row and does no choosing, for a test about something
    else, where the choice would only cost time)."""
    home = log.removesuffix("-again")
    models, keys = processes.tmp / f"{home}-models", processes.tmp / f"{home}-identity"
    return processes.start(
        ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
         "--port", str(free_port()), "--node-config",
         f"data-path='{data}' client-id='{name}' model-dir='{models}' identity-dir='{keys}' "
         f"keep='{keep}'"],
        log)


def members_run(processes, config: str, timeout: float = 600) -> str:
    out = subprocess.run([FLWR, "run", str(app_files()), "--stream", "--run-config", config],
                         env=processes.env, cwd=processes.tmp, capture_output=True, text=True,
                         timeout=timeout)
    return out.stdout + out.stderr


def fleet_metrics(results: Path, name: str, log: str) -> dict:
    path = results / name / "metrics.json"
    assert path.is_file(), log[-4000:]
    return json.loads(path.read_text())


def initial_accuracy(season: dict, data: Path) -> float:
    """What the run's initial model scores on a member's test rows (inputs standardized by
    the run's pooled statistics, as the member's ClientApp does)."""
    import tasks
    from fedamp_flwr.config import RunConfig

    cfg = RunConfig.from_run_config(season["config"])
    torch.manual_seed(cfg.seed)
    model = tasks.build_model(cfg.data_config(len(season["client_names"])), cfg.model)
    scaling = season["member_scaling"]
    with np.load(data) as site:
        x = (site["x_test"] - np.asarray(scaling["mean"])) / np.asarray(scaling["std"])
        y = site["y_test"]
    with torch.no_grad():
        guess = model(torch.as_tensor(x, dtype=torch.float32)).argmax(dim=1).numpy()
    return float((guess == y).mean())


class Crash(Exception):
    """The ServerApp's process dies."""


class FaultyGrid(LocalGrid):
    """A LocalGrid (node ``100 + i`` is client ``i``) with scripted faults.

    ``crash_at``: (server round, message type) at which the ServerApp dies,
    before that phase's messages are delivered. ``offline``: client -> rounds
    in which its node is gone. ``moves``: client -> (round, node id): from that
    round on the client is on a new node with an empty ``context.state`` (a
    restarted SuperNode). ``silent`` / ``failing``: (round, client) pairs whose
    train reply never comes / comes as Flower's node-unavailable error.
    """

    def __init__(self, run_config, n, crash_at=None, offline=None, moves=None, silent=(),
                 failing=()):
        super().__init__(run_config, n)
        self.crash_at, self.offline, self.moves = crash_at, offline or {}, moves or {}
        self.silent, self.failing = set(silent), set(failing)
        self.client = {100 + c: c for c in range(n)}
        for c, (_, node) in self.moves.items():
            self.client[node] = c
            self.contexts[node] = Context(run_id=1, node_id=node, state=RecordDict(),
                                          run_config=run_config,
                                          node_config={"partition-id": c, "num-partitions": n})
        self.round = 1  # the round the fleet is in (the next one once a round's evaluation is done)

    def live(self) -> dict[int, int]:
        """Node id -> client of the nodes connected now."""
        out = {}
        for node, c in self.client.items():
            rnd, new = self.moves.get(c, (None, None))
            if rnd is not None and (node == new) != (self.round >= rnd):
                continue  # the old node after the move, or the new one before it
            if self.round not in self.offline.get(c, ()):
                out[node] = c
        return out

    def get_node_ids(self):
        return list(self.live())

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        kind = messages[0].metadata.message_type if messages else None
        if (self.round, kind) == self.crash_at:
            self.crash_at = None  # it dies once
            raise Crash(f"the ServerApp dies in round {self.round}")
        live, replies, delivered = self.live(), [], []
        for m in messages:
            node = m.metadata.dst_node_id
            c = self.client.get(node)
            if kind == MessageType.TRAIN and (self.round, c) in self.silent:
                continue
            if node not in live or (kind == MessageType.TRAIN and (self.round, c) in self.failing):
                replies.append(Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node is gone"),
                                       reply_to=m))
                continue
            replies.append(None)
            delivered.append(m)
        # the live nodes' messages together, as the grid takes them (client-batching stacks them)
        answers = iter(super().send_and_receive(delivered) if delivered else [])
        replies = [r if r is not None else next(answers) for r in replies]
        if kind == MessageType.EVALUATE:
            self.round += 1
        return replies


def grid_config(tmp_path, strategy, **overrides) -> dict:
    return {"strategy": strategy, "num-server-rounds": 4, "local-epochs": 1, "min-nodes": 3,
            "results-dir": str(tmp_path), "run-name": "run", "server-device": "cpu", **overrides}


def run_on_grid(grid: LocalGrid, run_config: dict) -> dict:
    """The real ServerApp on ``grid``; returns its metrics.json."""
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=run_config))
    folder = run_config["results-dir"] + "/" + run_config["run-name"]
    return json.loads(open(folder + "/metrics.json").read())


FAKE_CLIENTS = 4


FAKE_OFFSETS = [-0.02, -0.01, 0.01, 0.02]   # per-client deviation from the round's mean (sums to 0)


def fake_run(strategy: str, seed: int, best: float, *, dataset: str = "fmnist",
             partitioning: str = "practical", drop: float = 0.0, regression: bool = False,
             xi: bool = False, failed_eval_round: int | None = None) -> dict:
    """A metrics.json dict with 3 rounds whose best mean is ``best`` (round 2).

    Parameters
    ----------
    strategy, seed, dataset, partitioning : the run's identity.
    best : BMTA in % (classification) or best mean MSE (regression).
    drop : the run config's drop-rate.
    regression : MSE records instead of accuracy.
    xi : record FedAMP's collaboration weights for rounds 1..3.
    failed_eval_round : a round without evaluation records (as when evaluation failed).
    """
    name = "mse" if regression else "accuracy"
    # classification: means 0.1 below, at and 0.05 below the best; regression: 2x, 1x, 1.5x
    means = ([2 * best, best, 1.5 * best] if regression
             else [best / 100 - 0.1, best / 100, best / 100 - 0.05])
    rounds = []
    for r, mean in enumerate(means, start=1):
        rec = {"round": r, "train_loss": 1.0 / r, "trained_clients": list(range(FAKE_CLIENTS))}
        if r != failed_eval_round:
            rec[f"client_{name}"] = {str(c): mean + FAKE_OFFSETS[c] * (best if regression else 1)
                                     for c in range(FAKE_CLIENTS)}
            rec[f"mean_{name}"] = mean
            rec["client_loss"] = {str(c): 0.5 for c in range(FAKE_CLIENTS)}
            rec["mean_loss"] = 0.5
        rounds.append(rec)
    run = {
        "run_name": f"{strategy}-{dataset}-{partitioning}-{seed}-d{drop}",
        "strategy": strategy, "dataset": dataset, "partitioning": partitioning,
        "num_clients": FAKE_CLIENTS, "seed": seed,
        "config": {"strategy": strategy, "dataset": dataset, "partitioning": partitioning,
                   "seed": seed, "num-server-rounds": 3, "local-epochs": 5,
                   "drop-rate": drop, "attack-ratio": 0.0, "novel-client-fraction": 0.0,
                   "learning-rate": 0.001},
        "sigma": {"fedamp": 1e5, "heurfedamp": 10.0}, "wall_time_s": 12.5,
        "rounds": rounds, "novel_clients": [], "attackers": [],
    }
    run["best_mean_mse" if regression else "bmta"] = best
    if xi:
        w = [[0.7 if i == j else 0.1 for j in range(FAKE_CLIENTS)] for i in range(FAKE_CLIENTS)]
        run["xi"] = {"client_ids": list(range(FAKE_CLIENTS)), "rounds": {str(r): w for r in (1, 2, 3)}}
    return run


BEHAVIOUR_RECORDS = Path(__file__).parent / "data" / "behaviour"


def recorded(key: str) -> list[dict]:
    """The recorded rounds of the run ``key``."""
    return json.loads((BEHAVIOUR_RECORDS / f"{key}.json").read_text())


def site_node_configs(folder: Path, n: int) -> list[dict]:
    return [{"data-path": str(folder / f"{member_name(i, n)}.npz"),
             "client-id": member_name(i, n)} for i in range(n)]


class RoundGrid(InProcessGrid):
    """Members' nodes 100, 101, ... (``node_configs``) that know the round the fleet is in:
    ``self.round``, the next one once a round's evaluation is done."""

    def __init__(self, run_config: dict, nodes: list[dict]) -> None:
        super().__init__(run_config, node_configs=nodes)
        self.round = 1

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout)
        if messages and messages[0].metadata.message_type == "evaluate":
            self.round += 1
        return replies


class JoiningGrid(RoundGrid):
    """Members on nodes 100, 101, ...; the last one's node connects only from round
    ``joins_at`` on (a member that joins a run under way)."""

    def __init__(self, run_config: dict, nodes: list[dict], joins_at: int) -> None:
        super().__init__(run_config, nodes)
        self.joins_at, self.all = joins_at, list(self.contexts)

    def get_node_ids(self) -> list[int]:
        return self.all if self.round >= self.joins_at else self.all[:-1]


def run_app(grid, cfg: dict) -> dict:
    with task_identity():
        server_app.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                     run_config=cfg))
    return json.loads((Path(cfg["results-dir"]) / cfg["run-name"] / "metrics.json").read_text())


MEMBERS = ("site-a", "site-b", "site-c")


class MembersFleet:
    """A loopback fleet of members: a SuperLink (no simulation) and one SuperNode per member
    of :data:`MEMBERS`, each with its own data file (:func:`member_file`), model-dir and key
    folder (:func:`member_supernode`), all under ``processes.tmp``. Tests that share it keep
    their runs apart by run name and stop every node they add."""

    def __init__(self, processes: Processes) -> None:
        self.processes, self.tmp = processes, processes.tmp
        self.port = start_superlink(processes, simulation=False)
        self.files = {name: member_file(self.tmp / f"{name}.npz", seed)
                      for seed, name in enumerate(MEMBERS)}
        self.nodes = {name: member_supernode(processes, self.port, self.files[name], name, name)
                      for name in MEMBERS}

    def run(self, config: str, timeout: float = 600) -> str:
        """``flwr run`` of the app on this fleet (``--stream``): what it printed."""
        return members_run(self.processes, config, timeout)

    def models(self, name: str, run: str) -> list[str]:
        """The files of run ``run`` in member ``name``'s model-dir (its own machine)."""
        folder = self.tmp / f"{name}-models" / run
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def as_older_version(run: Path, secret: bytes | None = None) -> None:
    """Make run folder ``run`` look as a version before the manifest wrote it: no
    ``checkpoint/manifest.json``, no register record, no generation and no checkpoint
    version (1, :mod:`fedamp_flwr.server.checkpoint`) in its checkpoints (each sealed again, with
    ``secret`` where the run had one)."""
    from fedamp_flwr.server.manifest import MANIFEST, register_path
    from fedamp_flwr.server.results import checkpoint_files, digest_path, seal

    (run / "checkpoint" / MANIFEST).unlink()
    register_path(run).unlink()
    for path in checkpoint_files(run):
        state = torch.load(path, weights_only=True)
        state.pop("generation", None)  # (a checkpoint made older before has none)
        state.pop("version", None)
        torch.save(state, path)
        digest_path(path).write_text(f"{seal(path, secret, run.name)}  {path.name}\n")
