"""pFedMe (Dinh et al., NeurIPS 2020): personalization with Moreau envelopes.

Each sampled client receives the global model w, runs pFedMe's local update
(:func:`tasks.train.train_pfedme`: on every mini-batch, ``pfedme-inner-steps``
steps towards ``theta = argmin f(theta) + lambda/2 ||theta - w_i||^2``, then
``w_i <- w_i - lr * lambda * (w_i - theta)``) and returns w_i; it keeps its
personalized model theta in ``context.state``. The server sets
``w <- (1 - beta) w + beta * mean_i w_i`` (Alg. 1, line 11; the mean is
Flower FedAvg's, weighted by sample counts). Each client is tested on its
own theta (clients that never trained are tested on w).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord

from .flower import ClientInstructions, FedAvg


def pfedme_global(previous: ArrayRecord, averaged: ArrayRecord, beta: float) -> ArrayRecord:
    """``(1 - beta) * w + beta * mean_i w_i`` per array (Alg. 1, line 11)."""
    out = {}
    for key, arr in averaged.items():
        new, old = arr.numpy(), previous[key].numpy()
        mixed = ((1.0 - beta) * old + beta * new).astype(new.dtype) if new.dtype.kind == "f" else new
        out[key] = torch.from_numpy(np.ascontiguousarray(mixed))
    return ArrayRecord(out)


class PFedMe(ClientInstructions, FedAvg):
    """pFedMe on top of Flower's FedAvg.

    Parameters
    ----------
    lam : float
        lambda, the weight of the Moreau envelope's proximal term, > 0.
    inner_steps : int
        K, the steps that solve the personalized problem per mini-batch.
    personal_lr : float
        Step size of those K steps.
    beta : float
        Server mixing parameter (1: plain averaging).
    **kwargs
        Flower FedAvg's arguments.
    """

    def __init__(self, lam: float = 15.0, inner_steps: int = 5, personal_lr: float = 0.01,
                 beta: float = 1.0, **kwargs) -> None:
        self.lam, self.inner_steps, self.personal_lr, self.beta = lam, inner_steps, personal_lr, beta
        self._previous: ArrayRecord | None = None
        super().__init__(**kwargs)

    def train_keys(self) -> dict:  # noqa: D102
        return {"pfedme-lambda": self.lam, "pfedme-inner-steps": self.inner_steps,
                "pfedme-personal-lr": self.personal_lr}

    def evaluate_keys(self) -> dict:  # noqa: D102
        return {"personal-state": "pfedme-personal"}

    def configure_train(self, server_round, arrays, config, grid):  # noqa: D102
        self._previous = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):  # noqa: D102
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None and self._previous is not None and self.beta != 1.0:
            arrays = pfedme_global(self._previous, arrays, self.beta)
        return arrays, metrics
