"""pFedMe (Dinh et al., NeurIPS 2020): personalization with Moreau envelopes.

Both halves of the method are here.

Server (:class:`PFedMe`): ``w <- (1 - beta) w + beta * mean_i w_i``
(Alg. 1, line 11; the mean is Flower FedAvg's, weighted by sample counts).

Client (:class:`PFedMeClient`, ``client-update = "pfedme"``, keys
``pfedme-lambda``, ``pfedme-inner-steps``, ``pfedme-personal-lr``): runs
pFedMe's local update (:func:`train_pfedme`: on every mini-batch,
``pfedme-inner-steps`` steps towards ``theta = argmin f(theta) + lambda/2
||theta - w_i||^2``, then ``w_i <- w_i - lr * lambda * (w_i - theta)``) from
the received w and replies w_i; it keeps its personalized model theta in
``context.state`` (key ``pfedme-personal``) and is tested on it (a client
that never trained is tested on w).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from tasks.train import Fit, LocalRule, loss_for, park, run_batches

from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.registry import OWN_LOOP, RunSetup, flower_kwargs, register_strategy
from .core.settings import MOST_STEPS, TRAIN, Settings, integer_in, setting
from .flower import FedAvg

PFEDME = "pfedme"
STATE = "pfedme-personal"  # the client's theta_i in context.state


@dataclass(frozen=True)
class PFedMeSettings(Settings):
    """pFedMe's keys."""

    pfedme_lambda: float = setting(15.0, "lambda, the weight of the Moreau envelope's term",
                                   ok=lambda v: v > 0, allowed="a number > 0", sent=TRAIN)
    pfedme_inner_steps: int = setting(5, "K, the steps on the personalized problem per batch",
                                      **integer_in(1, MOST_STEPS), sent=TRAIN)
    pfedme_personal_lr: float = setting(0.01, "the step size of those K steps",
                                        ok=lambda v: v > 0, allowed="a number > 0", sent=TRAIN)
    pfedme_beta: float = setting(1.0, "the server's mixing parameter (1: plain averaging)",
                                 ok=lambda v: v > 0, allowed="a number > 0")


def train_pfedme(
    model: nn.Module,
    personal: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lam: float,
    inner_steps: int,
    personal_lr: float,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    steps: int = 0,
    device: torch.device | str = "cpu",
    seed: int = 0,
    stackable: bool = False,
) -> float:
    """pFedMe's local update (Alg. 1); both models trained in place.

    ``personal`` (theta) starts as a copy of ``model`` (the local w, received
    from the server). On every mini-batch D: ``inner_steps`` gradient steps of
    size ``personal_lr`` on ``f(theta; D) + lam/2 ||theta - w||^2`` (Eq. 7,
    solved approximately), then ``w <- w - learning_rate * lam * (w - theta)`` (line 8).
    Returns the mean loss of theta. Other parameters as in :func:`tasks.train.train`;
    there is no optimizer choice: both updates are the paper's own gradient
    steps (theta's with SGD, w's by line 8), whatever the run's optimizer.
    ``stackable``: an engine that trains a round's clients together may take the call
    (:class:`MoreauStep`: the same steps).
    """
    if stackable:
        rule = MoreauStep(personal, lam, inner_steps, personal_lr)
        parked = park(Fit(model, x, y, epochs=epochs, batch_size=batch_size,
                          learning_rate=learning_rate, optimizer="sgd", proximal_mu=0.0,
                          grad_correction=None, steps=steps, momentum=0.0, weight_decay=0.0,
                          clip_norm=0.0, device=device, seed=seed, rule=rule))
        if parked is not None:
            return parked
    loss_fn = loss_for(y)
    model.to(device).train()
    personal.to(device).train()
    w, theta = list(model.parameters()), list(personal.parameters())
    opt = torch.optim.SGD(theta, lr=personal_lr)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        for _ in range(inner_steps):
            opt.zero_grad()
            loss = loss_fn(personal(xb), yb)
            prox = sum(((t - c.detach()) ** 2).sum() for t, c in zip(theta, w))
            (loss + 0.5 * lam * prox).backward()
            opt.step()
        with torch.no_grad():
            for p, t in zip(w, theta):
                p.sub_(learning_rate * lam * (p - t))
        return loss.detach()

    return run_batches(x, y, step, epochs=epochs, batch_size=batch_size, steps=steps,
                       device=device, seed=seed)


