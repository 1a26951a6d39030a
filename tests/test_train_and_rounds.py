"""Local training loop and the FedAMP round maths inside the strategy."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from strategies.fedamp_math import fedamp_weights
from tasks.models import MLP
from tasks.train import evaluate, train

from .conftest import LocalGrid, setup_strategy


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
    train(model, x, y, epochs=2, batch_size=8, lr=lr, optimizer="sgd", proximal_mu=mu)
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
    train(free, x, y, epochs=30, batch_size=20, lr=1e-2)
    train(held, x, y, epochs=30, batch_size=20, lr=1e-2, proximal_mu=1e3)
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
        train(model, x, y, epochs=5, steps=3, batch_size=20, lr=1e-3)
    finally:
        torch.optim.Adam.step = orig
    assert len(opt_steps) == 3


def test_fedamp_sends_cloud_models_and_lambda_over_alpha():
    strategy, model = setup_strategy("fedamp")
    init = ArrayRecord(model.state_dict())
    strategy._ensure_models(init)
    gen = torch.Generator().manual_seed(1)
    strategy.models = strategy.models + 0.05 * torch.randn(strategy.models.shape, generator=gen)
    strategy.sigma = 1.0
    strategy.alpha_k = 0.01  # rows stay below 1: a real convex mix with xi_ii > 0
    messages = list(strategy.configure_train(31, init, ConfigRecord(), LocalGrid()))
    alpha = 0.01 * 0.1  # decayed once after 30 rounds
    params = strategy.models[:, : strategy.layout.num_params].double()
    xi = fedamp_weights(params, alpha, 1.0)
    assert (xi.diagonal() > 0).all()
    expected = (xi.float() @ strategy.models)
    by_node = {m.metadata.dst_node_id: m for m in messages}
    for row, cid in enumerate(strategy.client_ids):
        node = next(n for n, i in strategy.tracker.clients.items() if i.client_id == cid)
        msg = by_node[node]
        got = strategy.layout.flatten(msg.content["arrays"])
        assert torch.allclose(got, expected[row], atol=1e-6)
        assert msg.content["config"]["proximal-mu"] == pytest.approx(1.0 / alpha)
    assert strategy.history.xi[31][0] == pytest.approx(xi[0].tolist())
