"""Flower's own strategies, used as they are, with this project's checks and records.

:class:`strategies.core.base.FlowerStrategy` holds each (see its
docstring). Two client halves live here, beside the strategies that use them:

* ``proximal`` (:class:`ProximalTraining`): FedProx's client contract, as
  Flower's ``FedProx`` states it: train the received model w^t on the local
  loss plus ``proximal-mu / 2 ||w - w^t||^2``. (FedAMP's clients pull toward
  their cloud models with the same term, through their own client half:
  :class:`strategies.fedamp.CloudTraining`.)
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

from .core.base import FlowerStrategy
from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.registry import RunSetup, flower_kwargs, register_strategy
from .core.settings import EVALUATE, MOST_EPOCHS, TRAIN, Settings, integer_in, setting

PROXIMAL = "proximal"
PROXIMAL_MU = "proximal-mu"  # the key Flower's FedProx sends
FINETUNE = "finetune"
# Fine-tuning runs on its own mini-batch order: the round's seed plus this.
FINETUNE_SEED_OFFSET = 7


@dataclass(frozen=True)
class ProximalSettings(Settings):
    """FedProx's key (sent as the ``proximal-mu`` of Flower's FedProx)."""

    fedprox_mu: float = setting(0.01, "the proximal coefficient mu", ok=lambda v: v >= 0,
                                allowed="a number >= 0", sent=TRAIN, message_key=PROXIMAL_MU)


@dataclass(frozen=True)
class FineTuneSettings(Settings):
    """FedAvg-FT's key."""

    finetune_epochs: int = setting(1, "local epochs of fine-tuning before a client tests",
                                   **integer_in(1, MOST_EPOCHS), sent=EVALUATE)


@dataclass(frozen=True)
class ProximalFineTuneSettings(ProximalSettings, FineTuneSettings):
    """FedProx-FT's keys: FedProx's and FedAvg-FT's."""


@dataclass(frozen=True)
class TrimmedMeanSettings(Settings):
    """FedTrimmedAvg's key."""

    fedtrimmedavg_beta: float = setting(0.2, "the share cut at each end",
                                        ok=lambda v: 0 <= v < 0.5, allowed="a number in [0, 0.5)")


@register_client_update
class ProximalTraining(ClientUpdate[ProximalSettings]):
    """Local training with the proximal term ``proximal-mu / 2 ||w - w_received||^2``."""

    name = PROXIMAL
    settings = ProximalSettings

    def train(self, job: ClientJob[ProximalSettings]) -> tuple[float, dict]:
        return job.fit(proximal_mu=job.settings.fedprox_mu), {}


def finetune(job: ClientJob, *, epochs: int, steps: int = 0, learning_rate: float | None = None,
             optimizer: str | None = None) -> nn.Module:
    """Train the received model on the local training data before it is tested; return it.

    ``epochs`` (or ``steps`` > 0) of the generic loop, on the round's seed plus
    :data:`FINETUNE_SEED_OFFSET`; ``learning_rate`` and ``optimizer`` default to the job's.
    """
    job.fit(seed=job.seed + FINETUNE_SEED_OFFSET, epochs=epochs, steps=steps,
            learning_rate=learning_rate, optimizer=optimizer)
    return job.model


@register_client_update
class FineTuning(ClientUpdate[FineTuneSettings]):
    """Plain local training; at evaluation, ``finetune-epochs`` of fine-tuning first."""

    name = FINETUNE
    settings = FineTuneSettings

    def evaluate(self, job: ClientJob[FineTuneSettings]) -> nn.Module:
        return finetune(job, epochs=job.settings.finetune_epochs)


class FedAvg(FlowerStrategy):
    """Flower's FedAvg with this project's checks and records; clients train plainly."""

    flower_class = flwr_strategy.FedAvg


class FedProx(FlowerStrategy):
    """Flower's FedProx; its clients run ``proximal`` (the ``proximal-mu`` term)."""

    flower_class = flwr_strategy.FedProx
    client_update = PROXIMAL


class FedMedian(FlowerStrategy):
    """Flower's FedMedian (coordinate-wise median); clients train plainly (``local``)."""

    flower_class = flwr_strategy.FedMedian


class FedTrimmedAvg(FlowerStrategy):
    """Flower's FedTrimmedAvg (trimmed mean, ``beta`` cut at each end); clients train plainly."""

    flower_class = flwr_strategy.FedTrimmedAvg


class Krum(FlowerStrategy):
    """Flower's Krum; clients train plainly (``local``)."""

    flower_class = flwr_strategy.Krum


class FineTuned:
    """Mixin: ask every client to fine-tune the global model before testing it.

    Client contract: evaluate messages name ``finetune`` and carry
    ``finetune-epochs`` (the strategy's ``settings``, a :class:`FineTuneSettings`);
    the client trains the received model that many epochs on its own training
    data, then tests it.
    """

    evaluate_update: ClassVar[str | None] = FINETUNE


class FedAvgFT(FineTuned, FedAvg):
    """FedAvg-FT: FedAvg's global model, fine-tuned by each client before it is tested."""


class FedProxFT(FineTuned, FedProx):
    """FedProx-FT: FedProx's global model, fine-tuned by each client before it is tested."""


@register_strategy("fedavg")
def _fedavg(settings: Settings, run: RunSetup) -> FedAvg:
    return FedAvg(**flower_kwargs(run))


@register_strategy("fedprox", settings=ProximalSettings)
def _fedprox(settings: ProximalSettings, run: RunSetup) -> FedProx:
    return FedProx(settings=settings, proximal_mu=settings.fedprox_mu, **flower_kwargs(run))


@register_strategy("fedavg-ft", settings=FineTuneSettings)
def _fedavg_ft(settings: FineTuneSettings, run: RunSetup) -> FedAvgFT:
    return FedAvgFT(settings=settings, **flower_kwargs(run))


@register_strategy("fedprox-ft", settings=ProximalFineTuneSettings)
def _fedprox_ft(settings: ProximalFineTuneSettings, run: RunSetup) -> FedProxFT:
    return FedProxFT(settings=settings, proximal_mu=settings.fedprox_mu, **flower_kwargs(run))


@register_strategy("fedmedian")
def _fedmedian(settings: Settings, run: RunSetup) -> FedMedian:
    return FedMedian(**flower_kwargs(run))


@register_strategy("fedtrimmedavg", settings=TrimmedMeanSettings)
def _fedtrimmedavg(settings: TrimmedMeanSettings, run: RunSetup) -> FedTrimmedAvg:
    return FedTrimmedAvg(beta=settings.fedtrimmedavg_beta, **flower_kwargs(run))


@register_strategy("krum")
def _krum(settings: Settings, run: RunSetup) -> Krum:
    return Krum(num_malicious_nodes=run.num_attackers, **flower_kwargs(run))
