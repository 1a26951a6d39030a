"""Members bring their own data (``dataset = "members"``), in process.

Each node reads only its own file, named by its node config (``data-path``,
``client-id``); the server checks every member's data against the run's
schema, leaves out a member that does not fit (by name) and numbers the
members by name. The end-to-end tests on a loopback fleet of SuperNodes are in
``tests/test_members_fleet.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

import tasks
from experiments.make_sites import member_name, write_sites
from fedamp_flwr import server_app
from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.server.discovery import ClientSetupError
from fedamp_flwr.tools.inprocess import InProcessGrid, task_identity
from tasks.members import MemberDataError, MemberSchema, load_member_data

from .helpers import JoiningGrid, RoundGrid, run_app, run_named, site_node_configs

ROUND_KEYS = ("round", "client_accuracy", "mean_accuracy", "train_loss", "mean_loss",
              "trained_clients")


def _rounds(metrics: dict) -> list[dict]:
    return [{k: r.get(k) for k in ROUND_KEYS} for r in metrics["rounds"]]


@pytest.mark.slow
@pytest.mark.parametrize("dataset, n, strategy, extra", [
    ("synthetic", 4, "fedamp", {"local-epochs": 1}),
    ("synthetic", 4, "heurfedamp", {"local-epochs": 1, "heurfedamp-sigma": 25.0}),
    ("synthetic", 4, "fedavg", {"local-epochs": 1}),
    # a strategy's values for a task ("auto": task_auto, strategies/tuned.json) are not in
    # the sites' run config (docs/federation.md): the ones that differ are given here
    ("fl60", 60, "panacea", {"panacea-server-lr": 0.01, "panacea-client-lr": 0.1}),
])
def test_members_files_give_the_numbers_of_the_partitioned_simulation(tmp_path, dataset, n,
                                                                      strategy, extra):
    seed = 3
    dc = tasks.DataConfig(dataset=dataset, data_dir="", num_clients=n, seed=seed)
    members_config = write_sites(dc, tmp_path / "sites")
    sigma = {"fedamp-sigma": 1.0} if strategy == "fedamp" else {}
    common = {"strategy": strategy, "seed": seed, **extra, **sigma}
    partitioned = run_named(tmp_path, "partitioned", {**common, "dataset": dataset}, n)
    members = run_named(tmp_path, "members", {**common, **members_config}, n,
                   site_node_configs(tmp_path / "sites", n))
    # the same clients, test results and losses (Panacea's server step sums in threads, which
    # changes its losses in the ninth digit from one run to the next, members or not)
    for got, want in zip(_rounds(members), _rounds(partitioned), strict=True):
        for key in ("round", "client_accuracy", "mean_accuracy", "trained_clients"):
            assert got[key] == want[key], (got["round"], key)
        for key in ("train_loss", "mean_loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-6), (got["round"], key)
    assert members["client_names"] == [member_name(i, n) for i in range(n)]


def test_a_misfit_member_is_left_out_by_name_and_the_others_go_on(tmp_path, caplog):
    n = 3
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    nodes = site_node_configs(tmp_path / "sites", n)
    rng = np.random.default_rng(0)
    bad = tmp_path / "five-features.npz"
    np.savez(bad, x=rng.normal(size=(20, 5)).astype(np.float32), y=rng.integers(0, 2, 20))
    nodes.append({"data-path": str(bad), "client-id": "site-bad"})
    with caplog.at_level(logging.WARNING):
        metrics = run_named(tmp_path, "misfit", {**run_config, "strategy": "fedavg",
                                             "local-epochs": 1, "min-nodes": n}, n, nodes)
    assert metrics["client_names"] == [member_name(i, n) for i in range(n)]
    assert all(r["trained_clients"] == [0, 1, 2] for r in metrics["rounds"])
    left_out = [r.getMessage() for r in caplog.records if "Left out" in r.getMessage()]
    assert len(left_out) == 1 and "member 'site-bad'" in left_out[0]
    features = tasks.data_info(dc).input_shape[0]
    assert f"x has 5 feature(s) per row; the run expects {features}" in left_out[0]
    # and the server's words reach the member's own node, which logs them
    told = [r.getMessage() for r in caplog.records if "The run leaves this node out" in
            r.getMessage()]
    assert told == [f"The run leaves this node out: left out: {left_out[0][len('Left out: '):]}"]


def test_two_nodes_claiming_one_client_id_are_both_refused(tmp_path, caplog):
    n = 3
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    nodes = site_node_configs(tmp_path / "sites", n)
    nodes.append({**nodes[1]})  # node 103 claims client-1, as node 101 does
    with caplog.at_level(logging.WARNING):
        metrics = run_named(tmp_path, "dup", {**run_config, "strategy": "fedavg", "local-epochs": 1,
                                          "min-nodes": 2}, n, nodes)
    assert metrics["client_names"] == ["client-0", "client-2"]
    assert "member 'client-1' (node 101): node(s) 103 claim the same client-id" in caplog.text
    assert "member 'client-1' (node 103): node(s) 101 claim the same client-id" in caplog.text
    # each of the two nodes hears why, once, in its own log
    assert caplog.text.count("The run leaves this node out: held back: another connected node "
                             "has or claims the client-id 'client-1'") == 2


class MovingGrid(RoundGrid):
    """Members on nodes 100, 101, ...; from round ``moved_at`` on, member 1 is on node 900 (a
    restarted SuperNode: a new node id, an empty context.state) and node 901 claims member
    0's client-id while member 0's node is still connected."""

    def __init__(self, run_config: dict, nodes: list[dict], moved_at: int | None) -> None:
        super().__init__(run_config, nodes)
        self.moved_at, self.before = moved_at, list(self.contexts)
        for node, config in ((900, nodes[1]), (901, nodes[0])):
            self.contexts[node] = Context(run_id=1, node_id=node, state=RecordDict(),
                                          run_config=self.run_config, node_config=dict(config))

    def get_node_ids(self) -> list[int]:
        if self.moved_at is None or self.round < self.moved_at:
            return self.before
        return [n for n in self.before if n != self.before[1]] + [900, 901]


def test_a_member_on_a_new_node_keeps_its_id_and_its_personalized_model(tmp_path, caplog):
    """The same numbers as if member 1 had never moved: its row of FedAMP's store (its w_i)
    followed it to its new node; the node claiming a connected member's name is refused."""
    n = 3
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    nodes = site_node_configs(tmp_path / "sites", n)
    results = {}
    for name, moved_at in (("stayed", None), ("moved", 2)):
        cfg = {**run_config, "strategy": "fedamp", "fedamp-sigma": 1.0, "local-epochs": 1,
               "num-server-rounds": 3, "results-dir": str(tmp_path), "run-name": name,
               "server-device": "cpu"}
        with task_identity(), caplog.at_level(logging.INFO):
            server_app.app(MovingGrid(cfg, nodes, moved_at),
                           Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                   run_config=cfg))
        results[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    assert results["moved"]["client_names"] == ["client-0", "client-1", "client-2"]
    assert _rounds(results["moved"]) == _rounds(results["stayed"])
    assert "Member 'client-1' is back, on node 900 (was 101)" in caplog.text
    assert "member 'client-0' (node 901): node 100 already has client-id 'client-0'" in caplog.text


def test_too_few_fitting_members_stop_the_run_naming_the_refused(tmp_path):
    rng = np.random.default_rng(0)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=rng.normal(size=(20, 3)).astype(np.float32), y=rng.integers(0, 9, 20))
    cfg = {"dataset": "members", "member-input-shape": "3", "member-outputs": 2,
           "strategy": "fedavg", "node-wait-timeout": 1.0, "min-nodes": 2}
    with pytest.raises(ClientSetupError, match=r"only 0 member\(s\) with fitting data .* "
                                               r"member 'lab-7' \(node 100\): .*labels \[2, 3"):
        run_named(tmp_path, "few", cfg, 1, [{"data-path": str(bad), "client-id": "lab-7"}])
    # the fleet min-nodes asks for is there, and every node of it is left out: at once,
    # not after node-wait-timeout
    import time

    cfg = {**cfg, "node-wait-timeout": 600.0, "min-nodes": 2}
    two = [{"data-path": str(bad), "client-id": "lab-7"},
           {"data-path": str(tmp_path / "none.csv"), "client-id": "lab-8"}]
    started = time.monotonic()
    with pytest.raises(ClientSetupError, match=r"every one of the 2 connected node\(s\) is left "
                                               r"out, none can take part \(min-nodes is 2\); "
                                               r"left out: member 'lab-7' .*member 'lab-8' "
                                               r"\(node 101\): .*none.csv: does not exist"):
        run_named(tmp_path, "none-fit", cfg, 2, two)
    assert time.monotonic() - started < 60


