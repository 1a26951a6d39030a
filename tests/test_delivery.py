"""Each client's model delivered (save-models), used (fedamp-flwr predict), and a member's
data checked before it joins (fedamp-flwr check-data), in process.

The same on a loopback fleet of SuperNodes, each with its own model-dir:
``tests/test_members_fleet.py``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import tasks
from experiments.make_sites import member_name, write_sites
from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.tools import cli
from tasks.export import ModelFileError, load_model

from .helpers import SHARED_DATA, run_named


def _test_rows(dc: tasks.DataConfig, client: int, path: Path) -> Path:
    """A client's test rows (as the run tests on them) in a members' .npz file."""
    d = tasks.load_client_data(dc, client)
    np.savez(path, x=d.x_test.numpy(), y=d.y_test.numpy())
    return path


def _predicted_score(model: Path, data: Path, out: Path, capsys) -> str:
    assert cli.main(["predict", str(model), str(data), "--out", str(out)]) == 0
    assert out.stat().st_mode & 0o077 == 0  # a prediction per row of the member's: its own
    line = capsys.readouterr().out.strip().splitlines()[-1]
    return line.split(" on ")[0]  # "accuracy 0.46" / "mse 0.0123..."


@pytest.mark.slow
@pytest.mark.parametrize("strategy, dataset, n, extra", [
    ("fedamp", "synthetic", 3, {"local-epochs": 1}),
    ("fedavg-ft", "synthetic", 3, {"local-epochs": 1}),
    ("apfl", "synthetic", 3, {"local-epochs": 1}),
    ("panacea", "fl60", 60, {"fl60-variant": "grda", "local-steps": 2}),
    ("fedavg", "tpt48", 48, {"data-dir": str(SHARED_DATA / "tpt48")}),
])
def test_a_simulated_run_leaves_every_clients_model_and_predict_gives_its_recorded_score(
        tmp_path, capsys, strategy, dataset, n, extra):
    if dataset == "tpt48" and not Path(extra["data-dir"]).is_dir():
        pytest.skip("TPT-48 is not in ../shared/data")
    metrics = run_named(tmp_path, "run", {"strategy": strategy, "dataset": dataset, **extra}, n)
    folder = tmp_path / "run" / "models"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{i}{suffix}" for i in range(n) for suffix in (".json", ".safetensors"))
    last = metrics["rounds"][-1]
    cfg = RunConfig.from_run_config({"strategy": strategy, "dataset": dataset, **extra})
    dc = cfg.data_config(n)
    key = "accuracy" if "client_accuracy" in last else "mse"
    for client in (0, n - 1):
        card = json.loads((folder / f"{client}.json").read_text())
        assert card["client_id"] == client and card["round"] == 2 and card["run"] == "run"
        assert card["strategy"] == strategy and card["why"] == "the last round"
        assert card["score"][key] == last[f"client_{key}"][str(client)]
        data = _test_rows(dc, client, tmp_path / f"test-{client}.npz")
        got = _predicted_score(folder / f"{client}.safetensors", data, tmp_path / "p.csv", capsys)
        name, value = got.split()
        assert name == key
        if key == "accuracy":  # to the last digit
            assert float(value) == last["client_accuracy"][str(client)]
        else:
            assert float(value) == pytest.approx(last["client_mse"][str(client)], abs=1e-6)
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert len(rows) == 1 + len(tasks.load_client_data(dc, n - 1).y_test)
    assert rows[0].startswith("row,prediction")


def test_a_changed_byte_is_refused_and_data_that_does_not_fit_gets_one_line(tmp_path, capsys):
    run_named(tmp_path, "run", {"strategy": "fedavg", "local-epochs": 1}, 2)
    model = tmp_path / "run" / "models" / "0.safetensors"
    good = load_model(model)
    assert good.card["schema"]["input_shape"] == [32]
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((4, 5), np.float32), y=np.zeros(4, np.int64))
    assert cli.main(["predict", str(model), str(wrong)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {wrong}: x has 5 feature(s) per row; the run expects 32"]
    data = bytearray(model.read_bytes())
    data[-3] ^= 0x01
    model.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="sha256 .* is not the card's"):
        load_model(model)
    assert cli.main(["predict", str(model), str(wrong)]) == 1
    assert "refused" in capsys.readouterr().err


def test_files_are_owner_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAMP_CACHE_DIR", str(tmp_path / "cache" / "fedamp"))
    monkeypatch.setattr(os, "umask", os.umask)  # the test's umask is put back below
    old = os.umask(0o022)
    try:
        run_named(tmp_path, "run", {"strategy": "fedavg", "local-epochs": 1}, 2)
        tasks.loading._client_data.cache_clear()
        tasks.load_client_data(tasks.DataConfig("synthetic", "", 2, 7), 0)
    finally:
        os.umask(old)
    cached = list((tmp_path / "cache" / "fedamp").glob("*.npz"))
    assert cached
    for path in [*cached, *(tmp_path / "run" / "models").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for folder in (tmp_path / "cache" / "fedamp", tmp_path / "cache", tmp_path / "run" / "models"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_a_resumed_run_goes_on_writing_the_same_files(tmp_path):
    common = {"strategy": "fedamp", "local-epochs": 1, "save-models": "every-checkpoint"}
    run_named(tmp_path, "run", common, 3)
    folder = tmp_path / "run" / "models"
    before = sorted(p.name for p in folder.iterdir())
    token = json.loads((folder / "0.json").read_text())["run_token"]
    run_named(tmp_path, "run", {**common, "resume": True, "num-server-rounds": 3}, 3)
    assert sorted(p.name for p in folder.iterdir()) == before and len(before) == 6
    for i in range(3):
        card = json.loads((folder / f"{i}.json").read_text())
        assert card["round"] == 3 and card["run_token"] == token


def test_save_models_none_writes_nothing_and_changes_no_number(tmp_path):
    with_models = run_named(tmp_path, "a", {"strategy": "fedamp", "local-epochs": 1}, 3)
    without = run_named(tmp_path, "b", {"strategy": "fedamp", "local-epochs": 1,
                                   "save-models": "none"}, 3)
    assert not (tmp_path / "b" / "models").exists()
    assert with_models["rounds"] == without["rounds"]


def test_best_validation_keeps_each_clients_best_validation_round(tmp_path):
    with pytest.raises(ConfigError, match="'save-models' = 'best-validation'.*validation-fraction"):
        RunConfig.from_run_config({"save-models": "best-validation"})
    metrics = run_named(tmp_path, "run", {"strategy": "fedavg", "local-epochs": 1,
                                     "save-models": "best-validation",
                                     "validation-fraction": 0.2, "num-server-rounds": 4}, 3)
    for client in range(3):
        series = [r["client_accuracy"][str(client)] for r in metrics["rounds"]]
        card = json.loads((tmp_path / "run" / "models" / f"{client}.json").read_text())
        assert card["round"] == 1 + int(np.argmax(series))  # the first round of the best
        assert card["score"]["accuracy"] == max(series)
        assert card["score"]["on"].startswith("validation rows")


def _members(tmp_path: Path, n: int, model_dirs: bool) -> tuple[dict, list[dict]]:
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    nodes = [{"data-path": str(tmp_path / "sites" / f"{member_name(i, n)}.npz"),
              "client-id": member_name(i, n),
              **({"model-dir": str(tmp_path / member_name(i, n))} if model_dirs else {})}
             for i in range(n)]
    return run_config, nodes


def test_each_member_gets_its_own_model_on_its_own_machine_and_left_out_members_are_recorded(
        tmp_path, capsys, caplog):
    n = 3
    run_config, nodes = _members(tmp_path, n, model_dirs=True)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.full((6, 32), np.nan, np.float32), y=np.array([0, 1, 12, 0, 1, 0]))
    nodes.append({"data-path": str(bad), "client-id": "site-bad",
                  "model-dir": str(tmp_path / "site-bad")})
    with caplog.at_level(logging.INFO):
        metrics = run_named(tmp_path / "coordinator", "run",
                       {**run_config, "strategy": "fedamp", "fedamp-sigma": 1.0,
                        "local-epochs": 1, "min-nodes": n}, n, nodes)
    # the member's own log names every problem of its file
    own = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("This node cannot take part")]
    assert any("2 problems" in m and "labels [12]" in m and "non-finite" in m for m in own)
    assert list(metrics["left_out"].values()) == [
        next(v for v in metrics["left_out"].values())]  # one member left out ...
    assert "site-bad" in next(iter(metrics["left_out"].values()))  # ... by name, with why
    assert "partitioning" not in metrics
    assert not (tmp_path / "coordinator" / "run" / "models").exists()
    assert not (tmp_path / "site-bad").exists()
    last = metrics["rounds"][-1]
    for i in range(n):
        name = member_name(i, n)
        assert sorted(p.name for p in (tmp_path / name / "run").iterdir()) == [
            f"{name}.json", f"{name}.safetensors"]
        card = json.loads((tmp_path / name / "run" / f"{name}.json").read_text())
        cid = metrics["client_names"].index(name)
        assert card["member"] == name and card["client_id"] == cid
        with np.load(nodes[i]["data-path"]) as site:  # write_sites gives x_test / y_test
            np.savez(tmp_path / "t.npz", x=site["x_test"], y=site["y_test"])
        got = _predicted_score(tmp_path / name / "run" / f"{name}.safetensors",
                               tmp_path / "t.npz", tmp_path / "p.csv", capsys)
        # the model it took home by its own rule (fedamp_flwr/member/member_choice.py), scored as
        # its card says; the run's own where that is its federated model
        choice = card["choice"]
        assert sorted(choice["held_out"]) == sorted(choice["test"]) == [
            "federated", "linear alone", "model alone"]
        assert got == f"accuracy {card['score']['accuracy']!r}"
        assert card["score"]["accuracy"] == choice["test"][choice["kept"]]["accuracy"]
        if choice["kept"] == "federated":
            assert got == f"accuracy {last['client_accuracy'][str(cid)]!r}"
        # whom it learned from: the other members by name, with the last round's xi row
        xi = np.load(sorted((tmp_path / "coordinator" / "run" / "xi").glob("round-*.npy"))[-1])
        learned = card["learned_from"]
        assert learned["own_model"] == pytest.approx(xi[cid, cid], rel=1e-6)
        assert {o["member"]: o["weight"] for o in learned["others"]} == pytest.approx(
            {metrics["client_names"][j]: float(xi[cid, j]) for j in range(n) if j != cid},
            rel=1e-6)
        said = [r.getMessage() for r in caplog.records if "learned most from" in r.getMessage()]
        assert any(f"'{learned['others'][0]['member']}'" in m for m in said)


def test_a_member_without_model_dir_writes_nothing_and_says_so(tmp_path, caplog):
    run_config, nodes = _members(tmp_path, 2, model_dirs=False)
    with caplog.at_level(logging.WARNING):
        run_named(tmp_path / "coordinator", "run", {**run_config, "strategy": "fedavg",
                                               "local-epochs": 1}, 2, nodes)
    said = [r for r in caplog.records if "names no 'model-dir'" in r.getMessage()]
    assert len(said) == 2  # once per node
    assert not (tmp_path / "coordinator" / "run" / "models").exists()
    assert not list(tmp_path.rglob("*.safetensors"))


def test_check_data_lists_every_problem_before_joining(tmp_path, capsys):
    import pandas as pd

    run = "member-input-shape='3' member-outputs=2 member-class-names='no,yes'"
    good = pd.DataFrame({"a": [0.1, 0.2, 0.3], "b": [1, 2, 3], "c": [3.0, 2, 1],
                         "label": ["no", "yes", "no"]})
    good.to_csv(tmp_path / "good.csv", index=False)
    assert cli.main(["check-data", str(tmp_path / "good.csv"), "--run-config", run]) == 0
    assert capsys.readouterr().out.startswith(f"fits: {tmp_path / 'good.csv'}: 2 training and 1")
    (tmp_path / "bad.csv").write_text("a,b,c,label\n0.1,1,3,no\nn/a,2,2,yes\n0.3,x,1,maybe\n")
    assert cli.main(["check-data", str(tmp_path / "bad.csv"), "--run-config", run]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"does not fit: {tmp_path / 'bad.csv'}: 3 problems: column 'a' is missing "
                   "(empty or n/a) at line 3; column 'b' holds non-numeric values such as 'x' "
                   "at line 4; label column 'label' has labels ['maybe'] that are not among the "
                   "run's classes ['no', 'yes'] at line 4"]
    assert cli.main(["check-data", str(tmp_path / "good.csv"), "--run-config",
                     "member-outputs=-1"]) == 2


def test_a_client_absent_from_the_last_evaluation_still_gets_its_model(tmp_path):
    from flwr.app import Context, RecordDict

    from fedamp_flwr import server_app
    from fedamp_flwr.tools.inprocess import InProcessGrid, task_identity

    class LosesOneReply(InProcessGrid):
        """The last round's evaluation reply of node 101 (client 1) never arrives."""

        evaluations = 0

        def send_and_receive(self, messages, timeout=None):
            messages = list(messages)
            replies = super().send_and_receive(messages, timeout)
            if messages and messages[0].metadata.message_type == "evaluate":
                self.evaluations += 1
                if self.evaluations == 2:
                    return [r for r in replies if r.metadata.src_node_id != 101]
            return replies

    cfg = {"num-server-rounds": 2, "results-dir": str(tmp_path), "run-name": "run",
           "server-device": "cpu", "min-nodes": 3, "strategy": "fedamp", "local-epochs": 1}
    grid = LosesOneReply(cfg, 3)
    with task_identity():
        server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                run_config=cfg))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "1" in metrics["rounds"][-1]["absent_evaluation"]
    assert grid.evaluations == 3  # the delivery after the run
    card = json.loads((tmp_path / "run" / "models" / "1.json").read_text())
    assert card["round"] == 2 and card["why"].startswith("after the run: the client was absent")
    assert json.loads((tmp_path / "run" / "models" / "0.json").read_text())["why"] == \
        "the last round"


