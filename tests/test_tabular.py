"""A member's table as its model sees it (pooled standardizing statistics) and the linear
model it would fit alone (tasks/tabular.py), checked against values worked by hand and
against scikit-learn's own fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.tabular import column_stats, fit_linear, own, pooled, scaling_problem, standardize


def test_pooled_statistics_are_those_of_all_rows_together():
    a = torch.tensor([[1.0, 10.0], [3.0, 10.0]])
    b = torch.tensor([[5.0, 10.0]])
    mean, std = pooled([column_stats(a), column_stats(b)])
    assert mean == pytest.approx([3.0, 10.0])
    # population std of 1, 3, 5: sqrt(8/3); a constant column: 1 (left as it is)
    assert std == pytest.approx([(8 / 3) ** 0.5, 1.0])
    assert column_stats(a) == (2, [2.0, 10.0], [2.0, 0.0])  # count, means, centred squares
    both = torch.cat([a, b])
    assert own(both) == (mean, std)
    z = standardize(both, mean, std)
    assert z[:, 0].tolist() == pytest.approx([-(1.5 ** 0.5), 0.0, 1.5 ** 0.5])
    assert z[:, 1].tolist() == [0.0, 0.0, 0.0]


def test_scaling_values_from_a_message_are_checked():
    assert scaling_problem([0.0, 1.0], [1.0, 2.0], 2) is None
    assert "not a list of 3" in scaling_problem([0.0], [1.0], 3)
    assert "finite" in scaling_problem([0.0, float("nan")], [1.0, 1.0], 2)
    assert "below 1e-12" in scaling_problem([0.0, 0.0], [1.0, 0.0], 2)
    assert "below 1e-12" in scaling_problem([0.0], [1e-300], 1)
    assert "beyond 1e+30" in scaling_problem([1e200], [1.0], 1)
    assert "not a list" in scaling_problem("x", [1.0], 1)


def test_a_members_statistics_are_checked_and_pooled_stably():
    """A member's statistics are untrusted (no count other than its rows, none from fewer
    than LEAST_ROWS rows, finite and bounded values); pooling them is stable where a column's
    values are large beside their spread (a timestamp: 1.7e9 + 0..4, std 1.414)."""
    from tasks.tabular import LEAST_ROWS, stats_problem

    assert stats_problem(12, [0.0], [1.0], 12, 1) is None
    assert "at least 10" in stats_problem(3, [0.0], [1.0], 3, 1)
    assert LEAST_ROWS == 10
    assert "not its 12 training rows" in stats_problem(13, [0.0], [1.0], 12, 1)
    assert "within 1e+30" in stats_problem(12, [1e200], [1.0], 12, 1)
    assert "below 0" in stats_problem(12, [0.0], [-1.0], 12, 1)
    assert "finite" in stats_problem(12, [float("nan")], [1.0], 12, 1)
    assert "not 2 finite" in stats_problem(12, [0.0], [1.0], 12, 2)
    stamps = torch.tensor([[1.7e9 + i] for i in range(5)], dtype=torch.float64)
    parts = [column_stats(stamps[:2]), column_stats(stamps[2:])]
    mean, std = pooled(parts)
    assert mean == pytest.approx([1.7e9 + 2]) and std == pytest.approx([2 ** 0.5], rel=1e-9)


def _logistic_both(z: torch.Tensor, y: np.ndarray, classes: int):
    """Our linear model alone and scikit-learn's LogisticRegression(C=1) fitted on (z, y):
    our probabilities (asserted within 1e-3 of scikit-learn's) and scikit-learn's model."""
    from sklearn.linear_model import LogisticRegression

    model = fit_linear(z, torch.from_numpy(y).long(), classes)
    reference = LogisticRegression(C=1.0, max_iter=5000, tol=1e-10).fit(z.numpy(), y)
    with torch.no_grad():
        ours = torch.softmax(model(z).double(), 1).numpy()
    assert np.abs(ours - reference.predict_proba(z.numpy())).max() < 1e-3
    return ours, reference


def test_the_linear_model_alone_is_scikit_learns():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_wine
    from sklearn.linear_model import Ridge

    x, y = load_wine(return_X_y=True)
    x = torch.from_numpy(x).float()
    z = standardize(x, *own(x))
    ours, reference = _logistic_both(z, y, 3)
    assert (ours.argmax(1) == reference.predict(z.numpy())).all()
    target = z[:, 0].clone()
    ridge = fit_linear(z[:, 1:], target, 1)
    with torch.no_grad():
        mine = ridge(z[:, 1:]).reshape(-1).double().numpy()
    theirs = Ridge(alpha=1.0).fit(z[:, 1:].numpy(), target.numpy()).predict(z[:, 1:].numpy())
    assert np.abs(mine - theirs).max() < 1e-3


def test_the_linear_model_alone_of_two_classes_is_scikit_learns_binary_fit():
    """Two classes: scikit-learn's one weight vector and penalty ||w||^2 / 2, not the
    multinomial fit's two rows (half the penalty on their difference: its C = 2)."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = torch.from_numpy(x[:200]).float()
    y = y[:200]
    _logistic_both(standardize(x, *own(x)), y, 2)


def _tables(folder, n: int = 3, rows: int = 60, seed: int = 0) -> list[dict]:
    """Members' CSV tables whose columns are of very different scales (0.1 to 1,000), a
    text label, a split column; each member its own class mix."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    scale = np.array([0.1, 1.0, 30.0, 1000.0])
    nodes = []
    for m in range(n):
        y = rng.choice(3, size=rows, p=np.roll([0.6, 0.3, 0.1], m))
        x = (rng.normal(size=(rows, 4)) + y[:, None] * np.array([1.0, -1.0, 0.5, 2.0])) * scale
        frame = pd.DataFrame(x, columns=["a", "b", "c", "d"])
        frame["label"] = np.array(["low", "mid", "high"])[y]
        frame["split"] = ["train"] * (rows * 3 // 4) + ["test"] * (rows - rows * 3 // 4)
        path = folder / f"site-{m}.csv"
        frame.to_csv(path, index=False)
        nodes.append({"data-path": str(path), "client-id": f"site-{m}",
                      "model-dir": str(folder / f"models-{m}")})
    return nodes


TABLE = {"dataset": "members", "member-input-shape": "4", "member-outputs": 3,
         "member-class-names": "low,mid,high", "strategy": "fedamp", "local-epochs": 2}


def test_members_tables_are_standardized_by_pooled_statistics_and_their_cards_say_how(
        tmp_path, capsys):
    """The server pools the members' column sums into one mean and std per column, every
    member's inputs are standardized by them, each card carries them (and what the member
    scores alone), and predict on the raw table gives the card's score."""
    import json

    import pandas as pd

    from fedamp_flwr.tools import cli

    from .helpers import run_named

    # every training row trains (no rows held out for the member's choice of its model)
    nodes = [{**n, "keep": "federated"} for n in _tables(tmp_path)]
    metrics = run_named(tmp_path, "run", TABLE, 3, nodes)
    train = pd.concat([pd.read_csv(n["data-path"]).query("split == 'train'") for n in nodes])
    want_mean = train[["a", "b", "c", "d"]].mean().to_numpy()
    want_std = train[["a", "b", "c", "d"]].std(ddof=0).to_numpy()
    scaling = metrics["member_scaling"]
    assert np.allclose(scaling["mean"], want_mean) and np.allclose(scaling["std"], want_std)
    assert scaling["members"] == 3 and scaling["rows"] == len(train)
    last = metrics["rounds"][-1]["client_accuracy"]
    assert sorted(metrics["alone"]) == ["0", "1", "2"]
    for i, node in enumerate(nodes):
        model = tmp_path / f"models-{i}" / "run" / f"site-{i}.safetensors"
        card = json.loads(model.with_suffix(".json").read_text())
        spec = card["preprocessing"]["standardize"]
        assert spec["mean"] == pytest.approx(scaling["mean"]) and spec["from"].startswith(
            "pooled")
        alone = card["alone"]
        assert alone == {**alone, **metrics["alone"][str(i)]}
        assert alone["gain"] == pytest.approx(last[str(i)] - max(alone["linear"],
                                                                  alone["model"]))
        assert cli.main(["predict", str(model), node["data-path"], "--rows", "test",
                         "--out", str(tmp_path / "p.csv")]) == 0
        said = capsys.readouterr().out.strip().splitlines()[-1]
        assert said.startswith(f"accuracy {last[str(i)]!r} on ") and said.endswith(
            f"(the card: {last[str(i)]!r})"), said


