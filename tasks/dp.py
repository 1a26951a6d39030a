"""Differential privacy of a member's reply: the Gaussian mechanism on its model update
(``dp = "update"``) or on each step's per-example gradients (``dp = "dp-sgd"``,
:class:`DPSGD`), and the (epsilon, delta) it spends, from a maintained accountant.

``dp = "update"`` (:func:`privatize_update`): the update a member replies, its trained model
minus the model it received, is clipped to an L2 norm of at most ``clip`` (C) over all its
floating-point tensors together, and Gaussian noise of standard deviation
``noise_multiplier`` x C is added to every coordinate; the reply is the received model
plus that. This is the client half of DP-FedAvg (McMahan et al., "Learning Differentially
Private Recurrent Language Models", ICLR 2018, Algorithm 1's ClipFn and the Gaussian
noise, here added by the member itself rather than by a trusted server), so that the
coordinator, the other members and every model made from the reply see only the noised
update. Integer tensors (BatchNorm's batch counter) are replied as received.

Accounting (:func:`epsilon`): one noised reply is one Gaussian mechanism of sensitivity C
on the member's data set for adding or removing it, whole or in part (the clipped update
against none at all: at most C apart), with no subsampling amplification (sample rate 1:
a member that trains is in the round for sure); its rounds compose. Replacing records
moves a clipped update by up to 2C: for that neighbouring relation the same noise gives
the epsilon of half the noise multiplier. DP-SGD's accounting (Opacus's) is likewise for
adding or removing one example. Opacus's RDP
accountant (Mironov, "Renyi Differential Privacy", 2017; Mironov et al. 2019 for the
sampled Gaussian) turns the history ``[(noise multiplier, sample rate, steps), ...]`` into
epsilon at a delta; no formula is written here.

Deviations, said plainly: the noise comes from torch's generator seeded from the
operating system's randomness (:func:`os_generator`), not from a cryptographically
secure generator (Opacus's ``secure_mode``); floating-point attacks on the Gaussian
sampler are not addressed (as in Opacus's default mode).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

#: A history of Gaussian mechanisms: (noise multiplier, sample rate, steps) each.
History = Sequence[tuple[float, float, int]]


def os_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator seeded from the operating system's randomness: never a run's seed,
    which the coordinator chooses and every member could know."""
    return torch.Generator(device=device).manual_seed(secrets.randbits(63))


def privatize_update(received: Mapping[str, torch.Tensor], trained: Mapping[str, torch.Tensor],
                     clip: float, noise_multiplier: float, generator: torch.Generator
                     ) -> tuple[dict[str, torch.Tensor], float]:
    """The reply ``received + clip(trained - received) + N(0, (noise_multiplier * clip)^2)``
    over the floating-point tensors (the others as received), and the update's L2 norm
    before clipping.

    ``received`` and ``trained`` have the same keys, shapes and dtypes (a model's state
    dict before and after local training)."""
    if clip <= 0 or noise_multiplier < 0:
        raise ValueError(f"clip = {clip} and noise_multiplier = {noise_multiplier}; allowed: "
                         "clip > 0, noise_multiplier >= 0")
    if received.keys() != trained.keys():
        raise ValueError("the trained model's tensors are not the received model's")
    floats = [k for k, v in received.items() if torch.is_floating_point(v)]
    sizes = [received[k].numel() for k in floats]
    before = torch.cat([received[k].detach().reshape(-1).double() for k in floats])
    after = torch.cat([trained[k].detach().reshape(-1).double().to(before.device)
                       for k in floats])
    update = after - before
    norm = float(torch.linalg.vector_norm(update))
    update = update * min(1.0, clip / norm) if norm > 0 else update
    noise = torch.randn(update.shape, generator=generator, dtype=torch.float64,
                        device=generator.device).to(update.device)
    noised = before + update + noise * (noise_multiplier * clip)
    out = dict(received)
    for key, part in zip(floats, torch.split(noised, sizes)):
        out[key] = part.reshape(received[key].shape).to(received[key].dtype)
    return out, norm


def epsilon(history: History, delta: float) -> float:
    """The epsilon at ``delta`` that the Gaussian mechanisms of ``history`` spend together
    (Opacus's RDP accountant); 0 for an empty history. Never negative: where the
    accountant's conversion gives a negative number (a large delta, e.g. 0.1 at noise
    multiplier 20), that delta is refused with a ValueError."""
    if not 0 < delta < 1:
        raise ValueError(f"delta = {delta}; allowed: a number in (0, 1)")
    # mechanisms of the same noise and sample rate merged (RDP composes by adding: exact),
    # so that a member's thousandth round costs what its first did
    merged: dict[tuple[float, float], int] = {}
    for z, q, n in history:
        if n > 0:
            merged[(float(z), float(q))] = merged.get((float(z), float(q)), 0) + int(n)
    entries = [(z, q, n) for (z, q), n in merged.items()]
    if not entries:
        return 0.0
    from opacus.accountants import RDPAccountant  # imported where used: a heavy import

    accountant = RDPAccountant()
    accountant.history = entries
    spent = float(accountant.get_epsilon(delta))
    if not spent >= 0:
        raise ValueError(f"the accountant gives epsilon {spent:.3g} < 0 at delta {delta:g}: "
                         "that delta is too large to bound anything; allowed: a smaller delta "
                         "(e.g. 1e-5)")
    return spent


