"""The tuning protocol: validation held out of training, equal trials, the best chosen."""

from __future__ import annotations

import json

import pytest
import torch

import simulation
import tasks
from experiments import tuning
from fedamp_flwr.config import ConfigError, RunConfig
from strategies.core import registry

from .helpers import SHARED_DATA

#: the tuned layer of "auto" is what these test (tests/conftest.py, declared_defaults)
pytestmark = pytest.mark.tuned


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x}


def test_validation_is_held_out_of_training_and_replaces_the_test_split():
    cfg = RunConfig.from_run_config({"dataset": "synthetic", "seed": 3})
    whole = tasks.load_client_data(cfg.data_config(4), 1)
    dc = RunConfig.from_run_config({"dataset": "synthetic", "seed": 3,
                                    "validation-fraction": 0.25}).data_config(4)
    part = tasks.load_client_data(dc, 1)
    n = len(whole.y_train)
    assert len(part.y_test) == round(0.25 * n) and len(part.y_train) == n - len(part.y_test)
    train, val = _rows(part.x_train), _rows(part.x_test)
    assert not train & val  # never trained on what it is scored on
    assert train | val == _rows(whole.x_train)  # from the training data only
    assert not val & _rows(whole.x_test)  # the test data is not used
    again = tasks.load_client_data(dc, 1)
    assert torch.equal(again.x_test, part.x_test)  # seeded


def test_validation_fraction_is_checked_and_a_tiny_client_is_refused():
    with pytest.raises(ConfigError, match="validation-fraction"):
        RunConfig.from_run_config({"validation-fraction": 1.0})
    data = tasks.ClientData(torch.zeros(1, 2), torch.zeros(1), torch.zeros(1, 2), torch.zeros(1))
    with pytest.raises(ValueError, match="leaves none to train on"):
        tasks.loading.hold_out(data, 0.2, 0, 7)


def test_every_method_gets_the_same_number_of_distinct_trials_starting_at_its_own():
    for strategy in ("fedavg", "fedamp", "pfedme", "panacea", "pfedhn", "separate"):
        cfg = {"strategy": strategy, "dataset": "synthetic" if "fedamp" in strategy else "fl60"}
        got = tuning.trials(strategy, cfg, 4)
        assert len(got) == 4 and len({tuple(t.values()) for t in got}) == 4
        with registry.untuned():  # trial 0: the defaults, not strategies/tuned.json's values
            assert got[0] == tuning.base_values(cfg, list(got[0]))
    # Panacea's clients train with their own learning rate: the generic one is not tuned
    panacea = tuning.trials("panacea", {"strategy": "panacea", "dataset": "fl60"}, 3)
    assert set(panacea[0]) == {"panacea-client-lr", "panacea-server-lr", "local-steps"}
    fedavg = tuning.trials("fedavg", {"strategy": "fedavg", "dataset": "tpt48",
                                      "data-dir": "x"}, 100)
    assert set(fedavg[0]) == {"learning-rate", "local-epochs", "optimizer"}  # epochs there
    base = fedavg[0]
    assert base["optimizer"] == "adam"
    for t in fedavg[1:]:  # each optimizer's learning rate around its own
        centre = base["learning-rate"] if t["optimizer"] == "adam" else 0.1
        assert any(t["learning-rate"] / centre == pytest.approx(f, rel=1e-5)
                   for f in (1 / 3, 1, 3))
    assert len(fedavg) == 18  # the whole grid: 3 local epochs x 2 optimizers x 3 rates
    assert "optimizer" not in tuning.space("pfedme", steps=True)  # its own SGD steps
    assert "optimizer" not in tuning.space("panacea", steps=True)  # no generic rate either


def test_the_trials_try_every_value_of_every_key_before_any_twice():
    cfg = {"strategy": "fedavg", "dataset": "fl60", "fl60-variant": "grda"}
    got = tuning.trials("fedavg", cfg, 7)
    ladders = {"local-steps": {10, 20, 40, 1}, "optimizer": {"adam", "sgd"}}
    for key, values in ladders.items():
        assert {t[key] for t in got} == values, key
    rates = {(t["optimizer"], t["learning-rate"]) for t in got}
    assert rates == {("adam", 0.000333333), ("adam", 0.001), ("adam", 0.003),
                     ("sgd", 0.0333333), ("sgd", 0.1), ("sgd", 0.3)}
    assert tuning.trials("fedavg", cfg, 7) == got  # seeded
    # a learning rate left at "auto" belongs to the "auto" optimizer
    with pytest.raises(ConfigError, match="'learning-rate' = 'auto'.*optimizer = 'sgd'"):
        RunConfig.from_run_config({**cfg, "optimizer": "sgd"})
    assert RunConfig.from_run_config({**cfg, "optimizer": "sgd", "learning-rate": 0.3}
                                     ).optimizer == "sgd"


