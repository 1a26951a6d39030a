"""Traffic sensors as members, on a real loopback fleet: a SuperLink and one SuperNode per
sensor, each reading only its own file (its windows of the generated stand-in, named by its
sensor id), the road graph as ``graph = "file"`` by sensor name; Panacea runs a round. What
only processes show: each sensor's node reading its own file, named by its sensor id, and
taking its model home. In process: SFL on sensors that are members, over the same kind of
graph file (tests/test_traffic.py
``test_sensors_as_members_forecast_with_sfl_over_a_road_graph_file_by_their_names``), and
the methods' arithmetic on the traffic task (tests/test_traffic.py, tests/test_sfl.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.graphs import write_edge_list
from tasks.traffic import make_traffic_standin

from .helpers import FLWR, fleet_metrics, free_port, members_run, start_superlink

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]

SENSORS = ["773869", "767541", "767542"]


def test_panacea_forecasts_traffic_on_a_fleet_of_sensors(processes):
    tmp = processes.tmp
    path = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=np.float32)  # a road: 0 - 1 - 2
    np.savez(tmp / "road.npz", sensor_ids=np.array(SENSORS), adjacency=path)
    data = make_traffic_standin(tmp / "road.npz", days=3, seed=0, stride=24)
    port = start_superlink(processes, simulation=False)
    for i, sensor in enumerate(SENSORS):  # each sensor's SuperNode holds its own file only
        site = tmp / f"sensor-{sensor}.npz"
        np.savez(site, x=data.train[i].x, y=data.train[i].y, x_test=data.test[i].x,
                 y_test=data.test[i].y)
        processes.start(["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                         "--port", str(free_port()), "--node-config",
                         f"data-path='{site}' client-id='{sensor}' "
                         f"model-dir='{tmp / sensor}' identity-dir='{tmp / (sensor + '-id')}'"],
                        sensor)
    graph = tmp / "road.csv"
    assert write_edge_list(graph, data.adjacency, SENSORS) == 2
    results = tmp / "results"
    common = (f"dataset='members' member-task='regression' member-input-shape='12' "
              f"member-outputs=12 model='gru' member-scaling='none' graph='file' "
              f"graph-file='{graph}' local-epochs=1 batch-size=16 num-server-rounds=1 alone=false "
              f"min-nodes=3 results-dir='{results}'")
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
        assert (tmp / sensor / "panacea" / f"{sensor}.safetensors").is_file()
