"""The scores a member's analysts use (tasks/scores.py): values worked by hand, and
scikit-learn's on random outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.scores import auc, average_ranks, classification_scores, regression_scores, said


def test_values_worked_by_hand():
    # the ROC's four pairs: (0.35 vs 0.1) (0.35 vs 0.4: below) (0.8 vs both): 3 of 4
    assert auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert auc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5  # a tie counts a half
    assert auc(np.array([0.2, 0.7]), np.array([1, 1])) is None  # no negative: none
    assert average_ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    # always "no" on 3 negatives and 1 positive: accuracy 0.75, balanced 0.5
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    s = classification_scores(p, np.array([0, 0, 0, 1]))
    assert s["accuracy"] == 0.75 and s["balanced_accuracy"] == 0.5
    assert s["confusion"] == [[3, 0], [1, 0]] and s["auc"] == 1.0  # ranked right, cut wrong
    assert math.isclose(s["brier"], (0.01 + 0.04 + 0.09 + 0.36) / 4)
    assert math.isclose(s["log_loss"], -(math.log(0.9) + math.log(0.8) + math.log(0.7)
                                         + math.log(0.4)) / 4)
    half = classification_scores(np.full((2, 2), 0.5), np.array([0, 1]))
    assert math.isclose(half["log_loss"], math.log(2)) and half["auc"] == 0.5
    r = regression_scores(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]))
    assert math.isclose(r["mse"], 1 / 3) and math.isclose(r["mae"], 1 / 3)
    assert math.isclose(r["r2"], 1 - 1 / (42 / 9))  # y's squares about 7/3: 16/9 + 1/9 + 25/9
    assert regression_scores(np.array([1.0, 2.0]), np.array([3.0, 3.0]))["r2"] is None
    line = said(s)
    assert line.startswith("accuracy 0.75, balanced accuracy 0.5, AUC 1, log loss ")
    assert line.endswith("(a row per true class, a column per predicted): 3 0 / 1 0")


@pytest.mark.parametrize("classes", [2, 5])
def test_as_scikit_learn_scores_them(classes):
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(classes)
    n = 300
    logits = rng.normal(size=(n, classes)) * 2
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.where(rng.random(n) < 0.6, p.argmax(1), rng.integers(0, classes, n))
    s = classification_scores(p, y)
    assert math.isclose(s["accuracy"], metrics.accuracy_score(y, p.argmax(1)))
    assert math.isclose(s["balanced_accuracy"], metrics.balanced_accuracy_score(y, p.argmax(1)))
    assert math.isclose(s["log_loss"], metrics.log_loss(y, p, labels=list(range(classes))))
    assert s["confusion"] == metrics.confusion_matrix(y, p.argmax(1)).tolist()
    if classes == 2:
        assert math.isclose(s["auc"], metrics.roc_auc_score(y, p[:, 1]))
        assert math.isclose(s["brier"], metrics.brier_score_loss(y, p[:, 1]))
    else:
        assert math.isclose(s["auc"], metrics.roc_auc_score(y, p, multi_class="ovr"))
    target = rng.normal(size=(n, 3))
    guess = target + rng.normal(size=(n, 3)) * 0.5
    r = regression_scores(guess, target)
    assert math.isclose(r["mse"], metrics.mean_squared_error(target, guess))
    assert math.isclose(r["mae"], metrics.mean_absolute_error(target, guess))
    assert math.isclose(r["r2"], metrics.r2_score(target, guess,
                                                  multioutput="variance_weighted"))


@pytest.mark.parametrize("p, y", [(np.ones((2, 2)) / 2, np.array([0, 2])),
                                  (np.ones((2, 2)) / 2, np.array([0])),
                                  (np.ones((0, 2)), np.zeros(0, dtype=int))])
def test_outputs_that_do_not_fit_their_labels_are_refused(p, y):
    with pytest.raises(ValueError, match="allowed"):
        classification_scores(p, y)


def test_a_models_scores_and_a_diverged_models_are_none_not_nan():
    import torch
    from torch import nn

    from tasks.scores import of_model

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,))
    got = of_model(model, x, y)
    p = torch.softmax(model(x).double(), 1).detach().numpy()
    assert got == classification_scores(p, y.numpy())
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    broken = of_model(model, x, y)  # no score looks real
    assert broken == dict.fromkeys(("accuracy", "balanced_accuracy", "log_loss", "auc"))
    assert said(broken) == "no score: the model's outputs are not all finite"
    reg = of_model(nn.Linear(3, 1), x, torch.randn(20, 1))
    assert set(reg) == {"mse", "mae", "r2"} and all(isinstance(v, float) for v in reg.values())


def test_many_classes_get_no_confusion_matrix():
    p = np.full((3, 500), 1 / 500)
    s = classification_scores(p, np.array([0, 1, 499]))
    assert "confusion" not in s and s["accuracy"] == 1 / 3 and s["balanced_accuracy"] == 1 / 3
