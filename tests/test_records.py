"""A run's records, read and written through strategies/core/records.py, by hand."""

from __future__ import annotations

import pytest

from strategies.core.history import RunHistory
from strategies.core.records import (
    ACCURACY_SCORE,
    MSE_SCORE,
    VERSION,
    RunFile,
    best_of_rounds,
    client_scores,
    evaluated_clients,
    headlines,
    round_score,
    version_of,
)

ROUNDS = [{"round": 1, "client_accuracy": {0: 0.5, 1: 0.7}, "mean_accuracy": 0.6,
           "novel_mean_accuracy": 0.2, "client_loss": {0: 1.0, 2: 2.0}},
          {"round": 2, "client_accuracy": {0: 0.9, 1: 0.7}, "mean_accuracy": 0.8}]
REGRESSION = [{"round": 1, "client_mse": {0: 2.0}, "mean_mse": 2.0},
              {"round": 2, "client_mse": {0: 1.5}, "mean_mse": 1.5}]


def test_the_headline_is_the_best_round_mean():
    assert best_of_rounds(ROUNDS, regression=False) == 80.0  # percent
    assert best_of_rounds(ROUNDS, regression=False, novel=True) == 20.0
    assert best_of_rounds(REGRESSION, regression=True) == 1.5
    assert best_of_rounds([], regression=False) is None
    assert headlines(ROUNDS) == {"bmta": 80.0, "novel_bmta": 20.0}
    assert headlines(REGRESSION) == {"best_mean_mse": 1.5}


def test_a_records_score_and_clients():
    assert round_score(ROUNDS[0]) is ACCURACY_SCORE and round_score(REGRESSION[0]) is MSE_SCORE
    assert round_score({"round": 3}) is None
    assert client_scores(ROUNDS[1]) == {0: 0.9, 1: 0.7}
    assert evaluated_clients(ROUNDS[0]) == {0, 1, 2}  # any metric
    assert RunFile.from_dict({"rounds": REGRESSION}).score is MSE_SCORE
    assert RunFile.from_dict({"bmta": 80.0, "rounds": []}).score is ACCURACY_SCORE
    assert RunFile.from_dict({"best_mean_mse": 1.5}).headline() == (MSE_SCORE, 1.5)
    assert RunFile.from_dict({"rounds": []}).headline() == (ACCURACY_SCORE, None)


def test_records_say_their_version():
    written = RunHistory().run_file().to_dict()
    assert version_of(written) == VERSION == 2 == RunFile.from_dict(written).records_version
    assert version_of({"rounds": []}) == 1  # written before records were versioned
    assert RunFile.from_dict({"rounds": []}).records_version == 1


def test_metrics_json_is_written_and_read_through_one_class():
    history = RunHistory()
    history.rounds = {r["round"]: r for r in ROUNDS}
    history.notes = {"alone": {"0": {"linear": 0.5}}, "fedamp_sigma": {"value": 2.0}}
    run = history.run_file(run_name="r", strategy="fedamp", dataset="mnist",
                           task_kind="classification", num_clients=3, seed=0,
                           config={"seed": 0}, extra={"sigma": {"fedamp": None}},
                           completed_rounds=2, finished=True, wall_time_s=1.5)
    written = run.to_dict()
    # the headline and the method's records at the top level, as before the class
    assert written["bmta"] == 80.0 and written["fedamp_sigma"] == {"value": 2.0}
    assert written["sigma"] == {"fedamp": None} and written["alone"] == {"0": {"linear": 0.5}}
    # a run without members writes none of their keys; a federated task no partitioning
    assert not {"client_names", "member_keys", "member_roster", "impostors", "left_out",
                "partitioning", "models", "xi"} & set(written)
    assert list(written)[:4] == ["run_name", "strategy", "label", "dataset"]
    assert RunFile.from_dict(written) == run
    named = RunFile(client_names=["a"], member_keys={"a": "ed25519:x"}).to_dict()
    assert named["member_roster"] is None and named["client_names"] == ["a"]


def test_a_hostile_or_old_metrics_json_reads_as_defaults():
    run = RunFile.from_dict({"completed_rounds": "3", "finished": "no", "num_clients": True,
                             "rounds": [{"round": 1}, "junk", 5], "config": [1],
                             "bmta": "high", "wall_time_s": float("nan"), "new_key": 1})
    assert (run.completed_rounds, run.finished, run.num_clients, run.config) == (0, True, None,
                                                                                 {})
    assert run.rounds == [{"round": 1}] and run.headlines == {}
    assert run.extra == {"new_key": 1}


def test_a_round_is_evaluated_by_its_evaluation_metrics_only():
    """A dp run's training records each member's epsilon (``client_dp_epsilon``): that is
    no evaluation, so a round whose every evaluation failed is a failed round (before the
    records were spelled in one module, any ``client_`` key counted as an evaluation)."""
    from fedamp_flwr.server.rounds import round_failure

    trained = {"round": 1, "trained_clients": [0, 1], "client_dp_epsilon": {0: 1.0, 1: 1.0},
               "absent_evaluation": {0: "no reply within the round timeout (60 s)",
                                     1: "no reply within the round timeout (60 s)"}}
    assert "evaluation could be used: 2 client(s) left out" in round_failure(trained)
    assert round_failure({**trained, "client_loss": {0: 0.5}}) is None
    assert evaluated_clients(trained) == set()


def test_the_gain_over_the_better_model_alone():
    assert ACCURACY_SCORE.gain(0.9, (0.8, 0.85)) == pytest.approx(0.05)
    assert ACCURACY_SCORE.gain(0.7, (0.8, 0.6)) == pytest.approx(-0.1)  # federation worse
    assert MSE_SCORE.gain(1.0, (1.5, 1.2)) == pytest.approx(0.2)  # lower is better
