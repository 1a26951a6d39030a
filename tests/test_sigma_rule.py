"""FedAMP's and HeurFedAMP's sigma from the data where the paper gives none (members' own
data) or where ``fedamp-sigma-rule = "data"``: FedAMP's the median of the squared distances
between the models the clients trained in round 1, HeurFedAMP's the inverse of their median
cosine distance; fixed for the run."""

from __future__ import annotations

import json

import pytest
import torch

from fedamp_flwr.config import RunConfig
from fedamp_flwr.server.results import checkpoint_files
from fedamp_flwr.tools.inprocess import run_inprocess
from strategies.fedamp_math import median_cosine_distance, median_sq_distance

from .helpers import member_sites


def test_the_median_rule_on_models_worked_by_hand():
    # squared distances 9, 16, 25: the median is 16
    assert median_sq_distance(torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]])) == 16.0
    # 1-D points 0, 1, 3, 6: 1, 9, 36, 4, 25, 9 -> 1, 4, 9, 9, 25, 36: the median is 9
    assert median_sq_distance(torch.tensor([[0.0], [1.0], [3.0], [6.0]])) == 9.0
    # an even count of pairs takes the mean of the two middle ones: 0, 1, 2, 4 ->
    # 1, 4, 16, 1, 9, 4 -> 1, 1, 4, 4, 9, 16: (4 + 4) / 2
    assert median_sq_distance(torch.tensor([[0.0], [1.0], [2.0], [4.0]])) == 4.0
    assert median_sq_distance(torch.zeros(1, 3)) == 0.0


def test_the_cosine_median_rule_worked_by_hand():
    # unit vectors at 0, 60 and 180 degrees: 1 - cos = 0.5, 2, 1.5 -> the median is 1.5
    rows = torch.tensor([[1.0, 0.0], [0.5, 3 ** 0.5 / 2], [-1.0, 0.0]])
    assert median_cosine_distance(rows) == pytest.approx(1.5)
    assert median_cosine_distance(2 * rows) == pytest.approx(1.5)  # scale does not matter
    assert median_cosine_distance(torch.ones(1, 2)) == 0.0


def test_heurfedamp_chooses_its_sigma_from_the_data_and_records_it(tmp_path):
    cfg = {"strategy": "heurfedamp", "fedamp-sigma-rule": "data", "num-server-rounds": 2,
           "local-epochs": 1, "results-dir": str(tmp_path), "run-name": "heur",
           "server-device": "cpu", "min-nodes": 4, "save-models": "none"}
    assert RunConfig.from_run_config(cfg).settings.sigma("synthetic", "practical") is None
    run_inprocess(cfg, 4)
    metrics = json.loads((tmp_path / "heur" / "metrics.json").read_text())
    note = metrics["heurfedamp_sigma"]
    assert note["round"] == 1 and note["clients"] == 4 and "cosine" in note["rule"]
    state = torch.load(checkpoint_files(tmp_path / "heur")[0], weights_only=True)
    assert state["strategy"]["sigma"] == note["value"] > 0
    r1, r2 = metrics["rounds"]
    assert r2["trained_clients"] == [0, 1, 2, 3]


def test_auto_sigma_is_the_papers_where_it_has_one_and_else_from_the_data():
    paper = RunConfig.from_run_config({"dataset": "fmnist", "strategy": "fedamp"})
    assert paper.settings.sigma("fmnist", "practical") == 10.0
    data = RunConfig.from_run_config({"dataset": "fmnist", "strategy": "fedamp",
                                      "fedamp-sigma-rule": "data"})
    assert data.settings.sigma("fmnist", "practical") is None
    members = RunConfig.from_run_config({"dataset": "members", "strategy": "fedamp",
                                         "member-input-shape": "6", "member-outputs": 3})
    assert members.settings.sigma("members", "federated") is None
    with pytest.raises(Exception, match="'fedamp-sigma-rule' = 'median'"):
        RunConfig.from_run_config({"fedamp-sigma-rule": "median"})


@pytest.mark.slow
def test_a_members_fedamp_run_with_every_default_chooses_sigma_and_keeps_it_on_resume(tmp_path):
    n = 4
    run_config, nodes = member_sites(tmp_path / "sites", "synthetic", n)
    common = {**run_config, "strategy": "fedamp", "results-dir": str(tmp_path),
              "server-device": "cpu", "min-nodes": n, "save-models": "none"}
    run_inprocess({**common, "run-name": "whole", "num-server-rounds": 4}, n, node_configs=nodes)
    run_inprocess({**common, "run-name": "cut", "num-server-rounds": 2}, n, node_configs=nodes)
    run_inprocess({**common, "run-name": "cut", "num-server-rounds": 4, "resume": True}, n,
                  node_configs=nodes)
    whole, cut = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in ("whole", "cut"))
    assert whole["finished"] and whole["sigma"]["fedamp"] is None  # no paper value: the data's
    note = whole["fedamp_sigma"]
    assert note["round"] == 1 and note["clients"] == n and note["value"] > 0
    state = torch.load(checkpoint_files(tmp_path / "whole")[0], weights_only=True)
    assert state["strategy"]["sigma"] == note["value"]
    assert cut["fedamp_sigma"] == note  # kept across the resume
    for got, want in zip(cut["rounds"], whole["rounds"], strict=True):
        assert got["client_accuracy"] == want["client_accuracy"]
    assert whole["rounds"][0]["trained_clients"] == list(range(n))
