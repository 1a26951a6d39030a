"""The generic local training and evaluation loops, shared by every method.

:func:`train` runs epochs or steps of an optimizer on shuffled mini-batches,
with an optional proximal term and gradient correction; :func:`run_batches`
is its mini-batch schedule, on which a method's own loop (APFL's, pFedMe's,
Per-FedAvg's, in their modules under ``strategies/``) builds; :func:`evaluate`
tests a model.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from .dp import DPSGD, clipped_gradient_sum

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def skip_dynamo_import() -> int:
    """Let torch's optimizers start and step without importing ``torch._dynamo``; return how
    many of their methods this changed (0 where it is done already).

    torch readies its optimizers for ``torch.compile``: methods marked "not for compile"
    (``torch._compile._disable_dynamo``) import ``torch._dynamo`` at their first call, and
    every ``step`` (``_use_grad_for_differentiable``) imports it to place two graph breaks,
    which do nothing outside compiled code. That import takes 1.5 to 3 s of CPU in every
    process: on a SuperNode, where Flower starts a ClientApp process per message, every
    train message paid it (docs/performance.md). This app never compiles a model, so:

    * a marked method keeps itself as what the mark would have kept
      (``torch._dynamo.disable(fn)`` is ``fn`` outside compiled code);
    * ``step`` sets grad mode as torch's wrapper does, and calls the optimizer's own step,
      without the graph breaks.

    The arithmetic is torch's own (tests/test_behaviour_unchanged.py: every method's numbers
    as recorded). A torch whose wrappers are not the ones recognised here, or a process that
    has imported ``torch._dynamo`` already (it may compile), is left as it is."""
    import sys

    from torch import _compile
    from torch.optim import optimizer as optimizer_module

    if "torch._dynamo" in sys.modules:
        return 0
    marked_wrapper = _compile._disable_dynamo(lambda: None).__code__  # the mark's own code
    grad_wrapper = optimizer_module._use_grad_for_differentiable(lambda self: None).__code__
    changed, classes = 0, [torch.optim.Optimizer]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        for name, attr in list(vars(cls).items()):
            fn = getattr(attr, "__wrapped__", None)
            code = getattr(attr, "__code__", None)
            if fn is None:
                continue
            if code is marked_wrapper and getattr(fn, "__dynamo_disable", None) is None:
                setattr(fn, "__dynamo_disable", fn)
                changed += 1
            elif code is grad_wrapper and name == "step":
                setattr(cls, name, _grad_mode_step(fn))
                changed += 1
    return changed


def _grad_mode_step(step: Callable) -> Callable:
    """torch's ``_use_grad_for_differentiable`` around an optimizer's ``step``, without
    its graph breaks (:func:`skip_dynamo_import`)."""
    @functools.wraps(step)
    def grad_mode_step(self, *args, **kwargs):
        previous = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(previous)
    return grad_mode_step


skip_dynamo_import()


def make_optimizer(name: str, params, learning_rate: float, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Return the optimizer ``name`` ("adam" or "sgd") over ``params`` (``momentum``: SGD's)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=learning_rate, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, momentum=momentum,
                               weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer '{name}'; allowed: adam, sgd")


def _batches(n: int, batch_size: int, generator: torch.Generator,
             device: torch.device | str = "cpu"):
    """Mini-batch indices of one pass over n samples (drawn on the CPU, as always, and moved
    to ``device`` once per pass)."""
    order = torch.randperm(n, generator=generator).to(device)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def num_steps(n: int, batch_size: int, epochs: int, steps: int = 0) -> int:
    """Mini-batch steps that :func:`train` takes on ``n`` samples (SCAFFOLD's K)."""
    if n == 0:
        return 0
    return steps if steps > 0 else epochs * math.ceil(n / batch_size)


def run_batches(
    x: torch.Tensor, y: torch.Tensor, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *, epochs: int, batch_size: int, steps: int, device: torch.device | str, seed: int,
) -> float:
    """Call ``step(xb, yb)`` (returns the batch loss) on shuffled mini-batches; mean loss.

    ``steps`` > 0: that many steps (the order reshuffled each pass), else
    ``epochs`` passes over the data. The data go to ``device`` once (not per
    mini-batch), the losses are summed there (in float64) and read back once,
    at the end: no step waits for the device.
    """
    gen = torch.Generator().manual_seed(seed)
    x, y = x.to(device), y.to(device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    count, done = 0, 0
    target = num_steps(len(x), batch_size, epochs, steps)
    while done < target:
        for idx in _batches(len(x), batch_size, gen, device):
            loss = step(x[idx], y[idx])
            total += loss.detach().double() * len(idx)
            count += len(idx)
            done += 1
            if done >= target:
                break
    return float(total) / max(count, 1)


def _adjust_gradients(params: list[nn.Parameter], center: list[torch.Tensor] | None,
                      proximal_mu: float, correction: list[torch.Tensor] | None,
                      clip_norm: float) -> None:
    """Add the proximal gradient mu (w - center) (the gradient of 0.5 mu ||w - center||^2,
    without its graph) and the ``correction`` to the gradients; clip their norm."""
    if center is not None:
        with torch.no_grad():
            grads = [(i, p.grad) for i, p in enumerate(params) if p.grad is not None]
            used = [i for i, _ in grads]
            torch._foreach_add_([g for _, g in grads],
                                torch._foreach_sub([params[i] for i in used],
                                                   [center[i] for i in used]),
                                alpha=proximal_mu)
    if correction is not None:
        pairs = [(p.grad, c) for p, c in zip(params, correction) if p.grad is not None]
        if pairs:
            torch._foreach_add_([g for g, _ in pairs], [c for _, c in pairs])
    if clip_norm > 0:
        nn.utils.clip_grad_norm_(params, clip_norm)


class LocalRule:
    """A method's own local update, which an engine that trains a round's clients together
    (:mod:`tasks.stacked`) can run stacked: :meth:`alone` is the method's one-by-one loop,
    :meth:`step` the same step of every client of a chunk at once. Subclassed beside the
    method's loop (``strategies/per_fedavg.py``, ``strategies/pfedme.py``); one instance per
    client's call (a :class:`Fit` whose ``steps`` count its mini-batches).

    Contract: the first client's rule steps the whole chunk (:meth:`begin`, :meth:`step`,
    :meth:`end` read only settings that :meth:`key` holds, so that they are every client's;
    a client's own objects, a personal model, are read from ``chunk.fits[j].rule`` and written
    by :meth:`write`, each client's own rule). A rule's fits carry no proximal term,
    correction, clipping, momentum or weight decay (the stacked path refuses them: the group
    runs one by one)."""

    def alone(self, fit: Fit) -> float:
        """The method's own loop on ``fit`` (one by one); its mean training loss."""
        raise NotImplementedError

    def key(self) -> tuple:
        """The rule's settings, which clients trained together share."""
        return (type(self),)

    def begin(self, chunk: Any) -> dict:
        """The rule's own state for a chunk of clients (a ``tasks.stacked.Chunk``)."""
        return {}

    def step(self, chunk: Any, state: dict, s: int, k: int) -> torch.Tensor:
        """Mini-batch ``s`` of the chunk's first ``k`` clients (those that still have one):
        their weights (``chunk.weights``, updated in place); each one's batch loss."""
        raise NotImplementedError

    def end(self, chunk: Any, state: dict) -> list[torch.Tensor]:
        """Stacked tensors the rule writes back besides the weights (:meth:`write`)."""
        return []

    def write(self, fit: Fit, extra: list[torch.Tensor]) -> None:
        """Write one client's share of :meth:`end`'s tensors (once every chunk is done)."""


@dataclass
class Fit:
    """One client's call of :func:`train` (its arguments), as an engine that trains a round's
    clients together (:mod:`tasks.stacked`) receives it."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    epochs: int
    batch_size: int
    learning_rate: float
    optimizer: str
    proximal_mu: float
    grad_correction: list[torch.Tensor] | None
    steps: int
    momentum: float
    weight_decay: float
    clip_norm: float
    device: torch.device | str
    seed: int
    #: a method's own local update in place of :func:`train`'s step (Per-FedAvg's, pFedMe's),
    #: or None
    rule: LocalRule | None = None

    def alone(self) -> float:
        """This call as one by one: :func:`train`, or the method's own loop."""
        if self.rule is not None:
            return self.rule.alone(self)
        return train(self.model, self.x, self.y, epochs=self.epochs, batch_size=self.batch_size,
                     learning_rate=self.learning_rate, optimizer=self.optimizer,
                     proximal_mu=self.proximal_mu, grad_correction=self.grad_correction,
                     steps=self.steps,
                     momentum=self.momentum, weight_decay=self.weight_decay,
                     clip_norm=self.clip_norm, device=self.device, seed=self.seed)


#: a thread of an engine that trains clients together: ``park`` (a :class:`Fit` -> its loss,
#: trained with the others) and ``stacks`` (a :class:`Fit` and a reason it cannot be, or None
#: -> whether it is; the engine says a reason once), set by the engine
STACKING = threading.local()


def stacking_worker() -> bool:
    """Whether this thread is one of an engine's client threads that train together."""
    return getattr(STACKING, "park", None) is not None


def park(fit: Fit, problem: str | None = None) -> float | None:
    """``fit``'s loss, trained by the engine with the round's other clients where this thread
    is one of its client threads (:func:`stacking_worker`) and the engine can stack it
    (``problem``: a reason it cannot, said once); else None: the caller trains it here."""
    if stacking_worker() and STACKING.stacks(fit, problem):
        return STACKING.park(fit)
    return None


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
          learning_rate: float, optimizer: str = "adam", proximal_mu: float = 0.0,
          grad_correction: list[torch.Tensor] | None = None, steps: int = 0,
          momentum: float = 0.0, weight_decay: float = 0.0, clip_norm: float = 0.0,
          loss_fn: LossFn | None = None, device: torch.device | str = "cpu", seed: int = 0,
          dp_sgd: DPSGD | None = None, stackable: bool = False) -> float:
    """Train ``model`` in place on (x, y) (on the CPU; batches go to ``device``) and return
    the mean training loss.

    Minimizes ``loss_fn(model(x), y) + proximal_mu / 2 * ||w - w0||^2`` (``loss_fn``: default
    :func:`loss_for` ``(y)``), ``w0`` the weights on entry (FedProx's global model, FedAMP's
    cloud model u_i with ``proximal_mu = lambda / alpha_k``), over all trainable parameters.
    The proximal gradient mu (w - w0) is added to each step's gradient directly (no autograd
    graph), and the returned loss is the data loss alone.

    ``epochs`` passes of mini-batches of ``batch_size`` (or ``steps`` > 0 steps) of
    ``optimizer`` ("adam" or "sgd", with ``momentum`` for SGD and ``weight_decay``) at
    ``learning_rate``, in an order seeded by ``seed``. ``grad_correction``: added to each parameter's
    gradient before every step, in ``model.parameters()`` order (SCAFFOLD's ``c - c_i``,
    Karimireddy et al. 2020, Alg. 1 line 10). ``clip_norm`` > 0: the gradients' total norm
    clipped to it before every step. ``dp_sgd``: per-example DP-SGD
    (:class:`tasks.dp.DPSGD`): as many steps, each on a Poisson sample drawn from the
    operating system's randomness (not ``seed``), with clipped per-example gradients and
    Gaussian noise; no ``grad_correction`` then, and its clipping replaces ``clip_norm``
    (the proximal gradient, which reads no data, is added after the noise).

    ``stackable``: the caller (a method's generic training, ``ClientJob.fit``) lets an engine
    that trains a round's clients as one stacked model (run config ``client-batching``,
    :mod:`tasks.stacked`) take this call, where it can: the same steps on the same batches,
    the model trained in place, the same loss returned.
    """
    if stackable:
        fit = Fit(model, x, y, epochs, batch_size, learning_rate, optimizer, proximal_mu,
                  grad_correction, steps, momentum, weight_decay, clip_norm, device, seed)
        parked = park(fit, "DP-SGD's per-example clipping" if dp_sgd is not None else
                      "a method's own loss" if loss_fn is not None else None)
        if parked is not None:
            return parked
    loss_fn = loss_fn or loss_for(y)
    model.to(device).train()
    params = list(model.parameters())
    opt = make_optimizer(optimizer, params, learning_rate, momentum, weight_decay)
    center = [p.detach().clone() for p in params] if proximal_mu > 0 else None
    correction = [c.to(device) for c in grad_correction] if grad_correction is not None else None
    if dp_sgd is not None:  # its per-example clipping replaces clip_norm
        if correction is not None:
            raise ValueError("dp_sgd takes no grad_correction (SCAFFOLD is refused with dp)")
        return _train_dp_sgd(model, x.to(device), y.to(device), loss_fn, opt, center,
                             proximal_mu, dp_sgd, num_steps(len(x), batch_size, epochs, steps))

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        _adjust_gradients(params, center, proximal_mu, correction, clip_norm)
        opt.step()
        return loss.detach()

    return run_batches(x, y, step, epochs=epochs, batch_size=batch_size, steps=steps,
                        device=device, seed=seed)


def _train_dp_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                  opt: torch.optim.Optimizer, center: list[torch.Tensor] | None,
                  proximal_mu: float, dp: DPSGD, steps: int) -> float:
    """``steps`` DP-SGD steps (:class:`tasks.dp.DPSGD`); the mean loss of the sampled
    examples."""
    trainable = [p.requires_grad for p in model.parameters()]
    params = [p for p, t in zip(model.parameters(), trainable) if t]  # clipped_gradient_sum's
    if center is not None:  # the proximal centre of the same parameters
        center = [c for c, t in zip(center, trainable) if t]
    sizes = [p.numel() for p in params]
    expected = dp.sample_rate * len(x)
    total, count = 0.0, 0
    for _ in range(steps):
        picked = torch.rand(len(x), generator=dp.generator, device=dp.generator.device)
        idx = (picked < dp.sample_rate).nonzero().squeeze(1).to(x.device)
        if len(idx):
            summed, loss = clipped_gradient_sum(model, loss_fn, x[idx], y[idx], dp.clip)
            total += float(loss) * len(idx)
            count += len(idx)
        else:  # an empty sample is still a step of noise (the accountant counts it)
            summed = [torch.zeros_like(p) for p in params]
        noise = torch.randn(sum(sizes), generator=dp.generator, device=dp.generator.device)
        noise = noise.to(x.device) * (dp.noise_multiplier * dp.clip)
        with torch.no_grad():
            grads: list[torch.Tensor] = [(g + z.reshape(g.shape)) / expected
                                         for g, z in zip(summed, torch.split(noise, sizes))]
            if center is not None:  # reads no data: after the noise
                weights: list[torch.Tensor] = list(params)
                torch._foreach_add_(grads, torch._foreach_sub(weights, center),
                                    alpha=proximal_mu)
            for p, g in zip(params, grads):
                p.grad = g
        opt.step()
        dp.steps_taken += 1
    return total / max(count, 1)


