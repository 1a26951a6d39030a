"""A run's records, read and written through strategies/core/records.py, by hand."""

from __future__ import annotations

import pytest

from strategies.core.history import RunHistory
from strategies.core.records import (
    ACCURACY_SCORE,
    MSE_SCORE,
    VERSION,
    best_of_rounds,
    client_scores,
    evaluated_clients,
    headline,
    headlines,
    round_score,
    run_score,
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
    assert run_score({"rounds": REGRESSION}) is MSE_SCORE
    assert run_score({"bmta": 80.0, "rounds": []}) is ACCURACY_SCORE
    assert headline({"best_mean_mse": 1.5}) == (MSE_SCORE, 1.5)
    assert headline({"rounds": []}) == (ACCURACY_SCORE, None)


def test_records_say_their_version():
    assert version_of(RunHistory().to_dict()) == VERSION == 2
    assert version_of({"rounds": []}) == 1  # written before records were versioned


def test_a_round_is_evaluated_by_its_evaluation_metrics_only():
    """A dp run's training records each member's epsilon (``client_dp_epsilon``): that is
    no evaluation, so a round whose every evaluation failed is a failed round (before the
    records were spelled in one module, any ``client_`` key counted as an evaluation)."""
    from fedamp_flwr.rounds import round_failure

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
