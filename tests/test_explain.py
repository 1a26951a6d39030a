"""Where a run-config value comes from: ``fedamp-flwr explain KEY`` and the layers of "auto"."""

from __future__ import annotations

import pytest

from fedamp_flwr.config import (
    GENERIC_AUTO,
    TABLE_AUTO,
    ConfigError,
    RunConfig,
    auto_layers,
    auto_values,
    explain,
)
from fedamp_flwr.tools.cli import main

TABLE = {"dataset": "members", "member-input-shape": "6", "member-outputs": 3}

#: the tuned layer of "auto" is what these test (tests/conftest.py, declared_defaults)
pytestmark = pytest.mark.tuned


def test_auto_is_the_last_layer_that_names_the_key():
    layers = auto_layers("members", "fedamp", "members/federated", table=True)
    assert [layer.name for layer in layers] == ["the key's declaration",
                                                "the run's task and strategy", "the tuning"]
    assert layers[0].values["batch-size"] == GENERIC_AUTO["batch-size"]
    assert layers[1].sources["batch-size"] == [("members' tables (TABLE_AUTO)",
                                                TABLE_AUTO["batch-size"])]
    # within a layer, the most specific table last: Panacea's own on TPT-48 over the task's
    assert [where for where, _ in auto_layers("tpt48", "panacea")[1].sources["batch-size"]] \
        == ["the task 'tpt48'", "the strategy 'panacea' on 'tpt48'"]
    assert auto_values("members", "fedamp", "members/federated", table=True)["batch-size"] \
        == TABLE_AUTO["batch-size"] == RunConfig.from_run_config(TABLE).batch_size


def test_a_members_run_of_the_traffic_gru_gets_panaceas_clip_from_the_model_it_names():
    sensors = {"dataset": "members", "member-task": "regression", "member-input-shape": "12",
               "member-outputs": 12, "strategy": "panacea", "graph": "inferred"}
    assert RunConfig.from_run_config(sensors).settings.panacea_server_clip == 0.0
    gru = RunConfig.from_run_config({**sensors, "model": "gru"})
    assert gru.settings.panacea_server_clip == 50.0
    assert "with the model 'gru'" in explain({**sensors, "model": "gru"},
                                             "panacea-server-clip")[0]


def test_explain_names_the_layer_that_gave_the_value_and_what_it_overrode():
    lines = explain(TABLE, "batch-size")
    assert lines[0].startswith(f"batch-size = {TABLE_AUTO['batch-size']}")
    assert lines == [f'batch-size = {TABLE_AUTO["batch-size"]}: "auto", given by layer 2 of 3, '
                     "the run's task and strategy: members' tables (TABLE_AUTO)",
                     "  (overrides layer 1 of 3, the key's declaration: GENERIC_AUTO: "
                     f"{GENERIC_AUTO['batch-size']})"]
    assert explain({"seed": 3}, "seed") == ["seed = 3: set in the run config"]
    assert "declared default" in explain({}, "seed")[0]
    assert "resolved by the method" in explain({}, "fedamp-sigma")[0]


def test_explain_refuses_an_unknown_key_and_a_bad_config(capsys):
    with pytest.raises(ConfigError, match="unknown run config key 'bogus'"):
        explain({}, "bogus")
    assert main(["explain", "learning-rate", "--run-config", "seed=-1"]) == 2
    assert "'seed' = -1" in capsys.readouterr().err
    assert main(["explain", "learning-rate", "--run-config", "dataset='fmnist'"]) == 0
    assert capsys.readouterr().out.startswith("learning-rate = 0.001")  # not tuned there
    assert main(["explain", "learning-rate"]) == 0  # the default task: tuned for each method
    assert capsys.readouterr().out.startswith('learning-rate = 0.3: "auto", given by layer 3 '
                                              "of 3, the tuning: strategies/tuned.json "
                                              "(fedamp on synthetic/practical)")