def test_fedamp_personalizes_the_linear_model_an_analyst_fits(tmp_path, capsys):
    """model = "linear": one layer (multinomial logistic regression on the standardized
    columns) as the federated model; each member takes home its own, rebuilt by predict to
    the card's score."""
    import json

    from safetensors.torch import load_file

    from fedamp_flwr.tools import cli

    from .helpers import run_named

    nodes = [{**n, "keep": "federated"} for n in _tables(tmp_path)]  # its federated model
    metrics = run_named(tmp_path, "run", {**TABLE, "model": "linear"}, 3, nodes)
    last = metrics["rounds"][-1]["client_accuracy"]
    weights = []
    for i, node in enumerate(nodes):
        model = tmp_path / f"models-{i}" / "run" / f"site-{i}.safetensors"
        card = json.loads(model.with_suffix(".json").read_text())
        assert card["model"]["name"] == "linear"
        tensors = load_file(str(model))
        assert sorted((k, tuple(v.shape)) for k, v in tensors.items()) == [
            ("net.0.bias", (3,)), ("net.0.weight", (3, 4))]
        weights.append(tensors["net.0.weight"])
        assert cli.main(["predict", str(model), node["data-path"], "--rows", "test",
                         "--out", str(tmp_path / "p.csv")]) == 0
        said = capsys.readouterr().out.strip().splitlines()[-1]
        assert said.endswith(f"(the card: {last[str(i)]!r})"), said
    assert not torch.equal(weights[0], weights[1])  # each member its own


