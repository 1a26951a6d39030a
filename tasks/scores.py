"""The scores a member's analysts use, beside accuracy: pure functions on a model's outputs.

Classification (``probabilities``: one row per example, one column per class, each row
summing to 1; ``y``: the true class indices), the prediction being the most probable class:

* ``accuracy``; ``balanced_accuracy``: the mean over the classes present in ``y`` of each
  one's recall (a table with 6% positives scores 0.5 for always "no", where its accuracy
  is 0.94);
* ``log_loss``: the mean of -log p(true class), each p clipped to [1e-15, 1] (a proper
  score: lowest for the true probabilities);
* ``auc``: the area under the ROC curve, the probability that a random positive is ranked
  above a random negative (ties count a half: Mann-Whitney's U over n1 n0 with average
  ranks); of the second class's probability where there are two classes, else the mean of
  each class's one-vs-rest AUC over the classes present in ``y`` (where ``y`` holds one
  class only, none);
* ``brier`` (two classes): the mean of (p(second class) - [y is the second class])^2;
* ``confusion``: rows the true class, columns the predicted one (up to
  :data:`MOST_CONFUSION` classes).

Regression (``predictions`` and ``y`` of one shape): ``mse``, ``mae`` and ``r2`` (1 - the
squared error's sum over y's sum of squares about each output's mean, pooled over the
outputs: scikit-learn's ``multioutput="variance_weighted"`` where no output is constant;
none where y is constant).

No scikit-learn here (a member's node does not install it); tests/test_scores.py checks
each against scikit-learn's and against values worked by hand.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: the smallest probability log loss takes the log of
EPS = 1e-15
#: the most classes whose confusion matrix is given
MOST_CONFUSION = 100


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``values`` (ties: the mean of the ranks they share)."""
    order = np.argsort(values, kind="mergesort")
    _, inverse, counts = np.unique(values[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = ((ends - counts + 1 + ends) / 2.0)[inverse]
    return ranks


def auc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC of ``score`` for the boolean labels ``positive``; None where one is absent."""
    positive = np.asarray(positive, dtype=bool)
    n1 = int(positive.sum())
    n0 = len(positive) - n1
    if n1 == 0 or n0 == 0:
        return None
    ranks = average_ranks(np.asarray(score, dtype=np.float64))
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def classification_scores(probabilities: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Accuracy, balanced accuracy, log loss, AUC, Brier (two classes) and the confusion
    matrix of ``probabilities`` (n x classes) against ``y`` (n class indices)."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    if p.ndim != 2 or y.shape != (len(p),) or len(p) == 0:
        raise ValueError(f"probabilities of shape {p.shape} and labels of shape {y.shape}: "
                         "allowed: (n, classes) and (n,), n > 0")
    classes = p.shape[1]
    if y.min() < 0 or y.max() >= classes:
        raise ValueError(f"labels in [{y.min()}, {y.max()}]; allowed: 0 to {classes - 1}")
    predicted = p.argmax(1)
    counts = np.bincount(y, minlength=classes)
    present = counts > 0
    right = np.bincount(y[predicted == y], minlength=classes)
    recall = right[present] / counts[present]
    out: dict[str, Any] = {
        "accuracy": float((predicted == y).mean()),
        "balanced_accuracy": float(recall.mean()),
        "log_loss": float(-np.log(np.clip(p[np.arange(len(y)), y], EPS, 1.0)).mean())}
    if classes <= MOST_CONFUSION:  # (more: classes^2 numbers on a card and a log line)
        out["confusion"] = np.bincount(y * classes + predicted, minlength=classes * classes
                                       ).reshape(classes, classes).tolist()
    if classes == 2:
        out["auc"] = auc(p[:, 1], y == 1)
        out["brier"] = float(((p[:, 1] - (y == 1)) ** 2).mean())
    else:
        each = [auc(p[:, c], y == c) for c in np.flatnonzero(present)]
        known = [a for a in each if a is not None]
        out["auc"] = float(np.mean(known)) if known else None
    return out


def regression_scores(predictions: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """MSE, MAE and R^2 of ``predictions`` against ``y`` (the same shape; over all outputs)."""
    pred = np.asarray(predictions, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if pred.shape != y.shape or y.size == 0:
        raise ValueError(f"predictions of shape {pred.shape} and targets of shape {y.shape}: "
                         "allowed: the same shape, not empty")
    error = pred - y
    spread = float(((y - y.mean(0)) ** 2).sum())
    return {"mse": float((error ** 2).mean()), "mae": float(np.abs(error).mean()),
            "r2": 1.0 - float((error ** 2).sum()) / spread if spread > 0 else None}


#: the words each score is printed with, in the order printed
WORDS = {"accuracy": "accuracy", "balanced_accuracy": "balanced accuracy", "auc": "AUC",
         "log_loss": "log loss", "brier": "Brier score", "mse": "MSE", "mae": "MAE",
         "r2": "R^2"}


def said(scores: dict[str, Any]) -> str:
    """The scores in one line (those that are numbers; "no score: its outputs are not all
    finite" where none is), then the confusion matrix's rows."""
    line = ", ".join(f"{WORDS[k]} {scores[k]:.4g}" for k in WORDS
                     if isinstance(scores.get(k), float)) or \
        "no score: the model's outputs are not all finite"
    if "confusion" in scores:
        line += "; confusion matrix (a row per true class, a column per predicted): " + \
            " / ".join(" ".join(str(v) for v in row) for row in scores["confusion"])
    return line


def of_outputs(outputs: Any, y: Any) -> dict[str, Any]:
    """The scores of a model's raw outputs (a torch tensor) against labels ``y`` (integer:
    classes, the softmax of the outputs; float: regression); outputs that are not all
    finite (a diverged model's) get none of the scores (None), and a score that is not
    finite is None."""
    import torch

    outputs = outputs.detach().cpu().double()
    if not bool(torch.isfinite(outputs).all()):  # a diverged model: no score is its own
        keys = ("mse", "mae", "r2") if torch.is_floating_point(y) else (
            "accuracy", "balanced_accuracy", "log_loss", "auc")
        return dict.fromkeys(keys)
    if torch.is_floating_point(y):
        found = regression_scores(outputs.reshape(y.shape).numpy(), y.double().cpu().numpy())
    else:
        found = classification_scores(torch.softmax(outputs, dim=1).numpy(), y.cpu().numpy())
    # a card is strict JSON: a score that is not finite is none, never NaN
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in found.items()}


def of_model(model: Any, x: Any, y: Any) -> dict[str, Any]:
    """:func:`of_outputs` of a torch model on rows ``x``, on the model's own device."""
    from .export import predict

    device = next(model.parameters()).device
    return of_outputs(predict(model, x.to(device)), y)


#: the scores a member may choose its model by (node config ``member-metric``), per kind of
#: task, the first being the default (both proper scoring rules)
CLASSIFICATION_CHOICES = ("log_loss", "accuracy", "balanced_accuracy", "auc", "brier")
REGRESSION_CHOICES = ("mse", "mae", "r2")
#: the scores where higher is better (the others: lower is)
HIGHER_IS_BETTER = frozenset({"accuracy", "balanced_accuracy", "auc", "r2"})


def goodness(scores: dict[str, Any], metric: str) -> float:
    """``scores[metric]`` as a number where higher is better (lower-is-better scores
    negated); -inf where it is missing or not finite (a diverged model's: the worst)."""
    value = scores.get(metric)
    if not isinstance(value, float | int) or isinstance(value, bool) or not math.isfinite(value):
        return -math.inf
    return float(value) if metric in HIGHER_IS_BETTER else -float(value)


def best(candidates: dict[str, dict[str, Any]], metric: str) -> str:
    """The name of the candidate whose ``metric`` is best (:func:`goodness`); a tie goes to
    the one named first (a member's federated model, where it is named first)."""
    if not candidates:
        raise ValueError("no candidate to choose from")
    top = max(goodness(s, metric) for s in candidates.values())
    return next(name for name, s in candidates.items() if goodness(s, metric) == top)


#: the scores that are a mean over the rows of a loss of each row (the others are not)
PER_ROW = frozenset({"log_loss", "accuracy", "brier", "mse", "mae"})


def row_losses(outputs: Any, y: Any, metric: str) -> np.ndarray | None:
    """Each row's loss under ``metric`` (one of :data:`PER_ROW`; lower is better: accuracy's
    is 1 where the row is wrong) from a model's raw outputs (a torch tensor) and the labels
    or targets ``y``; None for another metric, or outputs that are not all finite. The mean
    of the losses is the score (1 - the accuracy)."""
    import torch

    outputs = outputs.detach().cpu().double()
    if metric not in PER_ROW or not bool(torch.isfinite(outputs).all()):
        return None
    if torch.is_floating_point(y):
        error = (outputs.reshape(y.shape) - y.double().cpu()).reshape(len(y), -1).numpy()
        return (error ** 2).mean(1) if metric == "mse" else np.abs(error).mean(1)
    p = torch.softmax(outputs, dim=1).numpy()
    labels = y.cpu().numpy().astype(np.int64)
    rows = np.arange(len(labels))
    if metric == "log_loss":
        return -np.log(np.clip(p[rows, labels], EPS, 1.0))
    if metric == "accuracy":
        return (p.argmax(1) != labels).astype(np.float64)
    return (p[:, 1] - (labels == 1)) ** 2  # brier (two classes)


def leads(challenger: np.ndarray, reference: np.ndarray) -> bool:
    """Whether the ``challenger``'s losses on the same rows are lower than the
    ``reference``'s by more than one standard error of their paired difference (the mean
    difference plus its standard error below 0): a lead that one split's noise does not
    explain as easily."""
    diff = np.asarray(challenger, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if len(diff) < 2:
        return False
    return bool(diff.mean() + diff.std(ddof=1) / math.sqrt(len(diff)) < 0)