def test_a_hostile_save_request_never_writes_outside_the_model_dir(tmp_path, caplog):
    from flwr.app import ConfigRecord, Context, RecordDict

    from fedamp_flwr.member.keeping import keep_tested_model
    from strategies.core.protocol import MODEL_KEPT, SAVE_MODEL, SAVE_TOKEN, SERVER_ROUND

    with pytest.raises(ConfigError, match="'run-name' = 'grid/a'"):
        RunConfig.from_run_config({"run-name": "grid/a"})
    cfg = RunConfig.from_run_config({})
    dc = cfg.data_config(2)
    model = tasks.build_model(dc)
    context = Context(run_id=1, node_id=5, node_config={"model-dir": str(tmp_path / "mine")},
                      state=RecordDict(), run_config={})
    for run in ("../escape", "..", "a/b", "C:evil", "x" * 300, "", 7):
        config = ConfigRecord({SAVE_MODEL: run, SAVE_TOKEN: "t", SERVER_ROUND: 2})
        with caplog.at_level(logging.ERROR):
            records, said = keep_tested_model(context, cfg, dc, config, model, 0, "site-a",
                                              {"accuracy": 0.5, "loss": 1.0})
        assert records == {} and said == {MODEL_KEPT: 0}, run
    assert not list(tmp_path.rglob("*.safetensors")) and not (tmp_path / "escape").exists()
    assert "is not a run name" in caplog.text
    # whom the model learned from, as a hostile server might say it: left off, model kept
    from strategies.core.protocol import LEARNED_FROM, LEARNED_SELF, LEARNED_WEIGHTS

    for names, weights, own in ((["../x"], [0.5], 0.5), (["a"], [2.0], 0.5),
                                (["a"] * 21, [0.0] * 21, 1.0), (["a", "b"], [0.1], 0.9)):
        config = ConfigRecord({SAVE_MODEL: "run", SAVE_TOKEN: "t", SERVER_ROUND: 2,
                               LEARNED_FROM: names, LEARNED_WEIGHTS: weights, LEARNED_SELF: own})
        records, said = keep_tested_model(context, cfg, dc, config, model, 0, "site-a",
                                          {"accuracy": 0.5, "loss": 1.0})
        assert said == {MODEL_KEPT: 1}
        card = json.loads((tmp_path / "mine" / "run" / "site-a.json").read_text())
        assert "learned_from" not in card
    assert "left off the model's card" in caplog.text