def test_members_run_config_is_checked_before_anything_runs():
    base = {"dataset": "members", "member-outputs": 2, "strategy": "fedavg"}
    with pytest.raises(ConfigError, match="member-input-shape"):
        RunConfig.from_run_config({**base, "member-input-shape": "2,2"})
    with pytest.raises(ConfigError, match="'member-outputs' = 0"):
        RunConfig.from_run_config({**base, "member-input-shape": "4", "member-outputs": 0})
    with pytest.raises(ConfigError, match="'model' = 'cnn'.*needs image inputs"):
        RunConfig.from_run_config({**base, "member-input-shape": "4", "model": "cnn"})
    with pytest.raises(ConfigError, match="'graph' = 'task'"):
        RunConfig.from_run_config({**base, "member-input-shape": "4", "strategy": "panacea"})
    with pytest.raises(ConfigError, match="'member-class-names'"):
        RunConfig.from_run_config({**base, "member-input-shape": "4",
                                   "member-class-names": "a,b,c"})
    cfg = RunConfig.from_run_config({**base, "member-input-shape": "1,28,28"})
    assert tasks.model_name(cfg.data_config(2), cfg.model) == "cnn"
    cfg = RunConfig.from_run_config({**base, "member-input-shape": "3,32,32"})
    assert tasks.model_name(cfg.data_config(2), cfg.model) == "resnet18"


