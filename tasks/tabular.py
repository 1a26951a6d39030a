"""A member's table as its model sees it, and what the member would get alone.

**Standardizing** (:func:`column_stats`, :func:`pooled`, :func:`standardize`): every
input column of a vector task (a table, an ``.npz`` of float vectors) is standardized,
``(x - mean) / std``, by statistics of the members' rows, not the rows: each member
tells the server its training rows' count and, per column, their mean and their centred
sum of squares (three numbers a column, nothing when it has fewer than
:data:`LEAST_ROWS` rows); the server pools them (Chan, Golub and LeVeque's parallel
combination, numerically stable where a column's values are large beside their spread)
into one mean and one standard deviation per column, the same for every member, so that
every model of the run sees its inputs on one common scale. Measured on the wine table
cut into three members with different class mixes (docs/federation.md,
``python -m experiments.tabular``), pooled statistics did better than each member's own:
a member's own mean shifts with its class mix, so the same weight means different things
at different members. A member's own statistics stay the fallback where no member gives
any (under ``dp``, or members of too few rows).

**Alone** (:func:`fit_linear`): the standardized linear model a member could fit on its
own rows in a second, multinomial logistic regression for classes (ridge regression for
regression targets) with an L2 penalty of 1 / (2 n) on the weights, as scikit-learn's
``LogisticRegression(C=1)`` and ``Ridge(alpha=1)`` minimize (checked against them in
tests/test_tabular.py), by L-BFGS on the whole training set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

#: a column whose standard deviation is below this is left unscaled (a constant column)
TINY_STD = 1e-12
#: a member with fewer training rows gives no statistics (a row or two could be solved for)
LEAST_ROWS = 10
#: the largest magnitude a statistic may have (inputs are float32)
LARGEST = 1e30


def column_stats(x: torch.Tensor) -> tuple[int, list[float], list[float]]:
    """The count of rows of ``x`` (N x F) and, per column, their mean and centred sum of
    squares ``sum (x - mean)^2`` (in float64): what a member's node tells the server of
    its training rows."""
    x = x.detach().reshape(len(x), -1).double()
    mean = x.mean(0)
    return len(x), mean.tolist(), ((x - mean) ** 2).sum(0).tolist()


def stats_problem(count: object, mean: object, m2: object, rows: int,
                  features: int) -> str | None:
    """Why a member's statistics (untrusted: a query answer) cannot be pooled, or None:
    its count must be its ``rows`` training rows, at least :data:`LEAST_ROWS`, the means
    and centred sums of squares ``features`` finite numbers within :data:`LARGEST`, the
    sums of squares >= 0."""
    if isinstance(count, bool) or count != rows or rows < LEAST_ROWS:
        return f"a count of {count!r} rows, not its {rows} training rows (at least {LEAST_ROWS})"
    for name, values in (("means", mean), ("centred sums of squares", m2)):
        if not (isinstance(values, list) and len(values) == features and all(
                isinstance(v, float) and math.isfinite(v) and abs(v) <= LARGEST
                for v in values)):
            return f"its {name} are not {features} finite numbers within {LARGEST:g}"
    assert isinstance(m2, list)
    if min(m2) < 0:
        return "a centred sum of squares below 0"
    return None


def pooled(stats: Sequence[tuple[int, Sequence[float], Sequence[float]]]
           ) -> tuple[list[float], list[float]]:
    """The mean and (population) standard deviation of every column over all the members'
    rows, from their counts, means and centred sums of squares (Chan et al.'s pairwise
    combination); a constant column gets std 1."""
    if not stats or len({len(s[1]) for s in stats} | {len(s[2]) for s in stats}) != 1:
        raise ValueError("no statistics, or members of different column counts")
    n = 0
    mean = m2 = torch.zeros(len(stats[0][1]), dtype=torch.float64)
    for count, means, squares in stats:
        b_n = int(count)
        b_mean = torch.tensor(list(means), dtype=torch.float64)
        b_m2 = torch.tensor(list(squares), dtype=torch.float64)
        total = n + b_n
        delta = b_mean - mean
        mean = mean + delta * (b_n / total)
        m2 = m2 + b_m2 + delta * delta * (n * b_n / total)
        n = total
    std = (m2.clamp_min(0.0) / n).sqrt()
    std = torch.where(std > TINY_STD, std, torch.ones_like(std))
    if not bool(torch.isfinite(mean).all() and torch.isfinite(std).all()):
        raise ValueError("the pooled statistics are not finite")
    return mean.tolist(), std.tolist()


def own(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """The mean and standard deviation of ``x``'s own columns (:func:`pooled` of one)."""
    return pooled([column_stats(x)])