def loss_for(y: torch.Tensor) -> LossFn:
    """Cross-entropy for integer class labels, mean squared error for float targets."""
    if torch.is_floating_point(y):
        return lambda out, target: nn.functional.mse_loss(out.reshape(target.shape), target)
    return nn.functional.cross_entropy


class Evaluation(NamedTuple):
    """What :func:`evaluate` measured: the mean loss, and accuracy or MSE (the other is None)."""

    loss: float
    accuracy: float | None
    mse: float | None


@dataclass
class Test:
    """One client's call of :func:`evaluate`, as an engine that tests a round's clients
    together (:mod:`tasks.stacked`) receives it."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    batch_size: int
    device: torch.device | str

    def alone(self) -> Evaluation:
        """This call as one by one: :func:`evaluate`."""
        return evaluate(self.model, self.x, self.y, batch_size=self.batch_size,
                        device=self.device)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 500,
    device: torch.device | str = "cpu",
    stackable: bool = False,
) -> Evaluation:
    """Test ``model`` on (x, y).

    Classification (integer ``y``): the mean cross-entropy and the accuracy;
    regression (float ``y``): the MSE (mean over all outputs) as both loss and mse.
    The data go to ``device`` once; the sums stay there and are read back once.
    ``stackable``: as :func:`train`'s (the ClientApp's test of a round's model).
    """
    if stackable and stacking_worker():
        test = Test(model, x, y, batch_size, device)
        if STACKING.stacks(test, None):
            return STACKING.park(test)
    model.to(device).eval()
    regression = torch.is_floating_point(y)
    x, y = x.to(device), y.to(device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, correct
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        out = model(xb)
        if regression:
            sums[0] += nn.functional.mse_loss(out.reshape(yb.shape), yb, reduction="sum").double()
        else:
            sums[0] += nn.functional.cross_entropy(out, yb, reduction="sum").double()
            sums[1] += (out.argmax(1) == yb).sum()
    loss_sum, correct = sums.tolist()
    count = max(y.numel() if regression else len(y), 1)
    if regression:
        return Evaluation(loss_sum / count, None, loss_sum / count)
    return Evaluation(loss_sum / count, correct / count, None)
