"""The clients' optimizers take torch's steps, without importing torch's compiler."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tasks.optim import SGD, Adam

from .conftest import ROOT


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3),
                               torch.nn.Linear(3, 2))


@pytest.mark.parametrize("kind, options", [
    ("sgd", {}), ("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.5, "weight_decay": 1e-3}),
    ("adam", {}), ("adam", {"weight_decay": 1e-2}),
])
def test_the_same_steps_as_torch_optim(kind, options):
    ours_model, torch_model = _model(0), _model(0)
    ours_cls, torch_cls = {"sgd": (SGD, torch.optim.SGD), "adam": (Adam, torch.optim.Adam)}[kind]
    ours = ours_cls(ours_model.parameters(), lr=0.05, **options)
    theirs = torch_cls(torch_model.parameters(), lr=0.05, **options)
    gen = torch.Generator().manual_seed(1)
    # every third step the last two layers get no gradient (parameters without one)
    for step in range(12):
        x, y = torch.randn(16, 5, generator=gen), torch.randn(16, 2, generator=gen)
        for model, opt in ((ours_model, ours), (torch_model, theirs)):
            opt.zero_grad()
            out = model[:2](x) if step % 3 == 1 else model(x)
            target = y[:, :1].expand(-1, 7) if step % 3 == 1 else y
            ((out - target) ** 2).mean().backward()
            opt.step()
        for a, b in zip(ours_model.parameters(), torch_model.parameters()):
            assert torch.equal(a, b), (kind, options, step)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="lr"):
        SGD([torch.zeros(2, requires_grad=True)], lr=0.0)
    with pytest.raises(ValueError, match="momentum"):
        SGD([torch.zeros(2, requires_grad=True)], lr=0.1, momentum=-1)


def test_a_training_step_does_not_import_the_compiler():
    code = ("import sys, torch\n"
            "from tasks.train import train\n"
            "m = torch.nn.Linear(3, 2)\n"
            "x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))\n"
            "for opt in ('adam', 'sgd'):\n"
            "    train(m, x, y, epochs=1, batch_size=4, lr=0.1, optimizer=opt)\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
