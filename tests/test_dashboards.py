"""TensorBoard and MLflow (fedamp_flwr/server/dashboards.py): the scalars of a round's record worked by
hand, a run killed and resumed with each step once in both (read by TensorBoard's own reader
and MLflow's client) and equal to metrics.json, Panacea's server losses, a dashboard that fails
leaving the run whole, a missing package named before any work."""

from __future__ import annotations

import json
import logging
import os
import socket

import numpy as np
import pytest
from flwr.app import MessageType
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedamp_flwr.config import ConfigError, redact_uri
from fedamp_flwr.server import dashboards
from fedamp_flwr.server.dashboards import EXPERIMENT, heat_image, reason_kind, round_scalars

from .helpers import Crash, FaultyGrid, LocalGrid, grid_config, run_on_grid


def test_the_scalars_of_a_round_by_hand():
    rec = {"round": 3, "client_accuracy": {0: 0.5, 1: 0.75, 2: 1.0}, "mean_accuracy": 0.75,
           "novel_mean_accuracy": 0.25, "client_loss": {0: 1.5}, "mean_loss": 1.5,
           "trained_clients": [0, 2], "train_loss": 0.4, "global_norm": 2.0,
           "absent_clients": {1: "node not connected", 3: "rejected: update norm 12.5 > 10",
                              4: "rejected: NaN in arrays"},
           "absent_evaluation": {3: "no reply within the round timeout (30 s)"},
           "rejected": {3: "rejected: update norm 12.5 > 10", 4: "rejected: NaN in arrays"},
           "client_dp_epsilon": {0: 1.25, 2: float("nan")},
           "server_losses": {"model": 0.125, "graph": 0.69}}
    got = round_scalars(rec, ["site-a", "site@b", "c"])
    assert got == {
        "mean_accuracy": 0.75, "novel_mean_accuracy": 0.25, "mean_loss": 1.5,
        "client_accuracy/site-a": 0.5, "client_accuracy/site:b": 0.75, "client_accuracy/c": 1.0,
        "client_loss/site-a": 1.5, "train_loss": 0.4, "trained_clients": 2.0,
        "global_norm": 2.0, "absent_train/all": 3.0, "absent_train/node_not_connected": 1.0,
        "absent_train/rejected": 2.0, "rejected_train": 2.0, "absent_evaluate/all": 1.0,
        "absent_evaluate/no_reply_within_the_round_timeout": 1.0, "rejected_evaluate": 0.0,
        "epsilon/site-a": 1.25,  # a NaN is no value
        "server_loss/model": 0.125, "server_loss/graph": 0.69}
    # without names (a partitioned run): by client id; a client beyond the names too
    assert round_scalars({"client_mse": {7: 0.5}})["client_mse/7"] == 0.5
    assert reason_kind("rejected: update norm 12 > 3x median") == "rejected"
    assert reason_kind("node unavailable") == "node_unavailable"
    assert reason_kind("no reply within the round timeout (3 s)") ==\
        "no_reply_within_the_round_timeout"
    # a client's own words (an error reply's reason) never make a metric's name
    for words in ("../../x", "/abs", ".", "a/./b", "x" * 500, "rejected"[:-1]):
        assert reason_kind(words) == "other"
    # a name with @ and the name an impostor would take for it stay two curves
    two = round_scalars({"client_loss": {0: 1.0, 1: 2.0}}, ["a@b", "a_b"])
    assert {k: v for k, v in two.items() if k.startswith("client_loss/")} == {
        "client_loss/a:b": 1.0, "client_loss/a_b": 2.0}
    # a tracking URI's password is never shown
    assert redact_uri("http://me:secret@host:5000/x") == "http://me:***@host:5000/x"
    assert redact_uri("file:///tmp/mlruns") == "file:///tmp/mlruns"
    picture = heat_image(np.array([[1.0, 0.0], [0.5, 0.25]]))
    assert picture.shape == (256, 256, 3) and picture.dtype == np.uint8
    assert (picture[0, 0] != picture[0, 200]).any()  # 1 and 0 differ in colour


