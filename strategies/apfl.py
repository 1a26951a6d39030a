"""APFL: adaptive personalized federated learning (Deng et al. 2020), fixed mixture weight.

Both halves of the method are here.

Server (:class:`APFL`): averages the shared models w as Flower's FedAvg does.

Client (:class:`APFLClient`, ``client-update = "apfl"``, key ``apfl-alpha``):
every client keeps a local model v_i in its ``context.state`` (key
``apfl-local``; a copy of w at first). In a round it runs APFL's local update
(:func:`train_apfl`: on every mini-batch a step of w on its own loss and a
step of v_i on the loss of the mixture ``alpha v_i + (1 - alpha) w``) and
replies w. It is tested on its personalized model ``alpha v_i + (1 - alpha) w``
(Eq. 3). ``alpha`` is fixed (the run config's ``apfl-alpha``); the paper's
adaptive update of alpha is not implemented.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord
from torch import nn

from tasks.train import loss_for, make_optimizer, run_batches

from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.registry import OWN_LOOP, RunSetup, flower_kwargs, register_strategy
from .core.settings import EVALUATE, TRAIN, Settings, setting
from .flower import FedAvg

APFL_NAME = "apfl"
STATE = "apfl-local"  # the client's local model v_i in context.state


@dataclass(frozen=True)
class APFLSettings(Settings):
    """APFL's key."""

    apfl_alpha: float = setting(0.5, "the mixture weight of the local model",
                                ok=lambda v: 0 < v <= 1, allowed="a number in (0, 1]",
                                sent=(TRAIN, EVALUATE))


def mix_parameters(local: nn.Module, shared: nn.Module, alpha: float) -> dict[str, torch.Tensor]:
    """APFL's personalized parameters ``alpha * v + (1 - alpha) * w`` (Eq. 3).

    ``local`` holds v, ``shared`` holds w; the result keeps v's autograd graph
    (w is detached), for :func:`torch.func.functional_call` on ``local``.
    """
    w = dict(shared.named_parameters())
    return {k: alpha * v + (1.0 - alpha) * w[k].detach() for k, v in local.named_parameters()}


def train_apfl(
    shared: nn.Module,
    local: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    alpha: float,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    optimizer: str = "adam",
    steps: int = 0,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> float:
    """APFL's local update (Alg. 1); both models trained in place.

    On every mini-batch, both gradients taken at the same (w, v), the shared
    model takes a step on its own loss, ``w <- w - learning_rate * grad f(w)``, and the
    local model a step on the loss of the mixture,
    ``v <- v - learning_rate * grad_v f(alpha v + (1 - alpha) w)``. Returns the
    mean loss of the mixture. The parameters are as in :func:`tasks.train.train`;
    ``alpha`` is the mixture weight (fixed, the paper's non-adaptive variant).
    """
    loss_fn = loss_for(y)
    shared.to(device).train()
    local.to(device).train()
    opt_w = make_optimizer(optimizer, shared.parameters(), learning_rate)
    opt_v = make_optimizer(optimizer, local.parameters(), learning_rate)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        opt_w.zero_grad()
        opt_v.zero_grad()
        loss_fn(shared(xb), yb).backward()
        mixed = torch.func.functional_call(local, mix_parameters(local, shared, alpha), (xb,))
        loss = loss_fn(mixed, yb)
        loss.backward()  # reaches v only: w is detached in the mixture
        opt_w.step()
        opt_v.step()
        return loss.detach()

    return run_batches(x, y, step, epochs=epochs, batch_size=batch_size, steps=steps,
                       device=device, seed=seed)


def _local_model(job: ClientJob) -> nn.Module:
    """The client's local model v from its state (first time: a copy of the received w)."""
    local = copy.deepcopy(job.model)
    saved = job.saved_state(STATE)
    if saved is not None:
        local.load_state_dict(saved.to_torch_state_dict())
    return local


@register_client_update
class APFLClient(ClientUpdate[APFLSettings]):
    """APFL's client: trains w and its own v; is tested on their mixture."""

    name = APFL_NAME
    settings = APFLSettings

    def train(self, job: ClientJob[APFLSettings]) -> tuple[float, dict]:
        local = _local_model(job)
        loss = train_apfl(job.model, local, job.data.x_train, job.targets,
                          alpha=job.settings.apfl_alpha, **job.loop_kwargs())
        job.state[STATE] = ArrayRecord(local.to("cpu").state_dict())
        return loss, {}

    def evaluate(self, job: ClientJob[APFLSettings]) -> nn.Module:
        """The personalized model ``alpha v + (1 - alpha) w``."""
        model, local = job.model, _local_model(job)
        with torch.no_grad():
            mixed = mix_parameters(local, model, job.settings.apfl_alpha)
            for name, p in model.named_parameters():
                p.copy_(mixed[name])
        return model


class APFL(FedAvg):
    """APFL's server: Flower's FedAvg (its arguments, and ``settings``: the method's keys);
    the messages name ``apfl`` and carry ``apfl-alpha``."""

    client_update = APFL_NAME


@register_strategy(APFL_NAME, settings=APFLSettings,
                   not_private={"dp-sgd": OWN_LOOP.format("two models, two optimizers")})
def _apfl(settings: APFLSettings, run: RunSetup) -> APFL:
    return APFL(settings=settings, **flower_kwargs(run))