# ---------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------
SCHEMA = MemberSchema((3,), "classification", 2, ("no", "yes"), "label", ())


def test_csv_and_parquet_tables_with_names_and_a_split_column(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"a": [0.1, 0.2, 0.3, 0.4, 0.5], "b": [1, 2, 3, 4, 5],
                          "c": [5.0, 4, 3, 2, 1], "label": ["no", "yes", "yes", "no", "yes"],
                          "split": ["train", "train", "test", "train", "test"]})
    for path in (tmp_path / "t.csv", tmp_path / "t.parquet"):
        (frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path))
        train, test = load_member_data(path, SCHEMA, 0, "site")
        assert train.x.shape == (3, 3) and test.x.shape == (2, 3)
        assert train.y.tolist() == [0, 1, 0] and test.y.tolist() == [1, 1]
    frame.drop(columns=["split"]).to_csv(tmp_path / "nosplit.csv", index=False)
    train, test = load_member_data(tmp_path / "nosplit.csv", SCHEMA, 0, "site")
    assert len(train.y) == 4 and len(test.y) == 1  # the seeded 80/20 split
    frame.rename(columns={"label": "target"}).to_csv(tmp_path / "nolabel.csv", index=False)
    with pytest.raises(MemberDataError, match="no label column 'label'"):
        load_member_data(tmp_path / "nolabel.csv", SCHEMA, 0, "site")
    frame.assign(label=["no", "maybe", "yes", "no", "yes"]).to_csv(tmp_path / "odd.csv",
                                                                   index=False)
    with pytest.raises(MemberDataError, match=r"labels \['maybe'\]"):
        load_member_data(tmp_path / "odd.csv", SCHEMA, 0, "site")


