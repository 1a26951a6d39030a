"""Flower's own strategies, used as they are, with this project's reply checks and records.

:class:`strategies.base.TrackedStrategy` sits in front of each (see its
docstring). The ``-ft`` variants (the FedAMP paper's FedAvg-FT and FedProx-FT)
evaluate the global model after each client has fine-tuned it on its own
training data for ``finetune-epochs`` epochs (the ClientApp does this when the
evaluate config says so); training is unchanged.
"""

from __future__ import annotations

from flwr.serverapp import strategy as flwr_strategy

from .base import TrackedStrategy


class FedAvg(TrackedStrategy, flwr_strategy.FedAvg):
    """Flower's FedAvg with this project's reply checks and records."""


class FedProx(TrackedStrategy, flwr_strategy.FedProx):
    """Flower's FedProx with this project's reply checks and records."""


class FedMedian(TrackedStrategy, flwr_strategy.FedMedian):
    """Flower's FedMedian (coordinate-wise median) with this project's checks and records."""


class FedTrimmedAvg(TrackedStrategy, flwr_strategy.FedTrimmedAvg):
    """Flower's FedTrimmedAvg (trimmed mean, ``beta`` cut at each end) with checks and records."""


class Krum(TrackedStrategy, flwr_strategy.Krum):
    """Flower's Krum with this project's checks and records."""


class ClientInstructions:
    """Mixin: add a strategy's instructions for the generic ClientApp to every config.

    Subclasses override :meth:`train_keys` and :meth:`evaluate_keys`; their
    entries are added to the config of every train / evaluate message.
    """

    def train_keys(self) -> dict:
        """Keys added to every train config (none by default)."""
        return {}

    def evaluate_keys(self) -> dict:
        """Keys added to every evaluate config (none by default)."""
        return {}

    def configure_train(self, server_round, arrays, config, grid):  # noqa: D102
        config.update(self.train_keys())
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round, arrays, config, grid):  # noqa: D102
        config.update(self.evaluate_keys())
        return super().configure_evaluate(server_round, arrays, config, grid)


class FineTuned(ClientInstructions):
    """Mixin: ask every client to fine-tune the global model before testing it.

    Parameters
    ----------
    finetune_epochs : int
        Local epochs of fine-tuning on the client's training data (>= 1).
    """

    def __init__(self, *args, finetune_epochs: int = 1, **kwargs) -> None:
        if finetune_epochs < 1:
            raise ValueError(f"finetune_epochs = {finetune_epochs} is invalid; allowed: >= 1")
        self.finetune_epochs = finetune_epochs
        super().__init__(*args, **kwargs)

    def evaluate_keys(self) -> dict:  # noqa: D102
        return {"finetune-epochs": self.finetune_epochs}


class FedAvgFT(FineTuned, FedAvg):
    """FedAvg-FT: FedAvg's global model, fine-tuned by each client before it is tested."""


class FedProxFT(FineTuned, FedProx):
    """FedProx-FT: FedProx's global model, fine-tuned by each client before it is tested."""