@pytest.mark.parametrize("validation", [0.0, 0.25])
def test_predict_on_the_rows_the_run_used_prints_the_cards_score(tmp_path, capsys, validation):
    """Members with a CSV without a split column (the seeded 80/20 split), a CSV with one,
    a Parquet table and an npz with its own test rows: ``predict --rows test`` on each
    member's own file selects the rows the run tested on and prints the card's score to
    the last digit (with validation-fraction: the validation rows the score is on), with
    no warning."""
    import warnings

    import pandas as pd

    from experiments.make_sites import member_name, write_sites

    n = 4
    run_config = write_sites(tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n,
                                              seed=0), tmp_path / "sites")
    nodes = []
    for i in range(n):
        name = member_name(i, n)
        with np.load(tmp_path / "sites" / f"{name}.npz") as f:
            x, y, xt, yt = f["x"], f["y"], f["x_test"], f["y_test"]
        frame = pd.DataFrame(np.concatenate([x, xt]), columns=[f"f{j}" for j in
                                                                range(x.shape[1])])
        frame["label"] = np.concatenate([y, yt])
        path = tmp_path / "sites" / f"{name}.npz"
        if i == 1:
            path = path.with_suffix(".csv")
            frame.to_csv(path, index=False)
        elif i == 2:
            path = path.with_suffix(".csv")
            frame.assign(split=["train"] * len(y) + ["test"] * len(yt)).to_csv(path, index=False)
        elif i == 3:
            path = path.with_suffix(".parquet")
            frame.to_parquet(path)
        nodes.append({"data-path": str(path), "client-id": name,
                      "model-dir": str(tmp_path / f"models-{i}")})
    metrics = run_named(tmp_path, "run", {**run_config, "strategy": "fedamp", "local-epochs": 1,
                                          "validation-fraction": validation}, n, nodes)
    last = metrics["rounds"][-1]["client_accuracy"]
    for i, node in enumerate(nodes):
        model = tmp_path / f"models-{i}" / "run" / f"{node['client-id']}.safetensors"
        card = json.loads(model.with_suffix(".json").read_text())
        mine = _kept_score(card, last[str(i)])
        analyst = card["score"]["analyst"]  # what the member's analysts read, on the same rows
        assert analyst["accuracy"] == mine and 0 <= analyst["auc"] <= 1
        assert sum(map(sum, analyst["confusion"])) == card["score"]["num_examples"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning on a normal call
            assert cli.main(["predict", str(model), node["data-path"], "--rows", "test",
                             "--out", str(tmp_path / "p.csv")]) == 0
        scores, said = capsys.readouterr().out.strip().splitlines()[-2:]
        assert said.startswith(f"accuracy {mine!r} on {card['score']['num_examples']} "
                               f"rows the run tested on"), (node, said)
        assert said.endswith(f"(the card: {mine!r})")
        # and the scores an analyst reads, on the same rows
        assert scores.startswith(f"On the {card['score']['num_examples']} rows the run tested "
                                 f"on: accuracy {mine:.4g}, balanced accuracy "), scores
        assert ", AUC " in scores and ", log loss " in scores and "confusion matrix" in scores
    assert cli.main(["predict", str(model), node["data-path"], "--rows", "train", "--out",
                     str(tmp_path / "p.csv")]) == 0
    assert "training rows the run used" in capsys.readouterr().out


def _kept_score(card: dict, recorded: float) -> float:
    """The accuracy on a member's card: that of the model it took home by its own rule
    (fedamp_flwr/member/member_choice.py), which is the run's recorded one where that model is its
    federated model."""
    choice = card["choice"]
    assert card["score"]["accuracy"] == choice["test"][choice["kept"]]["accuracy"]
    if choice["kept"] == "federated":
        assert card["score"]["accuracy"] == recorded
    return card["score"]["accuracy"]


def test_a_table_with_a_categorical_column_trains_and_predict_one_hots_it_as_the_run(
        tmp_path, capsys):
    """member-categories end to end: three members' CSVs whose label depends on a
    categorical column (text) and a numeric one; every card records the categories, and
    ``predict --rows test`` on a member's own file one-hots them as the run did, printing
    the card's score."""
    import pandas as pd

    rng = np.random.default_rng(0)
    nodes = []
    for i in range(3):
        kind = rng.choice(["clinic", "ward", "lab"], size=60)
        dose = rng.normal(100.0 * (i + 1), 30.0, size=60)
        label = np.where((kind == "lab") | (dose > 100.0 * (i + 1)), "yes", "no")
        path = tmp_path / f"site-{i}.csv"
        pd.DataFrame({"kind": kind, "dose": dose, "label": label}).to_csv(path, index=False)
        nodes.append({"data-path": str(path), "client-id": f"site-{i}",
                      "model-dir": str(tmp_path / f"models-{i}")})
    run_config = {"dataset": "members", "member-input-shape": "4", "member-outputs": 2,
                  "member-class-names": "no,yes", "member-categories": "kind: clinic, ward, lab",
                  "strategy": "fedamp", "local-epochs": 1}
    metrics = run_named(tmp_path, "run", run_config, 3, nodes)
    last = metrics["rounds"][-1]["client_accuracy"]
    for i, node in enumerate(nodes):
        model = tmp_path / f"models-{i}" / "run" / f"site-{i}.safetensors"
        card = json.loads(model.with_suffix(".json").read_text())
        assert card["schema"]["categories"] == [["kind", ["clinic", "ward", "lab"]]]
        assert len(card["preprocessing"]["standardize"]["mean"]) == 4
        assert cli.main(["predict", str(model), node["data-path"], "--rows", "test",
                         "--out", str(tmp_path / "p.csv")]) == 0
        said = capsys.readouterr().out.strip().splitlines()[-1]
        assert said.startswith(f"accuracy {_kept_score(card, last[str(i)])!r} on"), said
    # the docs' plain-PyTorch snippet gives predict's classes on the whole file
    import re

    doc = (Path(__file__).parents[1] / "docs" / "federation.md").read_text()
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
                  if "safetensors.torch.load_file" in b]
    snippet = snippet.replace('"site-3.json"', repr(str(model.with_suffix(".json")))).replace(
        '"site-3.safetensors"', repr(str(model)))
    scope: dict = {}
    exec(snippet, scope)  # the docs' own code
    frame = pd.read_csv(nodes[-1]["data-path"])
    classes = scope["model"](scope["inputs"](scope["table"](frame[["kind", "dose"]]))).argmax(1)
    assert cli.main(["predict", str(model), nodes[-1]["data-path"], "--out",
                     str(tmp_path / "all.csv")]) == 0
    predicted = pd.read_csv(tmp_path / "all.csv")["prediction"].tolist()
    assert [["no", "yes"][int(c)] for c in classes] == predicted
