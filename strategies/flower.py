"""Flower's own strategies, used as they are, with this project's checks and records.

:class:`strategies.base.TrackedStrategy` sits in front of each (see its
docstring). Two client halves live here, beside the strategies that use them:

* ``proximal`` (:class:`ProximalTraining`): FedProx's client contract, as
  Flower's ``FedProx`` states it: train the received model w^t on the local
  loss plus ``proximal-mu / 2 ||w - w^t||^2``. FedAMP's clients run it too,
  with ``proximal-mu`` = lambda / alpha_k.
* ``finetune`` (:class:`FineTuning`): the evaluation rule of the FedAMP
  paper's FedAvg-FT and FedProx-FT: fine-tune the received global model for
  ``finetune-epochs`` epochs on the local training data, then test it.
  Training is unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.serverapp import strategy as flwr_strategy
from torch import nn

from .base import TrackedStrategy
from .client import ClientJob, ClientUpdate, register_client_update
from .registry import RunSetup, flower_kwargs, register_strategy

if TYPE_CHECKING:
    from fedamp_flwr.config import RunConfig

PROXIMAL = "proximal"
PROXIMAL_MU = "proximal-mu"  # the key Flower's FedProx sends
FINETUNE = "finetune"
FINETUNE_EPOCHS = "finetune-epochs"
# Fine-tuning runs on its own mini-batch order: the round's seed plus this.
FINETUNE_SEED_OFFSET = 7


@register_client_update
class ProximalTraining(ClientUpdate):
    """Local training with the proximal term ``proximal-mu / 2 ||w - w_received||^2``."""

    name = PROXIMAL
    train_keys = (PROXIMAL_MU,)

    def train(self, job: ClientJob) -> tuple[float, dict]:  # noqa: D102
        return job.fit(proximal_mu=float(job.config.get(PROXIMAL_MU, 0.0))), {}


def finetune(job: ClientJob, *, epochs: int, steps: int = 0, lr: float | None = None,
             optimizer: str | None = None) -> nn.Module:
    """Train the received model on the local training data before it is tested; return it.

    ``epochs`` (or ``steps`` > 0) of the generic loop, on the round's seed plus
    :data:`FINETUNE_SEED_OFFSET`; ``lr`` and ``optimizer`` default to the job's.
    """
    job.fit(seed=job.seed + FINETUNE_SEED_OFFSET, epochs=epochs, steps=steps, lr=lr,
            optimizer=optimizer)
    return job.model


@register_client_update
class FineTuning(ClientUpdate):
    """Plain local training; at evaluation, ``finetune-epochs`` of fine-tuning first."""

    name = FINETUNE
    evaluate_keys = (FINETUNE_EPOCHS,)

    def evaluate(self, job: ClientJob) -> nn.Module:  # noqa: D102
        return finetune(job, epochs=int(job.config[FINETUNE_EPOCHS]))


class FedAvg(TrackedStrategy, flwr_strategy.FedAvg):
    """Flower's FedAvg with this project's checks and records; clients train plainly."""


class FedProx(TrackedStrategy, flwr_strategy.FedProx):
    """Flower's FedProx; its clients run ``proximal`` (the ``proximal-mu`` term)."""

    client_update = PROXIMAL


class FedMedian(TrackedStrategy, flwr_strategy.FedMedian):
    """Flower's FedMedian (coordinate-wise median); clients train plainly (``local``)."""


class FedTrimmedAvg(TrackedStrategy, flwr_strategy.FedTrimmedAvg):
    """Flower's FedTrimmedAvg (trimmed mean, ``beta`` cut at each end); clients train plainly."""


class Krum(TrackedStrategy, flwr_strategy.Krum):
    """Flower's Krum; clients train plainly (``local``)."""


class FineTuned:
    """Mixin: ask every client to fine-tune the global model before testing it.

    Client contract: evaluate messages name ``finetune`` and carry
    ``finetune-epochs``; the client trains the received model that many
    epochs on its own training data, then tests it.

    Parameters
    ----------
    finetune_epochs : int
        Local epochs of fine-tuning on the client's training data (>= 1).
    """

    evaluate_update = FINETUNE

    def __init__(self, *args, finetune_epochs: int = 1, **kwargs) -> None:
        if finetune_epochs < 1:
            raise ValueError(f"finetune_epochs = {finetune_epochs} is invalid; allowed: >= 1")
        self.finetune_epochs = finetune_epochs
        super().__init__(*args, **kwargs)

    def evaluate_keys(self) -> dict:  # noqa: D102
        return {FINETUNE_EPOCHS: self.finetune_epochs}


class FedAvgFT(FineTuned, FedAvg):
    """FedAvg-FT: FedAvg's global model, fine-tuned by each client before it is tested."""


class FedProxFT(FineTuned, FedProx):
    """FedProx-FT: FedProx's global model, fine-tuned by each client before it is tested."""


@register_strategy("fedavg")
def _fedavg(cfg: RunConfig, run: RunSetup) -> FedAvg:
    return FedAvg(**flower_kwargs(cfg, run))


@register_strategy("fedprox")
def _fedprox(cfg: RunConfig, run: RunSetup) -> FedProx:
    return FedProx(proximal_mu=cfg.fedprox_mu, **flower_kwargs(cfg, run))


@register_strategy("fedavg-ft")
def _fedavg_ft(cfg: RunConfig, run: RunSetup) -> FedAvgFT:
    return FedAvgFT(finetune_epochs=cfg.finetune_epochs, **flower_kwargs(cfg, run))


@register_strategy("fedprox-ft")
def _fedprox_ft(cfg: RunConfig, run: RunSetup) -> FedProxFT:
    return FedProxFT(finetune_epochs=cfg.finetune_epochs, proximal_mu=cfg.fedprox_mu,
                     **flower_kwargs(cfg, run))


@register_strategy("fedmedian")
def _fedmedian(cfg: RunConfig, run: RunSetup) -> FedMedian:
    return FedMedian(**flower_kwargs(cfg, run))


@register_strategy("fedtrimmedavg")
def _fedtrimmedavg(cfg: RunConfig, run: RunSetup) -> FedTrimmedAvg:
    return FedTrimmedAvg(beta=cfg.fedtrimmedavg_beta, **flower_kwargs(cfg, run))


@register_strategy("krum")
def _krum(cfg: RunConfig, run: RunSetup) -> Krum:
    return Krum(num_malicious_nodes=run.num_attackers, **flower_kwargs(cfg, run))
