"""The default run, by config alone: every registered strategy on the embedded task with
``strategy`` alone, every value of ``graph`` as documented, a mistake as one line before any
node is waited for, and the closing lines that compare with training alone.

All in process (the real ServerApp and ClientApps, :mod:`fedamp_flwr.tools.inprocess`); what only
``flwr run`` shows (Flower's own log and status) is in tests/test_flower_e2e.py.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import numpy as np
import pytest

import strategies
from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.tools import cli
from fedamp_flwr.tools.inprocess import InProcessGrid, run_inprocess
from strategies.core.registry import GRAPHS
from tasks.data import synthetic_graph

ALL = sorted(strategies.STRATEGIES)
GRAPH_METHODS = [s for s in ALL if strategies.STRATEGIES[s].uses_graph]
ALLOWED = re.compile(r"allowed: (.*?) \(")


def _run(tmp_path, name: str, n: int, **run_config) -> dict:
    cfg = {"results-dir": str(tmp_path), "run-name": name, "min-nodes": n, **run_config}
    run_inprocess(cfg, n)
    return json.loads((tmp_path / name / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.tuned  # as a user's run: its "auto" values tuned for the default task
@pytest.mark.parametrize("strategy", ALL)
def test_every_strategy_runs_the_default_task_with_strategy_alone(tmp_path, strategy):
    """Two clients, the size of Flower's default federation; every other key its default."""
    m = _run(tmp_path, strategy, 2, strategy=strategy, **{"num-server-rounds": 2})
    assert m["strategy"] == strategy and m["completed_rounds"] == 2 and m["finished"]
    assert 0 < m["bmta"] <= 100
    assert set(m["alone"]) == {"0", "1"}  # the default task's clients also trained alone


def test_the_synthetic_task_says_which_clients_are_alike():
    """Clients that see the features through one rotation are one group: 5 groups of
    consecutive ids, and no edges where every client is its own group."""
    ten = synthetic_graph(10)
    assert ten.shape == (10, 10) and np.array_equal(ten, ten.T) and not ten.diagonal().any()
    assert {(int(a), int(b)) for a, b in zip(*np.nonzero(np.triu(ten)))} == {
        (0, 1), (2, 3), (4, 5), (6, 7), (8, 9)}
    assert not synthetic_graph(2).any() and not synthetic_graph(5).any()
    assert int(synthetic_graph(20).sum()) // 2 == 5 * 6  # 5 groups of 4


def _refusal_or_none(run_config: dict) -> str | None:
    try:
        RunConfig.from_run_config(run_config)
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize("strategy", GRAPH_METHODS)
@pytest.mark.parametrize("data", [
    {},  # the synthetic task, which has a graph
    {"dataset": "mnist"},  # a pool of images: no graph of its own
    {"dataset": "members", "member-input-shape": "4", "member-outputs": 2},  # members
])
def test_a_graph_refusal_lists_exactly_the_values_that_are_accepted(tmp_path, strategy, data):
    graph_file = tmp_path / "graph.csv"
    graph_file.write_text("u,v\n0,1\n")
    accepted, refusals = [], []
    for value in GRAPHS:
        said = _refusal_or_none({"strategy": strategy, "graph": value,
                                 "graph-file": str(graph_file), **data})
        if said is None:
            accepted.append(value)
        else:
            assert said.startswith(f"run config 'graph' = '{value}' is invalid")
            refusals.append(said)
    assert refusals and "file" in accepted and "none" not in accepted
    for said in refusals:
        match = ALLOWED.search(said)
        assert match is not None and match.group(1).split(", ") == accepted, said
    expected = set(strategies.STRATEGIES[strategy].graphs)
    if data:  # MNIST and members define no graph; members bring no groups
        expected.discard("task")
    if data.get("dataset") == "members":
        expected.discard("groups")
    assert set(accepted) == expected


