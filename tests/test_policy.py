"""A collaboration policy (``collaboration-policy``): pairs of members kept apart never weigh
each other's models: FedAMP's and HeurFedAMP's xi between them is 0 in every round, a client
graph (given or inferred) has no edge between them, and a method that mixes everyone into a
shared model refuses the run."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import tasks
from fedamp_flwr.config import RunConfig
from fedamp_flwr.server_app import client_graph
from strategies.core.policy import ApartPolicy, read_policy
from strategies.core.roster import ClientInfo
from strategies.core.settings import ConfigError
from strategies.core.tracking import RunTracking
from strategies.fedamp import FedAMP

from .helpers import member_sites, run_named


def _policy(tmp_path, text: str):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


def test_every_pair_of_an_apart_group_is_kept_apart_by_name(tmp_path):
    path = _policy(tmp_path, '[[apart]]\nmembers = ["bank-a", "bank-b"]\n\n'
                             '[[apart]]\nmembers = ["c", "d", "e"]\n')
    policy = read_policy(path)
    assert policy.groups == (("bank-a", "bank-b"), ("c", "d", "e")) and len(policy.digest) == 64
    mask = policy.mask(["e", "bank-b", "x", "bank-a", "c"])  # d is not in the run
    assert mask.tolist() == [[False, False, False, False, True],
                             [False, False, False, True, False],
                             [False] * 5,
                             [False, True, False, False, False],
                             [True, False, False, False, False]]
    assert policy.record("p.toml")["apart"] == [["bank-a", "bank-b"], ["c", "d", "e"]]
    # a byte-order mark (Windows editors) reads as the same file
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "policy.toml").read_bytes())
    assert read_policy(str(tmp_path / "bom.toml")).groups == policy.groups


@pytest.mark.parametrize("text, message", [
    ("[[apart]]\nmembers = ['a']\n", "number 1 'members' is not a list of two or more"),
    ("[[apart]]\nmembers = ['a', 'a']\n", "number 1 names a member twice"),
    ("[[apart]]\nmembers = ['a', 3]\n", "number 1 names '3', not a member name"),
    ("[[apart]]\nmembers = ['Bank A', 'b']\n", "number 1 names 'Bank A', not a member name"),
    ("[[apart]]\nmembers = ['a', 'b']\nwhy = 'x'\n", r"number 1 has \['members', 'why'\]"),
    ("apart = 'a'\n", r"no \[\[apart\]\] table"),
    ("", r"no \[\[apart\]\] table"),
    ("[[together]]\nmembers = ['a', 'b']\n", r"unknown table\(s\) \['together'\]"),
    ("[[apart]\n", "not TOML"),
])
def test_a_bad_policy_file_is_one_line_naming_the_key(tmp_path, text, message):
    path = _policy(tmp_path, text)
    with pytest.raises(ConfigError, match=f"'collaboration-policy' = '{path}' is invalid.*"
                                          f"{message}"):
        read_policy(path)


def test_a_policy_too_large_or_absent_is_refused_before_it_is_parsed(tmp_path):
    path = _policy(tmp_path, "#" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="more than 1048576 bytes"):
        read_policy(path)
    with pytest.raises(ConfigError, match="not a file"):
        read_policy(str(tmp_path / "absent.toml"))


def test_only_the_server_reads_the_policy_file(tmp_path):
    """A member's ClientApp checks the run config too, on its own machine: no file is opened
    there. The ServerApp reads it before any round and refuses one it cannot read."""
    absent = str(tmp_path / "on-the-coordinator.toml")
    cfg = RunConfig.from_run_config({"strategy": "fedamp", "collaboration-policy": absent})
    assert cfg.collaboration_policy == absent  # the config alone opens nothing
    with pytest.raises(ConfigError, match="'collaboration-policy' = .*not a file"):
        run_named(tmp_path, "run", {"strategy": "fedamp", "collaboration-policy": absent}, 2)


def test_a_resumed_run_keeps_the_policy_it_started_with(tmp_path):
    path = _policy(tmp_path, "[[apart]]\nmembers = ['0', '1']\n")
    common = {"strategy": "fedamp", "collaboration-policy": path, "local-epochs": 1}
    run_named(tmp_path, "run", {**common, "num-server-rounds": 1}, 3)
    _policy(tmp_path, "[[apart]]\nmembers = ['0', '2']\n")
    with pytest.raises(ConfigError, match="started with a policy of sha256 .*the same file"):
        run_named(tmp_path, "run", {**common, "num-server-rounds": 2, "resume": True}, 3)


def test_a_method_that_mixes_everyone_refuses_a_policy(tmp_path):
    path = _policy(tmp_path, "[[apart]]\nmembers = ['0', '1']\n")
    for strategy in ("fedavg", "fedavg-ft", "pfedhn"):
        with pytest.raises(ConfigError, match=f"strategy '{strategy}' .it mixes every client"):
            RunConfig.from_run_config({"strategy": strategy, "collaboration-policy": path})
    with pytest.raises(ConfigError, match="'graph' = 'none' is invalid"):  # no graph method
        RunConfig.from_run_config({"strategy": "panacea", "graph": "none",  # runs without
                                   "collaboration-policy": path})
    with pytest.raises(ConfigError, match="'sfl-train-from' = 'global' is invalid.*own with a "
                                          "collaboration-policy"):
        RunConfig.from_run_config({"strategy": "sfl", "collaboration-policy": path})
    for strategy, extra in (("fedamp", {}), ("heurfedamp", {}), ("separate", {}),
                            ("panacea", {}), ("sfl", {"sfl-train-from": "own"})):
        cfg = RunConfig.from_run_config({"strategy": strategy, "collaboration-policy": path,
                                         **extra})
        assert cfg.apart_policy() == ApartPolicy((("0", "1"),), cfg.apart_policy().digest)


def test_a_late_joiner_starts_from_the_mean_of_those_it_is_not_kept_apart_from():
    clients = {10 + c: ClientInfo(10 + c, c, 3, 10, 10, name=f"m{c}") for c in range(3)}
    joiner = ClientInfo(20, 3, 4, 10, 10, name="j")
    for policy, expected in ((None, 2.0), (ApartPolicy((("m0", "j"),)), 3.0),
                             (ApartPolicy((("m0", "m1", "m2", "j"),)), 9.0)):
        fedamp = FedAMP(sigma=1.0, tracking=RunTracking(clients=clients, apart=policy))
        fedamp.models, fedamp._initial = torch.tensor([[0.0], [2.0], [4.0]]), torch.tensor([9.0])
        fedamp.add_client(joiner)
        assert fedamp.models[-1].item() == expected and len(fedamp.models) == 4


def test_sfl_gives_a_pair_kept_apart_no_weight_through_a_common_neighbour():
    """The path 0 - 2 - 1: three hops of smoothing give 0 a weight of 1's model through 2;
    kept apart, that weight is 0 and the rows are renormalised."""
    from strategies.sfl import SFLStrategy

    path = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    clients = {10 + c: ClientInfo(10 + c, c, 3, 10, 10) for c in range(3)}
    free = SFLStrategy(adjacency=path, tracking=RunTracking(clients=clients)).propagation()
    assert free[0, 1] > 0.2
    kept = SFLStrategy(adjacency=path, tracking=RunTracking(
        clients=clients, apart=ApartPolicy((("0", "1"),)))).propagation()
    assert kept[0, 1] == kept[1, 0] == 0 and torch.allclose(kept.sum(1), torch.ones(3).double())
    assert torch.allclose(kept[2], free[2])  # a row with no pair apart is unchanged


def test_the_papers_self_weight_counts_only_the_group_mates_a_client_may_weigh():
    """1 / (N_i + 1) with N_i the others of i's group in the mix not kept apart from it."""
    clients = {10 + c: ClientInfo(10 + c, c, 4, 10, 10) for c in range(4)}
    fedamp = FedAMP(sigma=1.0, groups=[0, 0, 0, 1], tracking=RunTracking(clients=clients))
    fedamp.self_weight = "paper"
    apart = ApartPolicy((("0", "1"),)).mask(["0", "1", "2", "3"])
    assert fedamp.self_weights(torch.arange(4), None).tolist() == [1 / 3, 1 / 3, 1 / 3, 1.0]
    assert fedamp.self_weights(torch.arange(4), apart).tolist() == [0.5, 0.5, 1 / 3, 1.0]


