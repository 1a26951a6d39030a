"""The clients' optimizers, SGD and Adam, without ``torch.optim``'s first-step cost.

Every ``torch.optim.Optimizer.step`` imports ``torch._dynamo`` (about 1.2 s on
the first step of a process, measured in docs/performance.md); on a
SuperNode of Flower 1.41 every message runs in a fresh ClientApp process, so
that import is paid twice a round by every client. These two classes take the
same steps as ``torch.optim.SGD`` and ``torch.optim.Adam`` with their default
options (no Nesterov, no dampening, no AMSGrad, not maximising), element by
element in the same order of operations, as ``torch._foreach_*`` calls over the
parameters that have a gradient: the same numbers as torch's optimizers (a
test compares them step by step), and no import of the compiler stack.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class _Optimizer:
    """The part of ``torch.optim.Optimizer`` the training loops use: ``zero_grad`` and
    ``step`` over one group of parameters."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float) -> None:
        self.params = list(params)
        if lr <= 0 or weight_decay < 0:
            raise ValueError(f"lr = {lr}, weight_decay = {weight_decay}; allowed: lr > 0, "
                             "weight_decay >= 0")
        self.lr, self.weight_decay = float(lr), float(weight_decay)

    def zero_grad(self) -> None:
        """Forget the gradients (``set_to_none``, as torch's default)."""
        for p in self.params:
            p.grad = None

    def _with_grads(self) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
        used = [i for i, p in enumerate(self.params) if p.grad is not None]
        params = [self.params[i] for i in used]
        grads = [p.grad for p in params]
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        return used, params, grads  # type: ignore[return-value]


class SGD(_Optimizer):
    """``torch.optim.SGD(params, lr, momentum, weight_decay=...)``: ``g += wd w``; with
    momentum ``b = g`` at the first step, then ``b = momentum b + g``, ``g = b``; ``w -= lr g``.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr, weight_decay)
        if momentum < 0:
            raise ValueError(f"momentum = {momentum}; allowed: a number >= 0")
        self.momentum = float(momentum)
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        """One step over the parameters that have a gradient."""
        used, params, grads = self._with_grads()
        if not used:
            return
        if self.momentum != 0:
            fresh = [k for k, i in enumerate(used) if self.buffers[i] is None]
            old = [k for k, i in enumerate(used) if self.buffers[i] is not None]
            if old:
                bufs = [self.buffers[used[k]] for k in old]
                torch._foreach_mul_(bufs, self.momentum)  # type: ignore[arg-type]
                torch._foreach_add_(bufs, [grads[k] for k in old])  # type: ignore[arg-type]
            for k in fresh:
                self.buffers[used[k]] = torch.clone(grads[k]).detach()
            grads = [self.buffers[i] for i in used]  # type: ignore[misc]
        torch._foreach_add_(params, grads, alpha=-self.lr)


class Adam(_Optimizer):
    """``torch.optim.Adam(params, lr, weight_decay=...)`` with betas (0.9, 0.999) and eps
    1e-8 (Kingma and Ba 2015, Alg. 1, as torch computes it)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        super().__init__(params, lr, weight_decay)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.steps = [0] * len(self.params)
        self.exp_avg: list[torch.Tensor | None] = [None] * len(self.params)
        self.exp_avg_sq: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        """One step over the parameters that have a gradient."""
        used, params, grads = self._with_grads()
        if not used:
            return
        for i in used:
            if self.exp_avg[i] is None:
                p = self.params[i]
                self.exp_avg[i] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self.exp_avg_sq[i] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.steps[i] += 1
        m = [self.exp_avg[i] for i in used]
        v = [self.exp_avg_sq[i] for i in used]
        torch._foreach_lerp_(m, grads, 1 - self.beta1)  # type: ignore[arg-type]
        torch._foreach_mul_(v, self.beta2)  # type: ignore[arg-type]
        torch._foreach_addcmul_(v, grads, grads, 1 - self.beta2)  # type: ignore[arg-type]
        step_size = [-(self.lr / (1 - self.beta1 ** self.steps[i])) for i in used]
        bc2_sqrt = [(1 - self.beta2 ** self.steps[i]) ** 0.5 for i in used]
        denom = torch._foreach_sqrt(v)  # type: ignore[arg-type]
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, m, denom, step_size)  # type: ignore[arg-type]