def test_under_dp_no_member_gives_its_sums_and_each_standardizes_by_its_own(tmp_path, caplog):
    import json
    import logging

    from .helpers import run_named

    nodes = _tables(tmp_path)
    for i, node in enumerate(nodes):
        node["privacy-dir"] = str(tmp_path / f"ledger-{i}")
    with caplog.at_level(logging.INFO):
        metrics = run_named(tmp_path, "dp", {**TABLE, "dp": "update"}, 3, nodes)
    assert "member_scaling" not in metrics
    assert "No member gave its column statistics (dp, or too few rows)" in caplog.text
    card = json.loads((tmp_path / "models-0" / "dp" / "site-0.json").read_text())
    assert card["preprocessing"]["standardize"]["from"] == "this member's own training rows"


def test_scaling_none_leaves_the_inputs_and_a_bad_message_is_refused(tmp_path):
    import json

    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

    import tasks
    from fedamp_flwr import client_app
    from fedamp_flwr.tools.inprocess import task_identity

    from .helpers import run_named

    nodes = [{**n, "keep": "federated"} for n in _tables(tmp_path)]  # nothing alone at all
    run_named(tmp_path, "plain", {**TABLE, "member-scaling": "none", "alone": False}, 3,
              nodes)
    card = json.loads((tmp_path / "models-0" / "plain" / "site-0.json").read_text())
    assert "standardize" not in card["preprocessing"] and "alone" not in card
    config = {**TABLE, "member-scaling": "pooled"}
    model = tasks.build_model(tasks.DataConfig("members", "", 2, 0, schema=tasks.MemberSchema(
        (4,), "classification", 3)), "auto")
    msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord(
        {"server-round": 1, "client-index": 0, "feature-mean": [0.0, 1.0],
         "feature-std": [1.0, 1.0]})}), message_type=MessageType.EVALUATE, dst_node_id=100)
    ctx = Context(run_id=1, node_id=100, node_config=nodes[0], state=RecordDict(),
                  run_config=config)
    with task_identity(), pytest.raises(Exception, match="'feature-mean'/'feature-std': mean "
                                                         "is not a list of 4 numbers"):
        client_app.evaluate(msg, ctx)


def test_a_member_takes_home_the_best_on_its_held_out_rows_even_where_the_run_says_alone_false(
        tmp_path, capsys):
    """By default each member keeps the best of its federated model and its models alone
    on rows it held out, by log loss, where it leads the linear model alone by more than one
    standard error (fedamp_flwr/member/member_choice.py), whatever the run
    config says (``alone = false`` here): its card records the choice, its score and
    predict's are the kept model's; the run's records keep the federated score."""
    import json

    import pandas as pd
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    from fedamp_flwr import client_app
    from fedamp_flwr.tools import cli
    from fedamp_flwr.tools.inprocess import task_identity

    from .helpers import run_named

    nodes = _tables(tmp_path)
    # FedAvg's one global model over three class mixes: alone does better for some members
    metrics = run_named(tmp_path, "run", {**TABLE, "strategy": "fedavg", "num-server-rounds": 3,
                                          "local-steps": 5, "alone": False}, 3, nodes)
    kept_alone = 0
    for i, node in enumerate(nodes):
        model = tmp_path / f"models-{i}" / "run" / f"site-{i}.safetensors"
        card = json.loads(model.with_suffix(".json").read_text())
        federated = metrics["rounds"][-1]["client_accuracy"][str(i)]
        choice = card["choice"]
        on_held = {k: v["log_loss"] for k, v in choice["held_out"].items()}
        # the best by log loss, or the reference where the best does not lead it by more
        # than one standard error (fedamp_flwr/member/member_choice.py)
        assert choice["reference"] == "linear alone"
        assert choice["kept"] in (min(on_held, key=on_held.__getitem__), "linear alone")
        assert choice["test"]["federated"]["accuracy"] == federated
        assert card["score"]["accuracy"] == choice["test"][choice["kept"]]["accuracy"]
        assert card["model"]["name"] == ("linear" if choice["kept"] == "linear alone"
                                         else "mlp")
        kept_alone += choice["kept"] != "federated"
        assert metrics["alone"][str(i)]["kept"] == ["federated", "linear alone",
                                                    "model alone"].index(choice["kept"])
        assert cli.main(["predict", str(model), node["data-path"], "--rows", "test",
                         "--out", str(tmp_path / "p.csv")]) == 0
        # the rows it held out, and those the run trained on: the file's training rows
        held = choice["held_out_rows"]
        assert held == 10 and card["rows"]["held_out_fraction"] == 0.2
        train = int((pd.read_csv(node["data-path"]).split == "train").sum())
        for rows, count in (("held-out", held), ("train", train - held)):
            capsys.readouterr()
            assert cli.main(["predict", str(model), node["data-path"], "--rows", rows,
                             "--out", str(tmp_path / "p.csv")]) == 0
            assert f"On the {count} " in capsys.readouterr().out
        # what the node trains on: its training rows less those held out
        ctx = Context(run_id=1, node_id=7, node_config=node, state=RecordDict(),
                      run_config=TABLE)
        with task_identity():
            info = client_app.query(Message(RecordDict({"config": ConfigRecord(
                {"query": "client-info", "challenge": b"\x01" * 32})}),
                message_type=MessageType.QUERY, dst_node_id=7), ctx).content["info"]
        assert info["num-train"] == train - held
    assert kept_alone >= 1
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    from fedamp_flwr import client_app
    from fedamp_flwr.tools.inprocess import task_identity

    ctx = Context(run_id=1, node_id=7, node_config={**nodes[0], "keep": "sometimes"},
                  state=RecordDict(), run_config=TABLE)
    with task_identity():
        info = client_app.query(Message(RecordDict({"config": ConfigRecord(
            {"query": "client-info", "challenge": b"\x01" * 32})}),
            message_type=MessageType.QUERY, dst_node_id=7), ctx).content["info"]
    assert "node config 'keep' = 'sometimes' is invalid; allowed: better" in info["error"]


