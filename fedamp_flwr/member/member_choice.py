"""A member never takes home less than it has alone: the choice its own node makes.

A member's node (``dataset = "members"``) holds out a share of its training rows that
the run's training never sees: ``held-out-fraction`` of them (node config; default
:data:`DEFAULT_FRACTION`, at least :data:`LEAST_HELD` rows, and at least as many left
to train on). Whenever the run asks it to keep a model (``save-models``), it scores
three models on those rows by ``member-metric`` (node config; default log loss for
classification, MSE for regression, both proper scores) and takes home the best where it
leads the reference (the linear model alone; for inputs that are not vectors, the run's
model alone) by more than one standard error of their paired per-row difference, else
the reference (:func:`tasks.scores.leads`; a metric that is no mean over rows, AUC,
balanced accuracy or R^2: the best, ties to the federated model). On a table the two
models alone are 5-fold cross-validated on every training row (:func:`out_of_fold`), and
the one kept is refitted on every training row:

* ``federated``: the run's model for this member (its personalized model);
* ``linear alone``: a logistic (classification) or ridge (regression) model fitted on
  its own training rows alone (:func:`tasks.tabular.fit_linear`; vector inputs only),
  and, where chosen, refitted on all of them, held-out rows too, as the member's
  analysts would fit it;
* ``model alone``: the run's model trained on its own rows alone for the same local
  steps (on a table: refitted on every training row, held-out ones too, where chosen).

Only then are the three scored on its test rows, once; the choice, the held-out scores
and the test scores of all three go in its log and on its model's card, and the choice
and the held-out gain (the federated model's metric against the best alone, positive
where federation is better) in the reply, for the coordinator's closing lines. A member
that does not keep its federated model is told so once, at WARNING, with the choice
made.

It is the member's own rule: the run config has no key for it but ``save-models =
"none"`` (no model is kept: nothing to choose). Its node config turns it off (``keep =
"federated"``: every training row trains, the run's model is kept, whatever it scores),
and so does a node config without a ``model-dir`` (the node writes no model). A member
with fewer than 2 x :data:`LEAST_HELD` training rows cannot hold out enough rows to
choose on: it keeps the federated model and its log says so at WARNING. Under ``dp`` the
reply says which model was kept, not the gain (a number about training rows, unnoised).

Left out (docs/federation.md): cross-validation of the federated model (it is trained
once, on one split), and of the models alone where the inputs are not vectors.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import tasks
from strategies.core.protocol import KEPT_NAMES
from tasks.export import predict
from tasks.scores import (
    CLASSIFICATION_CHOICES,
    HIGHER_IS_BETTER,
    PER_ROW,
    REGRESSION_CHOICES,
    WORDS,
    best,
    goodness,
    leads,
    of_model,
    of_outputs,
    row_losses,
)

from ..config import ConfigError

#: node config: which model a member keeps: "better" (the default: the best on its held-out
#: rows of its federated model, its linear model alone and the run's model alone) or
#: "federated" (the run's model, whatever it scores; no rows held out)
KEEP = "keep"
#: node config: the share of a member's training rows held out to choose its model on
HELD_OUT_FRACTION = "held-out-fraction"
#: node config: the score a member chooses its model by
MEMBER_METRIC = "member-metric"
DEFAULT_FRACTION = 0.2
#: the fewest rows a member holds out (and trains on)
LEAST_HELD = 10
#: the candidates, in the order a tie is settled
FEDERATED, LINEAR, MODEL = KEPT_NAMES
#: a candidate's code in the reply's ``kept-model``
CODES = {name: code for code, name in enumerate(KEPT_NAMES)}


@dataclass(frozen=True)
class Choice:
    """A member's own rule for the model it keeps (its node config, checked)."""

    on: bool
    fraction: float
    metric: str

    @classmethod
    def of(cls, node_config: dict[str, Any], kind: str, classes: int = 2) -> Choice:
        """The node config's ``keep``, ``held-out-fraction`` and ``member-metric`` for a task
        of ``kind`` (classification or regression; ``classes`` of them); a ConfigError names
        a bad value."""
        keep = node_config.get(KEEP, "better")
        if keep not in ("better", "federated"):
            raise ConfigError(f"node config '{KEEP}' = {keep!r} is invalid; allowed: better (the "
                              "best on held-out rows of the federated model, the linear model "
                              "alone and the run's model alone; the default), federated (the "
                              "run's model, whatever it scores)")
        fraction = node_config.get(HELD_OUT_FRACTION, DEFAULT_FRACTION)
        if (isinstance(fraction, bool) or not isinstance(fraction, int | float)
                or not math.isfinite(fraction) or not 0 < fraction <= 0.5):
            raise ConfigError(f"node config '{HELD_OUT_FRACTION}' = {fraction!r} is invalid; "
                              "allowed: a number in (0, 0.5] (the share of this member's "
                              f"training rows held out to choose its model on; default "
                              f"{DEFAULT_FRACTION})")
        choices: tuple[str, ...] = (REGRESSION_CHOICES if kind == tasks.REGRESSION
                                    else CLASSIFICATION_CHOICES)
        if kind != tasks.REGRESSION and classes != 2:  # a Brier score of two classes only
            choices = tuple(c for c in choices if c != "brier")
        metric = node_config.get(MEMBER_METRIC, choices[0])
        if metric not in choices:
            raise ConfigError(f"node config '{MEMBER_METRIC}' = {metric!r} is invalid for a "
                              f"{kind} task" + (f" of {classes} classes" if kind !=
                                                tasks.REGRESSION else "")
                              + f"; allowed: {', '.join(choices)} (default {choices[0]})")
        return cls(keep == "better", float(fraction), str(metric))