class MoreauStep(LocalRule):
    """:func:`train_pfedme`'s steps for the stacked path (:mod:`tasks.stacked`): every
    client's theta (from its w) takes the K gradient steps of Eq. 7 on its batch, then its w
    line 8's step; theta is written into the client's ``personal`` model."""

    def __init__(self, personal: nn.Module, lam: float, inner_steps: int,
                 personal_lr: float) -> None:
        self.personal, self.lam = personal, lam
        self.inner_steps, self.personal_lr = inner_steps, personal_lr

    def alone(self, fit: Fit) -> float:
        return train_pfedme(fit.model, self.personal, fit.x, fit.y, lam=self.lam,
                            inner_steps=self.inner_steps, personal_lr=self.personal_lr,
                            epochs=fit.epochs, batch_size=fit.batch_size,
                            learning_rate=fit.learning_rate, steps=fit.steps,
                            device=fit.device, seed=fit.seed)

    def key(self) -> tuple:
        return (type(self), self.lam, self.inner_steps, self.personal_lr)

    def begin(self, chunk) -> dict:  # theta from each client's personal model, as the loop
        return {"theta": chunk.stack([f.rule.personal for f in chunk.fits])}

    def step(self, chunk, state: dict, s: int, k: int) -> torch.Tensor:
        w, theta = chunk.w(k), [t[:k] for t in state["theta"]]
        for _ in range(self.inner_steps):
            loss, grads = chunk.loss_and_grads(theta, s, k)
            with torch.no_grad():  # SGD on f(theta) + lam/2 ||theta - w||^2
                for t, g, c in zip(theta, grads, w):
                    t.add_(g.add_(t - c, alpha=self.lam), alpha=-self.personal_lr)
        with torch.no_grad():  # line 8
            for p, t in zip(w, theta):
                p.sub_(chunk.first.learning_rate * self.lam * (p - t))
        return loss

    def end(self, chunk, state: dict) -> list[torch.Tensor]:
        return state["theta"]

    def write(self, fit: Fit, extra: list[torch.Tensor]) -> None:
        self.personal.to(fit.device).train()
        with torch.no_grad():
            for p, t in zip(self.personal.parameters(), extra):
                p.copy_(t)


def pfedme_global(previous: ArrayRecord, averaged: ArrayRecord, beta: float) -> ArrayRecord:
    """``(1 - beta) * w + beta * mean_i w_i`` per array (Alg. 1, line 11)."""
    out = {}
    for key, arr in averaged.items():
        new, old = arr.numpy(), previous[key].numpy()
        mixed = ((1.0 - beta) * old + beta * new).astype(new.dtype) if new.dtype.kind == "f" else new
        out[key] = torch.from_numpy(np.require(mixed, requirements="C"))
    return ArrayRecord(out)


@register_client_update
class PFedMeClient(ClientUpdate[PFedMeSettings]):
    """pFedMe's client: trains w and its theta; is tested on theta."""

    name = PFEDME
    settings = PFedMeSettings

    def train(self, job: ClientJob[PFedMeSettings]) -> tuple[float, dict]:
        personal = copy.deepcopy(job.model)
        loop = {k: v for k, v in job.loop_kwargs().items() if k != "optimizer"}
        loss = train_pfedme(job.model, personal, job.data.x_train, job.targets,
                            lam=job.settings.pfedme_lambda,
                            inner_steps=job.settings.pfedme_inner_steps,
                            personal_lr=job.settings.pfedme_personal_lr, **loop,
                            stackable=True)
        job.state[STATE] = ArrayRecord(personal.to("cpu").state_dict())
        return loss, {}

    def evaluate(self, job: ClientJob[PFedMeSettings]) -> nn.Module:
        """The client's theta (the received w if it never trained)."""
        if STATE in job.state.array_records:
            job.model.load_state_dict(job.state.array_records[STATE].to_torch_state_dict())
        return job.model


class PFedMe(FedAvg):
    """pFedMe's server on top of Flower's FedAvg.

    Client contract: train messages name ``pfedme`` and carry lambda, K and
    the personal step size; clients reply their w_i and keep theta_i, on
    which they are tested (evaluate messages name ``pfedme`` too).

    Parameters
    ----------
    settings : PFedMeSettings
        The method's keys (lambda, K and the personal step size, sent to the
        clients; beta, the server's mixing parameter).
    **kwargs
        Flower FedAvg's arguments.
    """

    client_update = PFEDME

    def __init__(self, settings: PFedMeSettings, **kwargs) -> None:
        self.beta = settings.pfedme_beta
        self._previous: ArrayRecord | None = None
        super().__init__(settings=settings, **kwargs)

    def configure_train(self, server_round, arrays, config, grid):
        self._previous = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None and self._previous is not None and self.beta != 1.0:
            arrays = pfedme_global(self._previous, arrays, self.beta)
        return arrays, metrics


# its updates are the paper's own SGD steps, whatever the optimizer: not a key to tune
@register_strategy(PFEDME, settings=PFedMeSettings, tune={"optimizer": ()},
                   not_private={"dp-sgd": OWN_LOOP.format("the Moreau envelope's inner problem")})
def _pfedme(settings: PFedMeSettings, run: RunSetup) -> PFedMe:
    return PFedMe(settings, **flower_kwargs(run))
