"""Damped FedAvg: clients send back only a share ``damped-keep`` of their update.

The worked example of docs/adding-a-method.md: a whole method in one module,
its settings, its client half and its server half. Clients train as usual and
reply ``w_sent + keep * (w_trained - w_sent)``; the server is Flower's FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from strategies.core.client import ClientJob, ClientUpdate, register_client_update
from strategies.core.registry import RunSetup, flower_kwargs, register_strategy
from strategies.core.settings import Settings, SettingsContext
from strategies.flower import FedAvg

KEEP = "damped-keep"  # the key of the method's train messages


@dataclass(frozen=True)
class DampedSettings(Settings):
    """The method's run-config key: ``damped-keep``, the share of the update a client sends."""

    damped_keep: float = 0.5

    def check(self, run: SettingsContext) -> None:
        """``damped-keep`` must be in [0, 1]."""
        self.require("damped-keep", 0 <= self.damped_keep <= 1, "a number in [0, 1]")


@register_client_update
class DampedClient(ClientUpdate):
    """Client half: train as usual, then keep only a share ``damped-keep`` of the update."""

    name = "damped"
    train_keys = (KEEP,)

    def train(self, job: ClientJob) -> tuple[float, dict[str, Any]]:
        """Train the received model; reply ``sent + keep * (trained - sent)``."""
        sent = {k: v.detach().clone() for k, v in job.model.state_dict().items()}
        loss = job.fit()  # on job.optim.device: the CPU or a GPU
        keep = float(job.config[KEEP])
        with torch.no_grad():
            for k, v in job.model.state_dict().items():
                if v.is_floating_point():
                    v.copy_(torch.lerp(sent[k].to(v.device), v, keep))
        return loss, {}


class DampedFedAvg(FedAvg):
    """Server half: Flower's FedAvg; train messages name ``damped`` and carry ``damped-keep``."""

    client_update = DampedClient.name

    def __init__(self, keep: float, **kwargs: Any) -> None:
        self.keep = keep
        super().__init__(**kwargs)

    def train_keys(self) -> dict[str, Any]:
        """The method's own entries of every train message."""
        return {KEEP: self.keep}


@register_strategy("damped-fedavg", settings=DampedSettings)
def _damped_fedavg(settings: DampedSettings, run: RunSetup) -> DampedFedAvg:
    return DampedFedAvg(settings.damped_keep, **flower_kwargs(run))
