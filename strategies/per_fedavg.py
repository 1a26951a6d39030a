"""Per-FedAvg (Fallah et al., NeurIPS 2020), first-order version.

Both halves of the method are here.

Server (:class:`PerFedAvg`): averages the models as Flower's FedAvg does.

Client (:class:`PerFedAvgClient`, ``client-update = "per-fedavg"``, key
``per-fedavg-alpha``): trains the shared model with the MAML-style
meta-update of :func:`train_per_fedavg` (inner step size alpha). It is
tested on the global model after one step of plain gradient descent at alpha
on one mini-batch of its own training data: the personalization that the
meta-objective ``f(w - alpha grad f(w))`` optimizes for.

Choices: the first-order version (Per-FedAvg (FO)); the Hessian-free version
(HF) is not implemented. D and D' are consecutive mini-batches of one
shuffled pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tasks.train import Fit, LocalRule, loss_for, make_optimizer, park, run_batches

from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.registry import OWN_LOOP, RunSetup, flower_kwargs, register_strategy
from .core.settings import EVALUATE, TRAIN, Settings, setting
from .flower import FedAvg, finetune

PER_FEDAVG = "per-fedavg"


@dataclass(frozen=True)
class PerFedAvgSettings(Settings):
    """Per-FedAvg's key."""

    per_fedavg_alpha: float = setting(0.01, "the inner (personalization) step size",
                                      ok=lambda v: v > 0, allowed="a number > 0",
                                      sent=(TRAIN, EVALUATE))


def train_per_fedavg(
    model: nn.Module,
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
    stackable: bool = False,
) -> float:
    """Per-FedAvg's local update, first-order version (Alg. 1, FO).

    Each step uses two mini-batches D, D' (consecutive batches of the
    shuffled data): ``w~ = w - alpha grad f(w; D)``, then the outer step
    ``w <- w - learning_rate * grad f(w~; D')`` (the Hessian term of the MAML gradient
    dropped, as in Per-FedAvg (FO)); with ``optimizer`` = "adam" the outer
    step is Adam's. Returns the mean loss over the batches: at w on each D, at w~ on each D'.
    Parameters as in :func:`tasks.train.train`; ``stackable``: an engine that trains a
    round's clients together may take the call (:class:`MetaStep`: the same steps).
    """
    if stackable:
        parked = park(Fit(model, x, y, epochs=epochs, batch_size=batch_size,
                          learning_rate=learning_rate, optimizer=optimizer, proximal_mu=0.0,
                          grad_correction=None, steps=2 * steps, momentum=0.0,
                          weight_decay=0.0, clip_norm=0.0, device=device, seed=seed,
                          rule=MetaStep(alpha)))
        if parked is not None:
            return parked
    loss_fn = loss_for(y)
    model.to(device).train()
    params = list(model.parameters())
    opt = make_optimizer(optimizer, params, learning_rate)
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if not pending:  # first batch of the pair: D
            pending.append((xb, yb))
            return loss_fn(model(xb), yb).detach()
        xd, yd = pending.pop()
        inner = torch.autograd.grad(loss_fn(model(xd), yd), params)
        adapted = {k: p - alpha * g for (k, p), g in zip(model.named_parameters(), inner)}
        loss = loss_fn(torch.func.functional_call(model, adapted, (xb,)), yb)
        opt.zero_grad()
        for p, g in zip(params, torch.autograd.grad(loss, list(adapted.values()))):
            p.grad = g.detach()  # first-order: grad at w~ applied to w
        opt.step()
        return loss.detach()

    return run_batches(x, y, step, epochs=epochs, batch_size=batch_size,
                       steps=2 * steps if steps > 0 else 0, device=device, seed=seed)


class MetaStep(LocalRule):
    """:func:`train_per_fedavg`'s steps for the stacked path (:mod:`tasks.stacked`): on each
    D, every client's loss and gradient at its w; on the D' after it, the gradient at its
    w~ = w - alpha g, the outer optimizer step (its count: the pair's) on w. A client's
    ``steps`` count its batches, two a step."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def alone(self, fit: Fit) -> float:
        if fit.steps % 2:
            raise ValueError(f"Per-FedAvg's steps are pairs of batches: {fit.steps} batches")
        return train_per_fedavg(fit.model, fit.x, fit.y, alpha=self.alpha, epochs=fit.epochs,
                                batch_size=fit.batch_size, learning_rate=fit.learning_rate,
                                optimizer=fit.optimizer, steps=fit.steps // 2,
                                device=fit.device, seed=fit.seed)

    def key(self) -> tuple:
        return (type(self), self.alpha)

    def step(self, chunk, state: dict, s: int, k: int) -> torch.Tensor:
        if s % 2 == 0:  # D: the inner gradient, kept for D'
            loss, state["inner"] = chunk.loss_and_grads(chunk.w(k), s, k)
            return loss
        with torch.no_grad():
            adapted = [w - self.alpha * g[:k] for w, g in zip(chunk.w(k), state["inner"])]
        loss, grads = chunk.loss_and_grads(adapted, s, k)
        chunk.optimizer_step(grads, s // 2, k)  # first-order: the gradient at w~ applied to w
        return loss


@register_client_update
class PerFedAvgClient(ClientUpdate[PerFedAvgSettings]):
    """Per-FedAvg's client: the first-order meta-update; one SGD step at alpha before testing."""

    name = PER_FEDAVG
    settings = PerFedAvgSettings

    def train(self, job: ClientJob[PerFedAvgSettings]) -> tuple[float, dict]:
        return train_per_fedavg(job.model, job.data.x_train, job.targets,
                                alpha=job.settings.per_fedavg_alpha, **job.loop_kwargs(),
                                stackable=True), {}

    def evaluate(self, job: ClientJob[PerFedAvgSettings]) -> nn.Module:
        return finetune(job, epochs=0, steps=1, learning_rate=job.settings.per_fedavg_alpha,
                        optimizer="sgd")


class PerFedAvg(FedAvg):
    """Per-FedAvg (FO)'s server: Flower's FedAvg (its arguments, and ``settings``: the method's
    keys); messages name ``per-fedavg`` and carry its alpha."""

    client_update = PER_FEDAVG


@register_strategy(PER_FEDAVG, settings=PerFedAvgSettings,
                   not_private={"dp-sgd": OWN_LOOP.format("MAML's inner and outer steps")})
def _per_fedavg(settings: PerFedAvgSettings, run: RunSetup) -> PerFedAvg:
    return PerFedAvg(settings=settings, **flower_kwargs(run))
