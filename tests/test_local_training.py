"""The generic local training loop: it learns, its proximal term is the one backpropagated and
holds the model near its start, and local steps replace epochs."""

from __future__ import annotations

from pathlib import Path

import torch

from tasks.models import MLP
from tasks.train import evaluate, train


def _data(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long()


def _distance(model, ref):
    return sum(((p - r) ** 2).sum().item() for p, r in zip(model.parameters(), ref))


def test_the_proximal_gradient_is_that_of_the_term_backpropagated():
    """Two full-batch SGD steps with proximal_mu equal two steps on loss + (mu / 2)
    ||w - w_start||^2 through autograd (in the second, w is away from its start)."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    model = MLP(3, 2, (4,))
    reference = MLP(3, 2, (4,))
    reference.load_state_dict(model.state_dict())
    start = [p.detach().clone() for p in reference.parameters()]
    mu, lr = 0.7, 0.5
    train(model, x, y, epochs=2, batch_size=8, learning_rate=lr, optimizer="sgd", proximal_mu=mu)
    params = list(reference.parameters())
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(reference(x), y)
        loss = loss + 0.5 * mu * sum(((p - c) ** 2).sum() for p, c in zip(params, start))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= lr * g
    moved = sum(float((p - c).abs().sum()) for p, c in zip(params, start))
    assert moved > 0.1  # the term mattered in the second step
    for want, got in zip(params, model.parameters()):
        assert torch.allclose(got, want, atol=1e-6)


def test_training_learns_and_proximal_term_holds_the_model_near_its_start():
    x, y = _data()
    torch.manual_seed(0)
    free, held = MLP(4, 2, (8,)), MLP(4, 2, (8,))
    held.load_state_dict(free.state_dict())
    start = [p.detach().clone() for p in free.parameters()]
    train(free, x, y, epochs=30, batch_size=20, learning_rate=1e-2)
    train(held, x, y, epochs=30, batch_size=20, learning_rate=1e-2, proximal_mu=1e3)
    assert evaluate(free, x, y).accuracy > 0.9
    assert _distance(held, start) < 0.05 * _distance(free, start)


def test_local_steps_override_epochs():
    x, y = _data()
    model = MLP(4, 2, (8,))
    opt_steps = []
    orig = torch.optim.Adam.step

    def counting(self, *a, **k):
        opt_steps.append(1)
        return orig(self, *a, **k)

    torch.optim.Adam.step = counting
    try:
        train(model, x, y, epochs=5, steps=3, batch_size=20, learning_rate=1e-3)
    finally:
        torch.optim.Adam.step = orig
    assert len(opt_steps) == 3


def test_an_optimizer_starts_and_steps_without_importing_dynamo():
    """torch imports torch._dynamo (1.5-3 s of CPU) at an optimizer's first step, which every
    ClientApp process on a SuperNode paid once per train message; the app's optimizers do
    without (tasks.train.skip_dynamo_import), and step as torch's wrapper does: grad mode
    restored, the update torch's own."""
    import subprocess
    import sys

    code = (
        "import sys, torch, tasks.train\n"
        "m = torch.nn.Linear(3, 2)\n"
        "for opt in (torch.optim.Adam(m.parameters(), lr=0.1),\n"
        "            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)):\n"
        "    m(torch.ones(4, 3)).sum().backward()\n"
        "    with torch.no_grad():\n"
        "        opt.step()\n"
        "        assert not torch.is_grad_enabled()  # the mode it was called in, kept\n"
        "    opt.step(); opt.zero_grad()\n"
        "assert torch.is_grad_enabled()\n"
        "print('torch._dynamo' in sys.modules, tasks.train.skip_dynamo_import())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"]  # never imported; marked once, at import
