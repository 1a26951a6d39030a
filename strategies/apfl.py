"""APFL: adaptive personalized federated learning (Deng et al. 2020), fixed mixture weight.

Every client keeps a local model v_i (in its ``context.state``) besides the
shared model w. In a round each client runs APFL's local update (Alg. 1:
a step of w on its own loss and a step of v_i on the loss of the mixture
``alpha v_i + (1 - alpha) w``, on every mini-batch; see
:func:`tasks.train.train_apfl`); the server averages the w's as FedAvg does.
Each client is tested on its personalized model ``alpha v_i + (1 - alpha) w``
(Eq. 3). ``alpha`` is fixed (the run config's ``apfl-alpha``); the paper's
adaptive update of alpha is not implemented.
"""

from __future__ import annotations

from .flower import ClientInstructions, FedAvg


class APFL(ClientInstructions, FedAvg):
    """APFL on top of Flower's FedAvg: the messages carry ``apfl-alpha``.

    Parameters
    ----------
    alpha : float
        Mixture weight of the local model, in (0, 1].
    **kwargs
        Flower FedAvg's arguments.
    """

    def __init__(self, alpha: float = 0.5, **kwargs) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"apfl alpha = {alpha} is invalid; allowed: a number in (0, 1]")
        self.alpha = alpha
        super().__init__(**kwargs)

    def train_keys(self) -> dict:  # noqa: D102
        return {"apfl-alpha": self.alpha}

    evaluate_keys = train_keys
