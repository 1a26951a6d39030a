"""Flower's own strategies, used as they are, with this project's checks and records.

:class:`strategies.core.base.TrackedStrategy` sits in front of each (see its
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

from dataclasses import dataclass
from typing import ClassVar

from flwr.serverapp import strategy as flwr_strategy
from torch import nn

from .core.base import TrackedStrategy
from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.protocol import as_float, as_int
from .core.registry import RunSetup, flower_kwargs, register_strategy
from .core.settings import Settings, SettingsContext

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

    def train(self, job: ClientJob) -> tuple[float, dict]:
        return job.fit(proximal_mu=as_float(job.config.get(PROXIMAL_MU, 0.0), PROXIMAL_MU)), {}


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

    def evaluate(self, job: ClientJob) -> nn.Module:
        return finetune(job, epochs=as_int(job.config[FINETUNE_EPOCHS], FINETUNE_EPOCHS))


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

    evaluate_update: ClassVar[str | None] = FINETUNE

    def __init__(self, *args, finetune_epochs: int = 1, **kwargs) -> None:
        if finetune_epochs < 1:
            raise ValueError(f"finetune_epochs = {finetune_epochs} is invalid; allowed: >= 1")
        self.finetune_epochs = finetune_epochs
        super().__init__(*args, **kwargs)

    def evaluate_keys(self) -> dict:
        return {FINETUNE_EPOCHS: self.finetune_epochs}


class FedAvgFT(FineTuned, FedAvg):
    """FedAvg-FT: FedAvg's global model, fine-tuned by each client before it is tested."""


class FedProxFT(FineTuned, FedProx):
    """FedProx-FT: FedProx's global model, fine-tuned by each client before it is tested."""


@dataclass(frozen=True)
class ProximalSettings(Settings):
    """FedProx's key: ``fedprox-mu``, the proximal coefficient mu (>= 0)."""

    fedprox_mu: float = 0.01

    def check(self, run: SettingsContext) -> None:
        self.require("fedprox-mu", self.fedprox_mu >= 0, "a number >= 0")


@dataclass(frozen=True)
class FineTuneSettings(Settings):
    """FedAvg-FT's key: ``finetune-epochs``, local epochs of fine-tuning before testing (>= 1)."""

    finetune_epochs: int = 1

    def check(self, run: SettingsContext) -> None:
        self.require("finetune-epochs", self.finetune_epochs >= 1, "an integer >= 1")


@dataclass(frozen=True)
class ProximalFineTuneSettings(ProximalSettings, FineTuneSettings):
    """FedProx-FT's keys: FedProx's and FedAvg-FT's."""

    def check(self, run: SettingsContext) -> None:
        ProximalSettings.check(self, run)
        FineTuneSettings.check(self, run)


@dataclass(frozen=True)
class TrimmedMeanSettings(Settings):
    """FedTrimmedAvg's key: ``fedtrimmedavg-beta``, the share cut at each end, in [0, 0.5)."""

    fedtrimmedavg_beta: float = 0.2

    def check(self, run: SettingsContext) -> None:
        self.require("fedtrimmedavg-beta", 0 <= self.fedtrimmedavg_beta < 0.5,
                     "a number in [0, 0.5)")


@register_strategy("fedavg")
def _fedavg(settings: Settings, run: RunSetup) -> FedAvg:
    return FedAvg(**flower_kwargs(run))


@register_strategy("fedprox", settings=ProximalSettings)
def _fedprox(settings: ProximalSettings, run: RunSetup) -> FedProx:
    return FedProx(proximal_mu=settings.fedprox_mu, **flower_kwargs(run))


@register_strategy("fedavg-ft", settings=FineTuneSettings)
def _fedavg_ft(settings: FineTuneSettings, run: RunSetup) -> FedAvgFT:
    return FedAvgFT(finetune_epochs=settings.finetune_epochs, **flower_kwargs(run))


@register_strategy("fedprox-ft", settings=ProximalFineTuneSettings)
def _fedprox_ft(settings: ProximalFineTuneSettings, run: RunSetup) -> FedProxFT:
    return FedProxFT(finetune_epochs=settings.finetune_epochs, proximal_mu=settings.fedprox_mu,
                     **flower_kwargs(run))


@register_strategy("fedmedian")
def _fedmedian(settings: Settings, run: RunSetup) -> FedMedian:
    return FedMedian(**flower_kwargs(run))


@register_strategy("fedtrimmedavg", settings=TrimmedMeanSettings)
def _fedtrimmedavg(settings: TrimmedMeanSettings, run: RunSetup) -> FedTrimmedAvg:
    return FedTrimmedAvg(beta=settings.fedtrimmedavg_beta, **flower_kwargs(run))


@register_strategy("krum")
def _krum(settings: Settings, run: RunSetup) -> Krum:
    return Krum(num_malicious_nodes=run.num_attackers, **flower_kwargs(run))
