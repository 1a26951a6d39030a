"""Local training and evaluation loops, shared by every strategy.

What a round does is said by the strategy in the message config; these loops
take it as arguments. See ``fedamp_flwr/client_app.py`` for the keys.
"""

from __future__ import annotations

import math
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


def num_steps(n: int, batch_size: int, epochs: int, steps: int = 0) -> int:
    """Mini-batch steps that :func:`train` takes on ``n`` samples (SCAFFOLD's K)."""
    if n == 0:
        return 0
    return steps if steps > 0 else epochs * math.ceil(n / batch_size)


def _run_batches(
    x: torch.Tensor, y: torch.Tensor, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *, epochs: int, batch_size: int, steps: int, device: torch.device | str, seed: int,
) -> float:
    """Call ``step(xb, yb)`` (returns the batch loss) on shuffled mini-batches; mean loss.

    ``steps`` > 0: that many steps (the order reshuffled each pass), else
    ``epochs`` passes over the data.
    """
    gen = torch.Generator().manual_seed(seed)
    total, count, done = 0.0, 0, 0
    target = num_steps(len(x), batch_size, epochs, steps)
    while done < target:
        for idx in _batches(len(x), batch_size, gen):
            loss = step(x[idx].to(device), y[idx].to(device))
            total += loss.item() * len(idx)
            count += len(idx)
            done += 1
            if done >= target:
                break
    return total / max(count, 1)


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
    grad_correction: list[torch.Tensor] | None = None,
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
    grad_correction : list of torch.Tensor, optional
        Added to each parameter's gradient before every step, one tensor per
        parameter in ``model.parameters()`` order (SCAFFOLD's ``c - c_i``,
        Karimireddy et al. 2020, Alg. 1 line 10).
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
    params = list(model.parameters())
    opt = make_optimizer(optimizer, params, lr)
    center = [p.detach().clone() for p in params] if proximal_mu > 0 else None
    correction = [c.to(device) for c in grad_correction] if grad_correction is not None else None

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        if center is not None:
            prox = sum(((p - c) ** 2).sum() for p, c in zip(params, center))
            loss = loss + 0.5 * proximal_mu * prox
        loss.backward()
        if correction is not None:
            for p, c in zip(params, correction):
                p.grad.add_(c)
        opt.step()
        return loss.detach()

    return _run_batches(x, y, step, epochs=epochs, batch_size=batch_size, steps=steps,
                        device=device, seed=seed)


def mean_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int,
    loss_fn: LossFn | None = None, device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Gradient of the mean loss over all of (x, y) at the model's weights, one tensor per
    parameter (SCAFFOLD's option I control variate, Karimireddy et al. 2020, Eq. 4 (i))."""
    loss_fn = loss_fn or loss_for(y)
    model.to(device).train()
    params = list(model.parameters())
    grads = [torch.zeros_like(p) for p in params]
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        loss = loss_fn(model(xb), yb) * (len(xb) / max(len(x), 1))
        for g, d in zip(grads, torch.autograd.grad(loss, params)):
            g.add_(d)
    return [g.detach() for g in grads]


def mix_parameters(local: nn.Module, shared: nn.Module, alpha: float) -> dict[str, torch.Tensor]:
    """APFL's personalized parameters ``alpha * v + (1 - alpha) * w`` (Deng et al. 2020, Eq. 3).

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
    lr: float,
    optimizer: str = "adam",
    steps: int = 0,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> float:
    """APFL's local update (Deng et al. 2020, Alg. 1); both models trained in place.

    On every mini-batch, both gradients taken at the same (w, v), the shared
    model takes a step on its own loss, ``w <- w - lr * grad f(w)``, and the
    local model a step on the loss of the mixture,
    ``v <- v - lr * grad_v f(alpha v + (1 - alpha) w)``. Returns the
    mean loss of the mixture. The parameters are as in :func:`train`;
    ``alpha`` is the mixture weight (fixed, the paper's non-adaptive variant).
    """
    loss_fn = loss_for(y)
    shared.to(device).train()
    local.to(device).train()
    opt_w = make_optimizer(optimizer, shared.parameters(), lr)
    opt_v = make_optimizer(optimizer, local.parameters(), lr)

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

    return _run_batches(x, y, step, epochs=epochs, batch_size=batch_size, steps=steps,
                        device=device, seed=seed)


def train_per_fedavg(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    alpha: float,
    epochs: int,
    batch_size: int,
    lr: float,
    optimizer: str = "adam",
    steps: int = 0,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> float:
    """Per-FedAvg's local update, first-order version (Fallah et al. 2020, Alg. 1, FO).

    Each step uses two mini-batches D, D' (consecutive batches of the
    shuffled data): ``w~ = w - alpha grad f(w; D)``, then the outer step
    ``w <- w - lr * grad f(w~; D')`` (the Hessian term of the MAML gradient
    dropped, as in Per-FedAvg (FO)); with ``optimizer`` = "adam" the outer
    step is Adam's. Returns the mean loss at w~. Parameters as in :func:`train`.
    """
    loss_fn = loss_for(y)
    model.to(device).train()
    params = list(model.parameters())
    opt = make_optimizer(optimizer, params, lr)
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

    return _run_batches(x, y, step, epochs=epochs, batch_size=batch_size,
                        steps=2 * steps if steps > 0 else 0, device=device, seed=seed)


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
    lr: float,
    steps: int = 0,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> float:
    """pFedMe's local update (Dinh et al. 2020, Alg. 1); both models trained in place.

    ``personal`` (theta) starts as a copy of ``model`` (the local w, received
    from the server). On every mini-batch D: ``inner_steps`` gradient steps of
    size ``personal_lr`` on ``f(theta; D) + lam/2 ||theta - w||^2`` (Eq. 7,
    solved approximately), then ``w <- w - lr * lam * (w - theta)`` (line 8).
    Returns the mean loss of theta. Other parameters as in :func:`train`.
    """
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
                p.sub_(lr * lam * (p - t))
        return loss.detach()

    return _run_batches(x, y, step, epochs=epochs, batch_size=batch_size, steps=steps,
                        device=device, seed=seed)


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