def scaling_problem(mean: object, std: object, features: int) -> str | None:
    """Why ``mean`` and ``std`` (untrusted: a message's) cannot standardize ``features``
    columns, or None."""
    for name, values in (("mean", mean), ("std", std)):
        if not isinstance(values, list) or len(values) != features:
            return f"{name} is not a list of {features} numbers"
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) for v in values):
            return f"{name} holds a value that is not a finite number"
    assert isinstance(std, list) and isinstance(mean, list)
    if min(std) < TINY_STD:
        return f"std holds a value below {TINY_STD:g}"
    if max(abs(v) for v in mean + std) > LARGEST:
        return f"a value beyond {LARGEST:g}"
    return None


def standardize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x - mean) / std`` column by column, in ``x``'s float dtype (a new tensor)."""
    m = torch.tensor(list(mean), dtype=torch.float64)
    s = torch.tensor(list(std), dtype=torch.float64)
    flat = x.reshape(len(x), -1).double()
    return ((flat - m) / s).to(x.dtype if torch.is_floating_point(x) else torch.float32
                               ).reshape(x.shape)


def fit_linear(x: torch.Tensor, y: torch.Tensor, num_outputs: int,
               steps: int = 200) -> nn.Linear:
    """A linear model fitted on (x, y) alone: multinomial logistic regression for integer
    classes (``num_outputs`` of them), ridge regression for float targets; the L2 penalty
    ``||W||^2 / (2 n)`` on the weights (not the bias), as scikit-learn's ``C = 1`` /
    ``alpha = 1``; full-batch L-BFGS (float64), deterministic."""
    x = x.detach().reshape(len(x), -1).double()
    regression = torch.is_floating_point(y)
    target = y.double().reshape(len(y), -1) if regression else y.long()
    outputs = target.shape[1] if regression else num_outputs
    model = nn.Linear(x.shape[1], outputs).double()
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    n = max(len(x), 1)
    # two classes: scikit-learn fits one weight vector w (the logit of the second class);
    # here the two rows' logits differ by w = w_1 - w_0, whose penalty at the optimum
    # (w_0 = -w_1) is ||w||^2 / 4: doubled, it is scikit-learn's ||w||^2 / 2
    binary = 2.0 if not regression and outputs == 2 else 1.0
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=steps,
                                  tolerance_grad=1e-10, tolerance_change=1e-14,
                                  history_size=20, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        out = model(x)
        if regression:  # Ridge(alpha=1): ||y - Xw - b||^2 + ||w||^2, over 2 n
            loss = ((out - target) ** 2).sum() / (2 * n)
        else:  # LogisticRegression(C=1): sum of losses + ||w||^2 / 2, over n
            loss = nn.functional.cross_entropy(out, target, reduction="sum") / n
        loss = loss + binary * (model.weight ** 2).sum() / (2 * n)
        loss.backward()
        return loss

    optimizer.step(objective)
    return model.float()


def folded(linear: nn.Linear, mean: list[float], std: list[float]) -> nn.Module:
    """The linear model ``linear``, fitted on inputs standardized by ``mean`` and ``std``, as
    a model of the run's "linear" architecture on the unstandardized inputs: W ((x - m) / s)
    + b = (W / s) x + (b - (W / s) m), exact up to float rounding."""
    from .models import MODELS

    m = torch.tensor(mean, dtype=torch.float64)
    s = torch.tensor(std, dtype=torch.float64)
    weight = linear.weight.detach().double() / s
    bias = linear.bias.detach().double() - weight @ m
    model = MODELS["linear"]((weight.shape[1],), weight.shape[0])
    model.load_state_dict({"net.0.weight": weight.float(), "net.0.bias": bias.float()})
    return model