def test_a_tuned_key_must_take_auto():
    @registry.register_strategy("tuned-mu", settings=registry.STRATEGIES["fedprox"].settings,
                                tune={"fedprox-mu": (0.1, 1.0)})
    def _factory(settings, run):  # pragma: no cover - never built
        raise AssertionError
    try:
        with pytest.raises(ValueError, match="does not take 'auto'"):
            tuning.space("tuned-mu", steps=False)
    finally:
        registry.unregister_strategy("tuned-mu")


def test_auto_takes_the_tuned_values_of_its_data_setting(monkeypatch):
    monkeypatch.setattr(registry, "_TUNED", {"fedavg": {"fl60/grda": {"values": {
        "learning-rate": 0.123, "local-steps": 7}}}})
    cfg = RunConfig.from_run_config({"strategy": "fedavg", "dataset": "fl60",
                                     "fl60-variant": "grda"})
    assert (cfg.learning_rate, cfg.local_steps) == (0.123, 7)
    text = RunConfig.from_run_config({"strategy": "fedavg", "dataset": "fl60"})
    assert text.learning_rate != 0.123  # another data setting
    given = RunConfig.from_run_config({"strategy": "fedavg", "dataset": "fl60",
                                       "fl60-variant": "grda", "learning-rate": 0.5})
    assert given.learning_rate == 0.5  # a value the run config sets wins


def _committed_rows():
    data = json.loads(registry.TUNED_FILE.read_text())
    assert data["strategies"]
    tables = [("", data["strategies"])] + [(b, e["strategies"])
                                           for b, e in data.get("budgets", {}).items()]
    for budget, table in tables:
        for strategy, settings in table.items():
            for setting, row in settings.items():
                yield budget, strategy, setting, row


def test_the_committed_tuned_values_are_valid_and_traceable():
    for budget, strategy, setting, row in _committed_rows():
        assert row["command"].startswith("python simulation.py ") and "--tune" in row["command"]
        assert (f"--budget {budget}" in row["command"]) == bool(budget)
        dataset, _, variant = setting.partition("/")
        extra = {"fl60": {"fl60-variant": variant}, "tpt48": {"tpt48-split": variant,
                                                              "data-dir": "x"}}
        # "auto" gives a row's values; a budget's are given as simulation.py --budget does
        cfg = RunConfig.from_run_config({"strategy": strategy, "dataset": dataset,
                                         **extra.get(dataset, {}),
                                         **(row["values"] if budget else {})})
        assert cfg.tuning_key == setting
        values = {**cfg.method_values, **{k: getattr(cfg, k.replace("-", "_"))
                                          for k in row["values"] if hasattr(cfg, k.replace("-", "_"))}}
        for key, value in row["values"].items():
            assert values[key] == value, (strategy, setting, key)
        scores = [t["score"] for t in row["trials"].values() if t["score"] is not None]
        best = min(scores) if "lower" in row["metric"] else max(scores)
        assert row["validation_score"] == best
        if budget:
            unit, _, amount = budget.partition("=")
            spent = row["budget"]["steps_per_client" if unit == "steps" else "rounds"]
            assert spent == int(amount)


