"""A grid on a Ray cluster of two nodes (a head and a worker, both on loopback).

Ray's own cluster utilities start the two nodes in this process's tree, each
with one CPU and a resource naming it, on 127.0.0.1; ``simulation.py
--ray-address`` runs a small grid with Flower's engine attached to that
cluster; Ray's global state (read from the head's GCS) says on which node
every ClientApp actor ran. Every process the nodes started is stopped by pid.
"""

from __future__ import annotations

import csv
from pathlib import Path

import psutil
import pytest

import simulation
from experiments.processes import stop_tree

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402 - after the skip


def _pids(node) -> list[int]:
    return [p.process.pid for infos in node.all_processes.values() for p in infos]


@pytest.mark.flower
def test_a_grid_runs_its_clients_on_both_nodes_of_a_two_node_cluster(tmp_path, capfd):
    cluster = Cluster(initialize_head=True, head_node_args={
        "node_ip_address": "127.0.0.1", "num_cpus": 1, "resources": {"head-node": 1},
        "include_dashboard": False})
    started: list[int] = []
    try:
        worker = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1,
                                  resources={"worker-node": 1})
        head = cluster.head_node
        started = _pids(head) + _pids(worker)
        assert cluster.address.startswith("127.0.0.1:")
        out = tmp_path / "grid"
        args = ["--engine", "flower", "--ray-address", cluster.address, "--preset", "quick",
                "--datasets", "synthetic", "--strategies", "fedavg", "--num-supernodes", "4",
                "--rounds", "2", "--set", "local-epochs=1", "--set", "test-samples=50",
                "--cpus-per-client", "1", "--output", str(out), "--timeout", "600"]
        assert simulation.main(args) == 0, capfd.readouterr()
        rows = list(csv.DictReader(open(out / "results.csv")))
        assert [r["status"] for r in rows] == ["finished:completed"]
        actors = cluster.global_state.actor_table(None)
        app_actors = [a for a in actors.values() if "ClientAppActor" in a["ActorClassName"]]
        nodes = {a["Address"]["NodeID"] for a in app_actors}
        assert nodes == {head.node_id, worker.node_id}, app_actors
    finally:
        cluster.shutdown()
        for pid in started:  # Ray's shutdown, then by pid whatever is left
            if psutil.pid_exists(pid):
                stop_tree(pid)
    assert not [p for p in started if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_simulation_keeps_a_loopback_cluster_on_loopback(tmp_path):
    from experiments.processes import SuperLink

    link = SuperLink(Path(tmp_path), "127.0.0.1:6379")
    assert link.env["RAY_ADDRESS"] == "127.0.0.1:6379"
    assert link.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    remote = SuperLink(Path(tmp_path), "10.0.0.5:6379")
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in remote.env
