"""A round's clients trained as one stacked model: the same steps as :func:`tasks.train.train`
for each client, in one pass of large tensor operations instead of one client after another.

:func:`train_stacked` takes the clients' :class:`tasks.train.Fit` (their calls of ``train``)
whose models share an architecture and whose training shares its settings (:func:`group_key`):
their parameters are stacked along a first, client axis, and every step is one forward and
backward pass of all of them (batched matrix products, :func:`stacked_forward`) and one
optimizer step of all of them (:func:`_adam_step`: torch's fused Adam kernel;
:func:`_optimizer_step`: torch's single-tensor SGD, operation for operation; on the stacked
tensors: they are elementwise, so each client's state is its own). What stays each client's
own:

* its batches: drawn from its own data in the order its own seed gives, as ``train`` draws them
  (:func:`batch_plan`); a short last batch is padded with weight 0 (its samples add nothing);
* its number of steps (epochs of its own data, or ``steps``): the clients are sorted by it, and a
  client that has taken all of its steps takes no more (no step, no optimizer update): each
  step trains the prefix of clients that still have steps;
* its loss terms: the proximal term toward its own starting weights (``proximal_mu``, each its
  own), its own gradient correction (SCAFFOLD's), its own gradient-norm clipping; the loss
  returned is its own mean training loss, as ``train`` returns it.

Supported models: :class:`tasks.models.MLP`, :class:`tasks.models.GRUSeq2Seq` and
:class:`tasks.models.McMahanCNN` (grouped convolutions), the CNN on a GPU only: on a CPU it
trains faster one by one (:func:`call_problem`; :func:`stack_problem` says why another model
cannot be); DP-SGD (per-example clipping) and a method's own loss are not stacked; a
method's own loop is where its module gives its step (a :class:`tasks.train.LocalRule`:
Per-FedAvg's, pFedMe's; :class:`Chunk` is what the step works on). The
numbers equal the one-by-one loop's to float rounding: a batched product or a grouped
convolution sums in another order than a single one, and the GRU's gates are computed by hand
here (:class:`_GRUGates`) rather than by torch's fused cell, its tanh on a CPU as
2 sigmoid(2a) - 1 (``tests/test_stacked.py`` states the tolerances). The clients are trained
in chunks (:func:`chunks`; memory: a chunk's models, optimizer state and batches at once), on
a CPU two chunks side by side, each in a thread of its own on half of torch's threads
(:func:`side_by_side`: :data:`CHUNK` clients in all at once, and the memory budget shared).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import psutil
import torch
from torch import nn
from torch.optim.adam import adam

from .models import MLP, GRUSeq2Seq, McMahanCNN
from .train import Evaluation, Fit, LocalRule, Test, num_steps

#: clients trained at once at most (measured best of 16-207 for the traffic GRU on 2 cores:
#: docs/performance.md), and fewer where their state would pass :data:`MEMORY_BUDGET`; on a
#: CPU, split between two chunks that run side by side (:func:`workers`)
CHUNK = 64
#: chunks run side by side on a CPU of two threads or more, each on half of torch's threads:
#: 207 GRUs trained in 0.91 of one chunk at a time's time (chunks of 52 on two threads), in
#: chunks of 26 in 0.94 of that again; chunks of 16 took 1.17 times 26's (paired runs, 2 cores:
#: docs/performance.md)
WORKERS = 2
#: bytes a chunk's stacked state may take (:func:`chunk_for`): the most the stacked path
#: needs beyond one client's training, and at most an eighth of the machine's memory
#: (:func:`memory_budget`: a small machine stacks fewer clients at once)
MEMORY_BUDGET = 512 * 2**20
_BETAS, _EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which make_optimizer uses
_ATEN = torch.ops.aten


def stack_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained stacked, or None."""
    if type(model) not in _FORWARDS:
        return (f"no stacked form of {type(model).__name__} (stacked: "
                f"{', '.join(t.__name__ for t in _FORWARDS)})")
    if any(True for _ in model.buffers()):
        return f"{type(model).__name__} has buffers"
    if not all(p.requires_grad for p in model.parameters()):
        return "some of the model's parameters are frozen"
    return None


