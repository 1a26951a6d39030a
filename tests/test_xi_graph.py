"""FedAMP's weights as a client graph: the k-nearest-neighbour graph of xi, written as the
edge list that Panacea's ``graph = "file"`` reads (``fedamp-flwr xi-graph``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedamp_flwr.server.results import load_xi
from fedamp_flwr.tools import cli
from fedamp_flwr.tools.inprocess import run_inprocess
from tasks.graphs import GraphError, build_graph, knn_graph


def test_knn_graph_worked_by_hand():
    xi = np.array([[0.5, 0.3, 0.1, 0.1],
                   [0.2, 0.5, 0.2, 0.1],
                   [0.0, 0.1, 0.6, 0.3],
                   [0.1, 0.1, 0.4, 0.4]])
    # k = 1: 0 -> 1, 1 -> 0 (a tie with 2: the lower id), 2 -> 3, 3 -> 2
    assert knn_graph(xi, 1).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]
    two = knn_graph(xi, 2)  # 0 -> 1, 2 or 3 (tie: 2); 1 -> 0, 2; 2 -> 3, 1; 3 -> 2, 0
    assert two.tolist() == [[0, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 1], [1, 0, 1, 0]]
    assert (two == two.T).all() and not two.diagonal().any()
    for k in (0, 4):
        with pytest.raises(GraphError, match="1 <= k < n"):
            knn_graph(xi, k)


def test_well_separated_groups_give_edges_within_groups():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(3), 4)
    xi = np.where(groups[:, None] == groups[None, :], 0.2, 0.001) + 1e-4 * rng.random((12, 12))
    adj = knn_graph(xi, 3)
    u, v = np.nonzero(adj)
    assert len(u) > 0 and (groups[u] == groups[v]).all()


@pytest.mark.slow
def test_a_fedamp_runs_weights_seed_a_panacea_run(tmp_path, capsys):
    common = {"results-dir": str(tmp_path), "server-device": "cpu", "min-nodes": 10,
              "local-epochs": 1, "save-models": "none"}
    run_inprocess({**common, "strategy": "fedamp", "run-name": "amp", "num-server-rounds": 3}, 10)
    out = tmp_path / "graph.csv"
    assert cli.main(["xi-graph", str(tmp_path / "amp"), "--k", "2", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "of round 3" in said and f"graph-file='{out}'" in said
    ids, rounds = load_xi(tmp_path / "amp")
    want = knn_graph(rounds[3].astype(np.float64), 2)
    assert (build_graph("file", 10, graph_file=str(out)) == want).all()  # the graph written
    run_inprocess({**common, "strategy": "panacea", "run-name": "pan", "graph": "file",
                   "graph-file": str(out), "num-server-rounds": 1}, 10)
    metrics = json.loads((tmp_path / "pan" / "metrics.json").read_text())
    assert metrics["finished"] and metrics["rounds"][0]["trained_clients"] == list(range(10))
    assert cli.main(["xi-graph", str(tmp_path / "amp"), "--round", "9"]) == 1
    assert "has no weights of round 9" in capsys.readouterr().err


def test_a_members_graph_names_the_members(tmp_path):
    from fedamp_flwr.server.results import XiFiles

    names = ["site-a", "site-b", "site-c", "site-d"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text(json.dumps({"client_names": names}))
    import torch

    xi = torch.tensor([[0.6, 0.3, 0.05, 0.05], [0.3, 0.6, 0.05, 0.05],
                       [0.05, 0.05, 0.6, 0.3], [0.05, 0.05, 0.3, 0.6]])
    XiFiles(tmp_path / "run", 1, "float32", 2)(2, [0, 1, 2, 3], xi)
    out = tmp_path / "members.csv"
    assert cli.main(["xi-graph", str(tmp_path / "run"), "--k", "1", "--out", str(out)]) == 0
    assert out.read_text().splitlines() == ["u,v", "site-a,site-b", "site-c,site-d"]
    adj = build_graph("file", 4, graph_file=str(out), names=names)
    assert adj.tolist() == knn_graph(xi.numpy(), 1).tolist()