def test_categorical_columns_one_hot_against_the_runs_categories(tmp_path):
    """member-categories: a categorical column becomes one input per declared category, in
    the declared order, at the column's place among the features; a value outside them, an
    empty cell, a width that is not member-input-shape, are each named."""
    import pandas as pd

    cfg = RunConfig.from_run_config({
        "dataset": "members", "member-input-shape": "5", "member-outputs": 2,
        "member-class-names": "no,yes", "strategy": "fedavg",
        "member-categories": "sex: male, female; grade: 1, 2"})
    schema = cfg.member_schema()
    assert schema is not None and schema.categories == (("sex", ("male", "female")),
                                                        ("grade", ("1", "2")))
    frame = pd.DataFrame({"sex": ["female", " male", "female"], "age": [30.5, 41.0, 52.0],
                          "grade": [2, 1, 1], "label": ["no", "yes", "no"],
                          "split": ["train", "train", "test"]})
    for path in (tmp_path / "t.csv", tmp_path / "t.parquet"):
        (frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path))
        train, test = load_member_data(path, schema, 0, "site")
        # sex=male, sex=female, age, grade=1, grade=2
        assert train.x.tolist() == [[0, 1, 30.5, 0, 1], [1, 0, 41.0, 1, 0]], path
        assert test.x.tolist() == [[0, 1, 52.0, 1, 0]]
    assert schema.input_names(["sex", "age", "grade"]) == [
        "sex=male", "sex=female", "age", "grade=1", "grade=2"]
    # grade stored as floats with a gap (a Parquet of a column with missing values)
    frame.assign(grade=[2.0, None, 1.0]).to_parquet(tmp_path / "gap.parquet")
    frame.assign(sex=["female", "F", "x"]).to_csv(tmp_path / "odd.csv", index=False)
    with pytest.raises(MemberDataError, match=r"column 'grade' is missing \(empty or n/a\) at "
                                              r"row 2"):
        load_member_data(tmp_path / "gap.parquet", schema, 0, "site")
    with pytest.raises(MemberDataError, match=r"column 'sex' holds \['F', 'x'\] at lines 3, 4; "
                                              r"its categories are \['male', 'female'\]"):
        load_member_data(tmp_path / "odd.csv", schema, 0, "site")
    frame.drop(columns=["grade"]).to_csv(tmp_path / "nograde.csv", index=False)
    with pytest.raises(MemberDataError, match=r"categorical column\(s\) \['grade'\] .* not "
                                              r"among .*2 feature column\(s\) \(sex, age\), "
                                              r"which give 3 inputs .*the run expects 5"):
        load_member_data(tmp_path / "nograde.csv", schema, 0, "site")
    # the run config itself: a width the feature columns cannot give, or a bad declaration
    base = {"dataset": "members", "member-outputs": 2, "strategy": "fedavg"}
    with pytest.raises(ConfigError, match=r"'member-input-shape' = '4'.*\"5\": "
                                          "member-feature-columns give 5 inputs"):
        RunConfig.from_run_config({**base, "member-input-shape": "4",
                                   "member-feature-columns": "sex,age,grade",
                                   "member-categories": "sex: m, f; grade: 1, 2"})
    for bad in ("sex", "sex: m, m", "sex: m,; age: 1", "label: a, b", "sex: a; sex: b",
                "other: a, b"):
        with pytest.raises(ConfigError, match="'member-categories'"):
            RunConfig.from_run_config({**base, "member-input-shape": "3",
                                       "member-feature-columns": "sex,age",
                                       "member-categories": bad})
    with pytest.raises(ConfigError, match="'member-categories'.*only with vector inputs"):
        RunConfig.from_run_config({**base, "member-input-shape": "1,8,8",
                                   "member-categories": "sex: m, f"})
    # a CSV written from a float column with gaps ("2.0"), and categories that read like
    # missing values in pandas ("NA", "None"): the same inputs as the Parquet table
    cfg = RunConfig.from_run_config({**base, "member-input-shape": "5",
                                     "member-categories": "region: NA, None; grade: 1, 2"})
    schema = cfg.member_schema()
    assert schema is not None
    table = pd.DataFrame({"region": ["NA", "None", "NA"], "age": [1.0, 2.0, 3.0],
                          "grade": [2.0, 1.0, None], "label": [0, 1, 0]})
    table.to_csv(tmp_path / "na.csv", index=False)
    assert "2.0" in (tmp_path / "na.csv").read_text()
    with pytest.raises(MemberDataError, match=r"^[^;]*column 'grade' is missing \(empty or "
                                              r"n/a\) at line 4$"):
        load_member_data(tmp_path / "na.csv", schema, 0, "site")
    table.assign(grade=[2.0, 1.0, 1.0]).to_csv(tmp_path / "na.csv", index=False)
    table.assign(grade=[2.0, 1.0, 1.0]).to_parquet(tmp_path / "na.parquet")
    rows = [tasks.members.read_member_rows(tmp_path / f"na.{kind}", schema).x.tolist()
            for kind in ("csv", "parquet")]
    assert rows[0] == rows[1] == [[1, 0, 1, 0, 1], [0, 1, 2, 1, 0], [1, 0, 3, 1, 0]]


