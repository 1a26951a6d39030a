"""The baselines and scenarios: pure functions by hand, and every strategy for 2 rounds.

The 2-round runs call the real ServerApp ``main`` on the in-process grid of
``tests/conftest.py`` (the real ClientApp functions, each node with its own
``Context`` and so its ``context.state`` across rounds, as Flower does).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MessageType

import strategies
from strategies.apfl import mix_parameters
from strategies.nonconvex import nonconvex_weights
from strategies.scaffold import mean_gradient, update_control
from tasks.models import MLP
from tasks.scenarios import Roles, scenario_roles
from tasks.train import num_steps, train

from .helpers import run_local, setup_strategy

NEW = ["separate", "fedavg-ft", "fedprox-ft", "scaffold", "apfl", "nonconvex", "per-fedavg",
       "pfedme", "fedmedian", "fedtrimmedavg", "krum"]


@pytest.mark.parametrize("name", NEW)
def test_every_baseline_runs_two_rounds_on_the_default_task(tmp_path, name):
    m, grid = run_local(tmp_path, name)
    assert m["strategy"] == name and [r["round"] for r in m["rounds"]] == [1, 2]
    for r in m["rounds"]:
        assert r["trained_clients"] == [0, 1, 2]
        assert len(r["client_accuracy"]) == 3 and 0 <= r["mean_accuracy"] <= 1
    assert 0 <= m["bmta"] <= 100
    states = [ctx.state for ctx in grid.contexts.values()]
    train_cfgs = grid.sent_configs(MessageType.TRAIN)
    eval_cfgs = grid.sent_configs(MessageType.EVALUATE)
    # every message names the client half its strategy's module registers
    updates = {"scaffold": ("scaffold", "scaffold"), "apfl": ("apfl", "apfl"),
               "per-fedavg": ("per-fedavg", "per-fedavg"), "pfedme": ("pfedme", "pfedme"),
               "fedavg-ft": ("local", "finetune"), "fedprox-ft": ("proximal", "finetune")}
    train_update, eval_update = updates.get(name, ("local", "local"))
    assert {c["client-update"] for c in train_cfgs} == {train_update}
    assert {c["client-update"] for c in eval_cfgs} == {eval_update}
    if name == "scaffold":
        assert all("scaffold-control" in s.array_records for s in states)
        assert all("control" in msg.content.array_records for msg in grid.sent
                   if msg.metadata.message_type == MessageType.TRAIN)
    if name == "apfl":
        assert all("apfl-local" in s.array_records for s in states)
        assert all(c["apfl-alpha"] == 0.5 for c in train_cfgs + eval_cfgs)
    if name == "per-fedavg":
        assert all(c["per-fedavg-alpha"] == 0.01 for c in train_cfgs + eval_cfgs)
    if name == "pfedme":
        assert all("pfedme-personal" in s.array_records for s in states)
    if name.endswith("-ft"):
        assert eval_cfgs and all(c["finetune-epochs"] == 1 for c in eval_cfgs)


def test_fine_tuning_changes_what_fedavg_clients_are_tested_on(tmp_path):
    plain, _ = run_local(tmp_path / "a", "fedavg", **{"finetune-epochs": 3})
    tuned, _ = run_local(tmp_path / "b", "fedavg-ft", **{"finetune-epochs": 3})
    # same training (all clients, same seeds); only the evaluation fine-tunes
    assert plain["rounds"][0]["train_loss"] == pytest.approx(tuned["rounds"][0]["train_loss"])
    assert tuned["rounds"][-1]["mean_accuracy"] > plain["rounds"][-1]["mean_accuracy"]


def test_drop_rate_and_heterogeneous_epochs_reach_the_clients(tmp_path):
    m, grid = run_local(tmp_path, "fedamp", n=5, **{"drop-rate": 0.4, "heterogeneous-epochs": True,
                                                      "local-epochs": 3})
    for r in m["rounds"]:
        assert len(r["trained_clients"]) == 3  # 2 of 5 drop out each round
    epochs = {msg.content["config"]["local-epochs"] for msg in grid.sent
              if msg.metadata.message_type == MessageType.TRAIN}
    assert epochs <= {1, 2, 3, 4, 5} and len(epochs) > 1


def test_drop_rate_applies_to_flower_strategies_too(tmp_path):
    m, _ = run_local(tmp_path, "fedavg", n=4, **{"drop-rate": 0.5})
    assert all(len(r["trained_clients"]) == 2 for r in m["rounds"])


# ---------------------------------------------------------------------------
# Pure functions, against values worked by hand
# ---------------------------------------------------------------------------
def test_nonconvex_weights_by_hand():
    # shares r = (0.25, 0.75); c = 2: exp(0.5), exp(1.5), as written (not summing to 1)
    e = np.exp([0.5, 1.5])
    assert nonconvex_weights(np.array([100, 300]), c=2.0) == pytest.approx(e)
    assert nonconvex_weights(np.array([100, 300]), c=2.0, normalize=True) == pytest.approx(e / e.sum())
    assert nonconvex_weights(np.array([100, 300]), c=0.0) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError):
        nonconvex_weights(np.array([0, 0]), c=1.0)


def test_nonconvex_combination_is_the_weighted_sum_as_written():
    from flwr.app import ArrayRecord, ConfigRecord

    from .helpers import LocalGrid, client_infos, reply

    for normalize in (False, True):
        strategy, model = setup_strategy("nonconvex", n=2, **{"nonconvex-c": 2.0,
                                                               "nonconvex-normalize": normalize})
        strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(),
                                 LocalGrid(infos=client_infos(2)))
        ones = {k: torch.full_like(v, 0.01) for k, v in model.state_dict().items()}
        twos = {k: torch.full_like(v, 0.02) for k, v in model.state_dict().items()}
        arrays, _ = strategy.aggregate_train(1, [reply(10, ones, {"num-examples": 1}),
                                                 reply(11, twos, {"num-examples": 3})])
        a, b = np.exp([0.5, 1.5])  # shares 1/4, 3/4
        expected = (a * 0.01 + b * 0.02) / ((a + b) if normalize else 1.0)
        for arr in arrays.values():
            assert np.allclose(arr.numpy(), expected, rtol=1e-6)


def test_scaffold_server_control_update_by_hand():
    c = torch.tensor([1.0, 2.0])
    deltas = torch.tensor([[0.5, 1.0], [1.5, -3.0]])
    # c + (1/N) sum_i delta_i with N = 4 clients in all (2 sampled)
    assert torch.allclose(update_control(c, deltas, 4), torch.tensor([1.5, 1.5]))


def test_grad_correction_shifts_an_sgd_step_by_lr_times_the_correction():
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    torch.manual_seed(0)
    a = MLP(3, 2, (4,))
    b = MLP(3, 2, (4,))
    b.load_state_dict(a.state_dict())
    corr = [torch.full_like(p, 0.5) for p in b.parameters()]
    train(a, x, y, epochs=1, batch_size=8, learning_rate=0.1, optimizer="sgd")
    train(b, x, y, epochs=1, batch_size=8, learning_rate=0.1, optimizer="sgd", grad_correction=corr)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pb, pa - 0.05, atol=1e-6)


def test_mean_gradient_equals_the_full_batch_gradient():
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    model = MLP(3, 2, (4,))
    full = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y),
                               list(model.parameters()))
    for g, f in zip(mean_gradient(model, x, y, batch_size=3), full):
        assert torch.allclose(g, f, atol=1e-6)
    assert num_steps(10, 3, epochs=2) == 8 and num_steps(10, 3, epochs=2, steps=5) == 5


def test_apfl_mixture_by_hand():
    v, w = MLP(2, 2, ()), MLP(2, 2, ())
    with torch.no_grad():
        for p in v.parameters():
            p.fill_(1.0)
        for p in w.parameters():
            p.fill_(3.0)
    mixed = mix_parameters(v, w, alpha=0.25)  # 0.25 * 1 + 0.75 * 3 = 2.5
    assert all(torch.allclose(t, torch.full_like(t, 2.5)) for t in mixed.values())


def test_scenario_draws_are_seeded_and_in_range():
    roles = scenario_roles(10, seed=3, drop_rate=0.3, heterogeneous_epochs=True)
    kept = roles.participants(1, list(range(10)))
    assert len(kept) == 7 and kept == roles.participants(1, list(range(10)))
    assert roles.participants(1, [4]) == [4]  # somebody always trains
    draws = [roles.local_units(r, c, 10) for r in range(30) for c in range(10)]
    assert min(draws) >= 1 and max(draws) <= 19 and 8.5 < np.mean(draws) < 11.5
    assert Roles(frozenset(), frozenset()).local_units(1, 1, 10) == 10


def test_strategy_registry_has_every_baseline():
    assert set(NEW) | {"fedavg", "fedprox", "fedamp", "heurfedamp", "panacea"} <= set(
        strategies.STRATEGIES)


def test_client_config_only_copies_when_epochs_vary():
    strategy, _ = setup_strategy("separate")
    strategy.setup_tracking({}, Roles(frozenset(), frozenset(), heterogeneous_epochs=True, seed=1))
    cfg = ConfigRecord({"local-epochs": 10})
    own = strategy.tracker.scenario.client_config(3, 2, cfg)
    assert own is not cfg and 1 <= own["local-epochs"] <= 19 and cfg["local-epochs"] == 10


def test_pfedme_server_mixing_by_hand():
    from flwr.app import ArrayRecord

    from strategies.pfedme import pfedme_global

    old = ArrayRecord({"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([3])})
    avg = ArrayRecord({"w": torch.tensor([3.0, 0.0]), "n": torch.tensor([5])})
    out = pfedme_global(old, avg, beta=2.0)  # (1 - 2) * old + 2 * avg
    assert out["w"].numpy().tolist() == [5.0, -2.0] and out["n"].numpy().tolist() == [5]


def test_per_fedavg_first_order_step_by_hand():
    """One pair of batches, SGD: w <- w - lr * grad f(w - alpha grad f(w; D); D')."""
    from strategies.per_fedavg import train_per_fedavg

    torch.manual_seed(1)
    x, y = torch.randn(4, 2), torch.randint(0, 2, (4,))
    model = MLP(2, 2, ())
    w0 = [p.detach().clone() for p in model.parameters()]
    train_per_fedavg(model, x, y, alpha=0.5, epochs=1, batch_size=2, learning_rate=0.1,
                     optimizer="sgd", seed=3)
    order = torch.randperm(4, generator=torch.Generator().manual_seed(3))
    d, d2 = order[:2], order[2:]
    ref = MLP(2, 2, ())
    with torch.no_grad():
        for p, w in zip(ref.parameters(), w0):
            p.copy_(w)
    loss = torch.nn.functional.cross_entropy
    g = torch.autograd.grad(loss(ref(x[d]), y[d]), list(ref.parameters()))
    with torch.no_grad():
        for p, gi in zip(ref.parameters(), g):
            p.sub_(0.5 * gi)
    g2 = torch.autograd.grad(loss(ref(x[d2]), y[d2]), list(ref.parameters()))
    for p, w, gi in zip(model.parameters(), w0, g2):
        assert torch.allclose(p, w - 0.1 * gi, atol=1e-6)