def _tensorboard(folder) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def _mlflow_run(store):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (found,) = client.search_runs([experiment.experiment_id])
    return client, found


@pytest.mark.slow
def test_a_run_killed_and_resumed_has_each_step_once_on_both_dashboards(tmp_path):
    # checkpoints every 2 rounds, killed in round 4: rounds 1-3 were on the dashboards, the
    # resume starts again at round 3
    cfg = grid_config(tmp_path, "fedamp", **{"checkpoint-every": 2, "tensorboard": True,
                                        "mlflow": True, "num-server-rounds": 5})
    grid = FaultyGrid(cfg, 3, crash_at=(4, MessageType.TRAIN))
    old = os.umask(0o022)  # a machine's usual umask: what MLflow and TensorBoard would use
    try:
        with pytest.raises(Crash):
            run_on_grid(grid, cfg)
        metrics = run_on_grid(grid, {**cfg, "resume": True})
    finally:
        os.umask(old)
    assert metrics["completed_rounds"] == 5
    # every file and folder the dashboards made is their owner's alone (every member's scores)
    made = [*(tmp_path / "mlruns").rglob("*"), *(tmp_path / "run" / "tensorboard").rglob("*")]
    assert len(made) > 20 and all(p.stat().st_mode & 0o077 == 0 for p in made), \
        [(str(p), oct(p.stat().st_mode)) for p in made if p.stat().st_mode & 0o077]
    acc = _tensorboard(tmp_path / "run" / "tensorboard")
    tags = acc.Tags()["scalars"]
    assert {"mean_accuracy", "client_accuracy/0", "client_accuracy/2", "client_loss/1",
            "train_loss", "absent_train/all"} <= set(tags)
    client, found = _mlflow_run(tmp_path / "mlruns")
    assert found.info.status == "FINISHED" and found.data.params["strategy"] == '"fedamp"'
    for rec in metrics["rounds"]:
        expected = round_scalars(rec)
        for tag in ("mean_accuracy", "client_accuracy/1", "mean_loss"):
            assert expected[tag] == pytest.approx(
                next(e.value for e in acc.Scalars(tag) if e.step == rec["round"]), rel=1e-6)
    for tag in tags:  # every step once, in order
        assert [e.step for e in acc.Scalars(tag)] == [1, 2, 3, 4, 5], tag
        history = client.get_metric_history(found.info.run_id, tag)
        assert sorted(m.step for m in history) == [1, 2, 3, 4, 5], tag
        assert {m.step: m.value for m in history} == {
            r["round"]: round_scalars(r)[tag] for r in metrics["rounds"]}, tag
    # FedAMP's xi, each round it was written, as an image
    assert [e.step for e in acc.Images("xi")] == [1, 2, 3, 4, 5]
    artifacts = [a.path for a in client.list_artifacts(found.info.run_id, "cards")]
    assert "cards/models.json" in artifacts and "cards/0.json" in artifacts


def test_panacea_logs_its_server_losses_and_a_failing_dashboard_leaves_the_run_whole(
        tmp_path, caplog, monkeypatch):
    # an MLflow server that does not answer: one warning, the run and its TensorBoard go on
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    cfg = grid_config(tmp_path, "panacea", **{"graph": "groups", "local-steps": 3, "min-nodes": 6,
                                         "num-server-rounds": 2, "tensorboard": True,
                                         "mlflow": True,
                                         "mlflow-uri": f"http://127.0.0.1:{port}"})
    with caplog.at_level(logging.WARNING):
        metrics = run_on_grid(LocalGrid(cfg, 6), cfg)
    assert metrics["finished"] is True
    assert any("MLflow: cannot start" in r.getMessage() for r in caplog.records)
    losses = metrics["rounds"][-1]["server_losses"]
    assert set(losses) == {"model", "graph"} and all(np.isfinite(list(losses.values())))
    acc = _tensorboard(tmp_path / "run" / "tensorboard")
    assert acc.Scalars("server_loss/graph")[-1].value == pytest.approx(losses["graph"])


