"""The combination of Ioste and Finger ("Establishing the Parameters of a Decentralized
Neural Machine Learning Model"): exponentially weighted by the clients' data shares.

Each client trains its local model fully (``local-epochs`` as large as needed),
then the coordinator combines the models as ``w = sum_h alpha_h w_h`` with
``alpha_h = exp(c r_h)``, r_h the client's share of all training samples of the
round and c = ``nonconvex-c`` (paper: 1e-3).

Deviation: the alphas are normalised to sum to one (``alpha_h / sum_j alpha_j``).
Taken literally, ``sum_h exp(c r_h) w_h`` with c = 1e-3 is about the *sum* of
the N models, N times the scale of any of them; normalised, the rule is a
softmax over the data shares, which leans to the larger clients more than
plain averaging does as c grows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Message

from .flower import FedAvg
from .protocol import NUM_EXAMPLES
from .registry import RunSetup, flower_kwargs, register_strategy

if TYPE_CHECKING:
    from fedamp_flwr.config import RunConfig


def nonconvex_weights(num_examples: np.ndarray, c: float) -> np.ndarray:
    """``alpha_h = exp(c r_h) / sum_j exp(c r_j)`` with ``r_h = n_h / sum_j n_j``.

    Parameters
    ----------
    num_examples : np.ndarray
        Training samples of each client (n_h), at least one positive.
    c : float
        The paper's constant (1e-3 in the paper).
    """
    n = np.asarray(num_examples, dtype=np.float64)
    if n.ndim != 1 or len(n) == 0 or (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"num_examples must be non-negative with a positive sum, got {n}")
    z = c * n / n.sum()
    e = np.exp(z - z.max())
    return e / e.sum()


class NonConvex(FedAvg):
    """Flower's FedAvg aggregation with the weights of :func:`nonconvex_weights`.

    Client contract: plain local training (``local``) for ``local-epochs``;
    replies carry ``num-examples``, from which the shares r_h are taken.

    Flower's FedAvg weighs each reply by its ``num-examples`` metric; just
    before it aggregates, that metric of each (already validated and recorded)
    reply is replaced by the client's alpha_h.

    Parameters
    ----------
    c : float
        The paper's constant c.
    **kwargs
        Flower FedAvg's arguments.
    """

    def __init__(self, c: float = 1e-3, **kwargs) -> None:
        self.c = c
        super().__init__(**kwargs)

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Put each reply's alpha_h where FedAvg reads its weight."""
        if not replies:
            return replies
        records = [next(iter(m.content.metric_records.values())) for m in replies]
        alphas = nonconvex_weights(np.array([float(r[NUM_EXAMPLES]) for r in records]), self.c)
        for record, alpha in zip(records, alphas):
            record[NUM_EXAMPLES] = float(alpha)
        return replies


@register_strategy("nonconvex")
def _nonconvex(cfg: RunConfig, run: RunSetup) -> NonConvex:
    return NonConvex(c=cfg.nonconvex_c, **flower_kwargs(cfg, run))