def test_a_given_graph_loses_the_edges_of_pairs_kept_apart(tmp_path):
    """Synthetic practical, 6 clients in groups: 0 and 1 share a group (an edge), kept apart."""
    cfg = RunConfig.from_run_config({"strategy": "panacea", "graph": "groups"})
    graph = client_graph(cfg, cfg.data_config(6))
    assert graph is not None and graph[0, 1] == 1
    kept = client_graph(cfg, cfg.data_config(6), policy=ApartPolicy((("1", "0"),)))
    assert kept is not None and kept[0, 1] == kept[1, 0] == 0
    assert int((graph - kept).abs().sum()) == 2  # that edge only


@pytest.mark.parametrize("strategy", ["fedamp", "heurfedamp"])
def test_members_kept_apart_weigh_each_other_zero_in_every_round(tmp_path, strategy, caplog):
    n = 4
    members_config, nodes = member_sites(tmp_path / "sites", "synthetic", n)
    path = _policy(tmp_path, '[[apart]]\nmembers = ["client-0", "client-2"]\n\n'
                             '[[apart]]\nmembers = ["client-1", "ghost"]\n')
    with caplog.at_level(logging.WARNING):
        metrics = run_named(tmp_path, "run", {**members_config, "strategy": strategy,
                                              "collaboration-policy": path,
                                              "num-server-rounds": 3, "local-epochs": 1}, n, nodes)
    assert metrics["finished"]
    assert metrics["collaboration_policy"]["apart"] == [["client-0", "client-2"],
                                                        ["client-1", "ghost"]]
    # the coordinator is told of a name no member has, and of the missing member-roster
    assert "names no client of the run has (yet): ['ghost']" in caplog.text
    assert "collaboration-policy without a member-roster" in caplog.text
    names = metrics["client_names"]
    a, b = names.index("client-0"), names.index("client-2")
    rounds = sorted((tmp_path / "run" / "xi").glob("round-*.npy"))
    assert len(rounds) == 3
    for file in rounds:
        xi = np.load(file)
        assert xi[a, b] == xi[b, a] == 0.0, file.name
        assert np.allclose(xi.sum(axis=1), 1.0)
    # round 1 mixes no one (no model trained yet); after it they learn from the rest
    others = [i for i in range(n) if i not in (a, b)]
    assert (np.load(rounds[-1])[np.ix_([a, b], others)] > 0).all()


def test_an_inferred_graph_never_adds_an_edge_between_members_kept_apart(tmp_path):
    """Synthetic practical, 6 clients: 0 and 1 share a group, so the warm-up's updates link
    them (checked without the policy); with the policy the inferred graph has no such edge."""
    common = {"strategy": "panacea", "graph": "inferred", "graph-k": 1, "graph-warmup-rounds": 1,
              "graph-guard-rounds": 0, "num-server-rounds": 2, "local-epochs": 1}
    free = run_named(tmp_path, "free", common, 6)
    groups = tasks.client_groups("synthetic", "practical", 6)
    a, b = next([int(u), int(v)] for u, v in free["inferred_graph"]["edges"])
    assert groups[a] == groups[b]
    path = _policy(tmp_path, f"[[apart]]\nmembers = ['{a}', '{b}']\n")
    kept = run_named(tmp_path, "kept", {**common, "collaboration-policy": path}, 6)
    edges = {tuple(sorted(e)) for e in kept["inferred_graph"]["edges"]}
    assert (min(a, b), max(a, b)) not in edges and kept["finished"]