def test_a_dashboard_without_its_package_is_one_error_before_any_work(tmp_path, monkeypatch):
    real = dashboards.importlib.util.find_spec
    monkeypatch.setattr(dashboards.importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    cfg = grid_config(tmp_path, "fedavg", mlflow=True)
    with pytest.raises(ConfigError, match=r"'mlflow' = true needs the mlflow package.*"
                                          r"pip install 'fedamp-flwr\[mlflow\]'"):
        run_on_grid(LocalGrid(cfg, 3), cfg)
    assert not (tmp_path / "run").exists()  # before the run's folder is made
    with pytest.raises(ConfigError, match="mlflow-uri"):
        run_on_grid(LocalGrid(c := grid_config(tmp_path, "fedavg", **{"mlflow-uri": "file:/x"}), 3), c)


def test_forget_removes_the_event_files_and_names_the_mlflow_run(tmp_path, capsys):
    from fedamp_flwr.tools.cli import main

    cfg = grid_config(tmp_path, "fedamp", **{"tensorboard": True, "mlflow": True,
                                        "num-server-rounds": 2})
    run_on_grid(LocalGrid(cfg, 3), cfg)
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    data = json.loads((tmp_path / "run" / "metrics.json").read_text())
    data["client_names"] = ["site-a", "site-b", "site-c"]  # as a members run names them
    (tmp_path / "run" / "metrics.json").write_text(json.dumps(data))
    assert main(["report", str(tmp_path / "run")]) == 0
    assert main(["report", str(tmp_path / "run"), "--members"]) == 0
    assert main(["forget", str(tmp_path / "run"), "site-b"]) in (0, 1)
    err = capsys.readouterr().err
    assert "not erased here: the run's MLflow run" in err
    assert not any(p.is_file() for p in (tmp_path / "run" / "tensorboard").rglob("*"))
    # the pages that name it are gone; another member's stays
    pages = sorted(p.name for p in (tmp_path / "run").glob("report*.html"))
    assert pages == ["report-site-a.html", "report-site-c.html"]
    audit = json.loads((tmp_path / "run" / "forgotten.json").read_text())["forgotten"][-1]
    assert not any("report" in f or "tensorboard" in f for f in audit["name_still_found_in"])


def test_dashboards_turned_on_at_a_resume_take_the_checkpoints_rounds(tmp_path):
    cfg = grid_config(tmp_path, "fedamp", **{"num-server-rounds": 4})
    grid = FaultyGrid(cfg, 3, crash_at=(3, MessageType.TRAIN))
    with pytest.raises(Crash):
        run_on_grid(grid, cfg)
    metrics = run_on_grid(grid, {**cfg, "resume": True, "tensorboard": True, "mlflow": True})
    assert metrics["completed_rounds"] == 4
    client, found = _mlflow_run(tmp_path / "mlruns")
    history = client.get_metric_history(found.info.run_id, "mean_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # 1-2 from the checkpoint
    assert [e.step for e in _tensorboard(tmp_path / "run" / "tensorboard").Scalars(
        "mean_accuracy")] == [3, 4]


def test_a_run_started_again_over_its_folder_shows_its_own_rounds_once(tmp_path):
    cfg = grid_config(tmp_path, "fedavg", **{"num-server-rounds": 2, "tensorboard": True})
    run_on_grid(LocalGrid(cfg, 3), cfg)
    assert main_report(tmp_path / "run") == 0
    run_on_grid(LocalGrid(cfg, 3), {**cfg, "overwrite": True})
    assert [e.step for e in _tensorboard(tmp_path / "run" / "tensorboard").Scalars(
        "mean_accuracy")] == [1, 2]
    assert not (tmp_path / "run" / "report.html").exists()  # the old run's page, gone


def main_report(folder) -> int:
    from fedamp_flwr.tools.cli import main

    return main(["report", str(folder)])
