"""A member's own rule for the model it takes home (fedamp_flwr/member/member_choice.py): its node
config checked, its held-out rows, the choice on them by its metric worked by hand, the
linear model folded onto the run's inputs, and what the coordinator is told.

The run end to end: tests/test_delivery.py (every member's card records the three models'
held-out and test scores; ``predict`` gives the kept model's); on a loopback fleet, a
member whose federated model is worse on its held-out rows takes home a model alone and
its own log says so at WARNING (tests/test_members_fleet.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Message, MessageType
from torch import nn

from fedamp_flwr.config import ConfigError
from fedamp_flwr.member.member_choice import (
    LEAST_HELD,
    Choice,
    choose,
    folds,
    held_out,
    out_of_fold,
    said,
)
from strategies.core.records import kept_said
from strategies.core.replies import evaluate_reply_problem
from tasks.scores import best, goodness, leads
from tasks.tabular import fit_linear, folded, standardize

from .helpers import reply


def test_the_node_config_is_checked_and_defaults_to_choosing_by_a_proper_score():
    assert Choice.of({}, "classification") == Choice(True, 0.2, "log_loss")
    assert Choice.of({}, "regression") == Choice(True, 0.2, "mse")
    assert Choice.of({"keep": "federated"}, "classification").on is False
    assert Choice.of({"member-metric": "auc", "held-out-fraction": 0.3},
                     "classification") == Choice(True, 0.3, "auc")
    for config, match in (({"keep": "best"}, "'keep' = 'best' is invalid; allowed: better"),
                          ({"held-out-fraction": 0.0}, "'held-out-fraction' = 0.0"),
                          ({"held-out-fraction": 0.6}, "allowed: a number in \\(0, 0.5\\]"),
                          ({"held-out-fraction": True}, "'held-out-fraction' = True"),
                          ({"member-metric": "mse"}, "'member-metric' = 'mse' is invalid for "
                                                     "a classification task of 2 classes; "
                                                     "allowed: log_loss")):
        with pytest.raises(ConfigError, match=match):
            Choice.of(config, "classification")
    with pytest.raises(ConfigError, match="allowed: mse, mae, r2"):
        Choice.of({"member-metric": "auc"}, "regression")
    # a Brier score is of two classes
    assert Choice.of({"member-metric": "brier"}, "classification", 2).metric == "brier"
    with pytest.raises(ConfigError, match="of 3 classes; allowed: log_loss, accuracy, "
                                          r"balanced_accuracy, auc \(default log_loss\)"):
        Choice.of({"member-metric": "brier"}, "classification", 3)


def test_held_out_rows_are_a_seeded_share_never_fewer_than_the_least():
    held, rest = held_out(100, 0.2, "site-a")
    assert len(held) == 20 and len(rest) == 80
    assert sorted(torch.cat([held, rest]).tolist()) == list(range(100))
    again, _ = held_out(100, 0.2, "site-a")
    other, _ = held_out(100, 0.2, "site-b")
    assert torch.equal(held, again) and not torch.equal(held, other)
    held, rest = held_out(30, 0.2, "site-a")  # 6 would be too few: the least, 10
    assert (len(held), len(rest)) == (LEAST_HELD, 20)
    assert held_out(2 * LEAST_HELD, 0.2, "x") is not None
    assert held_out(2 * LEAST_HELD - 1, 0.2, "x") is None


class Fixed(nn.Module):
    """A model whose outputs are given: row i of ``logits`` for input i (x = [[i]])."""

    def __init__(self, logits: list[list[float]]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[x[:, 0].long()]


def test_the_best_on_held_out_rows_by_log_loss_is_kept_and_scored_on_test_rows_after():
    # two held-out rows (inputs 0, 1), both of class 1; two test rows (inputs 2, 3), classes
    # 0 and 1. Logits [0, ln 3] give p(1) = 3/4, [0, 0] p(1) = 1/2, [ln 3, 0] p(1) = 1/4
    q, h, o = [0.0, math.log(3)], [0.0, 0.0], [math.log(3), 0.0]
    held = (torch.tensor([[0.0], [1.0]]), torch.tensor([1, 1]))
    test = (torch.tensor([[2.0], [3.0]]), torch.tensor([0, 1]))
    candidates = {"federated": Fixed([h, h, q, q]),  # log loss ln 2 on the held-out rows
                  "linear alone": Fixed([q, q, o, q]),  # -ln(3/4) = 0.2877: the best
                  "model alone": Fixed([q, o, h, h])}  # (ln(4/3) + ln 4) / 2 = 0.8370
    choice = choose(candidates, held, test, "log_loss")
    assert choice["kept"] == "linear alone" and choice["held_out_rows"] == 2
    assert choice["held_out"]["federated"]["log_loss"] == pytest.approx(math.log(2))
    assert choice["held_out"]["linear alone"]["log_loss"] == pytest.approx(-math.log(0.75))
    assert choice["held_out"]["model alone"]["log_loss"] == pytest.approx(
        (math.log(4 / 3) + math.log(4)) / 2)
    # the gain: the federated model's log loss against the best alone's, positive = better
    assert choice["gain"] == pytest.approx(-(math.log(2) + math.log(0.75)))
    # each scored on the test rows: linear alone right on both (p = 3/4 each), accuracy 1
    assert choice["test"]["linear alone"]["accuracy"] == 1.0
    assert choice["test"]["federated"]["accuracy"] == 0.5
    assert choice["test"]["linear alone"]["log_loss"] == pytest.approx(-math.log(0.75))
    assert "confusion" not in choice["test"]["federated"]
    # by accuracy: the federated model predicts class 0 (a tie's argmax) and is wrong on both;
    # one that ties with the reference (the linear model alone) does not lead it: not kept
    assert choose(candidates, held, test, "accuracy")["kept"] == "linear alone"
    assert choose({"federated": Fixed([q, q, q, q]), "linear alone": Fixed([q, q, o, q])},
                  held, test, "accuracy")["kept"] == "linear alone"
    # AUC is no mean over rows: the best, a tie going to the federated model
    assert choose({"federated": Fixed([q, h, q, q]), "linear alone": Fixed([q, q, o, q])},
                  (torch.tensor([[0.0], [1.0]]), torch.tensor([1, 0])), test,
                  "auc")["kept"] == "federated"
    # as "final" has it: the linear model refitted is the one scored on the test rows
    final = choose(candidates, held, test, "log_loss", {"linear alone": Fixed([h, h, h, o])})
    assert final["test"]["linear alone"]["accuracy"] == 0.5
    assert final["held_out"] == choice["held_out"]
    line = said(choice)
    assert line.startswith("log loss (lower is better) on its 2 held-out rows: federated "
                           "0.6931, linear alone 0.2877, model alone 0.837; kept: linear alone "
                           "(the reference: linear alone, kept unless another leads it by more "
                           "than one standard error); then on its test rows: federated 0.837")


def test_a_candidate_must_lead_the_reference_by_more_than_one_standard_error():
    # per-row log losses on 4 held-out rows (inputs 0-3, all class 1): the reference (linear
    # alone) p = 1/2 on each, ln 2 = 0.693 a row; the federated model p = 3/4, 3/4, 3/4, 1/4:
    # differences -0.405 x 3 and +0.693, mean -0.131, standard deviation 0.549, standard
    # error 0.275: -0.131 + 0.275 > 0, no lead, the reference is kept though its mean is worse
    q, h, o = [0.0, math.log(3)], [0.0, 0.0], [math.log(3), 0.0]
    held = (torch.tensor([[0.0], [1.0], [2.0], [3.0]]), torch.tensor([1, 1, 1, 1]))
    candidates = {"federated": Fixed([q, q, q, o]), "linear alone": Fixed([h, h, h, h])}
    choice = choose(candidates, held, held, "log_loss")
    assert choice["held_out"]["federated"]["log_loss"] < choice["held_out"]["linear alone"][
        "log_loss"]
    assert choice["kept"] == "linear alone" and choice["reference"] == "linear alone"
    d = np.array([math.log(2 / 3)] * 3 + [math.log(2)])
    assert d.mean() + d.std(ddof=1) / 2 == pytest.approx(0.1438, abs=1e-4)
    assert not leads(np.array([-math.log(0.75)] * 3 + [math.log(4)]), np.full(4, math.log(2)))
    # p = 3/4 on every row: a lead of 0.405 a row with no spread: kept
    candidates["federated"] = Fixed([q, q, q, q])
    assert choose(candidates, held, held, "log_loss")["kept"] == "federated"
    assert leads(np.full(4, 0.2), np.full(4, 0.6)) and not leads(np.full(1, 0.0), np.ones(1))


def test_a_model_alone_lucky_on_the_held_out_rows_is_judged_on_every_row():
    # 10 training rows (inputs 0-9, all class 1), the last 2 held out. Cross-validated (its
    # out-of-fold outputs), the model alone is right and sure on the 2 held-out rows (p =
    # 3/4) but sure and wrong on 4 of the other 8 (p = 1/4): on every row it does not lead
    # the linear model alone (p = 1/2 everywhere), though on the held-out rows it would
    q, h, o = [0.0, math.log(3)], [0.0, 0.0], [math.log(3), 0.0]
    y = torch.ones(10, dtype=torch.long)
    held = (torch.tensor([[8.0], [9.0]]), y[8:])
    cross = {"linear alone": torch.tensor([h] * 10),
             "model alone": torch.tensor([o, q] * 4 + [q, q])}
    candidates = {"federated": Fixed([h] * 10), "linear alone": Fixed([h] * 10),
                  "model alone": Fixed([q] * 10)}
    choice = choose(candidates, held, held, "log_loss", cross=cross, targets=y)
    assert choice["held_out"]["model alone"]["log_loss"] == pytest.approx(-math.log(0.75))
    assert choice["kept"] == "linear alone"
    every = choice["cross_validated"]
    assert (every["folds"], every["rows"]) == (5, 10)
    assert every["scores"]["model alone"]["log_loss"] == pytest.approx(
        (4 * math.log(4) + 6 * -math.log(0.75)) / 10)
    assert "5-fold cross-validated: linear alone 0.6931, model alone 0.7271" in said(choice)
    # without the other rows, its luck would have won
    assert choose(candidates, held, held, "log_loss")["kept"] == "model alone"


def test_out_of_fold_outputs_come_from_models_that_never_saw_their_rows():
    x = torch.arange(12.0).reshape(12, 1)
    y = torch.zeros(12, dtype=torch.long)
    seen: list[set] = []

    class Memo(nn.Module):
        def __init__(self, rows: torch.Tensor) -> None:
            super().__init__()
            self.rows = set(rows[:, 0].long().tolist())
            self.w = nn.Parameter(torch.zeros(1))

        def forward(self, xs: torch.Tensor) -> torch.Tensor:
            return torch.tensor([[float(int(v) in self.rows), 0.0] for v in xs[:, 0]])

    def fit(xf: torch.Tensor, yf: torch.Tensor) -> nn.Module:
        seen.append(set(xf[:, 0].long().tolist()))
        return Memo(xf)

    out = out_of_fold(fit, x, y, "site-a")
    assert len(seen) == 5 and all(len(s) in (9, 10) for s in seen)
    assert (out[:, 0] == 0).all()  # no row was in the model that gave its output
    assert sorted(sum((sorted(f.tolist()) for f in folds(12, "site-a")), [])) == list(range(12))


def test_a_diverged_candidate_is_never_chosen_and_higher_scores_rank_first():
    assert goodness({"auc": 0.7}, "auc") == 0.7 and goodness({"mse": 2.0}, "mse") == -2.0
    assert goodness({"mse": None}, "mse") == -math.inf
    assert goodness({"mse": float("nan")}, "mse") == -math.inf
    assert best({"federated": {"mse": None}, "model alone": {"mse": 9.0}}, "mse") == "model alone"
    assert best({"federated": {"r2": 0.5}, "model alone": {"r2": 0.4}}, "r2") == "federated"


def test_the_linear_model_folded_onto_the_run_inputs_gives_the_same_outputs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, generator=gen) * torch.tensor([1.0, 10.0, 0.1, 5.0]) + 3.0
    y = (x[:, 0] + x[:, 1] / 10 > 3.5).long()
    mean, std = x.mean(0).tolist(), x.std(0).tolist()
    linear = fit_linear(standardize(x, mean, std), y, 2)
    model = folded(linear, mean, std)
    assert set(model.state_dict()) == {"net.0.weight", "net.0.bias"}  # the "linear" model's
    assert torch.allclose(model(x), linear(standardize(x, mean, std)), atol=1e-4)


def _reply(**metrics) -> Message:
    return reply(1, metrics={"accuracy": 0.5, "loss": 1.0, "num-examples": 10, "client-id": 0,
                             "server-round": 1, **metrics}, message_type=MessageType.EVALUATE)


def test_what_the_coordinator_is_told_is_checked_and_said():
    assert evaluate_reply_problem(_reply(**{"kept-model": 1, "held-out-gain": -0.2})) is None
    assert "'kept-model' = 3 is not 0, 1 or 2" in evaluate_reply_problem(
        _reply(**{"kept-model": 3}))
    assert "'held-out-gain' = inf" in evaluate_reply_problem(
        _reply(**{"held-out-gain": float("inf")}))
    assert kept_said({"kept": 1.0, "held_out_gain": -0.25}) == (
        "; kept: linear alone (the federated model against the best alone on its held-out "
        "rows: -0.25, by the member's metric)")
    assert kept_said({"kept": 0.0}) == "; kept: federated"
    assert kept_said({"kept": "2"}) == kept_said({"kept": True}) == kept_said({}) == ""
