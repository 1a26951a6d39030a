"""Per-FedAvg (Fallah et al., NeurIPS 2020), first-order version.

Clients train the shared model with the MAML-style meta-update of
:func:`tasks.train.train_per_fedavg` (inner step size ``per-fedavg-alpha``);
the server averages the models as FedAvg does. Each client is tested on the
global model after one step of plain gradient descent at ``per-fedavg-alpha``
on one mini-batch of its own training data: the personalization that the
meta-objective ``f(w - alpha grad f(w))`` optimizes for.

Choices: the first-order version (Per-FedAvg (FO)); the Hessian-free version
(HF) is not implemented. D and D' are consecutive mini-batches of one
shuffled pass.
"""

from __future__ import annotations

from .flower import ClientInstructions, FedAvg


class PerFedAvg(ClientInstructions, FedAvg):
    """Per-FedAvg (FO) on top of Flower's FedAvg.

    Parameters
    ----------
    alpha : float
        Inner (personalization) step size, > 0.
    **kwargs
        Flower FedAvg's arguments.
    """

    def __init__(self, alpha: float = 0.01, **kwargs) -> None:
        if not alpha > 0:
            raise ValueError(f"per-fedavg alpha = {alpha} is invalid; allowed: a number > 0")
        self.alpha = alpha
        super().__init__(**kwargs)

    def train_keys(self) -> dict:  # noqa: D102
        return {"per-fedavg-alpha": self.alpha}

    def evaluate_keys(self) -> dict:  # noqa: D102
        return {"finetune-steps": 1, "finetune-lr": self.alpha, "finetune-optimizer": "sgd"}