def test_values_tuned_under_a_budget_run_only_under_it(tmp_path, monkeypatch, capsys):
    into = tmp_path / "tuned.json"
    into.write_text(json.dumps({"strategies": {"fedavg": {"fl60/text": {"values": {
        "learning-rate": 0.002}}}}}))
    row = {"values": {"local-steps": 1, "optimizer": "sgd", "learning-rate": 0.3}}
    tuning.merge({"budget": "steps=1200", "strategies": {"fedavg": {"fl60/grda": row}}}, into)
    monkeypatch.setattr(registry, "TUNED_FILE", into)
    monkeypatch.setattr(registry, "_TUNED", {})
    assert registry.budget_tuned("steps=60") == {}
    assert registry.budget_tuned("steps=1200")["strategies"]["fedavg"]["fl60/grda"] == row
    grda = {"strategy": "fedavg", "dataset": "fl60", "fl60-variant": "grda"}
    assert RunConfig.from_run_config(grda).optimizer == "adam"  # "auto" never gives them
    assert RunConfig.from_run_config({**grda, "fl60-variant": "text"}).learning_rate == 0.002
    planned: list = []
    monkeypatch.setattr(simulation, "run_grid", lambda runs, *a: planned.extend(runs) or [])
    args = ["--engine", "inprocess", "--preset", "panacea-tables", "--datasets", "fl60/grda",
            "--strategies", "fedavg", "--seeds", "0", "--output", str(tmp_path / "o")]

    def run(*extra):
        planned.clear()
        simulation.main([*args, *extra])
        return {k: planned[0].run_config.get(k) for k in
                ("local-steps", "optimizer", "learning-rate", "num-server-rounds")}

    assert run("--budget", "steps=1200") == {"local-steps": 1, "optimizer": "sgd",
                                              "learning-rate": 0.3, "num-server-rounds": 1200}
    assert "--budget steps=1200: the values tuned under it" in capsys.readouterr().out
    # another budget: not these values ("auto": the preset's own regime)
    other = run("--budget", "steps=600")
    assert other["optimizer"] is None and other["num-server-rounds"] == 600 // 20
    assert "values tuned under it" not in capsys.readouterr().out
    # a forced optimizer takes its learning rate with it, never the other's tuned one
    forced = run("--budget", "steps=1200", "--set", "optimizer=adam",
                 "--set", "learning-rate=0.001")
    assert (forced["optimizer"], forced["learning-rate"], forced["local-steps"]) == (
        "adam", 0.001, 1)


@pytest.mark.slow
def test_tune_runs_trials_on_validation_chooses_the_best_and_resumes(tmp_path, capsys):
    out = tmp_path / "tune"
    args = ["--engine", "inprocess", "--preset", "quick", "--datasets", "synthetic",
            "--strategies", "fedavg,fedamp", "--num-supernodes", "3", "--rounds", "2",
            "--set", "local-epochs=1", "--tune", "2", "--output", str(out)]
    with pytest.raises(SystemExit, match="does not take 'auto'|invalid"):
        simulation.main([*args[:-4], "--tune", "0", "--output", str(out)])
    assert simulation.main(args) == 0
    printed = capsys.readouterr().out
    assert "4 runs, 0 already done, 4 to run" in printed
    tuned = json.loads((out / "tuned.json").read_text())
    for method in ("fedavg", "fedamp"):
        row = tuned["strategies"][method]["synthetic/practical"]
        scores = {int(i): t["score"] for i, t in row["trials"].items()}
        assert set(scores) == {0, 1} and row["validation_score"] == max(scores.values())
        assert row["trial"] == max(scores, key=scores.get)
        metrics = json.loads((out / "runs" / row["run"] / "metrics.json").read_text())
        assert metrics["config"]["validation-fraction"] == 0.2
        assert metrics["label"] == f"{method}@t{row['trial']}"
    assert "| synthetic/practical | fedamp |" in (out / "tuned.md").read_text()
    assert simulation.main(args) == 0
    assert "4 runs, 4 already done, 0 to run" in capsys.readouterr().out
    # the chosen values run the preset, --set still wins
    runs = simulation.expand(simulation.apply_overrides(
        simulation.PRESETS["quick"], "fedavg", None, 2, ["local-epochs=1"], 3, "synthetic"),
        None, tmp_path / "after")
    after = tuning.apply_tuned(runs, tuned, forced=["local-epochs"])
    chosen = tuned["strategies"]["fedavg"]["synthetic/practical"]["values"]
    assert after[0].run_config["learning-rate"] == chosen["learning-rate"]
    assert after[0].run_config["local-epochs"] == 1
    with pytest.raises(SystemExit, match="tuned.json"):
        (tmp_path / "bad.json").write_text("[]")
        simulation.main(["--engine", "inprocess", "--preset", "quick", "--datasets", "synthetic",
                         "--tuned", str(tmp_path / "bad.json"), "--output", str(tmp_path / "x")])