def group_key(call: Fit | Test) -> tuple:
    """What clients trained (or tested) together must share: the model's architecture, the
    data's shapes and the training's settings (its steps, seed, proximal weight and gradient
    correction may differ)."""
    shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in call.model.named_parameters())
    common = (type(call), type(call.model), shapes, getattr(call.model, "steps_out", None),
              call.batch_size, str(call.device), tuple(call.x.shape[1:]), call.x.dtype,
              tuple(call.y.shape[1:]), call.y.dtype)
    if isinstance(call, Test):
        return common
    return (*common, call.optimizer, call.learning_rate, call.momentum, call.weight_decay,
            call.clip_norm, call.grad_correction is None,
            None if call.rule is None else call.rule.key())


def evaluate_stacked(tests: Sequence[Test], chunk: int | None = None) -> list[Evaluation]:
    """Each test as :func:`tasks.train.evaluate` gives it (the same sums, in float64, of
    batches of at most ``batch_size`` rows), the models stacked; they share :func:`group_key`.
    ``chunk``: the most clients at once in a chunk (:func:`chunks`)."""
    parts, side = chunks(tests, list(range(len(tests))), max(len(t.x) for t in tests), chunk)
    done = side_by_side(lambda part: _evaluate_chunk([tests[i] for i in part]), parts, side)
    return [e for part in done for e in part]


@torch.no_grad()
def _evaluate_chunk(part: list[Test]) -> list[Evaluation]:
    first, device = part[0], part[0].device
    names = [n for n, _ in first.model.named_parameters()]
    params = dict(zip(names, _stacked_params([t.model for t in part], device)))
    x, y = _padded([t.x for t in part], device), _padded([t.y for t in part], device)
    rows = torch.tensor([len(t.y) for t in part], device=device)
    regression = torch.is_floating_point(first.y)
    sums = torch.zeros(len(part), 2, dtype=torch.float64, device=device)  # loss, correct
    for at in range(0, x.shape[1], first.batch_size):
        xb, yb = x[:, at:at + first.batch_size], y[:, at:at + first.batch_size]
        mask = (at + torch.arange(xb.shape[1], device=device))[None, :] < rows[:, None]
        o = _FORWARDS[type(first.model)](first.model, params, xb)
        if regression:
            per = (o.reshape(yb.shape) - yb).pow(2).reshape(*yb.shape[:2], -1).sum(2)
        else:
            per = nn.functional.cross_entropy(o.flatten(0, 1), yb.flatten(),
                                              reduction="none").view(yb.shape)
            sums[:, 1] += ((o.argmax(2) == yb) & mask).sum(1)
        sums[:, 0] += torch.where(mask, per, 0.0).sum(1).double()
    out = []
    for t, (loss_sum, correct), n in zip(part, sums.tolist(), rows.tolist()):
        count = max(t.y.numel() if regression else n, 1)
        out.append(Evaluation(loss_sum / count, None, loss_sum / count) if regression
                   else Evaluation(loss_sum / count, correct / count, None))
    return out


def workers(device: str | torch.device, clients: int) -> int:
    """How many chunks run side by side (:func:`side_by_side`): :data:`WORKERS` on a CPU
    where torch has as many threads or more, for two clients or more; else 1 (a GPU runs one
    chunk's kernels after another's)."""
    if torch.device(device).type != "cpu" or clients < 2:
        return 1
    return max(1, min(WORKERS, torch.get_num_threads()))


