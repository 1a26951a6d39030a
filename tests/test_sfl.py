"""SFL (strategies/sfl.py): its smoothing worked by hand, its server half on hand-made
replies, its keys refused where it cannot run, and real rounds of the ServerApp."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedamp_flwr.config import ConfigError, RunConfig
from strategies.sfl import sfl_propagation

from .helpers import LocalGrid, client_infos, reply, run_local, setup_strategy

PATH = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])  # 0 - 1 - 2


def test_the_smoothing_is_the_row_normalised_graph_with_self_loops_to_the_k():
    # A + I = [[1,1,0],[1,1,1],[0,1,1]], rows / 2, 3, 2
    one = torch.tensor([[1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 2, 1 / 2]],
                       dtype=torch.float64)
    assert torch.allclose(sfl_propagation(PATH, 1.0, 1), one)
    # K = 2, alpha = 1/2: row 0 of A_hat^2 = 1/2 (1/2, 1/2, 0) + 1/2 (1/3, 1/3, 1/3)
    #   = (5/12, 5/12, 1/6); half of it plus half of (1, 0, 0) = (17/24, 5/24, 1/12)
    m = sfl_propagation(PATH, 0.5, 2)
    assert torch.allclose(m[0], torch.tensor([17 / 24, 5 / 24, 1 / 12], dtype=torch.float64))
    assert torch.allclose(m.sum(dim=1), torch.ones(3, dtype=torch.float64))  # convex rows
    # a weighted graph: weights, not edges, are normalised
    weighted = sfl_propagation(torch.tensor([[0.0, 3.0], [3.0, 0.0]]), 1.0, 1)
    assert torch.allclose(weighted[0], torch.tensor([1 / 4, 3 / 4], dtype=torch.float64))


def test_a_client_outside_the_mix_sends_nothing_and_an_empty_row_keeps_its_own():
    senders = torch.tensor([True, True, False])  # client 2 is novel: it never trained
    m = sfl_propagation(PATH, 1.0, 1, senders)
    assert torch.allclose(m, torch.tensor([[1 / 2, 1 / 2, 0], [1 / 2, 1 / 2, 0], [0, 1, 0]],
                                          dtype=torch.float64))
    alone = sfl_propagation(torch.zeros(2, 2), 1.0, 3, torch.tensor([True, False]))
    assert torch.equal(alone, torch.eye(2, dtype=torch.float64))


def _vector(strategy, model, value: float) -> dict:
    return {k: torch.full_like(v, value) for k, v in model.state_dict().items()}


def test_the_server_smooths_the_replies_and_every_client_trains_from_their_mean():
    strategy, model = setup_strategy("sfl", n=3, **{"sfl-layers": 1})
    strategy.adjacency = PATH.clone()
    init = ArrayRecord(model.state_dict())
    first = list(strategy.configure_train(1, init, ConfigRecord(), LocalGrid(infos=client_infos(3))))
    start = strategy.layout.flatten(init)
    for m in first:  # round 1: the mean of three initial models, the initial model
        assert torch.allclose(strategy.layout.flatten(m.content["arrays"]), start)
    replies = [reply(10 + i, _vector(strategy, model, float(v)), {"num-examples": 5})
               for i, v in enumerate((0.0, 0.6, 1.2))]
    strategy.aggregate_train(1, replies)
    p = strategy.layout.num_params
    # P = A_hat X: client 0 (0 + .6) / 2 = .3, client 1 (0 + .6 + 1.2) / 3 = .6, client 2 .9
    assert strategy.models[:, 0].tolist() == pytest.approx([0.3, 0.6, 0.9])
    assert torch.equal(strategy.evaluation_models(), strategy.models)  # tested on P_i
    second = list(strategy.configure_train(2, init, ConfigRecord(), LocalGrid(infos=client_infos(3))))
    for m in second:  # g = (.3 + .6 + .9) / 3 = .6 for everyone
        assert torch.allclose(strategy.layout.flatten(m.content["arrays"])[:p],
                              torch.full((p,), 0.6))


def test_with_train_from_own_each_client_trains_from_its_smoothed_model():
    strategy, model = setup_strategy("sfl", n=3, **{"sfl-layers": 1, "sfl-train-from": "own"})
    strategy.adjacency = PATH.clone()
    init = ArrayRecord(model.state_dict())
    strategy.configure_train(1, init, ConfigRecord(), LocalGrid(infos=client_infos(3)))
    strategy.aggregate_train(1, [reply(10 + i, _vector(strategy, model, float(v)),
                                       {"num-examples": 5}) for i, v in enumerate((0, 0.6, 1.2))])
    sent = {m.metadata.dst_node_id: strategy.layout.flatten(m.content["arrays"])[0]
            for m in strategy.configure_train(2, init, ConfigRecord(),
                                              LocalGrid(infos=client_infos(3)))}
    assert [float(sent[10 + i]) for i in range(3)] == pytest.approx([0.3, 0.6, 0.9])


@pytest.mark.parametrize("graph", ["none", "inferred"])
def test_sfl_without_a_given_graph_is_refused_before_any_work(graph):
    with pytest.raises(ConfigError, match=f"'graph' = '{graph}'.*allowed: task, file, groups"):
        RunConfig.from_run_config({"strategy": "sfl", "graph": graph})
    with pytest.raises(ConfigError, match="'sfl-alpha' = 1.5"):
        RunConfig.from_run_config({"strategy": "sfl", "sfl-alpha": 1.5})
    with pytest.raises(ConfigError, match="'sfl-train-from' = 'mine'"):
        RunConfig.from_run_config({"strategy": "sfl", "sfl-train-from": "mine"})


def test_sfl_runs_in_the_server_app_with_novel_clients(tmp_path):
    """Two real rounds on the default task's groups' graph, one of six clients novel: it
    never trains, and is tested on its neighbours' smoothed models."""
    metrics, _ = run_local(tmp_path, "sfl", n=6, graph="groups",
                           **{"novel-client-fraction": 0.2})
    assert metrics["finished"] and metrics["strategy"] == "sfl"
    (novel,) = metrics["novel_clients"]
    last = metrics["rounds"][-1]
    assert novel not in last["trained_clients"] and len(last["trained_clients"]) == 5
    assert str(novel) in last["client_accuracy"] or novel in last["client_accuracy"]
    assert 0.0 <= metrics["bmta"] <= 100.0 and "novel_bmta" in metrics
