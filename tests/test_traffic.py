"""Traffic forecasting (tasks/traffic.py): the real loaders on files written in the real
formats (a pandas HDF5 speed table, DCRNN's pickled adj_mx, our .npz, an edge list), their
refusals, the generated stand-in, and real rounds on it."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tasks
from fedamp_flwr.config import ConfigError, RunConfig
from tasks.traffic import (
    TrafficDataError,
    client_graph,
    load_traffic,
    make_traffic_standin,
    read_graph,
    standin_speeds,
)

from .helpers import SENSOR_CONFIG, SENSORS, SHARED_DATA, run_named, sensor_sites

IDS = ["773869", "767541", "767542", "717447"]
#: DCRNN's adjacency is directed and weighted, with ones on the diagonal
ADJ = np.array([[1.0, 0.5, 0.0, 0.0], [0.0, 1.0, 0.2, 0.0], [0.0, 0.0, 1.0, 0.0],
                [0.0, 0.0, 0.9, 1.0]], dtype=np.float32)


def _speed_table(folder: Path, steps: int = 100, name: str = "metr-la.h5") -> np.ndarray:
    """DCRNN's table as pandas writes it: 5-minute rows, one column per sensor id, zeros where
    a reading is missing."""
    rng = np.random.default_rng(0)
    speeds = 40 + 20 * rng.random((steps, len(IDS)))
    speeds[30, 1] = 0.0  # a missing reading
    index = pd.date_range("2012-03-01", periods=steps, freq="5min")
    pd.DataFrame(speeds, index=index, columns=IDS).to_hdf(folder / name, key="df")
    return speeds


def test_metr_la_from_its_speed_table_and_graph(tmp_path):
    speeds = _speed_table(tmp_path)
    np.savez(tmp_path / "metr_la_adjacency.npz", sensor_ids=np.array(IDS), adjacency=ADJ)
    data = load_traffic(tmp_path, "metr-la", stride=12)
    assert data.names == IDS and data.num_clients == 4
    # 100 steps: windows of 24 start at 0, 12, ..., 72 (7); sensor 1's reading at step 30
    # (missing) leaves out the windows starting at 12 and 24
    counts = [len(data.train[i].y) + len(data.test[i].y) for i in range(4)]
    assert counts == [7, 5, 7, 7]
    lo, hi = speeds[speeds > 0].min(), speeds.max()
    first = (speeds[:12, 0] - lo) / (hi - lo)
    assert np.allclose(data.train[0].x[0], first, atol=1e-6)  # scaled to [0, 1], in time
    assert np.allclose(data.train[0].y[0], (speeds[12:24, 0] - lo) / (hi - lo), atol=1e-6)
    # the client graph: either direction, unweighted, no self loops
    assert data.adjacency.tolist() == [[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]]


def test_the_graph_from_dcrnns_pickle_or_an_edge_list(tmp_path):
    with open(tmp_path / "adj_mx.pkl", "wb") as f:  # as DCRNN wrote it: Python 2, protocol 2
        pickle.dump((IDS, {s: i for i, s in enumerate(IDS)}, ADJ), f, protocol=2)
    ids, adjacency = read_graph(tmp_path / "adj_mx.pkl")
    assert ids == IDS and np.array_equal(adjacency, ADJ)
    (tmp_path / "edges.csv").write_text("from,to,cost\n773869,767541,10.5\n767541,767542,3\n")
    ids, adjacency = read_graph(tmp_path / "edges.csv")
    assert ids == ["767541", "767542", "773869"]
    assert client_graph(adjacency).sum() == 4  # two undirected edges
    assert adjacency[ids.index("773869"), ids.index("767541")] == 1.0


def test_an_edge_list_that_is_bad_or_too_large_stops_before_the_matrix(tmp_path, monkeypatch):
    import tasks.traffic as traffic

    for text, message in (("a,b\n1,2\n", "needs the columns from,to"),
                          ("from,to\n1,\n", r"edges.csv:2: an edge list needs from,to filled"),
                          ("from,to\n", "at least one from,to row")):
        (tmp_path / "edges.csv").write_text(text)
        with pytest.raises(TrafficDataError, match=message):
            read_graph(tmp_path / "edges.csv")
    monkeypatch.setattr(traffic, "MOST_SENSORS", 3)
    (tmp_path / "edges.csv").write_text("from,to\n1,2\n3,4\n")
    with pytest.raises(TrafficDataError, match="more than 3 sensors"):
        read_graph(tmp_path / "edges.csv")
    (tmp_path / "adj_mx.pkl").write_bytes(b"\0" * (8 * 9 + (1 << 20) + 1))
    with pytest.raises(TrafficDataError, match="more than the 3 sensors' adj_mx.pkl"):
        read_graph(tmp_path / "adj_mx.pkl")


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/fedamp-traffic-pwned",))


def test_a_pickle_that_names_code_is_refused_and_runs_nothing(tmp_path):
    marker = Path("/tmp/fedamp-traffic-pwned")
    marker.unlink(missing_ok=True)
    with open(tmp_path / "adj_mx.pkl", "wb") as f:
        pickle.dump((IDS, {}, _Boom()), f, protocol=2)
    with pytest.raises(TrafficDataError, match=r"adj_mx.pkl: the pickle names posix.system"):
        read_graph(tmp_path / "adj_mx.pkl")
    assert not marker.exists()


def test_a_table_with_object_data_or_missing_files_is_refused(tmp_path):
    frame = pd.DataFrame({"773869": ["fast", "slow"]}, index=pd.date_range("2012", periods=2))
    frame.to_hdf(tmp_path / "metr-la.h5", key="df")
    np.savez(tmp_path / "metr_la_adjacency.npz", sensor_ids=np.array(IDS), adjacency=ADJ)
    with pytest.raises(TrafficDataError, match="not numeric.*object data is not read"):
        load_traffic(tmp_path, "metr-la")
    with pytest.raises(FileNotFoundError, match="'data-dir'.*pems-bay.h5.*pems_bay_adjacency"):
        load_traffic(tmp_path, "pems-bay")
    (tmp_path / "not.h5").write_text("junk")
    with pytest.raises(TrafficDataError, match="not an HDF5 file"):
        from tasks.traffic import read_speed_table

        read_speed_table(tmp_path / "not.h5")


def test_the_standin_couples_each_sensor_to_its_road_neighbours(monkeypatch):
    """Road neighbours' daily profiles are more alike than any two sensors' (the graph
    carries information about each sensor's model), and a seed gives the same speeds."""
    graph_file = SHARED_DATA / "sensor_graphs/metr_la_adjacency.npz"
    if not graph_file.is_file():
        pytest.skip("shared/data/sensor_graphs is not on this machine")
    _, adjacency = read_graph(graph_file)
    graph = client_graph(adjacency).astype(np.float64)
    speeds = standin_speeds(graph, days=7, seed=0)
    assert speeds.shape == (7 * 288, 207) and np.array_equal(speeds, standin_speeds(graph, 7, 0))
    profile = speeds[: 5 * 288].reshape(5, 288, 207).mean(axis=0)  # weekdays, by time of day
    gap = np.abs(profile[:, :, None] - profile[:, None, :]).mean(axis=0)
    u, v = np.nonzero(np.triu(graph, 1))
    assert gap[u, v].mean() < 0.6 * gap[np.triu_indices(207, 1)].mean()
    data = make_traffic_standin(graph_file, days=14, seed=0)
    assert data.num_clients == 207 and data.extras["generated"]
    # the server's graph = "task" reads the road graph alone: the data's own adjacency
    dc = RunConfig.from_run_config({"dataset": "traffic-generated", "data-dir": str(
        graph_file.parent), "traffic-days": 14}).data_config(207)
    assert np.array_equal(tasks.task_graph(dc), data.adjacency)
    monkeypatch.setattr(tasks.loading, "load_federated", lambda dc: 1 / 0)  # not generated
    assert np.array_equal(tasks.task_graph(dc), data.adjacency)
    assert [len(data.train[0].y), len(data.test[0].y)] == [268, 67]
    # the default five weeks: the test week is as hard as the training's (forecasting the last
    # reading), not an easier weekend as 7 days make it
    def persistence(splits):
        return float(np.mean([((t.x[:, -1:] - t.y) ** 2).mean() for t in splits]))

    week = make_traffic_standin(graph_file, seed=0, stride=60)
    assert abs(persistence(week.test) / persistence(week.train) - 1) < 0.2
    days7 = make_traffic_standin(graph_file, days=7, seed=0)
    assert persistence(days7.test) < 0.5 * persistence(days7.train)


def test_the_real_traffic_tasks_need_their_folder():
    with pytest.raises(ConfigError, match="'data-dir'"):
        RunConfig.from_run_config({"dataset": "metr-la"})
    with pytest.raises(ConfigError, match="'traffic-graph' = 'tokyo'"):
        RunConfig.from_run_config({"dataset": "traffic-generated", "traffic-graph": "tokyo"})


def test_sfl_and_panacea_forecast_the_standin_in_the_server_app(tmp_path):
    """Two real rounds on a stand-in over a small road graph (six sensors in a ring)."""
    ring = np.roll(np.eye(6, dtype=np.float32), 1, axis=1)
    np.savez(tmp_path / "metr_la_adjacency.npz", sensor_ids=np.array([f"s{i}" for i in range(6)]),
             adjacency=ring)
    for strategy in ("sfl", "panacea"):
        metrics = run_named(tmp_path, strategy, {
            "strategy": strategy, "dataset": "traffic-generated", "data-dir": str(tmp_path),
            "traffic-days": 3, "traffic-stride": 24, "local-epochs": 1}, 6)
        assert metrics["finished"] and metrics["task_kind"] == "regression"
        assert len(metrics["rounds"][-1]["client_mse"]) == 6
        assert 0 < metrics["best_mean_mse"] < 1


def test_sensors_as_members_forecast_with_sfl_over_a_road_graph_file_by_their_names(tmp_path):
    """SFL on sensors that are members (each node its own file of windows, named by its
    sensor id; the road graph as ``graph = "file"`` by sensor name), in process: the real
    ServerApp and ClientApps. The same on a real fleet, with Panacea:
    tests/test_traffic_fleet.py."""
    graph, files = sensor_sites(tmp_path)
    nodes = [{"data-path": str(files[sensor]), "client-id": sensor,
              "model-dir": str(tmp_path / sensor)}
             for sensor in reversed(SENSORS)]  # nodes in another order than the graph's
    metrics = run_named(tmp_path, "sfl", {**SENSOR_CONFIG, "strategy": "sfl",
                                          "graph-file": str(graph)}, 3, nodes)
    assert metrics["client_names"] == sorted(SENSORS) and metrics["finished"]
    assert metrics["task_kind"] == "regression" and metrics["rounds"][0]["trained_clients"] == [0, 1, 2]
    assert len(metrics["rounds"][-1]["client_mse"]) == 3 and 0 < metrics["best_mean_mse"] < 1
    for sensor in SENSORS:  # each sensor took its own model home
        assert (tmp_path / sensor / "sfl" / f"{sensor}.safetensors").is_file()


def test_the_stand_in_is_printed_beside_the_papers_numbers_said_not_comparable():
    from experiments.paper_numbers import paper_line, variant_of

    line = paper_line("traffic-generated", variant_of("traffic-generated",
                                                      {"traffic-graph": "pems-bay"}))
    assert line is not None and line.startswith("Panacea paper, Table 1, pems-bay (MSE x1e-3): "
                                                "fedavg 33.5, sfl 36.4, pfedhn 3.6")
    assert "generated stand-in" in line and "not comparable" in line
    assert "generated" not in (paper_line("metr-la", "") or "")
    assert paper_line("fl60", "grda") == ("Panacea paper, Table 1, fl60 (grda): fedavg 97.9, "
                                          "sfl 73.3, pfedhn 100, panacea-gn 100, panacea 100.")
    assert paper_line("fl60", "text") is None and paper_line("fl60", "grda", novel=True) is None


class _RawMemory:
    def __reduce__(self):  # an object array straight from bytes: pointers the file made up
        return (np.ndarray, ((1, 1), np.dtype("O"), b"A" * 8))


def test_a_pickle_that_builds_an_array_from_raw_memory_is_refused(tmp_path):
    """numpy's own unpickling never runs: an array from raw bytes, or a dtype of objects
    dressed as another, is refused before anything is built (both crashed the process)."""
    (tmp_path / "raw.pkl").write_bytes(pickle.dumps((["a"], {}, _RawMemory()), protocol=2))
    with pytest.raises(TrafficDataError, match="raw.pkl: the pickle holds a 'O8' array"):
        read_graph(tmp_path / "raw.pkl")
    flags = (b"\x80\x02(]X\x01\x00\x00\x00aa}cnumpy.core.multiarray\n_reconstruct\ncnumpy\n"
             b"ndarray\nK\x00\x85C\x01b\x87R(K\x01K\x01K\x01\x86cnumpy\ndtype\nX\x02\x00\x00\x00"
             b"O8\x89\x88\x87R(K\x03X\x01\x00\x00\x00|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
             b"\x89C\x08AAAAAAAAtbt.")
    (tmp_path / "flags.pkl").write_bytes(flags)
    with pytest.raises(TrafficDataError, match="only numbers are read"):
        read_graph(tmp_path / "flags.pkl")
    shared = [0.0, 0.0]
    for _ in range(30):  # 2^30 floats when expanded, 300 bytes pickled
        shared = [shared, shared]
    (tmp_path / "bomb.pkl").write_bytes(pickle.dumps((["a", "b"], {}, shared), protocol=2))
    with pytest.raises(TrafficDataError, match="expected \\(sensor_ids"):
        read_graph(tmp_path / "bomb.pkl")


def test_a_speed_table_that_reaches_outside_its_file_or_asks_for_terabytes_is_refused(tmp_path):
    import h5py

    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float64).tobytes())
    with h5py.File(tmp_path / "metr-la.h5", "w") as f:  # data "stored" in another file
        g = f.create_group("df")
        g["axis0"] = np.array([b"s1"])
        g["block0_items"] = np.array([b"s1"])
        g.create_dataset("block0_values", shape=(4, 1), dtype="f8",
                         external=[(str(secret), 0, 32)])
    from tasks.traffic import read_speed_table

    with pytest.raises(TrafficDataError, match="block0_values is stored outside the file"):
        read_speed_table(tmp_path / "metr-la.h5")
    with h5py.File(tmp_path / "huge.h5", "w") as f:  # 5 KB on disk, 8 TB when read
        g = f.create_group("df")
        g["axis0"] = np.array([b"s1"])
        g["block0_items"] = np.array([b"s1"])
        g.create_dataset("block0_values", shape=(10**12, 1), dtype="f8", chunks=(1024, 1))
    with pytest.raises(TrafficDataError, match="more than 200000000 readings"):
        read_speed_table(tmp_path / "huge.h5")
    # a few kB that declare 2e9 column labels (16 GB), or one label of 2 GB: refused, counted
    # before read, in a process that could not even allocate them (3 GB of address space
    # beyond what it holds once the reader is imported)
    for name, items in (("items.h5", dict(shape=(2 * 10**9,), dtype="f8", chunks=(4096,))),
                        ("label.h5", dict(shape=(1,), dtype="S2000000000"))):
        with h5py.File(tmp_path / name, "w") as f:
            g = f.create_group("df")
            g["axis0"] = np.array([b"s1"])
            g.create_dataset("block0_items", **items)
            g["block0_values"] = np.zeros((4, 1))
        assert (tmp_path / name).stat().st_size < 10_000
        code = ("import resource\nfrom tasks.traffic import read_speed_table\n"
                "held = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
                "resource.setrlimit(resource.RLIMIT_AS, (held + (3 << 30), held + (3 << 30)))\n"
                f"try: read_speed_table(__import__('pathlib').Path({str(tmp_path / name)!r}))\n"
                "except Exception as e: print(type(e).__name__, e)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).parents[1])
        (line,) = out.stdout.splitlines()
        assert line.startswith("TrafficDataError ") and "block0_items declares" in line, \
            out.stdout + out.stderr[-2000:]
    (tmp_path / "e.csv").write_text("from,to\n1,2\n3\n")
    with pytest.raises(TrafficDataError, match="filled in every row"):
        read_graph(tmp_path / "e.csv")


def test_one_sensor_alone_is_trained_and_tested_against_persistence(tmp_path, capsys):
    from experiments.traffic_alone import main

    ring = np.roll(np.eye(6, dtype=np.float32), 1, axis=1)
    np.savez(tmp_path / "metr_la_adjacency.npz", sensor_ids=np.array([f"s{i}" for i in range(6)]),
             adjacency=ring + ring.T)
    rows = main(["--data-dir", str(tmp_path), "--sensors", "0,3", "--steps", "5,40",
                 "--days", "7", "--stride", "24"])
    assert [r["sensor"] for r in rows] == [0, 3]
    assert all(0 < r["persistence"] < 1 and r["mse"][40] < r["mse"][5] for r in rows)
    assert "mean over 2 sensors: persistence" in capsys.readouterr().out
