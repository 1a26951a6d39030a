"""``graph = "inferred"``: Panacea's client graph built from the clients' warm-up updates.

Unit: the k-nearest-neighbour graph of update vectors by cosine similarity, on vectors
worked by hand and on well-separated groups; the edges' precision and recall. App: the
new keys' errors; a run's inferred graph is the one it writes, the one its checkpoint
holds and the one it keeps after a resume; a members run infers one over their names.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tasks
from experiments import graph_picture
from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.server.results import checkpoint_files
from fedamp_flwr.server_app import run_setup
from tasks.graphs import cosine_knn_graph, edge_agreement, read_edge_list

from .helpers import member_sites, run_named


def test_the_nearest_neighbours_by_cosine_worked_by_hand():
    updates = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    # cosines: 0~1 0.994, 2~3 0.994, 0~3 0.110, 1~3 0.215, 1~2 0.110, 0~2 0
    adj = cosine_knn_graph(updates, 1)
    assert adj.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]
    adj2 = cosine_knn_graph(updates, 2)  # each client's second choice: 0->3, 1->3, 2->1, 3->1
    assert {tuple(e) for e in np.argwhere(np.triu(adj2, 1))} == {(0, 1), (0, 3), (1, 2),
                                                                 (1, 3), (2, 3)}


def test_a_client_that_never_trained_has_no_edges():
    updates = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 0.0], [-1.0, 0.2]])
    adj = cosine_knn_graph(updates, 1)
    assert adj[2].sum() == 0 and adj[:, 2].sum() == 0  # chooses no one, chosen by no one
    assert adj[0, 1] == adj[1, 0] == 1
    # client 3 points away from everyone, yet chooses among those that trained (client 1)
    assert adj[3].tolist() == [0, 1, 0, 0]
    # 7 of 10 untrained (fraction-train < 1 in the warm-up): they stay out of the graph
    many = np.zeros((10, 3))
    many[:3] = np.eye(3)
    assert cosine_knn_graph(many, 2)[3:].sum() == 0


def test_well_separated_groups_give_edges_within_groups():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(5), 6)
    centres = rng.normal(size=(5, 200))
    updates = centres[groups] + 0.3 * rng.normal(size=(30, 200))
    adj = cosine_knn_graph(updates, 3)
    truth = (groups[:, None] == groups[None, :]).astype(np.float32)
    np.fill_diagonal(truth, 0)
    agreement = edge_agreement(adj, truth)
    assert agreement["precision"] == 1.0  # every edge within a group
    assert agreement["recall"] > 0.5


def test_edge_agreement_worked_by_hand():
    found = np.zeros((4, 4))
    truth = np.zeros((4, 4))
    for a, b in [(0, 1), (2, 3)]:
        found[a, b] = found[b, a] = 1
    for a, b in [(0, 1), (1, 2), (1, 3)]:
        truth[a, b] = truth[b, a] = 1
    assert edge_agreement(found, truth) == {"edges": 2, "true_edges": 3, "common": 1,
                                            "precision": 0.5, "recall": 1 / 3}


@pytest.mark.parametrize("override, words", [
    ({"graph-k": 0}, "'graph-k' = 0 is invalid; allowed: an integer >= 1"),
    ({"graph-warmup-rounds": 0}, "'graph-warmup-rounds' = 0 is invalid; allowed: an integer >= 1"),
    ({"graph-warmup-rounds": 5, "num-server-rounds": 5},
     "'graph-warmup-rounds' = 5 is invalid; allowed: fewer than num-server-rounds (5)"),
])
def test_the_new_keys_get_one_clear_line(override, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_run_config({"strategy": "panacea", "graph": "inferred", **override})


def test_more_neighbours_than_clients_is_refused_before_any_round():
    cfg = RunConfig.from_run_config({"strategy": "panacea", "graph": "inferred", "graph-k": 6})
    with pytest.raises(ConfigError, match=r"'graph-k' = 6 is invalid; allowed: auto, or an "
                                          r"integer in \[1, 5\] \(the run has 6 clients\)"):
        run_setup(cfg, 6, ["w"])


def _graph_of(path) -> set[tuple[str, str]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "u,v"
    return {tuple(line.split(",")) for line in lines[1:]}  # type: ignore[misc]


@pytest.mark.slow
def test_the_graph_written_is_the_one_used_and_measured_against_the_groups(tmp_path):
    n = 10  # synthetic practical: groups of same-distribution clients
    metrics = run_named(tmp_path, "run", {"strategy": "panacea", "graph": "inferred",
                                          "graph-k": 2, "graph-warmup-rounds": 1,
                                          "graph-guard-rounds": 0,
                                          "num-server-rounds": 2, "local-epochs": 1}, n)
    note = metrics["inferred_graph"]
    assert note["round"] == 1 and note["k"] == 2 and note["untrained_clients"] == []
    written = _graph_of(tmp_path / "run" / "graph-inferred.csv")
    assert written == {(str(u), str(v)) for u, v in note["edges"]}
    # the graph GH was built on (the checkpoint's) is the file's
    state = torch.load(checkpoint_files(tmp_path / "run")[0], weights_only=True)
    used = state["strategy"]["inferred_adjacency"].numpy()
    assert np.array_equal(used, read_edge_list(tmp_path / "run" / "graph-inferred.csv", n))
    # measured against the setting's groups, as the log says
    groups = np.array(tasks.client_groups("synthetic", "practical", n))
    truth = (groups[:, None] == groups[None, :]).astype(np.float32)
    np.fill_diagonal(truth, 0)
    assert note["against_truth"] == edge_agreement(used, truth)
    assert len(metrics["rounds"][1]["trained_clients"]) == n  # Panacea trained on it in round 2
    # the docs' picture of it: the truth, the inferred graph, their agreement
    picture = graph_picture.draw([tmp_path / "run"], tmp_path / "inferred.png")
    assert picture.stat().st_size > 1000


def test_a_members_run_infers_a_graph_over_their_names(tmp_path):
    n = 4
    members_config, nodes = member_sites(tmp_path / "sites", "synthetic", n)
    metrics = run_named(tmp_path, "members", {
        **members_config, "strategy": "panacea", "graph": "inferred", "graph-k": 1,
        "graph-guard-rounds": 0,
        "graph-warmup-rounds": 1, "local-epochs": 1}, n, nodes)
    assert metrics["finished"] and "against_truth" not in metrics["inferred_graph"]
    names = set(metrics["client_names"])
    written = _graph_of(tmp_path / "members" / "graph-inferred.csv")
    assert written and all(u in names and v in names for u, v in written)
    assert json.loads((tmp_path / "members" / "metrics.json").read_text())["finished"]


def test_the_signal_study_scores_each_signal_length_k_and_similarity(tmp_path):
    from experiments.graph_signal import Spy, plot, table

    groups = np.repeat(np.arange(3), 4)
    truth = (groups[:, None] == groups[None, :]).astype(np.float32)
    np.fill_diagonal(truth, 0)
    centres = np.random.default_rng(0).normal(size=(3, 8))
    warm, hn = Spy(), Spy()
    warm.truth = truth
    warm.updates = [centres[groups] + 0.01 * r for r in range(2)]  # two rounds, clean groups
    hn.models = hn.updates = [np.random.default_rng(r).normal(size=(12, 8)) for r in range(2)]
    rows = table(warm, hn, [2, 3])
    assert len(rows) == 2 * 2 * 2 + 2 * 2 * 2 * 2  # warm-up: W x k x sim; pFedHN: 2 signals
    clean = [r for r in rows if r["signal"] == "warm-up updates" and r["k"] == 3]
    assert all(r["precision"] == 1.0 and r["recall"] == 1.0 for r in clean)
    assert all(r["chance"] == pytest.approx(18 / 66) for r in rows)  # 3 x 6 edges of 66 pairs
    plot(rows, "groups", tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