def test_a_regression_member_chooses_by_mse_and_a_small_one_keeps_its_federated_model(
        tmp_path, caplog):
    """Regression members' tables (a float target column): each chooses by MSE on its
    held-out rows, the models alone cross-validated; a member of 15 training rows cannot
    hold out 10 and train on 10: it keeps the federated model and says so at WARNING; a
    node without a model-dir writes no model and holds nothing out (its query says all of
    its training rows)."""
    import json
    import logging

    import pandas as pd
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    from fedamp_flwr import client_app
    from fedamp_flwr.tools.inprocess import task_identity

    from .helpers import run_named

    rng = np.random.default_rng(1)
    nodes = []
    for m, rows in enumerate((80, 80, 20)):
        x = rng.normal(size=(rows, 3)) * np.array([1.0, 10.0, 100.0])
        target = x @ np.array([1.0, 0.1, 0.01 * (m + 1)]) + rng.normal(scale=0.1, size=rows)
        frame = pd.DataFrame(x, columns=["a", "b", "c"]).assign(target=target)
        frame["split"] = ["train"] * (rows * 3 // 4) + ["test"] * (rows - rows * 3 // 4)
        frame.to_csv(tmp_path / f"site-{m}.csv", index=False)
        nodes.append({"data-path": str(tmp_path / f"site-{m}.csv"), "client-id": f"site-{m}",
                      "model-dir": str(tmp_path / f"models-{m}")})
    config = {"dataset": "members", "member-task": "regression", "member-input-shape": "3",
              "member-outputs": 1, "member-label-column": "target", "strategy": "fedamp",
              "local-epochs": 2}
    with caplog.at_level(logging.INFO):
        run_named(tmp_path, "run", config, 3, nodes)
    for m in (0, 1):
        card = json.loads((tmp_path / f"models-{m}" / "run" / f"site-{m}.json").read_text())
        choice = card["choice"]
        assert choice["metric"] == "mse" and choice["held_out_rows"] == 12
        assert sorted(choice["cross_validated"]["scores"]) == ["linear alone", "model alone"]
        assert choice["cross_validated"]["rows"] == 60
        assert card["score"]["mse"] == pytest.approx(choice["test"][choice["kept"]]["mse"], rel=1e-6)
    small = json.loads((tmp_path / "models-2" / "run" / "site-2.json").read_text())
    assert "choice" not in small  # it kept its federated model
    assert "This member has 15 training rows, too few to hold out 10" in caplog.text
    assert "This member holds out 12 of its 60 training rows" in caplog.text
    # no model-dir: no model written, nothing held out
    bare = {k: v for k, v in nodes[0].items() if k != "model-dir"}
    ctx = Context(run_id=1, node_id=7, node_config=bare, state=RecordDict(), run_config=config)
    with task_identity():
        info = client_app.query(Message(RecordDict({"config": ConfigRecord(
            {"query": "client-info", "challenge": b"\x01" * 32})}),
            message_type=MessageType.QUERY, dst_node_id=7), ctx).content["info"]
    assert info["num-train"] == 60