def test_datasets_can_name_one_labelled_setting_of_a_preset():
    from experiments.presets import PRESETS, with_datasets

    settings = with_datasets(PRESETS["panacea-tables"].settings, ["tpt48/time", "fl60"])
    assert [(s.dataset, s.label) for s in settings] == [("tpt48", "time"), ("fl60", "text"),
                                                        ("fl60", "grda")]
    with pytest.raises(SystemExit, match="allowed: random, time"):
        simulation.main(["--preset", "panacea-tables", "--datasets", "tpt48/summer",
                         "--report-only"])


def test_a_tuning_starts_from_the_defaults_whatever_an_earlier_one_chose(monkeypatch):
    cfg = {"strategy": "fedavg", "dataset": "synthetic"}
    before = tuning.trials("fedavg", cfg, 3)
    monkeypatch.setattr(registry, "_TUNED", {"fedavg": {"synthetic/practical": {"values": {
        "learning-rate": 0.5}}}})
    assert RunConfig.from_run_config(cfg).learning_rate == 0.5  # what "auto" gives now
    assert tuning.trials("fedavg", cfg, 3) == before  # the same trials again
    assert before[0]["learning-rate"] == 1e-3


def test_fl60_with_another_noise_is_another_setting_than_the_tuned_one():
    plain = RunConfig.from_run_config({"strategy": "fedavg", "dataset": "fl60"})
    noisy = RunConfig.from_run_config({"strategy": "fedavg", "dataset": "fl60",
                                       "fl60-noise-std": 0.1})
    assert (plain.tuning_key, noisy.tuning_key) == ("fl60/text", "fl60/text-noise0.1")


def test_a_finished_run_is_run_again_where_auto_now_gives_other_values(tmp_path, monkeypatch):
    from experiments.presets import PlannedRun
    from experiments.runner import is_done

    cfg = {"strategy": "fedavg", "dataset": "synthetic", "num-server-rounds": 1,
           "run-name": "r", "results-dir": str(tmp_path / "runs")}
    recorded = RunConfig.from_run_config(cfg).to_dict()
    folder = tmp_path / "runs" / "r"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"config": recorded, "finished": True,
                                                      "completed_rounds": 1}))
    run = PlannedRun("r", 2, cfg)
    assert is_done(tmp_path, run)
    monkeypatch.setattr(registry, "_TUNED", {"fedavg": {"synthetic/practical": {"values": {
        "learning-rate": 0.5}}}})
    assert not is_done(tmp_path, run)


def test_tune_and_tuned_together_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="--tune and --tuned"):
        simulation.main(["--preset", "quick", "--tune", "2", "--tuned", str(tmp_path / "t.json")])
    with pytest.raises(SystemExit, match="--validation-fraction"):
        simulation.main(["--preset", "quick", "--validation-fraction", "0.3"])


def test_panacea_tables_narrowed_to_a_scenario_and_the_users_datasets_left_out(tmp_path, capsys):
    """Scenario 1 is Table 2 (20% novel clients); metr-la, pems-bay and compcars, whose files
    only their users have, are left out with a note where --data-dir has no folder for them,
    and refused where --datasets names them."""
    from experiments.presets import PRESETS, apply_overrides, expand

    data = SHARED_DATA
    if not (data / "tpt48").is_dir():
        pytest.skip("shared/data is not on this machine")
    grid = apply_overrides(PRESETS["panacea-tables"], "sfl", "0", 2, [], None, None, "1")
    runs = expand(grid, str(data), tmp_path)
    assert {r.run_config["dataset"] for r in runs} == {"fl60", "tpt48", "traffic-generated"}
    assert all(r.run_config["novel-client-fraction"] == 0.2 for r in runs)
    assert "note: metr-la left out" in capsys.readouterr().out
    named = apply_overrides(PRESETS["panacea-tables"], "sfl", "0", 2, [], None, "metr-la")
    with pytest.raises(ConfigError, match="no folder metr-la/"):
        expand(named, str(data), tmp_path)
    with pytest.raises(ConfigError, match="--scenarios '2'; allowed: comma-separated indices 0..1"):
        apply_overrides(PRESETS["panacea-tables"], None, None, None, [], None, None, "2")
