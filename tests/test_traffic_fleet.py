"""Traffic sensors as members, on a real loopback fleet: a SuperLink and one SuperNode per
sensor, each reading only its own file (its windows of the generated stand-in, named by its
sensor id), the road graph as ``graph = "file"`` by sensor name; Panacea runs a round. What
only processes show: each sensor's node reading its own file, named by its sensor id, and
taking its model home. In process: SFL on sensors that are members, over the same kind of
graph file (tests/test_traffic.py
``test_sensors_as_members_forecast_with_sfl_over_a_road_graph_file_by_their_names``), and
the methods' arithmetic on the traffic task (tests/test_traffic.py, tests/test_sfl.py)."""

from __future__ import annotations

import pytest

from experiments.flower_cli import toml_value

from .helpers import (
    FLWR,
    SENSOR_CONFIG,
    SENSORS,
    fleet_metrics,
    member_supernode,
    members_run,
    sensor_sites,
    start_superlink,
)

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]


def test_panacea_forecasts_traffic_on_a_fleet_of_sensors(processes):
    tmp = processes.tmp
    graph, files = sensor_sites(tmp)
    port = start_superlink(processes, simulation=False)
    for sensor in SENSORS:  # each sensor's SuperNode holds its own file only
        member_supernode(processes, port, files[sensor], sensor, sensor, keep="federated")
    results = tmp / "results"
    common = " ".join(f"{k}={toml_value(v)}" for k, v in SENSOR_CONFIG.items())
    common += f" graph-file='{graph}' min-nodes=3 results-dir='{results}'"
    log = members_run(processes, f"{common} strategy='panacea' run-name='panacea'")
    metrics = fleet_metrics(results, "panacea", log)
    assert metrics["client_names"] == sorted(SENSORS) and metrics["finished"], log[-3000:]
    assert metrics["task_kind"] == "regression"
    assert all(r["trained_clients"] == [0, 1, 2] for r in metrics["rounds"])
    assert len(metrics["rounds"][-1]["client_mse"]) == 3
    assert 0 < metrics["best_mean_mse"] < 1
    # Panacea's server clipping comes from "auto": the GRU named in the run config
    assert metrics["config"]["panacea-server-clip"] == 50.0
    for sensor in SENSORS:  # each sensor took its own model home
        assert (tmp / f"{sensor}-models" / "panacea" / f"{sensor}.safetensors").is_file()