def test_inferred_graph_k_auto_fits_a_run_of_two_and_a_number_is_checked_against_it():
    cfg = RunConfig.from_run_config({"strategy": "panacea", "graph": "inferred"})
    assert cfg.graph_k == "auto" and cfg.graph_k_for(2) == 1 and cfg.graph_k_for(60) == 3
    cfg = RunConfig.from_run_config({"strategy": "panacea", "graph": "inferred", "graph-k": 5})
    assert cfg.graph_k_for(6) == 5
    with pytest.raises(ConfigError, match=r"'graph-k' = 5 is invalid; allowed: auto, or an "
                                          r"integer in \[1, 1\] \(the run has 2 clients\)"):
        cfg.graph_k_for(2)


class _NoNodes(InProcessGrid):
    """A grid the ServerApp must not ask for nodes: every check comes before."""

    def get_node_ids(self) -> list[int]:
        raise AssertionError("the ServerApp waited for nodes before checking its config")


@pytest.mark.parametrize("run_config, said", [
    ({"strategy": "panacea", "graph": "none"}, "'graph' = 'none' is invalid; allowed: task, "
     "file, groups, inferred"),
    ({"strategy": "sfl", "graph": "file", "graph-file": "/no/such/graph.csv"},
     "'graph-file' = '/no/such/graph.csv'"),
    ({"collaboration-policy": "/no/such/policy.toml"}, "collaboration-policy"),
    ({"dp": "dp-sgd", "dataset": "cifar10", "model": "resnet18", "data-dir": "/x"}, "BatchNorm"),
])
def test_a_mistake_stops_the_run_before_any_node_is_waited_for(tmp_path, caplog, run_config,
                                                               said):
    from flwr.app import Context, RecordDict

    from fedamp_flwr.server_app import SAID
    from fedamp_flwr.server_app import app as server_app

    cfg = {"results-dir": str(tmp_path), "run-name": "stopped", **run_config}
    caplog.set_level(logging.INFO, logger="flwr")
    with pytest.raises(ConfigError, match=re.escape(said)) as raised:
        server_app(_NoNodes(cfg, 0), Context(run_id=1, node_id=0, node_config={},  # type: ignore[arg-type]
                                             state=RecordDict(), run_config=cfg))
    assert getattr(raised.value, SAID)  # Flower logs it without a traceback
    stops = [r for r in caplog.records if r.getMessage().startswith("Run stopped:")]
    assert len(stops) == 1 and said in stops[0].getMessage()
    assert not (tmp_path / "stopped").exists()  # no run folder made for a run that never ran


def test_flowers_log_of_a_stopped_run_has_no_traceback(caplog):
    """Flower logs the exception a ServerApp raises with its traceback; the app's stop has
    said why already, so the record keeps the words and drops the traceback."""
    from flwr.supercore import log

    from fedamp_flwr.server_app import SAID

    caplog.set_level(logging.ERROR, logger="flwr")
    stop = ConfigError("run config 'x' = 1 is invalid")
    setattr(stop, SAID, True)
    for exc in (stop, ValueError("a bug")):
        try:
            raise exc
        except Exception as err:
            log(logging.ERROR, "%s raised an exception", "Simulation", exc_info=err)
    stopped, bug = caplog.records[-2:]
    assert stopped.exc_info is None and stopped.getMessage() == (
        "Simulation raised an exception: ConfigError: run config 'x' = 1 is invalid")
    assert bug.exc_info is not None  # a failure the app did not foresee keeps its traceback