def test_an_image_folder_one_subfolder_per_class(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    schema = MemberSchema((1, 8, 8), "classification", 3, ("cat", "dog", "owl"))
    for cls in ("cat", "owl"):  # this site has no dogs
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(
                tmp_path / "imgs" / cls / f"{i}.png")
    train, test = load_member_data(tmp_path / "imgs", schema, 0, "site")
    assert train.x.shape == (8, 1, 8, 8) and train.x.dtype == np.uint8
    assert set(train.y.tolist()) | set(test.y.tolist()) == {0, 2}
    (tmp_path / "imgs" / "fox").mkdir()
    with pytest.raises(MemberDataError, match=r"class folder\(s\) \['fox'\]"):
        load_member_data(tmp_path / "imgs", schema, 0, "site")


def test_npz_problems_are_named(tmp_path):
    with pytest.raises(MemberDataError, match="does not exist"):
        load_member_data(tmp_path / "missing.npz", SCHEMA, 0, "s")
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object), y=np.array([0]))
    with pytest.raises(MemberDataError, match="object arrays, which only pickle can read"):
        load_member_data(tmp_path / "obj.npz", SCHEMA, 0, "s")
    np.savez(tmp_path / "noy.npz", x=np.zeros((4, 3)))
    with pytest.raises(MemberDataError, match=r"has no array\(s\) \['y'\]"):
        load_member_data(tmp_path / "noy.npz", SCHEMA, 0, "s")
    np.savez(tmp_path / "nan.npz", x=np.full((4, 3), np.nan), y=np.zeros(4, dtype=int))
    with pytest.raises(MemberDataError, match="non-finite"):
        load_member_data(tmp_path / "nan.npz", SCHEMA, 0, "s")
    (tmp_path / "data.txt").write_text("1,2,3")
    with pytest.raises(MemberDataError, match="suffix '.txt'"):
        load_member_data(tmp_path / "data.txt", SCHEMA, 0, "s")


@pytest.mark.parametrize("strategy, extra", [
    ("fedamp", {"fedamp-sigma": 1.0}), ("separate", {}), ("fedavg", {}),
    ("panacea", {"graph": "file", "panacea-server-lr": 0.01, "local-steps": 3}),
])
def test_a_member_that_joins_a_run_under_way_gets_the_next_id_and_trains(tmp_path, strategy,
                                                                         extra, caplog):
    n = 4
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    graph = tmp_path / "graph.csv"
    graph.write_text("u,v\nclient-0,client-1\nclient-1,client-2\nclient-2,client-3\n"
                     "client-0,client-unknown\n")  # a name that never joins: no edge
    cfg = {**run_config, "strategy": strategy, "local-epochs": 1, "num-server-rounds": 3,
           "min-nodes": 3, "results-dir": str(tmp_path), "run-name": strategy,
           "server-device": "cpu", "graph-file": str(graph), **extra}
    with caplog.at_level(logging.INFO):
        metrics = run_app(JoiningGrid(cfg, site_node_configs(tmp_path / "sites", n), joins_at=2), cfg)
    assert metrics["client_names"] == ["client-0", "client-1", "client-2", "client-3"]
    assert [r["trained_clients"] for r in metrics["rounds"]] == [[0, 1, 2]] + [[0, 1, 2, 3]] * 2
    assert set(metrics["rounds"][2]["client_accuracy"]) == {"0", "1", "2", "3"}
    assert "Member 'client-3' joins the run as client 3" in caplog.text
    if strategy == "panacea":  # the graph over the members' names, before client-3 joins
        assert "Client graph 'file': 3 clients, 2 edges" in caplog.text


