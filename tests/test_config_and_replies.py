"""Bad input: invalid run configs, clients that cannot start, and bad replies."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fedamp_flwr import client_app
from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.discovery import discover_clients

from .conftest import LocalGrid, client_infos, needs_data, reply, setup_strategy

RD = RecordDict


def test_defaults_are_valid():
    cfg = RunConfig.from_run_config({})
    assert cfg.strategy == "fedamp"
    assert cfg.settings.sigma("fedamp", cfg.dataset, cfg.data_setting) == 1.0
    fmnist = RunConfig.from_run_config({"dataset": "fmnist", "data-dir": "x"})
    assert fmnist.settings.sigma("fedamp", "fmnist", "practical") == 10.0


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ({"strategy": "fedsgd"}, "strategy", "apfl, fedamp, fedavg, fedavg-ft"),
        ({"drop-rate": 1.0}, "drop-rate", "[0, 1)"),
        ({"heterogeneous-epochs": 1}, "heterogeneous-epochs", "true or false"),
        ({"apfl-alpha": 0.0}, "apfl-alpha", "(0, 1]"),
        ({"finetune-epochs": 0}, "finetune-epochs", "integer >= 1"),
        ({"dataset": "imagenet"}, "dataset", "synthetic, mnist"),
        ({"partitioning": "weird"}, "partitioning", "practical, iid"),
        ({"fedamp-sigma": 0.0}, "fedamp-sigma", '"auto" or a finite number > 0'),
        ({"fedamp-sigma": -2}, "fedamp-sigma", '"auto" or a finite number > 0'),
        ({"heurfedamp-sigma": "big"}, "heurfedamp-sigma", '"auto" or a number'),
        ({"fedamp-sigma": float("inf")}, "fedamp-sigma", '"auto" or a number, finite'),
        ({"heurfedamp-self-weight": 1.0}, "heurfedamp-self-weight", "[0, 1)"),
        ({"heurfedamp-self-weight": -0.1}, "heurfedamp-self-weight", "[0, 1)"),
        ({"fraction-train": 0.0}, "fraction-train", "(0, 1]"),
        ({"local-epochs": 0}, "local-epochs", "integer >= 1"),
        ({"batch-size": "ten"}, "batch-size", "an integer"),
        ({"learning-rate": -1.0}, "learning-rate", "> 0"),
    ],
)
def test_bad_values_name_key_value_and_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config(override)
    msg = str(err.value)
    assert f"'{key}'" in msg and allowed in msg


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="unknown run config key.*'sigma'"):
        RunConfig.from_run_config({"sigma": 3})


def _context(run_config, pid=0, n=2):
    return Context(run_id=1, node_id=1, node_config={"partition-id": pid, "num-partitions": n},
                   state=RecordDict(), run_config=run_config)


def _query(ctx):
    msg = Message(RD({"config": ConfigRecord({"query": "client-info"})}),
                  message_type=MessageType.QUERY, dst_node_id=1)
    return client_app.query(msg, ctx)


def test_client_reports_missing_data_folder_and_too_many_clients():
    info = _query(_context({"dataset": "mnist", "data-dir": "/no/such/folder"})).content["info"]
    assert "data-dir" in info["error"] and "/no/such/folder" in info["error"]
    ok = _query(_context({})).content["info"]
    assert "error" not in ok and ok["client-id"] == 0 and ok["num-train"] == 500


def test_client_reports_a_federated_task_with_another_number_of_clients():
    folder = needs_data("tpt48")
    run_config = {"dataset": "tpt48", "strategy": "fedavg", "data-dir": str(folder)}
    info = _query(_context(run_config, pid=0, n=40)).content["info"]
    assert "defines 48 clients but num-partitions = 40" in info["error"]


def test_discover_clients_stops_on_a_client_error():
    good = {"client-id": 0, "num-partitions": 2, "num-train": 5, "num-test": 5}
    bad = {"client-id": 1, "error": "ConfigError: run config 'data-dir' = 'x' ..."}
    with pytest.raises(RuntimeError, match="client 1 .*data-dir"):
        discover_clients(LocalGrid(infos={11: good, 12: bad}), min_nodes=2)
    clients = discover_clients(LocalGrid(infos={11: good, 12: {**good, "client-id": 1}}), min_nodes=2)
    assert {n: i.client_id for n, i in clients.items()} == {11: 0, 12: 1}


def _train_reply(node, state, cid):
    return reply(node, state, {"num-examples": 5, "client-id": cid})


def test_fedamp_leaves_bad_replies_out_and_keeps_their_models(caplog):
    strategy, model = setup_strategy("fedamp")
    init = ArrayRecord(model.state_dict())
    list(strategy.configure_train(1, init, ConfigRecord(), LocalGrid()))
    before = strategy.models.clone()
    nan_state = {k: v.clone() for k, v in model.state_dict().items()}
    nan_state["net.0.weight"][0, 0] = float("nan")
    shape_state = {k: v.clone() for k, v in model.state_dict().items()}
    shape_state["net.0.bias"] = torch.zeros(3)
    good_state = {k: v + 1.0 for k, v in model.state_dict().items()}
    no_arrays = reply(10, metrics={"num-examples": 5})
    replies = [no_arrays, _train_reply(11, nan_state, 1), _train_reply(12, shape_state, 2)]
    strategy.aggregate_train(1, replies)
    assert torch.equal(strategy.models, before)  # nothing changed
    assert "client 1" in caplog.text and "non-finite" in caplog.text
    assert "client 2" in caplog.text and "shape" in caplog.text
    assert "client 0" in caplog.text and "ArrayRecord" in caplog.text
    strategy.aggregate_train(2, [_train_reply(12, good_state, 2), _train_reply(11, nan_state, 1)])
    assert torch.allclose(strategy.models[2], before[2] + 1.0)
    assert torch.equal(strategy.models[:2], before[:2])


def test_fedavg_aggregates_only_valid_replies():
    strategy, model = setup_strategy("fedavg")
    init = ArrayRecord(model.state_dict())
    strategy.configure_train(1, init, ConfigRecord(), LocalGrid(infos=client_infos(3)))
    nan_state = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    ones = {k: torch.ones_like(v) for k, v in model.state_dict().items()}
    arrays, _ = strategy.aggregate_train(1, [_train_reply(10, ones, 0), _train_reply(11, nan_state, 1)])
    assert all(np.all(a.numpy() == 1.0) for a in arrays.values())


def test_huge_and_float32_overflowing_replies_are_left_out(caplog):
    strategy, model = setup_strategy("fedamp")
    init = ArrayRecord(model.state_dict())
    list(strategy.configure_train(1, init, ConfigRecord(), LocalGrid()))
    before = strategy.models.clone()
    overflow = {k: v.double() for k, v in model.state_dict().items()}
    overflow["net.0.bias"][0] = 1e300  # finite in float64, inf in float32
    huge = {k: torch.full_like(v, 1e12) for k, v in model.state_dict().items()}
    strategy.aggregate_train(1, [_train_reply(10, overflow, 0), _train_reply(11, huge, 1)])
    assert torch.equal(strategy.models, before)
    assert "as float32" in caplog.text and "squared norm" in caplog.text
    list(strategy.configure_train(2, init, ConfigRecord(), LocalGrid()))
    assert all(torch.isfinite(torch.tensor(row)).all() for row in strategy.history.xi[2])


def test_discovery_needs_every_partition():
    good = {"num-partitions": 3, "num-train": 5, "num-test": 5}
    with pytest.raises(RuntimeError, match="set min-nodes = 3"):
        discover_clients(LocalGrid(infos={1: {**good, "client-id": 0}, 2: {**good, "client-id": 2}}), 2)


def test_fedamp_leaves_novel_clients_out_of_the_cloud_models():
    from tasks.scenarios import Roles

    strategy, model = setup_strategy("fedamp", roles=Roles(frozenset({1}), frozenset()))
    strategy.alpha_k, strategy.sigma = 0.01, 1.0
    messages = list(strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(),
                                             LocalGrid()))
    assert len(messages) == 2  # the novel client does not train
    xi = torch.tensor(strategy.history.xi[1])
    assert xi[1].tolist() == [0.0, 1.0, 0.0] and xi[0, 1] == 0 and xi[2, 1] == 0
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=xi.dtype))


def test_a_deployed_grid_is_pulled_often_and_within_the_timeout(monkeypatch):
    """On Flower's deployed grid the replies are pulled every PULL_INTERVAL seconds (not
    Flower's 3 s), until all came or the timeout passed."""
    from types import SimpleNamespace

    from flwr.superlink.grid.http_grid import HttpGrid

    from fedamp_flwr import discovery

    class FakeHttpGrid(HttpGrid):
        def __init__(self, ready_after: int):
            self.pulls, self.ready_after = 0, ready_after

        def push_messages(self, messages):
            return ["m1", "m2"]

        def pull_messages(self, message_ids):
            self.pulls += 1
            if self.pulls < self.ready_after:
                return []
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m))
                    for m in sorted(message_ids)]

    sleeps = []
    monkeypatch.setattr(discovery.time, "sleep", sleeps.append)
    msgs = [Message(RD(), message_type=MessageType.TRAIN, dst_node_id=n) for n in (1, 2)]
    grid = FakeHttpGrid(ready_after=3)
    got = discovery.send_and_receive(grid, msgs, timeout=60)
    assert len(got) == 2 and grid.pulls == 3 and sleeps == [discovery.PULL_INTERVAL] * 2
    assert discovery.PULL_INTERVAL <= 0.2
    never = FakeHttpGrid(ready_after=10**9)
    assert discovery.send_and_receive(never, msgs, timeout=0) == [] and never.pulls == 1


@pytest.mark.parametrize("run_config, says", [
    ({"fedamp-sigma": -1}, "'fedamp-sigma' = -1"),
    ({"dataset": "mnist", "data-dir": "/no/such/folder"}, "/no/such/folder"),
])
def test_a_config_error_stops_the_run_with_one_line_and_no_traceback_of_the_app(
        tmp_path, caplog, run_config, says):
    import traceback

    from fedamp_flwr import server_app
    from fedamp_flwr.inprocess import InProcessGrid, task_identity

    cfg = {**run_config, "results-dir": str(tmp_path)}
    caplog.set_level(logging.INFO, logger="flwr")
    with task_identity(), pytest.raises(Exception) as raised:
        server_app.main(InProcessGrid(cfg, 2), Context(run_id=1, node_id=0, node_config={},
                                                       state=RecordDict(), run_config=cfg))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("Run stopped: ") and says in errors[0]
    assert "\n" not in errors[0].split(":", 1)[0]
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [f.name for f in frames][1:] == ["main"]  # below the caller: only the entry point
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
