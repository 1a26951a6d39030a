"""A comparison's budget (experiments/budget.py): stated in every table, spent exactly.

A step budget S at k local steps a round is S / k rounds, for every k that divides S;
any other k, or local epochs (steps per round that vary by client), is refused before
anything runs. The tuning space holds one local step a round (FedAvg's own regime), and
the tables and tuned.json say what each run spent.
"""

from __future__ import annotations

import json

import pytest

import simulation
from experiments import tables
from experiments.budget import Budget, apply_budget, budget_of, describe, divisors
from experiments.presets import PRESETS, apply_overrides, expand
from experiments.scores import RunRecord
from experiments.tuning import trials
from fedamp_flwr.config import ConfigError, RunConfig

from .helpers import fake_run


@pytest.mark.parametrize("text", ["steps", "steps=0", "steps=-5", "rounds=x", "epochs=3", "=4"])
def test_a_bad_budget_is_one_line(text):
    with pytest.raises(ConfigError, match=f"--budget '{text}' is invalid; allowed: rounds=R or "
                                          "steps=S, a positive integer"):
        Budget.parse(text)


def test_a_step_budget_is_spent_exactly_for_any_split():
    budget = Budget.parse("steps=1200")
    assert divisors(1200)[:8] == [1, 2, 3, 4, 5, 6, 8, 10]
    for k in divisors(1200):
        assert budget.rounds_for(k) * k == 1200
    with pytest.raises(ConfigError, match=r"takes 7 local steps a round, which does not divide "
                                          r"the budget; allowed: local-steps that divide it \(1, 2"):
        budget.rounds_for(7)
    with pytest.raises(ConfigError, match="counts its local work in epochs"):
        budget.rounds_for(0)
    assert Budget.parse("rounds=60").rounds_for(20) == 60 == Budget.parse("rounds=60").rounds_for(0)


def _fl60_runs(tmp_path, sets=()):
    grid = apply_overrides(PRESETS["panacea-tables"], "fedavg,panacea", "0", None, list(sets),
                           None, "fl60/grda")
    return expand(grid, None, tmp_path)


@pytest.mark.tuned  # each method's regime is its tuned one (strategies/tuned.json)
def test_the_panacea_preset_spent_as_each_methods_regime_or_one_step_a_round(tmp_path):
    # each method at its own (tuned "auto") local steps: Panacea 20 a round for 60 rounds,
    # FedAvg 40 a round for 30 rounds: 1,200 steps per client each
    spent = {}
    for run in apply_budget(_fl60_runs(tmp_path), Budget.parse("steps=1200")):
        budget = budget_of(RunConfig.from_run_config(run.run_config).to_dict())
        assert budget["steps_per_client"] == 1200
        spent[run.run_config["strategy"]] = (budget["rounds"], budget["local_steps"])
    assert spent == {"panacea": (60, 20), "fedavg": (30, 40)}
    for run in apply_budget(_fl60_runs(tmp_path, ["local-steps=1"]), Budget.parse("steps=1200")):
        assert run.run_config["num-server-rounds"] == 1200  # FedAvg's regime, the same budget
        assert run.run_config["checkpoint-every"] == 24  # 50 writes of the history, not 1,200
    kept = apply_budget(_fl60_runs(tmp_path, ["local-steps=1", "checkpoint-every=1"]),
                        Budget.parse("steps=1200"))
    assert {r.run_config["checkpoint-every"] for r in kept} == {1}  # the run's own choice
    with pytest.raises(ConfigError, match="run fedavg-fl60-grda-s0 takes 7 local steps"):
        apply_budget(_fl60_runs(tmp_path, ["local-steps=7"]), Budget.parse("steps=1200"))


@pytest.mark.parametrize("rounds", [["--rounds", "3"], ["--set", "num-server-rounds=3"]])
def test_simulation_refuses_rounds_and_a_budget_together(tmp_path, rounds):
    with pytest.raises(SystemExit, match=r"--rounds \(or --set num-server-rounds\) and --budget "
                                         "together are invalid"):
        simulation.main(["--preset", "quick", *rounds, "--budget", "steps=60",
                         "--output", str(tmp_path)])


def test_values_tuned_under_a_budget_run_only_under_it(tmp_path):
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"budget": "steps=1200", "strategies": {}}))
    with pytest.raises(SystemExit, match="was chosen under --budget steps=1200; allowed: the "
                                         "same --budget"):
        simulation.main(["--preset", "quick", "--tuned", str(tuned), "--output",
                         str(tmp_path / "out"), "--data-dir", ""])


def test_every_tuning_space_of_a_step_task_holds_one_local_step(tmp_path):
    for run in _fl60_runs(tmp_path):
        steps = {t["local-steps"] for t in trials(run.run_config["strategy"], run.run_config, 50)}
        assert 1 in steps and 20 in steps, (run.name, steps)


def test_tables_state_their_budget(tmp_path):
    stepped = fake_run("fedavg", 0, 80.0)
    stepped["config"].update({"num-server-rounds": 60, "local-steps": 20})
    epochs = fake_run("fedamp", 0, 85.0)  # 3 rounds of 5 local epochs
    assert describe(budget_of(stepped["config"])) == \
        "60 rounds x 20 local steps = 1,200 steps per client"
    runs = [RunRecord.from_json(stepped)]
    tables.write_table(runs, tmp_path / "one.md")
    assert "Budget of every run: 60 rounds x 20 local steps = 1,200 steps per client." in \
        (tmp_path / "one.md").read_text()
    tables.write_table([*runs, RunRecord.from_json(epochs)], tmp_path / "two.md")
    text = (tmp_path / "two.md").read_text()
    assert "60 rounds x 20 local steps = 1,200 steps per client: fedavg (fmnist/practical)" in text
    assert "3 rounds x 5 local epochs: fedamp (fmnist/practical)" in text
    tables.write_csv(runs, tmp_path / "results.csv")
    header, row = (tmp_path / "results.csv").read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(",")))
    assert (cells["local_steps"], cells["steps_per_client"]) == ("20", "1200")
    json.dumps(budget_of(stepped["config"]), allow_nan=False)
