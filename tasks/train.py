"""Local training and evaluation loops, shared by every strategy.

What a round does is said by the strategy in the message config; these loops
take it as arguments. See ``fedamp_flwr/client_app.py`` for the keys.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """Return the optimizer ``name`` ("adam" or "sgd") over ``params``."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer '{name}'; allowed: adam, sgd")


def _batches(n: int, batch_size: int, generator: torch.Generator):
    order = torch.randperm(n, generator=generator)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    optimizer: str = "adam",
    proximal_mu: float = 0.0,
    steps: int = 0,
    loss_fn: LossFn | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> float:
    """Train ``model`` in place on (x, y) and return the mean training loss.

    Minimizes ``loss_fn(model(x), y) + proximal_mu / 2 * ||w - w0||^2`` where
    ``w0`` are the model's weights on entry (the proximal center: FedProx's
    global model, FedAMP's cloud model u_i with ``proximal_mu = lambda /
    alpha_k``). All trainable parameters enter the proximal term.

    Parameters
    ----------
    model : nn.Module
        The model, holding the starting weights.
    x, y : torch.Tensor
        Training inputs and targets (on the CPU; batches are moved to ``device``).
    epochs : int
        Passes over the data (used when ``steps`` is 0).
    batch_size : int
        Mini-batch size.
    lr : float
        Learning rate.
    optimizer : str
        "adam" or "sgd".
    proximal_mu : float
        Coefficient of the proximal term; 0 disables it.
    steps : int
        If > 0, train this many mini-batch steps instead of ``epochs`` epochs.
    loss_fn : callable, optional
        Loss on (predictions, targets); default :func:`loss_for` ``(y)``.
    device : torch.device or str
        Where to train.
    seed : int
        Seed of the mini-batch order.
    """
    loss_fn = loss_fn or loss_for(y)
    model.to(device).train()
    if len(x) == 0:
        return 0.0
    opt = make_optimizer(optimizer, model.parameters(), lr)
    center = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
    gen = torch.Generator().manual_seed(seed)
    total, count, done = 0.0, 0, 0
    epoch_budget = epochs if steps <= 0 else 10**9
    for _ in range(epoch_budget):
        for idx in _batches(len(x), batch_size, gen):
            xb, yb = x[idx].to(device), y[idx].to(device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            if center is not None:
                prox = sum(((p - c) ** 2).sum() for p, c in zip(model.parameters(), center))
                loss = loss + 0.5 * proximal_mu * prox
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
            done += 1
            if 0 < steps <= done:
                return total / max(count, 1)
    return total / max(count, 1)


def loss_for(y: torch.Tensor) -> LossFn:
    """Cross-entropy for integer class labels, mean squared error for float targets."""
    if torch.is_floating_point(y):
        return lambda out, target: nn.functional.mse_loss(out.reshape(target.shape), target)
    return nn.functional.cross_entropy


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 500,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Test ``model`` on (x, y).

    Classification (integer ``y``): ``{"loss": mean cross-entropy, "accuracy"}``;
    regression (float ``y``): ``{"loss": MSE, "mse": MSE}`` (mean over all outputs).
    """
    model.to(device).eval()
    regression = torch.is_floating_point(y)
    loss_sum, correct, count = 0.0, 0, 0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        out = model(xb)
        if regression:
            loss_sum += nn.functional.mse_loss(out.reshape(yb.shape), yb, reduction="sum").item()
            count += yb.numel()
        else:
            loss_sum += nn.functional.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
            count += len(yb)
    count = max(count, 1)
    if regression:
        return {"loss": loss_sum / count, "mse": loss_sum / count}
    return {"loss": loss_sum / count, "accuracy": correct / count}