def test_check_config_says_a_mistake_in_one_line_and_exits_1(capsys):
    assert cli.main(["check-config", "--run-config", "strategy='panacea' graph='none'"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: run config 'graph' = 'none' is invalid; "
                                               "allowed: task, file, groups, inferred")
    assert cli.main(["check-config", "--run-config", "strategy='panacea' graph='inferred' "
                     "graph-k=5", "--clients", "2"]) == 1
    assert "'graph-k' = 5 is invalid" in capsys.readouterr().err
    assert cli.main(["check-config", "--run-config", "strategy='sfl'", "--clients", "10"]) == 0
    assert capsys.readouterr().out.startswith("ok: strategy 'sfl' on synthetic/practical")
    assert cli.main(["check-config", "--run-config", "strategy=fedamp"]) == 1  # unquoted
    assert "cannot be read" in capsys.readouterr().err
    assert cli.main(["check-config", "--run-config", "num-server-rounds"]) == 1  # no value
    assert "sets no key (flwr run would ignore it too)" in capsys.readouterr().err


def test_check_config_is_a_command_with_its_exit_status(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fedamp_flwr.tools.cli", "check-config",
                          "--run-config", "fedamp-sigma=-1"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == ("error: run config 'fedamp-sigma' = -1.0 is invalid; "
                                  "allowed: \"auto\" or a finite number > 0")


def test_the_closing_lines_compare_with_each_client_alone_and_name_fedavg(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    m = _run(tmp_path, "closing", 4, **{"num-server-rounds": 2, "local-epochs": 1})
    lines = [r.getMessage() for r in caplog.records]
    alone = [line for line in lines if line.startswith("Each client alone")]
    assert len(alone) == 1
    mean_alone = 100 * np.mean([v["model"] for v in m["alone"].values()])
    mean_run = 100 * np.mean(list(m["rounds"][-1]["client_accuracy"].values()))
    assert f"scores {mean_alone:.2f}% on average" in alone[0]
    assert f"this run's models {mean_run:.2f}% in round 2: {mean_run - mean_alone:+.2f}" in alone[0]
    assert any("strategy='fedavg'" in line for line in lines)


def test_the_default_preset_runs_every_registered_method_on_the_default_task():
    """`simulation.py --preset default`: the table of docs/reproducing.md, and the tuning of
    the "auto" values every method takes on the default task."""
    from experiments.presets import EVERY_METHOD, PRESETS

    grid = PRESETS["default"]
    assert sorted(grid.strategies) == ALL == sorted(EVERY_METHOD)
    (setting,) = grid.settings
    assert (setting.dataset, setting.partitioning, setting.num_clients) == (
        "synthetic", "practical", 10)
    assert grid.run_config["num-server-rounds"] == RunConfig.from_run_config({}).num_server_rounds


@pytest.mark.parametrize("text", [
    "strategy='panacea' graph='inferred' graph-k=5",
    'num-server-rounds=2 local-epochs=1 learning-rate=1e-3 tensorboard=true',
    "data-dir='/a path/with spaces' run-name=\"x\" seed=0",
    "fedamp-sigma=0.1 fedamp-self-weight='paper'",
])
def test_check_config_reads_a_run_config_as_flwr_run_does(text):
    from flwr.common.config import parse_config_args

    assert cli.read_run_config(text) == parse_config_args([text])


def test_a_method_that_does_not_federate_is_never_said_to_do_worse_by_federation(tmp_path):
    from fedamp_flwr.server.run_summary import alone_lines, alone_summary
    from strategies import STRATEGIES
    from strategies.core.records import RunFile

    (tmp_path / "metrics.json").write_text(json.dumps({
        "strategy": "separate", "rounds": [{"round": 2, "client_accuracy": {"0": 0.5, "1": 0.6}}],
        "alone": {"0": {"model": 0.7, "linear": 0.65}, "1": {"model": 0.8}}}))
    result = RunFile.read(tmp_path / "metrics.json")
    assert not STRATEGIES["separate"].federates and STRATEGIES["fedamp"].federates
    said = alone_summary(result) + alone_lines(result, ["a", "b"])
    assert all("federation does worse" in line for line in said), said
    said = alone_summary(result, False) + alone_lines(result, ["a", "b"], False)
    assert not any("federation" in line.replace("no federation", "") for line in said), said
    assert "this run's models (each trained alone, no federation) 55.00% in round 2" in said[0]
