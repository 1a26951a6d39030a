"""Differential privacy on the members' machines: the noised update, the accountant's epsilon,
the ledger that outlives processes and runs, and a member's own limit."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

import strategies
import tasks
from experiments.make_sites import write_sites
from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.member.ledger import Declined, Ledger, NodePrivacy
from fedamp_flwr.tools import cli
from tasks.dp import (
    clipped_gradient_sum,
    epsilon,
    has_batch_statistics,
    noise_multiplier_for,
    privatize_update,
)

from .helpers import run_named, site_node_configs


def _models(scale: float):
    received = {"w": torch.zeros(30, 20), "b": torch.zeros(20), "seen": torch.tensor(7)}
    trained = {"w": torch.full((30, 20), scale), "b": torch.full((20,), 2 * scale),
               "seen": torch.tensor(9)}
    return received, trained


def test_an_update_is_clipped_to_its_bound_and_noised_with_the_stated_deviation():
    received, trained = _models(0.5)
    g = torch.Generator().manual_seed(0)
    out, norm = privatize_update(received, trained, clip=1.0, noise_multiplier=0.0, generator=g)
    whole = math.sqrt(600 * 0.25 + 20 * 1.0)
    assert norm == pytest.approx(whole)
    assert float(torch.cat([out["w"].flatten(), out["b"]]).norm()) == pytest.approx(1.0, rel=1e-6)
    assert float(out["b"][0] / out["w"][0, 0]) == pytest.approx(2.0)  # its direction kept
    assert int(out["seen"]) == 7  # an integer tensor is replied as received
    small, _ = privatize_update(received, _models(1e-3)[1], clip=1.0, noise_multiplier=0.0,
                                generator=g)
    assert torch.equal(small["w"], torch.full((30, 20), 1e-3))  # within the bound: unchanged
    noised, _ = privatize_update(received, received, clip=2.0, noise_multiplier=1.5, generator=g)
    values = torch.cat([noised["w"].flatten(), noised["b"]])
    assert float(values.std()) == pytest.approx(3.0, rel=0.1)  # noise_multiplier x clip
    assert abs(float(values.mean())) < 0.4
    with pytest.raises(ValueError, match="clip"):
        privatize_update(received, trained, clip=0.0, noise_multiplier=1.0, generator=g)


def test_epsilon_is_the_accountants_own():
    # the sampled Gaussian's RDP (Mironov et al. 2019) as opacus computes it, by hand here
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    for z, q, steps, delta in ((1.0, 1.0, 10, 1e-5), (1.1, 0.01, 1000, 1e-5), (4.0, 1.0, 60, 1e-6)):
        rdp = compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders)
        want, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
        assert epsilon([(z, q, steps)], delta) == pytest.approx(want, rel=1e-9)
    assert epsilon([(1.0, 1.0, 4), (1.0, 1.0, 6)], 1e-5) == pytest.approx(
        epsilon([(1.0, 1.0, 10)], 1e-5))  # rounds compose
    assert epsilon([], 1e-5) == 0.0
    assert 1.0 < epsilon([(1.0, 1.0, 1)], 1e-5) < epsilon([(1.0, 1.0, 2)], 1e-5)


@pytest.mark.parametrize("change, key, allowed", [
    ({"dp": "dp-sgd-2"}, "dp", "none, update, dp-sgd"),
    ({"dp": "update", "dp-clip": -1.0}, "dp-clip", "> 0"),
    ({"dp": "update", "dp-noise-multiplier": 0.0}, "dp-noise-multiplier", "no noise is no privacy"),
    ({"dp": "update", "dp-delta": 1.0}, "dp-delta", r"\(0, 1\)"),
    ({"dp": "update", "strategy": "scaffold"}, "dp", "none for strategy 'scaffold'"),
])
def test_bad_privacy_settings_are_one_line_before_any_work(change, key, allowed):
    with pytest.raises(ConfigError, match=f"run config '{key}' = .* is invalid; allowed: .*{allowed}"):
        RunConfig.from_run_config(change)


def _privacy(tmp_path, limit=math.inf, z=1.0):
    return NodePrivacy("update", 1.0, z, 1e-5, limit, tmp_path)


def test_the_ledger_continues_across_processes_and_declines_past_the_limit(tmp_path):
    first = Ledger(tmp_path, "site-1")
    spent = [first.spend(_privacy(tmp_path), "run-a", r, data_sha256="ab" * 32) for r in (1, 2)]
    again = Ledger(tmp_path, "site-1")  # a fresh ClientApp process, a later run
    assert again.spent(1e-5) == pytest.approx(spent[-1])
    # another split of its data (another seed, a validation share): the same budget
    third = again.spend(_privacy(tmp_path), "run-b", 1, data_sha256="cd" * 32)
    assert third == pytest.approx(epsilon([(1.0, 1.0, 3)], 1e-5)) and third > spent[-1]
    # a release another process wrote since this one read the ledger still counts
    stale = Ledger(tmp_path, "site-1")
    Ledger(tmp_path, "site-1").spend(_privacy(tmp_path), "run-c", 1)
    assert stale.spend(_privacy(tmp_path), "run-b", 2) == pytest.approx(
        epsilon([(1.0, 1.0, 5)], 1e-5))
    assert Ledger(tmp_path, "site-2").spent(1e-5) == 0.0  # another member
    with pytest.raises(Declined, match="past its dp-max-epsilon = 5"):
        Ledger(tmp_path, "site-1").spend(_privacy(tmp_path, limit=5.0), "run-b", 3)
    releases = json.loads(again.path.read_text())["releases"]
    assert len(releases) == 5  # a declined one: not spent
    assert [r["data_sha256"][:2] for r in releases[:3]] == ["ab", "ab", "cd"]
    assert oct(again.path.stat().st_mode & 0o777) == "0o600"
    lock = again.path.with_name(again.path.name + ".lock")
    assert oct(lock.stat().st_mode & 0o777) == "0o600"  # the lock file too
    again.path.write_text("{not json")
    with pytest.raises(Declined, match="cannot be read"):
        Ledger(tmp_path, "site-1")  # never a budget started again from zero


def _members(tmp_path, n=3):
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    return write_sites(dc, tmp_path / "sites"), site_node_configs(tmp_path / "sites", n)


def test_a_member_at_its_limit_stops_training_and_the_run_goes_on(tmp_path, capsys):
    run_config, nodes = _members(tmp_path)
    one_round = epsilon([(1.0, 1.0, 1)], 1e-5)
    for i, node in enumerate(nodes):
        node["privacy-dir"] = str(tmp_path / f"ledger-{i}")
    two_rounds = epsilon([(1.0, 1.0, 2)], 1e-5)
    nodes[1]["dp-max-epsilon"] = (one_round + two_rounds) / 2  # room for one reply, not two
    cfg = {**run_config, "strategy": "fedavg", "local-epochs": 1, "num-server-rounds": 3,
           "dp": "update"}
    metrics = run_named(tmp_path, "dp", cfg, 3, nodes)
    rounds = metrics["rounds"]
    assert [r["trained_clients"] for r in rounds] == [[0, 1, 2], [0, 2], [0, 2]]
    assert "privacy budget" in rounds[1]["absent_clients"]["1"]
    assert "the member declined" in rounds[1]["absent_clients"]["1"]
    assert rounds[0]["client_dp_epsilon"]["1"] == pytest.approx(one_round)
    assert rounds[2]["client_dp_epsilon"]["0"] == pytest.approx(epsilon([(1.0, 1.0, 3)], 1e-5))
    # the ledger is on the member's own machine, and a later run continues it
    again = run_named(tmp_path, "dp-again", {**cfg, "num-server-rounds": 1}, 3, nodes)
    assert again["rounds"][0]["client_dp_epsilon"]["0"] == pytest.approx(
        epsilon([(1.0, 1.0, 4)], 1e-5))
    assert again["rounds"][0]["trained_clients"] == [0, 2]
    # the member states what it spent, from its own ledger, with its own accountant
    assert cli.main(["privacy", nodes[0]["privacy-dir"]]) == 0
    said = capsys.readouterr().out
    assert "client-0: 4 noised replies in 2 run(s) (dp, dp-again), trained on 1 version(s)" in said
    assert f"epsilon {epsilon([(1.0, 1.0, 4)], 1e-5):.4g} at delta 1e-05" in said
    assert cli.main(["privacy", str(tmp_path / "nothing")]) == 1


def test_a_member_with_a_limit_declines_a_run_without_privacy_and_one_without_a_ledger(tmp_path):
    run_config, nodes = _members(tmp_path)
    nodes[0]["dp-max-epsilon"] = 8.0
    nodes[0]["privacy-dir"] = str(tmp_path / "ledger-0")
    cfg = {**run_config, "strategy": "fedavg", "local-epochs": 1, "num-server-rounds": 1,
           "max-failed-rounds": 1}
    plain = run_named(tmp_path, "plain", cfg, 3, nodes)
    assert plain["rounds"][0]["trained_clients"] == [1, 2]
    assert "asks no privacy" in plain["rounds"][0]["absent_clients"]["0"]
    private = run_named(tmp_path, "private", {**cfg, "dp": "update"}, 3, nodes)
    assert private["rounds"][0]["trained_clients"] == [0]  # the others keep no ledger
    assert "keeps no privacy ledger" in private["rounds"][0]["absent_clients"]["1"]


def test_a_simulation_keeps_each_clients_ledger_in_the_run_folder_and_none_changes_nothing(
        tmp_path, capsys):
    cfg = {"strategy": "fedamp", "dataset": "synthetic", "local-epochs": 1, "fedamp-sigma": 1.0}
    private = run_named(tmp_path, "private", {**cfg, "dp": "update", "dp-clip": 0.5}, 3)
    ledgers = sorted((tmp_path / "private" / "privacy").glob("*.json"))
    assert [p.name for p in ledgers] == ["0.json", "1.json", "2.json"]
    assert all(len(json.loads(p.read_text())["releases"]) == 2 for p in ledgers)
    assert set(private["rounds"][1]["client_dp_epsilon"]) == {"0", "1", "2"}
    plain = run_named(tmp_path, "plain", cfg, 3)
    assert "client_dp_epsilon" not in plain["rounds"][0]
    assert not (tmp_path / "plain" / "privacy").exists()
    assert plain["rounds"][0]["client_accuracy"] != private["rounds"][0]["client_accuracy"]
    # the accuracy-against-epsilon report reads the epsilon the members reported
    from experiments import dp_tradeoff as report

    assert report.main([str(tmp_path), "--out", str(tmp_path / "fig")]) == 0
    said = capsys.readouterr().out
    top = max(v for r in private["rounds"] for v in r["client_dp_epsilon"].values())
    assert f"| synthetic/practical | fedamp | update | 1 | {top:.3g} |" in said
    assert "| synthetic/practical | fedamp | none |  | none (no DP) |" in said
    assert (tmp_path / "fig" / "accuracy-epsilon.png").stat().st_size > 0
    assert (tmp_path / "fig" / "xi-epsilon-none.png").is_file()
    if tasks.client_groups("synthetic", "practical", 3) is not None:
        assert "fedamp, epsilon none: " in said and "weight within its group" in said


def test_per_example_gradients_are_opacus_own_clipped_and_summed():
    from opacus import GradSampleModule

    torch.manual_seed(0)
    model = tasks.build_model(tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=2,
                                               seed=0), "auto")
    x = torch.randn(12, *tasks.data_info(tasks.DataConfig(
        dataset="synthetic", data_dir="", num_clients=2, seed=0)).input_shape)
    y = torch.randint(0, 2, (12,))
    summed, loss = clipped_gradient_sum(model, torch.nn.functional.cross_entropy, x, y, clip=0.05)
    reference = GradSampleModule(copy.deepcopy(model), loss_reduction="sum")
    torch.nn.functional.cross_entropy(reference(x), y, reduction="sum").backward()
    samples = [p.grad_sample for p in reference.parameters()]
    norms = torch.cat([g.reshape(12, -1) for g in samples], dim=1).norm(dim=1)
    assert (norms > 0.05).all()  # every example is clipped here
    scale = (0.05 / norms).clamp(max=1.0)
    for ours, theirs in zip(summed, samples, strict=True):
        want = (theirs * scale.reshape(-1, *[1] * (theirs.dim() - 1))).sum(0)
        assert torch.allclose(ours, want, atol=1e-6)
    assert float(loss) == pytest.approx(float(torch.nn.functional.cross_entropy(model(x), y)),
                                        rel=1e-5)
    assert has_batch_statistics(torch.nn.Sequential(torch.nn.Linear(2, 2),
                                                    torch.nn.BatchNorm1d(2)))
    assert not has_batch_statistics(model)


@pytest.mark.parametrize("strategy", ["apfl", "per-fedavg", "pfedme"])
def test_dp_sgd_refuses_a_method_with_its_own_loop(strategy):
    with pytest.raises(ConfigError, match=f"allowed: none or update for strategy '{strategy}': "
                                          "its local training is its own loop"):
        RunConfig.from_run_config({"strategy": strategy, "dp": "dp-sgd"})


def test_dp_sgd_trains_privately_and_the_ledger_counts_its_sampled_steps(tmp_path):
    cfg = {"strategy": "fedavg", "dataset": "synthetic", "local-steps": 5, "batch-size": 10,
           "optimizer": "sgd", "learning-rate": 0.1, "dp": "dp-sgd", "dp-clip": 1.0,
           "dp-noise-multiplier": 1.1}
    metrics = run_named(tmp_path, "dpsgd", cfg, 3)
    ledger = json.loads((tmp_path / "dpsgd" / "privacy" / "0.json").read_text())
    n = len(tasks.load_client_data(RunConfig.from_run_config(cfg).data_config(3), 0).y_train)
    assert [(r["steps"], r["sample_rate"], r["mode"]) for r in ledger["releases"]] == [
        (5, 10 / n, "dp-sgd")] * 2
    want = epsilon([(1.1, 10 / n, 10)], 1e-5)
    assert metrics["rounds"][1]["client_dp_epsilon"]["0"] == pytest.approx(want)
    assert want < epsilon([(1.1, 1.0, 2)], 1e-5)  # sampling amplifies: far below 2 updates
    assert all(r["train_loss"] is None for r in metrics["rounds"])  # stays on the members
    assert all(math.isfinite(r["mean_accuracy"]) for r in metrics["rounds"])


@pytest.mark.slow
def test_the_presets_noise_multipliers_keep_every_member_at_its_epsilon():
    from experiments.presets import DP_NOISE, PRESETS

    # FMNIST practical at 20 clients: 600, 500, 400, 300, 200 training examples, 4 each
    # (tasks.partition's practical recipe; its seed changes which, not how many)
    fmnist = [(50 / n, math.ceil(n / 50)) for n in (600, 500, 400, 300, 200)]
    pinned = PRESETS["dp-panacea"].run_config  # FL-60: 80 training examples per client
    fl60 = [(pinned["batch-size"] / 80, pinned["local-steps"])]
    for releases, rounds, noise in ((fmnist, 10, DP_NOISE["fmnist"]),
                                    (fl60, pinned["num-server-rounds"], DP_NOISE["fl60"])):
        for target, z in noise.items():
            assert noise_multiplier_for(target, 1e-5, releases, rounds) == z
            spent = max(epsilon([(z, q, s * rounds)], 1e-5) for q, s in releases)
            assert 0.97 * target < spent <= target
    grid = PRESETS["dp-tradeoff"]
    assert grid.run_config["num-server-rounds"] == 10 and grid.run_config["batch-size"] == 50
    assert [sc.get("dp-noise-multiplier") for sc in grid.scenarios] == [None, 6.66, 2.14, 0.869]


def test_a_resumed_run_and_a_restarted_supernode_continue_the_same_ledger(tmp_path):
    from flwr.common import MessageType

    from .helpers import Crash, FaultyGrid, grid_config, run_on_grid

    cfg = grid_config(tmp_path, "fedavg", **{"dp": "update", "num-server-rounds": 4})
    # client 1's SuperNode restarts before round 2 (a new node, an empty context.state);
    # the ServerApp dies in round 3 before its training messages go out
    grid = FaultyGrid(cfg, 3, crash_at=(3, MessageType.TRAIN), moves={1: (2, 901)})
    with pytest.raises(Crash):
        run_on_grid(grid, cfg)
    metrics = run_on_grid(grid, {**cfg, "resume": True})
    assert [r["trained_clients"] for r in metrics["rounds"]] == [[0, 1, 2]] * 4
    for r in metrics["rounds"]:  # one release a round, whichever process or node made it
        for client in ("0", "1", "2"):
            assert r["client_dp_epsilon"][client] == pytest.approx(
                epsilon([(1.0, 1.0, r["round"])], 1e-5))
    ledgers = sorted((tmp_path / "run" / "privacy").glob("*.json"))
    assert [len(json.loads(p.read_text())["releases"]) for p in ledgers] == [4, 4, 4]


def test_a_members_noise_is_not_taken_for_a_hostile_update(tmp_path):
    import tasks as t

    cfg = {"strategy": "fedavg", "dataset": "synthetic", "local-epochs": 1, "dp": "update",
           "dp-noise-multiplier": 200.0}
    model = t.build_model(RunConfig.from_run_config(cfg).data_config(3), "auto")
    numel = sum(p.numel() for p in model.state_dict().values())
    weights = float(torch.cat([p.flatten() for p in model.state_dict().values()]).norm())
    assert 200.0 * math.sqrt(numel) > 100 * max(weights, 1.0) * 2  # the ratio alone: refused
    metrics = run_named(tmp_path, "loud", cfg, 3)
    assert [r["trained_clients"] for r in metrics["rounds"]] == [[0, 1, 2]] * 2
    assert not any(r.get("rejected") for r in metrics["rounds"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["update", "dp-sgd"])
@pytest.mark.parametrize("strategy", sorted(strategies.STRATEGIES))
def test_every_method_runs_private_or_is_refused_with_its_reason(strategy, mode, tmp_path):
    from .helpers import run_local

    entry = strategies.STRATEGIES[strategy]
    graph = entry.uses_graph
    n = 6 if graph else 3  # the synthetic task has 5 groups: 6 clients give its graph an edge
    extra = {"num-server-rounds": 1, "local-steps": 2, "dp": mode, "dp-noise-multiplier": 0.5,
             **({"graph": "groups", "panacea-server-lr": 0.01} if graph else {}),
             **({"fedamp-sigma": 1.0, "heurfedamp-sigma": 25.0} if "fedamp" in strategy else {})}
    if mode in entry.not_private:
        with pytest.raises(ConfigError, match=f"run config 'dp' = '{mode}' is invalid; allowed: "
                                              f".* for strategy '{strategy}': "):
            RunConfig.from_run_config({"strategy": strategy, **extra})
        return
    metrics, _ = run_local(tmp_path, strategy, n=n, **extra)
    record = metrics["rounds"][0]
    assert record["trained_clients"] == list(range(n)), record
    assert set(record["client_dp_epsilon"]) == {str(c) for c in range(n)}
    ledgers = sorted((tmp_path / strategy / "privacy").glob("*.json"))
    assert [json.loads(p.read_text())["releases"][0]["mode"] for p in ledgers] == [mode] * n


def test_epsilon_is_never_negative_a_delta_that_would_give_one_is_refused():
    with pytest.raises(ValueError, match=r"epsilon -\d.* < 0 at delta 0.9: that delta is too "
                                         "large"):
        epsilon([(1.0, 1.0, 1)], 0.9)
    assert epsilon([(1.0, 1.0, 1)], 1e-5) > 0
    ledger = Ledger.__new__(Ledger)
    ledger.releases = []
    privacy = NodePrivacy("update", 1.0, 20.0, 0.5, math.inf, None)
    with pytest.raises(Declined, match="at delta 0.5: that delta is too large.*no reply is "
                                       "noised or sent"):
        ledger.would_spend(privacy)


@pytest.mark.parametrize("run_delta", [1e-5, 1e-3, 0.9])
def test_a_members_budget_is_kept_at_its_own_delta_whatever_the_run_asks(tmp_path, caplog,
                                                                          run_delta):
    """A member with dp-max-epsilon = 8 and no dp-delta: whatever dp-delta the run asks, its
    ledger never passes 8 at its own delta (1e-5), and it declines, in its own log with the
    numbers, the round that would; what it reports is at the stricter of the two deltas."""
    import logging

    from fedamp_flwr.member.ledger import MEMBER_DELTA

    run_config, nodes = _members(tmp_path)
    nodes[1].update({"dp-max-epsilon": 8.0, "privacy-dir": str(tmp_path / "ledger")})
    for i in (0, 2):
        nodes[i]["privacy-dir"] = str(tmp_path / f"ledger-{i}")
    cfg = {**run_config, "strategy": "fedavg", "local-epochs": 1, "num-server-rounds": 4,
           "dp": "update", "dp-delta": run_delta}
    with caplog.at_level(logging.WARNING):
        metrics = run_named(tmp_path, "dp", cfg, 3, nodes)
    ledger = Ledger(tmp_path / "ledger", "client-1")
    assert [r["delta"] for r in ledger.releases] == [MEMBER_DELTA] * len(ledger.releases)
    assert 0 < ledger.spent(MEMBER_DELTA) <= 8.0
    assert len(ledger.releases) == 2  # 4.73 after one reply, 7.08 after two, 8.9 after three
    trained = [r["trained_clients"] for r in metrics["rounds"]]
    assert trained == [[0, 1, 2]] * 2 + [[0, 2]] * 2
    said = [r.getMessage() for r in caplog.records if "This node declines round 3" in
            r.getMessage()]
    assert said and "past its dp-max-epsilon = 8" in said[0] and "(delta 1e-05)" in said[0]
    stated = metrics["rounds"][1]["client_dp_epsilon"]["1"]
    assert stated == pytest.approx(epsilon([(1.0, 1.0, 2)], min(run_delta, MEMBER_DELTA)))
    if run_delta < 1:  # the others (no limit) keep theirs at their own delta too
        assert Ledger(tmp_path / "ledger-0", "client-0").releases[0]["delta"] == MEMBER_DELTA


def test_a_node_delta_is_checked_and_a_run_may_only_make_it_stricter(tmp_path):
    from flwr.app import Context, RecordDict

    cfg = RunConfig.from_run_config({"dp": "update", "dp-delta": 1e-7})

    def privacy(node: dict, member: bool = True) -> NodePrivacy:
        ctx = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config={})
        return NodePrivacy.of(ctx, cfg, "", member=member)

    own = privacy({"dp-delta": 1e-6, "privacy-dir": str(tmp_path)})
    assert (own.delta, own.report_delta) == (1e-6, 1e-7)
    assert privacy({}).delta == 1e-5 and privacy({}, member=False).delta == 1e-7
    for bad in (0, 1, 1.5, -1e-5, "1e-5", True):
        with pytest.raises(ConfigError, match=r"node config 'dp-delta' = .* allowed: a number "
                                              r"in \(0, 1\)"):
            privacy({"dp-delta": bad})