def chunks(calls: Sequence[Fit] | Sequence[Test], order: list[int], rows: int,
           most: int | None = None, steps: int = 0) -> tuple[list[list[int]], int]:
    """``order`` (indices of ``calls``, of at most ``rows`` rows) cut into chunks of about one
    size (207 clients by at most 32: 7 of 26 and one of 25, not 6 of 32 and one of 15), and how
    many run side by side (:func:`workers`): each at most ``most`` (by default :data:`CHUNK`
    shared among them) and what their share of the memory budget holds (:func:`chunk_for`); a
    multiple of them in count, so that none waits alone at the end."""
    side = workers(calls[0].device, len(order))
    size = chunk_for(calls[0], rows, most or max(1, CHUNK // side), steps, share=side)
    count = math.ceil(len(order) / size)
    if side > 1:
        count = min(len(order), math.ceil(count / side) * side)
    size, more = divmod(len(order), count)  # the first ``more`` chunks one client larger
    ends = [(i + 1) * size + min(i + 1, more) for i in range(count)]
    return [order[end - size - (i < more):end] for i, end in enumerate(ends)], side


def side_by_side(work: Callable, parts: list, side: int) -> list:
    """``work`` of each part, in order, ``side`` parts at once (threads: torch's operations
    leave Python's lock while they compute), each on 1/``side`` of torch's threads (restored
    after). A part's error is raised here, once every part has ended."""
    if side == 1 or len(parts) == 1:
        return [work(part) for part in parts]
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // side))
    try:
        with ThreadPoolExecutor(side, thread_name_prefix="stacked") as pool:
            return list(pool.map(work, parts))
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=8)
def memory_budget(device: str | torch.device = "cpu") -> int:
    """The bytes a stacked chunk may take on ``device``: on the host, :data:`MEMORY_BUDGET`,
    or an eighth of this machine's memory where that is less; on a GPU, an eighth of its
    memory (where many clients at once are meant to pay: not yet measured on one,
    docs/performance.md)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory) // 8
    return min(MEMORY_BUDGET, int(psutil.virtual_memory().total) // 8)


def chunk_for(call: Fit | Test, rows: int, most: int = CHUNK, steps: int = 0,
              share: int = 1) -> int:
    """How many clients like ``call`` (of at most ``rows`` rows) are stacked at once: at most
    ``most``, and as many as :func:`memory_budget` holds of their weights (six copies: the
    weights, gradients, optimizer's two, proximal centre, correction), data, and one batch's
    activations (the GRU's saved gates: about 11 x hidden a step of the sequence; the MLP's
    layers three times, and the CNN's every layer) and its plan of ``steps`` batches; a test:
    the weights, data and the activations of a batch (the GRU's input projections of every
    step, the CNN's every layer once). ``share``: chunks held at once, each 1/share of the
    budget."""
    model = call.model
    params = sum(p.numel() for p in model.parameters())
    data = rows * (call.x[0].numel() + call.y[0].numel()) if len(call.x) else 0
    if isinstance(model, GRUSeq2Seq):
        size = model.decoder.hidden_size
        per_row = (11 if isinstance(call, Fit) else 3) * size * (call.x[0].numel()
                                                                 + model.steps_out)
    elif isinstance(model, McMahanCNN):  # every layer's output, kept for the backward
        per_row = (3 if isinstance(call, Fit) else 1) * _outputs_per_row(model, call.x.shape[1:])
    else:
        per_row = 3 * sum(m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    copies = 6 if isinstance(call, Fit) else 1
    width = min(call.batch_size, max(rows, 1))
    floats = copies * params + data + width * per_row + 2 * steps * width  # the plan: int64
    return max(1, min(most, memory_budget(call.device) // share // (4 * floats)))


def _outputs_per_row(model: nn.Module, shape: Sequence[int]) -> int:
    """The floats of one row's outputs of every layer of ``model`` (its leaf modules) for an
    input row of ``shape``."""
    sizes: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: sizes.append(out[0].numel()))
             for m in model.modules() if not any(True for _ in m.children())]
    first = next(model.parameters())
    try:
        with torch.no_grad():
            model(torch.zeros((1, *shape), device=first.device, dtype=first.dtype))
    finally:
        for hook in hooks:
            hook.remove()
    return sum(sizes)


def batch_plan(fit: Fit, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's mini-batches as :func:`tasks.train.run_batches` draws them: (indices,
    steps x ``width``, a short batch padded with index 0; sizes, one per step). ``width``: at
    least the client's largest batch, min(batch size, rows)."""
    n, bs = len(fit.x), fit.batch_size
    target = num_steps(n, bs, fit.epochs, fit.steps)
    if target == 0:
        return torch.zeros(0, width, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    most, per_pass = min(bs, n), math.ceil(n / bs)
    gen = torch.Generator().manual_seed(fit.seed)
    orders = [torch.randperm(n, generator=gen) for _ in range(math.ceil(target / per_pass))]
    padded = torch.zeros(len(orders), per_pass * most, dtype=torch.long)
    padded[:, :n] = torch.stack(orders)
    plan = torch.zeros(target, width, dtype=torch.long)
    plan[:, :most] = padded.view(-1, most)[:target]
    sizes = torch.full((per_pass,), most, dtype=torch.long)
    sizes[-1] = n - (per_pass - 1) * most
    return plan, sizes.repeat(len(orders))[:target]


def call_problem(call: Fit | Test) -> str | None:
    """Why ``call`` cannot be stacked, or None: its model (:func:`stack_problem`), a model
    that is faster one by one on a CPU (:data:`ONE_BY_ONE_ON_CPU`), or a plan of batches
    (steps x rows, drawn before the first step) beyond :func:`memory_budget` alone."""
    problem = stack_problem(call.model)
    if problem is None and isinstance(call.model, ONE_BY_ONE_ON_CPU) \
            and torch.device(call.device).type == "cpu":
        problem = (f"{type(call.model).__name__} trains faster one by one on a CPU (stacked on "
                   "another device)")
    if problem is None and isinstance(call, Fit):
        steps = num_steps(len(call.x), call.batch_size, call.epochs, call.steps)
        budget = memory_budget(call.device)
        if 8 * steps * min(call.batch_size, len(call.x)) > budget:
            problem = (f"its plan of {steps} steps of up to {min(call.batch_size, len(call.x))} "
                       f"rows passes the stacked path's memory budget ({budget} bytes)")
    return problem


def train_stacked(fits: Sequence[Fit], chunk: int | None = None) -> list[float]:
    """Train every fit's model in place, as :func:`tasks.train.train` would one by one; return
    their mean training losses, in order. The fits share :func:`group_key`; at most ``chunk``
    of them at once in a chunk (:func:`chunks`)."""
    steps = [num_steps(len(f.x), f.batch_size, f.epochs, f.steps) for f in fits]
    order = sorted(range(len(fits)), key=lambda i: -steps[i])  # most steps first
    rows = max(len(f.x) for f in fits)
    width = min(fits[0].batch_size, rows)  # a batch's most rows (no wider than the data)
    parts, side = chunks(fits, order, rows, chunk, max(steps))
    trained = side_by_side(lambda part: (part, *_train_chunk(
        [fits[i] for i in part], [batch_plan(fits[i], width) for i in part])), parts, side)
    losses = [0.0] * len(fits)
    for part, done, _, _ in trained:  # the models written once every chunk is done
        for i, loss in zip(part, done):
            losses[i] = loss
    for part, _, weights, extra in trained:
        for j, i in enumerate(part):
            fits[i].model.to(fits[i].device).train()  # as train leaves it
            with torch.no_grad():
                for p, w in zip(fits[i].model.parameters(), weights):
                    p.copy_(w[j])
            rule = fits[i].rule
            if rule is not None:
                rule.write(fits[i], [e[j] for e in extra])
    return losses


def _stacked_params(models: list[nn.Module], device) -> list[torch.Tensor]:
    """The models' parameters, each stacked along a first, client axis, on ``device``."""
    return [torch.stack([p.detach().to(device) for p in same])
            for same in zip(*(m.parameters() for m in models))]


def _padded(tensors: list[torch.Tensor], device) -> torch.Tensor:
    """The clients' tensors (rows of one shape) stacked, each padded with zero rows to the most."""
    out = tensors[0].new_zeros((len(tensors), max(len(t) for t in tensors), *tensors[0].shape[1:]))
    for i, t in enumerate(tensors):
        out[i, :len(t)] = t
    return out.to(device)


class Chunk:
    """A chunk of clients trained together (sorted by their mini-batches, most first): their
    stacked weights (updated in place), data, plans of batches and optimizer state; what a
    step (:class:`_Plain`, a method's :class:`tasks.train.LocalRule`) works on."""

    def __init__(self, fits: list[Fit], plans: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        first, device = fits[0], fits[0].device
        self.fits, self.first, self.device = fits, first, device
        self.names = [n for n, _ in first.model.named_parameters()]
        self.weights = _stacked_params([f.model for f in fits], device)
        self.x, self.y = _padded([f.x for f in fits], device), _padded([f.y for f in fits], device)
        self.steps = [len(sizes) for _, sizes in plans]
        self.idx = _padded([i for i, _ in plans], device) if self.steps[0] else None
        self.sizes = _padded([s[:, None] for _, s in plans], device)[..., 0] \
            if self.steps[0] else None
        self.forward, self.loss_of = _FORWARDS[type(first.model)], _loss(first.y)
        self.optimizer_state: list[list[torch.Tensor]] = []

    def stack(self, models: list[nn.Module]) -> list[torch.Tensor]:
        """Other models of the chunk's clients (one each, in its order: a method's personal
        models), their parameters stacked as the weights are."""
        return _stacked_params(models, self.device)

    def w(self, k: int) -> list[torch.Tensor]:
        """The first k clients' weights (views: updated in place)."""
        return [w[:k] for w in self.weights]

    def batch_sizes(self, s: int, k: int) -> torch.Tensor:
        """The rows of the first k clients' batch ``s``."""
        assert self.sizes is not None
        return self.sizes[:k, s]

    def loss_and_grads(self, params: list[torch.Tensor], s: int, k: int
                       ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The first k clients' mean losses on their batch ``s`` at ``params`` (stacked, one
        per weight: the weights, or a method's other point) and each one's gradient there."""
        assert self.idx is not None
        rows = torch.arange(k, device=self.device)[:, None]
        picked, size = self.idx[:k, s], self.batch_sizes(s, k)
        mask = (torch.arange(picked.shape[1], device=self.device)[None, :] < size[:, None])
        params = [p.detach().requires_grad_() for p in params]
        per_client = self.loss_of(
            self.forward(self.first.model, dict(zip(self.names, params)), self.x[rows, picked]),
            self.y[rows, picked], mask, size)
        return per_client.detach(), list(torch.autograd.grad(per_client.sum(), params))

    def optimizer_step(self, grads: list[torch.Tensor], step: int, k: int) -> None:
        """The fits' optimizer's step ``step`` (from 0) on the first k clients' weights."""
        _optimizer_step(self.first, self.w(k), grads, self.optimizer_state, step, k)


class _Plain(LocalRule):
    """:func:`tasks.train.train`'s step: the optimizer on each client's gradient, with its
    own proximal term, correction and clipping (:func:`_adjust`)."""

    def begin(self, chunk: Chunk) -> dict:
        fits, weights, device = chunk.fits, chunk.weights, chunk.device
        mu = torch.tensor([f.proximal_mu for f in fits], dtype=weights[0].dtype, device=device)
        return {"mu": mu,
                "center": [w.clone() for w in weights] if bool((mu > 0).any()) else None,
                "correction": None if fits[0].grad_correction is None else [
                    torch.stack([f.grad_correction[j] for f in fits]).to(device)  # type: ignore
                    for j in range(len(weights))]}

    def step(self, chunk: Chunk, state: dict, s: int, k: int) -> torch.Tensor:
        loss, grads = chunk.loss_and_grads(chunk.w(k), s, k)
        _adjust(grads, chunk.w(k), state["center"], state["mu"][:k], state["correction"],
                chunk.first.clip_norm, k)
        chunk.optimizer_step(grads, s, k)
        return loss


_PLAIN = _Plain()


def _train_chunk(fits: list[Fit], plans: list[tuple[torch.Tensor, torch.Tensor]]
                 ) -> tuple[list[float], list[torch.Tensor], list[torch.Tensor]]:
    """Train one chunk (sorted by steps, most first) by its rule (the fits' ``rule``, else
    the plain step); their mean training losses, their trained weights, stacked, and the
    rule's other stacked outputs."""
    rule = fits[0].rule or _PLAIN
    if rule is not _PLAIN and any(f.proximal_mu or f.grad_correction is not None
                                  or f.clip_norm or f.momentum or f.weight_decay for f in fits):
        raise ValueError("a method's own step (LocalRule) takes no proximal term, correction, "
                         "clipping, momentum or weight decay")  # the group runs one by one
    chunk = Chunk(fits, plans)
    state = rule.begin(chunk)
    totals = torch.zeros(len(fits), dtype=torch.float64, device=chunk.device)
    counts = torch.zeros(len(fits), dtype=torch.long, device=chunk.device)
    k = len(fits)
    for s in range(chunk.steps[0]):
        while chunk.steps[k - 1] <= s:  # the clients that still have steps: a prefix, shrinking
            k -= 1
        size = chunk.batch_sizes(s, k)
        totals[:k] += rule.step(chunk, state, s, k).double() * size
        counts[:k] += size
    return (totals / counts.clamp(min=1)).tolist(), chunk.weights, rule.end(chunk, state)


def _loss(y: torch.Tensor) -> Callable[..., torch.Tensor]:
    """Each client's mean batch loss, as :func:`tasks.train.loss_for` gives it, of stacked
    outputs (clients x batch x ...), the padded samples weighted 0."""
    if torch.is_floating_point(y):
        def mse(out, target, mask, size):
            per = (out.reshape(target.shape) - target).pow(2).reshape(*target.shape[:2], -1).sum(2)
            return torch.where(mask, per, 0.0).sum(1) / (size * target[0, 0].numel())
        return mse

    def cross_entropy(out, target, mask, size):
        per = nn.functional.cross_entropy(out.flatten(0, 1), target.flatten(),
                                          reduction="none").view(target.shape)
        return torch.where(mask, per, 0.0).sum(1) / size
    return cross_entropy


def _adjust(grads, weights, center, mu, correction, clip_norm: float, k: int) -> None:
    """:func:`tasks.train._adjust_gradients`, each client's own: its proximal gradient
    mu_i (w - w0), its correction, its gradient norm clipped (torch's ``clip_grad_norm_``)."""
    with torch.no_grad():
        if center is not None:
            for g, w, c in zip(grads, weights, center):
                g.add_((w - c[:k]) * mu.view(-1, *([1] * (g.dim() - 1))))
        if correction is not None:
            for g, c in zip(grads, correction):
                g.add_(c[:k])
        if clip_norm > 0:
            norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads], 1).norm(dim=1)
            coef = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


def _optimizer_step(fit: Fit, weights, grads, state: list[list[torch.Tensor]], step: int,
                    k: int) -> None:
    """One step of the fits' optimizer on the first k clients (``state``: the stacked
    optimizer state, made at the first step)."""
    with torch.no_grad():
        if fit.weight_decay != 0:
            grads = [g.add(w, alpha=fit.weight_decay) for g, w in zip(grads, weights)]
        if fit.optimizer == "adam":
            if not state:  # the kernel's step counts: one float32 tensor's elements, one each
                state += [[torch.zeros_like(w) for w in weights],
                          [torch.zeros_like(w) for w in weights],
                          [weights[0].new_zeros(len(weights), dtype=torch.float32)]]
            _adam_step(weights, grads, [m[:k] for m in state[0]], [v[:k] for v in state[1]],
                       state[2][0], step, fit.learning_rate)
        elif fit.optimizer == "sgd":
            if fit.momentum != 0:
                if not state:
                    state.append([g.clone() for g in grads])
                    grads = state[0]
                else:
                    bufs = [b[:k] for b in state[0]]
                    for b, g in zip(bufs, grads):
                        b.mul_(fit.momentum).add_(g)
                    grads = bufs
            for w, g in zip(weights, grads):
                w.add_(g, alpha=-fit.learning_rate)
        else:
            raise ValueError(f"unknown optimizer '{fit.optimizer}'; allowed: adam, sgd")


def _adam_step(weights, grads, exp_avgs, exp_avg_sqs, steps: torch.Tensor, step: int,
               learning_rate: float) -> None:
    """torch's Adam step (no amsgrad) on every weight at once, by its fused kernel
    (``torch.optim.adam.adam(fused=True)``: one pass over each tensor, against 7 of the
    single-tensor form's operations, 0.03 s against 0.2-0.25 s for a round's 84 steps of 52
    GRUs here, docs/performance.md; the same formula, rounded in another order); every client
    in it is at the same ``step`` (from 0); ``steps``: the kernel's count for each weight (one
    element each, set at once).
    The kernel reads each tensor as one run of memory: given a gradient that is not (a
    transposed weight's), it computed wrong steps without a word (2% off in
    ``tests/test_stacked.py``), so the gradients are made contiguous, and other tensors
    refused (the group then trains one by one)."""
    if not all(t.is_contiguous() for t in (*weights, *exp_avgs, *exp_avg_sqs)):
        raise ValueError("the fused Adam kernel needs contiguous weights and state")
    steps.fill_(step)  # the kernel counts each up to step + 1, as the one-by-one optimizer
    grads = [g.contiguous() for g in grads]
    adam(weights, grads, exp_avgs, exp_avg_sqs, [], list(steps.unbind()), fused=True,
         amsgrad=False, beta1=_BETAS[0], beta2=_BETAS[1], lr=learning_rate, weight_decay=0.0,
         eps=_EPS, maximize=False)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``nn.Linear`` of every client at once: x (clients x rows x in) -> clients x rows x out."""
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


def _mlp(model: nn.Module, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """:class:`tasks.models.MLP`'s forward, stacked."""
    h = x.flatten(2)
    assert isinstance(model, MLP)
    layers = [i for i, m in enumerate(model.net) if isinstance(m, nn.Linear)]
    for j, i in enumerate(layers):
        h = _linear(h, p[f"net.{i}.weight"], p[f"net.{i}.bias"])
        if j < len(layers) - 1:
            h = torch.relu(h)
    return h


def _cnn(model: nn.Module, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """:class:`tasks.models.McMahanCNN`'s forward, stacked: each convolution one grouped
    convolution of every client (the clients' channels side by side, a group each), the dense
    layers batched products. Measured against ``torch.func.vmap`` of the model's own forward:
    7% faster here (docs/performance.md)."""
    assert isinstance(model, McMahanCNN)
    clients, rows = x.shape[:2]
    h = x.transpose(0, 1).flatten(1, 2)  # rows x (clients x channels) x height x width
    for i, m in enumerate(model.features):
        if isinstance(m, nn.Conv2d):
            assert m.groups == 1 and m.padding_mode == "zeros", "the McMahan CNN's convolutions"
            h = nn.functional.conv2d(h, p[f"features.{i}.weight"].flatten(0, 1),
                                     p[f"features.{i}.bias"].flatten(), m.stride, m.padding,
                                     m.dilation, groups=clients)
        else:  # ReLU, max pooling: channel by channel
            h = m(h)
    h = h.view(rows, clients, -1).transpose(0, 1)  # clients x rows x features
    h = torch.relu(_linear(h, p["classifier.1.weight"], p["classifier.1.bias"]))
    return _linear(h, p["classifier.3.weight"], p["classifier.3.bias"])


class _GRUGates(torch.autograd.Function):
    """A GRU step's gates (torch's ``nn.GRU`` equations, gates r, z, n) from the input's and
    the state's projections gi, gh; the backward by hand, in 8 elementwise operations (torch's
    own ``tanh_backward`` and ``sigmoid_backward``; a first hand-written form took 17, and was
    about 5% slower in eight paired runs). On a CPU, tanh is taken as 2 sigmoid(2a) - 1, the
    same function: torch's CPU tanh took 180-255 us for a 52 x 32 x 64 tensor here, its
    sigmoid 26-29 us, the four passes of the identity 50 us (docs/performance.md).
    Measured against summing the recurrent weights' gradient over all steps in one product
    (a hand-written backward through time): that was not faster here (docs/performance.md)."""

    @staticmethod
    def forward(ctx, gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        size = h.shape[-1]
        rz = torch.sigmoid(gi[..., :2 * size] + gh[..., :2 * size])
        r, z = rz[..., :size], rz[..., size:]
        gh_n = gh[..., 2 * size:]
        n = torch.addcmul(gi[..., 2 * size:], r, gh_n)
        if n.device.type == "cpu":  # tanh(a) = 2 sigmoid(2a) - 1: 4 passes, faster here
            n = torch.sigmoid(n.mul_(2), out=n).mul_(2).sub_(1)
        else:
            n = torch.tanh(n)
        h_n = h - n
        ctx.save_for_backward(rz, n, gh_n, h_n)
        return torch.addcmul(n, z, h_n)  # (1 - z) n + z h

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rz, n, gh_n, h_n = ctx.saved_tensors
        size = n.shape[-1]
        r, z = rz[..., :size], rz[..., size:]
        d_gi = grad.new_empty((*grad.shape[:-1], 3 * size))
        d_n, d_rz = d_gi[..., 2 * size:], d_gi[..., :2 * size]
        grad_z = grad * z  # the state's own share
        _ATEN.tanh_backward.grad_input(grad - grad_z, n, grad_input=d_n)
        torch.mul(d_n, gh_n, out=d_gi[..., :size])
        torch.mul(grad, h_n, out=d_gi[..., size:2 * size])
        _ATEN.sigmoid_backward.grad_input(d_rz, rz, grad_input=d_rz)
        return d_gi, torch.cat([d_rz, d_n * r], -1), grad_z


def _gru_step(gi, h, p: dict[str, torch.Tensor], names: tuple[str, str]) -> torch.Tensor:
    return _GRUGates.apply(gi, _linear(h, p[names[0]], p[names[1]]), h)


_ENCODER = ("encoder.weight_hh_l0", "encoder.bias_hh_l0")
_DECODER = ("decoder.weight_hh", "decoder.bias_hh")


def _gru_seq2seq(model: nn.Module, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """:class:`tasks.models.GRUSeq2Seq`'s forward, stacked (clients x rows x steps_in)."""
    assert isinstance(model, GRUSeq2Seq)
    x = x.reshape(x.shape[0], x.shape[1], -1)
    w_ih, b_ih = p["encoder.weight_ih_l0"], p["encoder.bias_ih_l0"]
    h = x.new_zeros((x.shape[0], x.shape[1], p[_ENCODER[0]].shape[2]))
    # the input is one reading: its projection is a product by the weight's column, a step
    # at a time (all steps' at once is a tensor that does not stay in the cache: 15% slower)
    for t in range(x.shape[2]):
        gi = torch.addcmul(b_ih[:, None, :], x[:, :, t, None], w_ih[:, None, :, 0])
        if t == 0:  # the state is 0: its projection is the bias alone (no product)
            h = _GRUGates.apply(gi, p[_ENCODER[1]][:, None, :].expand(gi.shape), h)
        else:
            h = _gru_step(gi, h, p, _ENCODER)
    reading, out = x[:, :, -1:], []
    for _ in range(model.steps_out):
        gi = torch.addcmul(p["decoder.bias_ih"][:, None, :], reading,
                           p["decoder.weight_ih"][:, None, :, 0])
        h = _gru_step(gi, h, p, _DECODER)
        reading = _linear(h, p["head.weight"], p["head.bias"])
        out.append(reading)
    return torch.cat(out, -1)


_FORWARDS: dict[type, Callable[..., torch.Tensor]] = {MLP: _mlp, GRUSeq2Seq: _gru_seq2seq,
                                                      McMahanCNN: _cnn}
#: models that train (and test) faster one by one on a CPU, stacked only on another device:
#: the CNN's convolutions already fill a CPU's cores one client at a time (100 FMNIST clients,
#: batches of 100 rows, stacked: 1.33 times the one-by-one training's time here, 2.18 times
#: its tests', docs/performance.md)
ONE_BY_ONE_ON_CPU = (McMahanCNN,)


def stacked_forward(model: nn.Module, params: dict[str, torch.Tensor],
                    x: torch.Tensor) -> torch.Tensor:
    """``model``'s forward for stacked ``params`` (name -> clients x ...) on x (clients x rows
    x ...)."""
    return _FORWARDS[type(model)](model, params, x)