def held_out(n: int, fraction: float, member: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The indices of a member's held-out rows and of the rest, seeded by the member's name
    alone, not the run's seed: where its training rows are the same (a file that marks its
    test rows, or the same run seed, and no rows added), a later season holds out the same
    rows, so that no model it starts from trained on them. ``fraction`` of its ``n``
    training rows, at least :data:`LEAST_HELD`, with at least as many left; None where
    ``n`` is too small."""
    held = max(LEAST_HELD, round(fraction * n))
    if n - held < LEAST_HELD:
        return None
    gen = torch.Generator().manual_seed(zlib.crc32(f"held-out:{member}".encode()))
    order = torch.randperm(n, generator=gen)
    return order[:held], order[held:]


#: the folds of the cross-validation of a member's models alone on its vector rows
FOLDS = 5


def folds(n: int, member: str, k: int = FOLDS) -> list[torch.Tensor]:
    """``k`` folds of ``n`` rows (row indices), seeded by the member's name alone."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"folds:{member}".encode()))
    order = torch.randperm(n, generator=gen)
    return [order[i::k] for i in range(k) if len(order[i::k])]


def out_of_fold(fit: Callable[[torch.Tensor, torch.Tensor], nn.Module], x: torch.Tensor,
                y: torch.Tensor, member: str) -> torch.Tensor:
    """Each row's outputs from the model ``fit`` makes of the other folds' rows
    (:func:`folds`): a score of these is the model's cross-validated one."""
    outputs: torch.Tensor | None = None
    for rows in folds(len(y), member):
        rest = torch.ones(len(y), dtype=torch.bool)
        rest[rows] = False
        model = fit(x[rest], y[rest])
        out = predict(model, x[rows].to(_device_of(model))).detach().cpu()
        if outputs is None:
            outputs = torch.empty((len(y), *out.shape[1:]), dtype=out.dtype)
        outputs[rows] = out
    assert outputs is not None
    return outputs


