"""Panacea's hypernetwork, server step, graph loss and graphs; fl60, tpt48 and npz data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tasks
from strategies.hypernetwork import (
    GraphHyperNetwork,
    graph_reconstruction_loss,
    normalized_adjacency,
    sample_pairs,
    server_step,
)
from tasks.federated import fl60_oracle_accuracy, load_npz, load_tpt48, make_fl60
from tasks.graphs import GraphError, build_graph, group_graph, validate_adjacency

from .helpers import needs_data

SIZES = [6 * 4, 4, 4 * 2, 2]  # an MLP 6-4-2: weight, bias, weight, bias


def _hnet(n=5, generator=True, gnn_layers=3):
    torch.manual_seed(0)
    return GraphHyperNetwork(n, SIZES, embed_dim=8, gnn_layers=gnn_layers, hidden=16,
                             mlp_layers=3, generator=generator)


def _ring(n):
    adj = torch.zeros(n, n)
    for i in range(n):
        adj[i, (i + 1) % n] = adj[(i + 1) % n, i] = 1.0
    return adj


def test_hypernetwork_shapes_and_parameter_groups():
    hnet = _hnet()
    prop = normalized_adjacency(_ring(5))
    theta = hnet(prop, torch.tensor([0, 3]))
    assert theta.shape == (2, sum(SIZES))
    assert len(hnet.heads) == len(SIZES)
    assert [h.out_features for h in hnet.heads] == SIZES
    assert len(hnet.encoder) == 3 and hnet.encode(prop).shape == (5, 16)
    psi_e = {id(p) for p in hnet.encoder_parameters()}
    assert id(hnet.embeddings.weight) in psi_e
    assert not psi_e & {id(p) for p in hnet.mlp.parameters()}
    pfedhn = _hnet(generator=False, gnn_layers=0)
    assert pfedhn.generator is None and len(pfedhn.encoder) == 0
    assert torch.equal(pfedhn.encode(None), pfedhn.embeddings.weight)


def test_normalized_adjacency_by_hand():
    # path 0-1: A + I = [[1,1],[1,1]], degrees 2 -> every entry 1/2
    prop = normalized_adjacency(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    assert torch.allclose(prop, torch.full((2, 2), 0.5))


@pytest.mark.parametrize("generator", [True, False])
def test_server_step_moves_toward_trained(generator):
    hnet = _hnet(generator=generator)
    adj = _ring(5)
    prop = normalized_adjacency(adj)
    rows = torch.tensor([1, 2, 4])
    with torch.no_grad():
        sent = hnet(prop, rows)
    trained = sent + 0.1 * torch.randn(sent.shape, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(hnet.parameters(), lr=0.01)
    pairs = sample_pairs(adj, torch.Generator().manual_seed(0)) if generator else None
    before = 0.5 * float(((sent - trained) ** 2).sum()) / len(rows)
    reported = server_step(hnet, opt, prop, rows, trained, adj, 0.0, pairs)
    assert reported == pytest.approx(before, rel=1e-5)
    with torch.no_grad():
        after = hnet(prop, rows)
    assert float(((after - trained) ** 2).sum()) < float(((sent - trained) ** 2).sum())
    # the step follows the gradient of 1/2 ||theta - trained||^2 (a descent direction)
    cos = torch.nn.functional.cosine_similarity((after - sent).flatten(), (trained - sent).flatten(), 0)
    assert cos > 0


@pytest.mark.parametrize("generator", [True, False])
def test_server_step_uses_autograd_grad_with_the_residual(generator):
    """The heads' backward written out (:func:`head_gradients`) gives autograd's gradient
    of the mean of 1/2 ||theta - trained||^2 (+ lambda_d L_d on psi_e), in float64 to
    1e-10 (sums in another order), on a subset of rows; the model loss it reports is
    that mean."""
    adj = _ring(5).double()
    prop = normalized_adjacency(adj).double()
    rows = torch.tensor([4, 0, 2])
    pairs = sample_pairs(adj, torch.Generator().manual_seed(0))
    hnet, hnet_ref = _hnet(generator=generator).double(), _hnet(generator=generator).double()
    trained = torch.randn(3, sum(SIZES), generator=torch.Generator().manual_seed(2),
                          dtype=torch.float64)
    theta = hnet_ref(prop, rows)
    model = 0.5 * ((theta - trained) ** 2).sum() / len(rows)
    loss = model + (0.3 * graph_reconstruction_loss(hnet_ref.generator(hnet_ref.encode(prop)),
                                                     adj, pairs) if generator else 0.0)
    # the graph term reaches psi_e only: its gradient is added there, by hand
    psi_e = {id(p) for p in hnet_ref.encoder_parameters()}
    model_grads = torch.autograd.grad(model, list(hnet_ref.parameters()), allow_unused=True,
                                      retain_graph=True)
    all_grads = torch.autograd.grad(loss, list(hnet_ref.parameters()), allow_unused=True)
    expected = {}
    for (name, p), g_model, g_all in zip(hnet_ref.named_parameters(), model_grads, all_grads):
        g = g_all if id(p) in psi_e else g_model
        expected[name] = p - 0.1 * (torch.zeros_like(p) if g is None else g)
    losses: dict[str, float] = {}
    reported = server_step(hnet, torch.optim.SGD(hnet.parameters(), lr=0.1), prop, rows,
                           trained, adj, 0.3, pairs, losses=losses)
    assert reported == pytest.approx(float(model), rel=1e-12) and losses["model"] == reported
    for name, p in hnet.named_parameters():
        assert torch.allclose(p, expected[name], rtol=0, atol=1e-10), name
    assert set(losses) == ({"model", "graph"} if generator else {"model"})


def test_server_step_with_m_and_e_frozen_moves_the_heads_and_refuses_a_wrong_width():
    """Only the heads trainable (nothing for autograd to take back: the step still runs, as
    plain autograd's did), and trained models of another width than the heads make refused."""
    hnet = _hnet(generator=False)
    for p in [*hnet.embeddings.parameters(), *hnet.encoder.parameters(), *hnet.mlp.parameters()]:
        p.requires_grad_(False)
    prop = normalized_adjacency(_ring(5))
    rows = torch.tensor([0, 3])
    heads = [h.weight.detach().clone() for h in hnet.heads]
    frozen = hnet.embeddings.weight.detach().clone()
    opt = torch.optim.SGD([p for p in hnet.parameters() if p.requires_grad], lr=0.1)
    server_step(hnet, opt, prop, rows, torch.ones(2, sum(SIZES)))
    assert all(not torch.equal(h.weight, w) for h, w in zip(hnet.heads, heads))
    assert torch.equal(hnet.embeddings.weight, frozen)
    with pytest.raises(ValueError, match="shape"):
        server_step(hnet, opt, prop, rows, torch.ones(2, sum(SIZES) + 1))


def test_graph_loss_on_a_tiny_graph_by_hand():
    f = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    adj = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    pairs = torch.tensor([[0, 1], [0, 2], [1, 2]])
    # scores f_u.f_v: 1 (edge), 0 (no edge), 2 (no edge)
    s = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = (-math.log(s(1.0)) - math.log(1 - s(0.0)) - math.log(1 - s(2.0))) / 3
    assert graph_reconstruction_loss(f, adj, pairs).item() == pytest.approx(expected, rel=1e-6)


def test_sample_pairs_balances_edges_and_non_edges():
    adj = _ring(10)
    pairs = sample_pairs(adj, torch.Generator().manual_seed(0))
    labels = adj[pairs[:, 0], pairs[:, 1]]
    assert int(labels.sum()) == 10 and len(pairs) == 20
    assert (pairs[:, 0] != pairs[:, 1]).all()


def test_graph_validation_errors(tmp_path):
    with pytest.raises(GraphError, match="not symmetric"):
        validate_adjacency(np.array([[0, 1], [0, 0]]), 2, "x")
    with pytest.raises(GraphError, match=r"\(3, 3\), the run has 2 clients"):
        validate_adjacency(np.zeros((3, 3)), 2, "x")
    edges = tmp_path / "g.csv"
    edges.write_text("u,v\n0,1\n1,7\n")
    with pytest.raises(GraphError, match="names client 7"):
        build_graph("file", 3, graph_file=str(edges))
    edges.write_text("u,v\n0,1\n1,2\n")
    assert build_graph("file", 3, graph_file=str(edges)).tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    with pytest.raises(GraphError, match="defines no graph"):
        build_graph("task", 3, None, dataset="mnist")
    assert group_graph(10)[0].tolist() == [0, 1] + [0] * 8
    assert build_graph("none", 3) is None
    with pytest.raises(GraphError, match="no edges with 3 clients"):
        build_graph("groups", 3)


def test_fl60_is_seeded_symmetric_and_has_an_oracle_ceiling():
    a, b = make_fl60(60, seed=3), make_fl60(60, seed=3)
    assert np.array_equal(a.adjacency, b.adjacency) and np.array_equal(a.train[5].x, b.train[5].x)
    assert np.array_equal(a.adjacency, a.adjacency.T) and a.adjacency.diagonal().sum() == 0
    assert len(a.train) == 60 and len(a.train[0].y) == 80 and len(a.test[0].y) == 20
    assert 0.6 < fl60_oracle_accuracy(a) < 0.8  # unit noise: the classes overlap
    assert fl60_oracle_accuracy(make_fl60(60, seed=3, noise_std=0.1)) > 0.93
    assert make_fl60(7, seed=0).num_clients == 7


def test_tpt48_real_files():
    fed = load_tpt48(needs_data("tpt48"))
    assert fed.num_clients == 48 and fed.names[0] == "AL"
    assert int(fed.adjacency.sum()) // 2 == 105
    assert fed.train[0].x.shape == (106, 6) and fed.test[0].y.shape == (27, 6)
    allx = np.concatenate([s.x for s in fed.train + fed.test])
    assert allx.min() >= 0.0 and allx.max() <= 1.0


def test_npz_loading_and_refusals(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    x, y, client = rng.normal(size=(60, 3)), rng.integers(0, 3, 60), np.repeat(np.arange(3), 20)
    adj = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float)
    np.savez(path, x=x, y=y, client=client, adjacency=adj)
    fed = load_npz(path)
    assert fed.num_clients == 3 and len(fed.train[0].y) == 16 and len(fed.test[0].y) == 4
    info = tasks.data_info(tasks.DataConfig("npz", str(path), 3, 0))
    assert info.kind == "classification" and info.num_outputs == 3 and info.input_shape == (3,)
    np.savez(path, x=x, y=y.astype(float), client=client)
    assert load_npz(path).train[0].y.dtype == np.float32
    np.savez(path, x=x, client=client)
    with pytest.raises(ValueError, match=r"missing key\(s\) \['y'\]"):
        load_npz(path)
    np.savez(path, x=x, y=y[:50], client=client)
    with pytest.raises(ValueError, match="inconsistent lengths"):
        load_npz(path)
    np.savez(path, x=x, y=np.array([object()] * 60, dtype=object), client=client)
    with pytest.raises(ValueError):
        load_npz(path)  # object arrays need pickle, which is refused


def test_panacea_hypernetwork_fits_325_clients_on_the_cpu():
    data = np.load(needs_data("sensor_graphs") / "pems_bay_adjacency.npz")
    adj = np.maximum(data["adjacency"], data["adjacency"].T)  # the raw graph is directed
    adj = torch.from_numpy(validate_adjacency(adj, 325, "pems-bay"))
    hnet = GraphHyperNetwork(325, [12 * 64, 64, 64 * 64, 64, 64 * 12, 12])  # paper sizes
    prop = normalized_adjacency(adj)
    rows = torch.arange(0, 325, 5)
    with torch.no_grad():
        sent = hnet(prop, rows)
    opt = torch.optim.SGD(hnet.parameters(), lr=0.01, momentum=0.9)
    pairs = sample_pairs(adj, torch.Generator().manual_seed(0))
    first = server_step(hnet, opt, prop, rows, sent + 0.01, adj, 1.0, pairs)
    second = server_step(hnet, opt, prop, rows, sent + 0.01, adj, 1.0, pairs)
    assert math.isfinite(second) and second < first


def test_fl60_grda_is_the_sources_spiral_and_separable():
    from tasks.federated import make_fl60_grda

    a, b = make_fl60_grda(60, seed=1), make_fl60_grda(60, seed=1)
    assert np.array_equal(a.adjacency, b.adjacency) and np.array_equal(a.train[3].x, b.train[3].x)
    assert len(a.train[0].y) + len(a.test[0].y) == 100 and len(a.test[0].y) == 20
    mu1 = a.extras["mu1"]  # the class-1 means: -m_t, |m_t| = 1 + 6 a_t / (2 pi) in [1, 7]
    radius = np.linalg.norm(mu1, axis=1)
    assert radius.min() >= 1.0 and radius.max() <= 7.0
    angles = np.mod(np.arctan2(-mu1[:, 1], -mu1[:, 0]), 2 * np.pi)
    assert np.allclose(radius, 1 + 6 * angles / (2 * np.pi))
    for t in range(5):  # every point within distance 1 of its class mean
        pts = np.concatenate([a.train[t].x, a.test[t].x])
        labels = np.concatenate([a.train[t].y, a.test[t].y])
        centers = np.where(labels[:, None] == 1, mu1[t], -mu1[t])
        assert (np.linalg.norm(pts - centers, axis=1) <= 1 + 1e-6).all()
        assert (labels == 0).sum() == 50
    cos = np.cos(angles[:, None] - angles[None, :])
    assert (cos[a.adjacency > 0] >= 0.2).all() and a.adjacency.sum() > 0
    assert fl60_oracle_accuracy(a) == 1.0  # the Bayes ceiling of this variant


def test_tpt48_random_split_is_seeded_and_differs_from_the_time_split():
    folder = needs_data("tpt48")
    time_split, r1, r2 = (load_tpt48(folder, "time"), load_tpt48(folder, "random", 3),
                          load_tpt48(folder, "random", 3))
    assert np.array_equal(r1.test[5].y, r2.test[5].y)
    assert r1.train[0].x.shape == time_split.train[0].x.shape == (106, 6)
    assert not np.array_equal(r1.test[0].x, time_split.test[0].x)
    with pytest.raises(ValueError, match="allowed: time, random"):
        load_tpt48(folder, "weekly")


def test_pfedhn_takes_its_reference_trainers_settings_unless_told_otherwise():
    from fedamp_flwr.config import RunConfig
    from strategies.panacea import PFEDHN_REFERENCE

    cfg = RunConfig.from_run_config({"strategy": "pfedhn"})
    for key, value in PFEDHN_REFERENCE.items():
        assert cfg.value(key) == value, key
    assert RunConfig.from_run_config({"strategy": "pfedhn", "panacea-client-lr": 0.2}
                                     ).settings.panacea_client_lr == 0.2
    panacea = RunConfig.from_run_config({"strategy": "panacea"})
    assert panacea.settings.panacea_client_clip == 0.0 and panacea.local_steps == 0


def test_server_step_clips_the_hypernetwork_gradient():
    hnet, ref = _hnet(generator=False), _hnet(generator=False)
    prop = normalized_adjacency(_ring(5))
    rows = torch.tensor([0, 1])
    trained = torch.full((2, sum(SIZES)), 100.0)  # a far target: a large gradient
    opt, ref_opt = (torch.optim.SGD(h.parameters(), lr=0.1) for h in (hnet, ref))
    before = [p.detach().clone() for p in hnet.parameters()]
    server_step(hnet, opt, prop, rows, trained, clip_norm=1.0)
    server_step(ref, ref_opt, prop, rows, trained)
    with torch.no_grad():
        moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(hnet.parameters(), before)))
        ref_moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(ref.parameters(), before)))
    assert float(moved) == pytest.approx(0.1, rel=1e-4)  # lr x the clipped norm
    assert float(ref_moved) > 1.0
