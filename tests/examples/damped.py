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
from strategies.core.settings import TRAIN, Settings, setting
from strategies.flower import FedAvg


@dataclass(frozen=True)
class DampedSettings(Settings):
    """The method's run-config key, declared once: its default, its check, its doc, and the
    messages that carry it to the clients."""

    damped_keep: float = setting(0.5, "the share of its update a client sends back",
                                 ok=lambda v: 0 <= v <= 1, allowed="a number in [0, 1]",
                                 sent=TRAIN)


@register_client_update
class DampedClient(ClientUpdate[DampedSettings]):
    """Client half: train as usual, then keep only a share ``damped-keep`` of the update."""

    name = "damped"
    settings = DampedSettings  # the keys it reads: those DampedSettings sends

    def train(self, job: ClientJob[DampedSettings]) -> tuple[float, dict[str, Any]]:
        """Train the received model; reply ``sent + keep * (trained - sent)``."""
        sent = {k: v.detach().clone() for k, v in job.model.state_dict().items()}
        loss = job.fit()  # on job.optim.device: the CPU or a GPU
        keep = job.settings.damped_keep
        with torch.no_grad():
            for k, v in job.model.state_dict().items():
                if v.is_floating_point():
                    v.copy_(torch.lerp(sent[k].to(v.device), v, keep))
        return loss, {}


class DampedFedAvg(FedAvg):
    """Server half: Flower's FedAvg; train messages name ``damped`` and carry its settings'
    sent keys."""

    client_update = DampedClient.name


@register_strategy("damped-fedavg", settings=DampedSettings)
def _damped_fedavg(settings: DampedSettings, run: RunSetup) -> DampedFedAvg:
    return DampedFedAvg(settings=settings, **flower_kwargs(run))