def choose(candidates: dict[str, nn.Module], held: tuple[torch.Tensor, torch.Tensor],
           test: tuple[torch.Tensor, torch.Tensor], metric: str,
           final: dict[str, nn.Module] | None = None,
           cross: dict[str, torch.Tensor] | None = None,
           targets: torch.Tensor | None = None) -> dict[str, Any]:
    """Score the ``candidates`` (federated first) on the held-out rows, choose the best by
    ``metric`` (for a metric that is a mean over rows, only where it leads the reference by
    more than one standard error: else the reference), then score all of them on the test
    rows (once, after the choice), each as ``final`` has it where it names it (the linear
    model alone refitted on every training row, held-out rows too: the model that is kept),
    else as it was chosen. Returns
    the card's ``choice`` record: ``kept``, ``metric``, ``held_out`` and ``test`` (each
    candidate's scores, :func:`tasks.scores.of_model`), ``held_out_rows``, ``reference``,
    ``gain`` (the
    federated model's ``metric`` on the held-out rows against the best alone's, positive
    where federation is better; None where it cannot be said).

    ``cross``: a model alone's out-of-fold outputs (:func:`out_of_fold`) on every training
    row, the held-out ones last, whose targets are ``targets``: its held-out scores are then
    those of its outputs there (models that never trained on those rows), its
    ``cross_validated`` scores those on every row, and its lead over a reference that has
    them too is judged on every row: one split's luck, on 10 to 40 rows, no longer makes an
    overconfident model look best."""
    cross = cross or {}
    n_held = len(held[1])
    outputs = {name: (cross[name][-n_held:] if name in cross
                      else predict(model, held[0].to(_device_of(model))))
               for name, model in candidates.items()}
    on_held = {name: of_outputs(out, held[1]) for name, out in outputs.items()}
    reference = next(n for n in (LINEAR, MODEL, FEDERATED) if n in candidates)
    kept = best(on_held, metric)
    if kept != reference and metric in PER_ROW:  # the best if it leads by one error, or none
        losses = {name: row_losses(out, held[1], metric) for name, out in outputs.items()}
        every = ({name: row_losses(out, targets, metric) for name, out in cross.items()}
                 if targets is not None else {})
        on = every if kept in every and reference in every else losses
        mine, ref = on[kept], on[reference]
        if ref is not None and (mine is None or not leads(mine, ref)):  # (a diverged
            kept = reference  # reference: the best, as it is)
    final = {**candidates, **(final or {})}
    on_test = {name: of_model(final[name], *test) for name in candidates}
    alone = [goodness(s, metric) for name, s in on_held.items() if name != FEDERATED]
    fed = goodness(on_held.get(FEDERATED, {}), metric)
    gain = fed - max(alone) if alone and math.isfinite(fed) and math.isfinite(max(alone)) \
        else None
    checked = ({"cross_validated": {
        "folds": FOLDS, "rows": len(targets),
        "scores": _plain({name: of_outputs(out, targets) for name, out in cross.items()})}}
        if cross and targets is not None else {})
    return {"kept": kept, "metric": metric, "held_out_rows": len(held[1]), "reference": reference,
            "held_out": _plain(on_held), "test": _plain(on_test), "gain": gain, **checked}


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _plain(by_name: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The scores without their confusion matrices (the card's ``score.analyst`` has the
    kept model's)."""
    return {name: {k: v for k, v in s.items() if k != "confusion"} for name, s in by_name.items()}


def said(choice: dict[str, Any]) -> str:
    """The choice in one line: the metric on the held-out rows and on the test rows of each."""
    metric = choice["metric"]
    word = WORDS[metric]

    def each(on: str) -> str:
        return ", ".join(f"{name} {_num(s.get(metric))}" for name, s in choice[on].items())

    direction = "higher" if metric in HIGHER_IS_BETTER else "lower"
    cross = choice.get("cross_validated")
    every = "" if not cross else (
        f"; on all its {cross['rows']} training rows, {cross['folds']}-fold cross-validated: "
        + ", ".join(f"{name} {_num(s.get(metric))}" for name, s in cross["scores"].items()))
    return (f"{word} ({direction} is better) on its {choice['held_out_rows']} held-out rows: "
            f"{each('held_out')}{every}; kept: {choice['kept']} (the reference: "
            f"{choice['reference']}, kept unless another leads it by more than one standard "
            f"error); then on its test rows: {each('test')}")


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "none"
