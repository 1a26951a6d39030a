"""The combination of Ioste and Finger ("Establishing the Parameters of a Decentralized
Neural Machine Learning Model"): exponentially weighted by the clients' data shares.

Each client trains its local model fully (``local-epochs`` as large as needed),
then the coordinator combines the models as ``w = sum_h alpha_h w_h`` with
``alpha_h = exp(c r_h)``, r_h the client's share of all training samples of the
round and c = ``nonconvex-c`` (paper: 1e-3). The alphas do not sum to one: the
paper's point is that "a non-convex combination is required". Taken as
written, with c = 1e-3 every alpha_h is about 1, so w is about the *sum* of
the N models, N times the scale of any of them (measured in the README).

``nonconvex-normalize = true``, the default, divides the alphas by their sum, a
softmax over the data shares (a deviation from the paper): plain averaging for
small c, leaning to the larger clients as c grows. The sum as written
(``nonconvex-normalize = false``) grows N-fold each round: on the default run's
10 clients its models' squared norm passes the reply checks' bound in round 10
and the run stops (measured: every trial of ``simulation.py --preset default
--tune 4``), so a run of the method by its name alone would not end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, Message

from .core.protocol import NUM_EXAMPLES, as_float
from .core.registry import RunSetup, flower_kwargs, register_strategy
from .core.settings import Settings, setting
from .flower import FedAvg


def nonconvex_weights(num_examples: np.ndarray, c: float, normalize: bool = False) -> np.ndarray:
    """``alpha_h = exp(c r_h)`` with ``r_h = n_h / sum_j n_j`` (divided by their sum with
    ``normalize``).

    Parameters
    ----------
    num_examples : np.ndarray
        Training samples of each client (n_h), at least one positive.
    c : float
        The paper's constant (1e-3 in the paper).
    normalize : bool
        Scale the alphas to sum to one (not the paper's rule).
    """
    n = np.asarray(num_examples, dtype=np.float64)
    if n.ndim != 1 or len(n) == 0 or (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"num_examples must be non-negative with a positive sum, got {n}")
    z = c * n / n.sum()
    if not normalize:
        return np.exp(z)
    e = np.exp(z - z.max())
    return e / e.sum()


class NonConvex(FedAvg):
    """``w = sum_h alpha_h w_h`` on top of Flower's FedAvg aggregation.

    Client contract: plain local training (``local``) for ``local-epochs``;
    replies carry ``num-examples``, from which the shares r_h are taken.

    Flower's FedAvg computes ``sum_h v_h w_h / sum_h v_h`` from each reply's
    ``num-examples`` v_h; just before it aggregates, that metric of each
    (already validated and recorded) reply is replaced by alpha_h, and the
    average is then multiplied by ``sum_h alpha_h`` (unless ``normalize``),
    which gives the sum as written.

    Parameters
    ----------
    settings : NonConvexSettings
        The paper's constant c, and whether the alphas are divided by their sum
        (a convex combination; not the paper's).
    **kwargs
        Flower FedAvg's arguments.
    """

    def __init__(self, settings: NonConvexSettings, **kwargs) -> None:
        self.c, self.normalize = settings.nonconvex_c, settings.nonconvex_normalize
        self._alpha_sum = 1.0
        super().__init__(**kwargs)

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Put each reply's alpha_h where FedAvg reads its weight."""
        if not replies:
            return replies
        records = [next(iter(m.content.metric_records.values())) for m in replies]
        alphas = nonconvex_weights(np.array([as_float(r[NUM_EXAMPLES], NUM_EXAMPLES)
                                             for r in records]), self.c,
                                   self.normalize)
        for record, alpha in zip(records, alphas):
            record[NUM_EXAMPLES] = float(alpha)
        self._alpha_sum = float(alphas.sum())
        return replies

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None and not self.normalize:
            arrays = ArrayRecord({
                k: (torch.from_numpy(np.require(a.numpy() * self._alpha_sum, requirements="C").astype(
                    a.numpy().dtype)) if a.numpy().dtype.kind == "f" else torch.from_numpy(a.numpy()))
                for k, a in arrays.items()})
        return arrays, metrics


@dataclass(frozen=True)
class NonConvexSettings(Settings):
    """Ioste and Finger's keys."""

    nonconvex_c: float = setting(1e-3, "c in alpha_h = exp(c * share of samples) (the "
                                 "paper's 1e-3)", ok=math.isfinite, allowed="a finite number")
    nonconvex_normalize: bool = setting(True, "true: the alphas divided by their sum (not "
                                        "the paper's rule, which false keeps: it grows "
                                        "N-fold a round)")


@register_strategy("nonconvex", settings=NonConvexSettings)
def _nonconvex(settings: NonConvexSettings, run: RunSetup) -> NonConvex:
    return NonConvex(settings, **flower_kwargs(run))
