"""Real Flower runs: `flwr run .` in the simulation engine, each test's runs on the test
session's simulation SuperLink (tests/conftest.py ``simulation_link``; runs apart by name and
results folder). What only a process shows: Flower's own log, status, federation config and
engine. Deployment (a SuperLink with SuperNodes) runs in tests/test_members_fleet.py (the
session's fleet of members) and tests/test_faults_e2e.py (partitions' SuperNodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import FLWR, ROOT, app_files, flwr_run

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]


def _metrics(procs, results: Path, name: str) -> dict:
    path = results / name / "metrics.json"
    log = Path(procs.env["FLWR_HOME"]) / "superlink.log"
    assert path.is_file(), f"{path} missing; superlink log:\n{log.read_text()[-3000:]}"
    return json.loads(path.read_text())


def _check_two_rounds(m: dict, strategy: str) -> None:
    assert m["strategy"] == strategy and m["num_clients"] == 2
    assert [r["round"] for r in m["rounds"]] == [1, 2]
    for r in m["rounds"]:
        assert set(r["client_accuracy"]) == {"0", "1"} or set(r["client_accuracy"]) == {0, 1}
        assert 0.0 <= r["mean_accuracy"] <= 1.0
    assert m["bmta"] == pytest.approx(100 * max(r["mean_accuracy"] for r in m["rounds"]))


def test_strategies_by_config_alone_on_flowers_default_federation(simulation_link, tmp_path):
    """`flwr run . --run-config "strategy='X' num-server-rounds=2"` and nothing else: Flower's
    default federation (2 simulated SuperNodes) and every other key at its default. FedAMP
    (the default, its weights written), Panacea (the task's graph, not given), and a mistake,
    which stops the run with one line naming what is allowed, Flower's status failed and no
    traceback. What only a process shows: Flower's own log, status and default federation,
    and (the first run) `flwr run` of the checkout itself, as the README's command."""
    from experiments.flower_cli import COMPLETED, FlowerRun
    from fedamp_flwr.server.results import load_xi

    link = simulation_link.links[0]
    results = tmp_path / "results"
    logs: dict[str, list[str]] = {}

    def run(name: str, config: str):
        lines = logs.setdefault(name, [])
        app = ROOT if name == "fedamp" else app_files()  # the first: `flwr run .` itself
        flower = FlowerRun(link.env, app, f"{config} results-dir='{results}' run-name='{name}'",
                           "", tmp_path / f"{name}.log", lines.append)
        return flower.run(timeout=400)

    assert run("fedamp", "num-server-rounds=2").status == COMPLETED
    m = _metrics(simulation_link, results, "fedamp")
    _check_two_rounds(m, "fedamp")
    assert m["xi"]["recorded_rounds"] == [1, 2] and m["xi"]["client_ids"] == [0, 1]
    ids, rounds = load_xi(results / "fedamp")
    assert ids == [0, 1] and sorted(rounds) == [1, 2] and rounds[2].shape == (2, 2)
    assert rounds[2].dtype == "float32" and abs(rounds[2].sum(1) - 1).max() < 1e-6
    said = "\n".join(logs["fedamp"])
    assert "Round 2: mean test accuracy" in said and "Each client alone" in said
    assert "FutureWarning" not in said  # Ray's tip, which the user cannot act on

    assert run("panacea", "strategy='panacea' num-server-rounds=2").status == COMPLETED
    _check_two_rounds(_metrics(simulation_link, results, "panacea"), "panacea")

    stopped = run("stopped", "strategy='panacea' graph='none'")
    assert stopped.status == "finished:failed"
    said = "\n".join(logs["stopped"])
    assert said.count("Run stopped: run config 'graph' = 'none' is invalid; allowed: task, "
                      "file, groups, inferred") == 1
    assert "Traceback" not in said and not (results / "stopped").exists()


def test_flwr_run_panacea_on_fl60_with_novel_clients_and_attackers(simulation_link, tmp_path):
    results = tmp_path / "results"
    flwr_run(
        simulation_link,
        f"strategy='panacea' dataset='fl60' num-server-rounds=2 local-steps=5 batch-size=16 "
        f"novel-client-fraction=0.2 attack-ratio=0.25 min-nodes=10 "
        f"results-dir='{results}' run-name='fl60'",
        ["--federation-config", "num-supernodes=10 client-resources-num-cpus=1"],
    )
    m = _metrics(simulation_link, results, "fl60")
    assert m["strategy"] == "panacea" and m["num_clients"] == 10
    assert len(m["novel_clients"]) == 2 and len(m["attackers"]) == 2
    last = m["rounds"][-1]
    assert set(last["trained_clients"]).isdisjoint(m["novel_clients"])
    assert len(last["client_accuracy"]) == 10  # novel clients are evaluated too
    assert 0 <= last["mean_accuracy"] <= 1 and 0 <= last["novel_mean_accuracy"] <= 1
    assert "novel_bmta" in m


def test_flwr_run_fedavg_on_tpt48_reports_mse(simulation_link, tmp_path):
    from .helpers import needs_data

    tpt48 = needs_data("tpt48")
    results = tmp_path / "results"
    flwr_run(
        simulation_link,
        f"strategy='fedavg' dataset='tpt48' data-dir='{tpt48}' num-server-rounds=2 "
        f"local-epochs=1 batch-size=16 min-nodes=48 results-dir='{results}' run-name='tpt'",
        ["--federation-config", "num-supernodes=48 client-resources-num-cpus=1"],
    )
    m = _metrics(simulation_link, results, "tpt")
    assert "bmta" not in m and 0 < m["best_mean_mse"] < 1
    assert len(m["rounds"][-1]["client_mse"]) == 48


def test_flwr_run_panacea_gn_on_an_npz_file(simulation_link, tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "mine.npz"
    client = np.repeat(np.arange(4), 30)
    x = rng.normal(size=(120, 5)) + client[:, None]
    adjacency = np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]])
    np.savez(path, x=x, y=(x[:, 0] > client).astype(np.int64), client=client, adjacency=adjacency)
    results = tmp_path / "results"
    flwr_run(
        simulation_link,
        f"strategy='panacea-gn' dataset='npz' data-dir='{path}' num-server-rounds=2 "
        f"local-steps=5 batch-size=8 min-nodes=4 results-dir='{results}' run-name='npz'",
        ["--federation-config", "num-supernodes=4 client-resources-num-cpus=1"],
    )
    m = _metrics(simulation_link, results, "npz")
    assert m["strategy"] == "panacea-gn" and m["num_clients"] == 4
    assert len(m["rounds"]) == 2 and 0 <= m["bmta"] <= 100