def test_a_resumed_run_takes_a_new_member_after_the_checkpoints_ones(tmp_path):
    n = 4
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    nodes = site_node_configs(tmp_path / "sites", n)
    cfg = {**run_config, "strategy": "fedamp", "fedamp-sigma": 1.0, "local-epochs": 1,
           "num-server-rounds": 2, "min-nodes": 3, "results-dir": str(tmp_path),
           "run-name": "grow", "server-device": "cpu"}
    first = run_app(InProcessGrid(cfg, node_configs=nodes[:3]), cfg)
    assert first["client_names"] == ["client-0", "client-1", "client-2"]
    cfg = {**cfg, "num-server-rounds": 3, "resume": True}
    # the members come back in another order, with a fourth one
    resumed = run_app(InProcessGrid(cfg, node_configs=[nodes[3], nodes[2], nodes[0], nodes[1]]),
                   cfg)
    assert resumed["client_names"] == ["client-0", "client-1", "client-2", "client-3"]
    assert resumed["rounds"][:2] == first["rounds"]
    assert resumed["rounds"][2]["trained_clients"] == [0, 1, 2, 3]


def _bad_files(folder: Path) -> dict[str, Path]:
    """Files the run refuses, one problem (or several) each, in every format."""
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"])
    frame["label"] = rng.choice(["no", "yes"], 30)
    files = {}
    frame[["a", "b", "label"]].to_csv(files.setdefault("two columns", folder / "two.csv"),
                                      index=False)
    odd = frame.astype({"b": object})
    odd.loc[3, "b"], odd.loc[4, "label"] = "x", "maybe"
    odd.rename(columns={"a": "A"}).to_csv(files.setdefault("renamed", folder / "renamed.csv"),
                                          index=False)
    frame.assign(split="later").to_parquet(files.setdefault("split", folder / "split.parquet"))
    np.savez(files.setdefault("npz shape", folder / "shape.npz"),
             x=rng.normal(size=(20, 4)).astype(np.float32), y=rng.integers(0, 2, 20))
    np.savez(files.setdefault("npz labels", folder / "labels.npz"),
             x=rng.normal(size=(20, 3)).astype(np.float32), y=rng.integers(0, 5, 20))
    frame.to_csv(files.setdefault("good", folder / "good.csv"), index=False)
    return files


def test_check_data_refuses_every_file_the_run_refuses_with_the_same_words(tmp_path, capsys):
    """One checker: what ``fedamp-flwr check-data`` says of a file with the run's config is
    what the run says when it leaves the member out (the wrong column count included), and
    a file that "fits" is one the server accepts."""
    from fedamp_flwr.server.discovery import query_nodes
    from fedamp_flwr.server.membership import Membership
    from fedamp_flwr.tools import cli

    config = "member-input-shape='3' member-outputs=2 member-class-names='no,yes'"
    run_config = {"dataset": "members", "member-input-shape": "3", "member-outputs": 2,
                  "member-class-names": "no,yes", "strategy": "fedavg"}
    schema = RunConfig.from_run_config(run_config).member_schema()
    for case, path in _bad_files(tmp_path).items():
        status = cli.main(["check-data", str(path), "--run-config", config,
                           "--client-id", "site-1"])
        said = capsys.readouterr().out.strip()
        grid = InProcessGrid(run_config, node_configs=[{"data-path": str(path),
                                                         "client-id": "site-1"}])
        with task_identity():
            infos, errors = query_nodes(grid, list(grid.contexts), 60, Membership(schema=schema))
        if case == "good":
            assert status == 0 and said.startswith("fits: ") and list(infos) == [100], said
            continue
        assert status == 1 and said.startswith("does not fit: "), (case, said)
        (refusal,) = errors.values()
        assert said.removeprefix("does not fit: ") in refusal, (case, said, refusal)
        if case == "two columns":
            assert said.endswith("it has 2 feature column(s) (a, b); the run expects 3 "
                                 "(member-input-shape)"), said
        if case == "renamed":
            assert "2 problems: column 'b' holds non-numeric values such as 'x'" in said, said
    # a column the run names and the file lacks: said with the file's other problems
    named = tasks.MemberSchema((3,), "classification", 2, ("no", "yes"), "label",
                               ("a", "b", "c"))
    with pytest.raises(MemberDataError, match=r"3 problems: it lacks the feature column\(s\) "
                                              r"\['a'\] .*column 'b' holds non-numeric .*"
                                              r"labels \['maybe'\]"):
        load_member_data(tmp_path / "renamed.csv", named, 0, "s")