@dataclass
class DPSGD:
    """Per-example DP-SGD for the generic loop (``dp = "dp-sgd"``; Abadi et al., "Deep
    Learning with Differential Privacy", CCS 2016, Algorithm 1): each step takes a Poisson
    sample of the client's examples (each with probability ``sample_rate``), clips every
    example's gradient to L2 norm ``clip``, adds Gaussian noise of standard deviation
    ``noise_multiplier`` x ``clip`` to their sum and divides by the expected batch size (as
    Opacus does with Poisson sampling), then takes the optimizer's step. The steps compose
    as ``(noise_multiplier, sample_rate, steps)`` in the accountant; ``steps_taken`` counts
    them (what the member's ledger records, however many times a method trains)."""

    clip: float
    noise_multiplier: float
    sample_rate: float
    generator: torch.Generator
    steps_taken: int = 0


def has_batch_statistics(model: nn.Module) -> bool:
    """Whether ``model`` mixes examples within a batch (BatchNorm): its per-example gradients
    are not defined, and DP-SGD cannot train it (Opacus refuses it too)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def clipped_gradient_sum(model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor,
                         clip: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The sum over the examples of (x, y) of each one's loss gradient clipped to L2 norm
    ``clip`` (all trainable parameters together), one tensor per trainable parameter in
    ``model.parameters()`` order, and the examples' mean loss. Per-example gradients come
    from ``torch.func`` (``vmap`` of ``grad``), in one batched pass."""
    from torch.func import functional_call, grad_and_value, vmap

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def one(p: dict, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xs.unsqueeze(0),))
        return loss_fn(out, ys.unsqueeze(0))

    grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0))(params, x, y)
    flat = [grads[n].reshape(len(x), -1) for n in names]
    norms = torch.linalg.vector_norm(torch.cat(flat, dim=1), dim=1)
    scale = (clip / (norms + 1e-12)).clamp(max=1.0)
    summed = [torch.einsum("b,b...->...", scale, grads[n]) for n in names]
    return summed, losses.mean()


def noise_multiplier_for(target: float, delta: float, releases: Sequence[tuple[float, int]],
                         rounds: int) -> float:
    """The smallest noise multiplier (to 3 significant digits, rounded up) at which every
    member's ``rounds`` rounds spend at most epsilon ``target`` at ``delta``; ``releases``:
    each member's (sample rate, steps) per round ((1.0, 1) for a noised update)."""
    if target <= 0 or rounds < 1 or not releases:
        raise ValueError(f"target = {target}, rounds = {rounds}; allowed: target > 0, "
                         "rounds >= 1, at least one member")

    def worst(z: float) -> float:
        return max(epsilon([(z, q, steps * rounds)], delta) for q, steps in releases)

    lo, hi = 0.05, 1.0
    while worst(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"epsilon {target} at delta {delta} needs a noise multiplier "
                             "over 10,000")
    for _ in range(24):  # to 1e-7 of hi: finer than the 3 digits it is rounded to
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if worst(mid) > target else (lo, mid)
    return _round_up(hi)


def _round_up(z: float) -> float:
    """``z`` rounded up to 3 significant digits."""
    digits = 2 - math.floor(math.log10(z))
    return math.ceil(z * 10 ** digits) / 10 ** digits


#: How much more noise than the run asks a member's node may add (its own stricter
#: dp-noise-multiplier) before the server's update-norm bound leaves its reply out.
STRICTER_NOISE = 4.0


def noise_allowance(clip: float, noise_multiplier: float, numel: int) -> float:
    """What ``dp = "update"`` may add to an honest reply's update norm: the clipped update
    (``clip``) and the norm of its Gaussian noise, ``noise_multiplier`` x ``clip`` x
    (sqrt(numel) + 10): the norm's mean, about sqrt(numel) for unit noise, and more than
    14 of its standard deviations (about 0.71), at up to :data:`STRICTER_NOISE` times the
    noise the run asks."""
    return clip * (1.0 + STRICTER_NOISE * noise_multiplier * (math.sqrt(numel) + 10.0))
