"""The experiment runner end to end: grids through `flwr run` and in process, their outputs,
resuming, time-outs, failures and signals."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import simulation
from experiments import presets, runner
from experiments.processes import SuperLink, alive, process_tree, processes_with_env, stop_tree
from fedamp_flwr.config import ConfigError
from tasks import TRAFFIC_GRAPHS

from .helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("flwr") is None or shutil.which("flower-superlink") is None,
                                reason="flwr CLI not on PATH (activate the venv)")

TINY = ["--preset", "quick", "--datasets", "synthetic", "--strategies", "fedavg,fedamp",
        "--rounds", "2", "--num-supernodes", "2", "--set", "local-epochs=1"]


@pytest.mark.flower
def test_a_grid_on_flowers_engine_runs_two_jobs_each_on_its_own_superlink(tmp_path, capfd):
    """What only processes show: a grid on Flower's engine, two jobs side by side, each on a
    SuperLink of its own, stopped with all it started; each run's progress read from Flower's
    log and its status from Flower. The same runner in process: resuming a grid, one more
    round from each run's checkpoint and a run whose metrics are gone run again
    (``test_the_inprocess_engine_runs_a_grid_with_variants_and_resumes``,
    ``test_several_jobs_give_the_results_of_one_and_resume_the_same``); a run resumed on
    Flower's engine after its SuperLink died (tests/test_faults_e2e.py); the table and plots
    of a grid's results (tests/test_report.py)."""
    out = tmp_path / "grid"
    assert simulation.main([*TINY, "--output", str(out), "--rounds", "1", "--jobs", "2"]) == 0
    printed = capfd.readouterr().out
    assert "2 runs, 0 already done, 2 to run" in printed
    assert "(job 1)" in printed and "(job 2)" in printed
    assert "Round 1: mean test accuracy" in printed  # a progress line per round, from the log
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {r["status"] for r in rows} == {"finished:completed"} and len(rows) == 2
    assert len({r["flower_run_id"] for r in rows}) == 2
    assert sorted(r["strategy"] for r in rows) == ["fedamp", "fedavg"]
    assert all(r["dataset"] == "synthetic" and r["num_rounds"] == "1" for r in rows)
    for row in rows:
        metrics = json.loads((out / "runs" / row["run_name"] / "metrics.json").read_text())
        assert metrics["finished"] and [r["round"] for r in metrics["rounds"]] == [1]
        assert 0 <= float(row["bmta"]) <= 100
    table = (out / "table.md").read_text()
    assert "| fedavg |" in table and "| fedamp |" in table and "synthetic/practical" in table
    for slot in (0, 1):  # each job's SuperLink, stopped with all it started
        assert (out / f".flwr-home-{slot}" / "superlink.log").is_file()
        assert _left_of(out / f".flwr-home-{slot}") == []


def test_bad_grid_values_fail_before_anything_runs(tmp_path):
    grid = presets.apply_overrides(presets.PRESETS["quick"], "fedavg", None, None,
                                      ["drop-rate=2"], None, "synthetic")
    with pytest.raises(ConfigError, match="'drop-rate' = 2"):
        presets.expand(grid, None, tmp_path)
    with pytest.raises(SystemExit, match="unknown run config key"):
        simulation.main(["--datasets", "synthetic", "--set", "nope=1", "--output", str(tmp_path)])
    assert not (tmp_path / "runs").exists()


def test_presets_expand_to_valid_runs(tmp_path):
    for name, grid in presets.PRESETS.items():
        runs = presets.expand(grid, "/data", tmp_path, check_data=False)
        assert len({r.name for r in runs}) == len(runs), name
    quick = presets.expand(presets.PRESETS["quick"], "/data", tmp_path, check_data=False)
    assert {r.run_config["data-dir"] for r in quick} == {"/data/mnist", "/data/fashion_mnist"}
    with pytest.raises(ConfigError, match="no folder mnist/.*or --data-dir '' to load from the Hug"):
        presets.expand(presets.PRESETS["quick"], str(tmp_path), tmp_path)
    # a dataset of the user's own files: no hub, and the stand-in where there is one
    # (the stand-in as the preset names it: its labelled setting where it has one)
    for preset, named, says in (
            ("quick", "metr-la", "own metr-la files in metr-la/.*without them, --datasets "
                                 "traffic-generated --set traffic-graph=metr-la runs"),
            ("panacea-tables", "pems-bay", "without them, --datasets traffic-generated/pems-bay "
                                           "runs the stand-in .* \\(from sensor_graphs/ there\\)$"),
            ("quick", "compcars", "own compcars files in compcars/ \\(docs/reproducing.md names "
                                  "them\\)$")):
        grid = presets.apply_overrides(presets.PRESETS[preset], "fedavg", None, 1, [], None, named)
        with pytest.raises(ConfigError, match=says) as err:
            presets.expand(grid, str(tmp_path), tmp_path)
        assert "Hugging Face" not in str(err.value)
    # and that advice plans the stand-in's runs on that graph alone
    advised = presets.apply_overrides(presets.PRESETS["panacea-tables"], "fedavg", None, 1, [],
                                      None, "traffic-generated/pems-bay")
    assert {(r.run_config["traffic-graph"], r.num_clients) for r in presets.expand(
        advised, "/data", tmp_path, check_data=False)} == {("pems-bay", 325)}


def test_command_line_values_win_over_a_settings_own(tmp_path):
    preset = presets.PRESETS["quick"]
    sigma = {r.name: r.run_config.get("heurfedamp-sigma")
             for r in presets.expand(preset, "/data", tmp_path, check_data=False)}
    assert sigma["heurfedamp-mnist-practical-s0"] == 5.0
    assert sigma["heurfedamp-fmnist-practical-s0"] is None
    grid = presets.apply_overrides(preset, "heurfedamp", None, 2, ["heurfedamp-sigma=25"], 4)
    runs = presets.expand(grid, "/data", tmp_path, check_data=False)
    assert [r.run_config["heurfedamp-sigma"] for r in runs] == [25, 25]
    assert all(r.run_config["num-server-rounds"] == 2 and r.num_clients == 4 for r in runs)


def test_the_traffic_stand_in_has_its_graphs_sensors_whatever_the_preset(tmp_path, capsys):
    """``--datasets traffic-generated`` with a preset that lacks it (the quick preset's 20
    clients) plans one client per sensor of the road graph the run config names, as the
    panacea-tables preset does: 20 failed on every node ("defines 207 clients")."""
    quick = presets.PRESETS["quick"]
    for sets, sensors in (([], 207), (["traffic-graph=pems-bay"], 325)):
        grid = presets.apply_overrides(quick, "fedavg", None, 1, sets, None, "traffic-generated")
        runs = presets.expand(grid, "/data", tmp_path, check_data=False)
        assert [(r.num_clients, r.run_config["min-nodes"]) for r in runs] == \
            [(sensors, sensors)] * len(runs) and runs
    tables = presets.expand(presets.apply_overrides(
        presets.PRESETS["panacea-tables"], "fedavg", "0", 1, [], None, "traffic-generated"),
        "/data", tmp_path, check_data=False)
    assert sorted({r.num_clients for r in tables}) == [207, 325]
    # every road graph the stand-in can run on has its count of sensors here
    assert set(TRAFFIC_GRAPHS) <= set(presets.FIXED_CLIENTS)
    # --num-supernodes is a partitioned dataset's: the others' runs say that it is not theirs
    args = simulation.parse_args(["--datasets", "traffic-generated,synthetic", "--strategies",
                                  "fedavg", "--num-supernodes", "5", "--output", str(tmp_path)])
    grid = presets.apply_overrides(presets.PRESETS[args.preset], args.strategies, None, None, [],
                                   args.num_supernodes, args.datasets)
    runs = simulation.grid_runs(args, grid, tmp_path)
    assert sorted(r.num_clients for r in runs) == [5, 207]
    assert "--num-supernodes 5 is not for traffic-generated: their data fix their clients" in \
        capsys.readouterr().out


def test_stop_tree_stops_children_that_started_their_own_session():
    # The SuperLink's shape: it starts a SuperExec in a session of its own, which
    # starts the simulation. Stopping the SuperLink's group alone leaves those running.
    child = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
             "'import time; time.sleep(120)'], start_new_session=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(tree := process_tree(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(tree) == 2
        assert os.getpgid(tree[1].pid) != os.getpgid(proc.pid)  # its own session and group
        stop_tree(proc.pid, timeout=10)
        proc.wait(timeout=10)
        assert not any(alive(p) for p in tree)
    finally:
        if proc.poll() is None:
            proc.kill()


def _left_of(home: Path) -> list[int]:
    """Live processes with FLWR_HOME=home: the SuperLink and everything it started."""
    return processes_with_env("FLWR_HOME", str(home))


@pytest.mark.flower
def test_a_timed_out_run_is_stopped_and_the_grid_goes_on(tmp_path, capsys):
    out = tmp_path / "grid"
    args = ["--preset", "quick", "--datasets", "synthetic", "--strategies", "fedavg,fedamp",
            "--rounds", "200", "--num-supernodes", "2", "--set", "local-epochs=1", "--timeout", "5"]
    assert simulation.main([*args, "--output", str(out)]) == 1
    printed = capsys.readouterr().out
    assert printed.count("timed out after 5s: stopped with flwr stop") == 2  # one after the other
    assert "2 run(s) failed" in printed
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {r["status"] for r in rows} == {"finished:stopped"}
    assert {r["timed_out"] for r in rows} == {"True"} and {r["finished"] for r in rows} == {"False"}
    assert "2 run(s) that did not finish are left out" in (out / "table.md").read_text()
    time.sleep(1)
    assert _left_of(out / ".flwr-home") == []


@pytest.mark.flower
def test_a_run_that_hangs_silently_times_out_by_the_clock(tmp_path):
    """A ClientApp that sleeps without a word: no log line ever comes, the clock stops it."""
    out = tmp_path / "grid"
    run = presets.PlannedRun("sleepy", 2, {"sleep-seconds": 3600.0})
    with SuperLink(tmp_path / "home") as link:
        started = time.monotonic()
        outcome = runner.run_one(link, out, run, "num-supernodes=2", "[sleepy]", timeout=8,
                                     app=ROOT / "tests" / "apps" / "sleepy")
        assert time.monotonic() - started < 90
        assert outcome.timed_out and outcome.status == "finished:stopped"
        status = json.loads((out / "runs" / "sleepy" / "status.json").read_text())
        assert status["status"] == "finished:stopped" and status["timed_out"] is True
        assert int(status["run_id"]) == outcome.run_id
        # flwr stop ends the simulation: nothing of the run is left but the SuperLink's own
        deadline = time.monotonic() + 60  # Ray workers end slowly on a loaded machine
        while (left := [p for p in _left_of(tmp_path / "home") if p != link.proc.pid]
               ) and time.monotonic() < deadline:
            time.sleep(0.5)
        names = [psutil.Process(p).cmdline()[:2] for p in left if psutil.pid_exists(p)]
        assert all("superexec" in " ".join(n) for n in names), names
    assert _left_of(tmp_path / "home") == []


@pytest.mark.flower
def test_a_failed_run_is_recorded_as_failed(tmp_path, capsys):
    """flwr run exits 0 when the ServerApp fails; Flower's status says it failed."""
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz file")
    out = tmp_path / "grid"
    args = ["--preset", "quick", "--datasets", "npz", "--strategies", "fedavg",
            "--rounds", "1", "--num-supernodes", "2", "--set", "local-epochs=1",
            "--set", f"data-dir={bad}", "--output", str(out)]
    assert simulation.main(args) == 1
    printed = capsys.readouterr().out
    assert "FAILED (finished:failed)" in printed and "1 run(s) failed" in printed
    (row,) = list(csv.DictReader(open(out / "results.csv")))
    assert row["status"] == "finished:failed" and row["finished"] == "False"
    assert row["strategy"] == "fedavg" and row["num_clients"] == "2"
    log = (out / "runs" / row["run_name"] / "log.txt").read_text()
    # the server reads the npz file itself, once, before any client is asked
    assert f"Run stopped: run config 'data-dir' = '{bad}': {bad}: is not an .npz file" in log


@pytest.mark.flower
def test_sigterm_stops_the_grid_and_everything_it_started(tmp_path):
    out = tmp_path / "grid"
    args = [sys.executable, str(simulation.ROOT / "simulation.py"), "--preset", "quick",
            "--datasets", "synthetic", "--strategies", "fedavg", "--rounds", "200",
            "--num-supernodes", "2", "--set", "local-epochs=1", "--output", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # wait until the simulation reports its first round
            if "Round 1:" in line:
                break
        assert _left_of(out / ".flwr-home")
        proc.terminate()
        assert proc.wait(timeout=60) == 130
        assert "the same command resumes the grid" in proc.stdout.read()
        assert _left_of(out / ".flwr-home") == []
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_the_inprocess_engine_runs_a_grid_with_variants_and_resumes(tmp_path, capsys):
    out = tmp_path / "grid"
    args = ["--engine", "inprocess", "--preset", "nonconvex", "--datasets", "synthetic",
            "--num-supernodes", "3", "--rounds", "1", "--set", "test-samples=50",
            "--output", str(out)]
    assert simulation.main(args) == 0  # synthetic/blocks and synthetic/practical x 3
    printed = capsys.readouterr().out
    assert "6 runs, 0 already done, 6 to run" in printed and "Round 1: mean test" in printed
    rows = {r["run_name"] for r in csv.DictReader(open(out / "results.csv"))}
    assert {"nonconvex-synthetic-blocks-s0", "nonconvex@sum-synthetic-blocks-s0",
            "fedavg-synthetic-practical-s0"} <= rows and len(rows) == 6
    table = (out / "table.md").read_text()
    assert "| nonconvex@sum |" in table and "| nonconvex |" in table
    runs = out / "runs"
    normalized = json.loads((runs / "nonconvex-synthetic-blocks-s0" / "metrics.json").read_text())
    assert normalized["config"]["nonconvex-normalize"] is True  # the default
    literal = json.loads((runs / "nonconvex@sum-synthetic-blocks-s0" / "metrics.json")
                         .read_text())
    assert literal["label"] == "nonconvex@sum" and not literal["config"]["nonconvex-normalize"]
    # the sum of 3 models as written is about 3 times the average's norm
    ratio = literal["rounds"][0]["global_norm"] / normalized["rounds"][0]["global_norm"]
    assert 2.5 < ratio < 3.5
    assert simulation.main(args) == 0
    assert "6 runs, 6 already done, 0 to run" in capsys.readouterr().out
    # a run whose metrics are gone runs again, and only that one
    gone = runs / "fedavg-synthetic-practical-s0" / "metrics.json"
    stamp = (runs / "nonconvex-synthetic-blocks-s0" / "metrics.json").stat().st_mtime_ns
    gone.unlink()
    assert simulation.main(args) == 0
    printed = capsys.readouterr().out
    assert "6 runs, 5 already done, 1 to run" in printed and "fedavg-synthetic-practical" in printed
    assert gone.is_file()
    assert (runs / "nonconvex-synthetic-blocks-s0" / "metrics.json").stat().st_mtime_ns == stamp
    # a piece of the grid into the same folder: the report keeps the other runs' rows
    before = {r["run_name"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert simulation.main([*args, "--strategies", "fedavg"]) == 0
    assert "with 4 earlier run(s)" in capsys.readouterr().out
    assert {r["run_name"]: r for r in csv.DictReader(open(out / "results.csv"))} == before
    assert "| nonconvex@sum |" in (out / "table.md").read_text()


def test_run_names_name_the_partitioning_only_for_pool_datasets():
    from experiments.presets import Setting, run_name

    assert run_name("panacea", Setting("fl60", "practical", 60, label="grda"), {}, 0) == \
        "panacea-fl60-grda-s0"
    assert run_name("fedavg", Setting("tpt48", "practical", 48), {"drop-rate": 0.1}, 1) == \
        "fedavg-tpt48-drop-rate0p1-s1"
    assert run_name("fedamp", Setting("fmnist", "practical", 20), {}, 0) == "fedamp-fmnist-practical-s0"


def test_help_shows_the_defaults(capsys):
    import simulation

    with pytest.raises(SystemExit):
        simulation.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: quick)" in text and "seconds per run (6 hours)" in text
    assert "(default: 21600" in text and "(default: None)" not in text


def _rows(path: Path) -> list[dict[str, str]]:
    """results.csv without what differs between two runs of the same grid: the clock, Flower's
    run id, the output folder and whether a run was resumed."""
    drop = {"wall_time_s", "flower_run_id", "config.results-dir", "config.resume",
            "config.overwrite"}
    return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(open(path))]


def _close(a: object, b: object, rel: float = 1e-6) -> bool:
    """``a == b``, floats within ``rel`` of each other, in nested lists and dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=rel)
    return type(a) is type(b) and a == b


# alone=false: the synthetic task's clients would also train alone (a measurement beside
# the run, tests/test_default_run.py), which these tests of the grid's jobs do not read
JOBS_GRID = ["--engine", "inprocess", "--preset", "nonconvex", "--datasets", "synthetic",
             "--num-supernodes", "3", "--set", "test-samples=50", "--set", "alone=false"]


@pytest.mark.flower
def test_several_jobs_give_the_results_of_one_and_resume_the_same(tmp_path, capfd):
    one, two = tmp_path / "one", tmp_path / "two"
    assert simulation.main([*JOBS_GRID, "--rounds", "2", "--output", str(one)]) == 0
    # two jobs: the first round, then the grid again with one more round (resumed)
    assert simulation.main([*JOBS_GRID, "--rounds", "1", "--output", str(two), "--jobs", "2"]) == 0
    assert simulation.main([*JOBS_GRID, "--rounds", "2", "--output", str(two), "--jobs", "2"]) == 0
    printed = capfd.readouterr().out
    assert "2 jobs at a time, 1 CPU thread(s) each" in printed
    assert printed.count("resuming after round 1 from its checkpoint") == 6
    # every job's progress, under its run's name
    assert "[6/6] fedavg-synthetic-practical-s0   Round 2: mean test accuracy" in printed
    assert _rows(one / "results.csv") == _rows(two / "results.csv")
    assert len(_rows(two / "results.csv")) == 6
    for run in (one / "runs").iterdir():
        a = json.loads((run / "metrics.json").read_text())
        b = json.loads((two / "runs" / run.name / "metrics.json").read_text())
        # the same to the last digit with the same number of threads; a job has fewer, so
        # float sums may differ in their last digits (as in test_behaviour_unchanged)
        assert _close(a["rounds"], b["rounds"]), run.name
    assert simulation.main([*JOBS_GRID, "--rounds", "2", "--output", str(two), "--jobs", "2"]) == 0
    assert "6 runs, 6 already done, 0 to run" in capfd.readouterr().out


@pytest.mark.flower
def test_a_failed_job_is_recorded_and_the_others_go_on(tmp_path, capfd):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz file")
    out = tmp_path / "grid"
    args = ["--engine", "inprocess", "--preset", "quick", "--datasets", "npz,synthetic",
            "--strategies", "fedavg", "--rounds", "1", "--num-supernodes", "2",
            "--set", "local-epochs=1", "--set", "test-samples=50", "--output", str(out),
            "--jobs", "2"]
    # data-dir names the bad file for every run; synthetic data ignores it
    assert simulation.main([*args, "--set", f"data-dir={bad}"]) == 1
    printed = capfd.readouterr().out
    assert "FAILED (finished:failed)" in printed and "1 run(s) failed" in printed
    rows = {r["dataset"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert rows["npz"]["status"] == "finished:failed" and rows["npz"]["finished"] == "False"
    assert rows["synthetic"]["status"] == "finished:completed"


def test_jobs_must_be_a_positive_integer_or_auto(tmp_path):
    from experiments.jobs import auto_jobs

    for bad in ("0", "-2", "many", "1.5"):
        with pytest.raises(SystemExit, match=f"--jobs = '{bad}' is invalid; allowed: a positive "
                                             "integer or 'auto'"):
            simulation.main([*JOBS_GRID, "--output", str(tmp_path), "--jobs", bad])
    assert not (tmp_path / "runs").exists()
    assert auto_jobs(2, 0) == 1 and auto_jobs(16, 0) == 2 and auto_jobs(64, 0) == 8
    assert auto_jobs(16, 1) == 4 and auto_jobs(4, 1) == 2 and auto_jobs(16, 2) == 8


@pytest.mark.flower
def test_sigterm_stops_every_job_and_what_it_started(tmp_path):
    out = tmp_path / "grid"
    args = [sys.executable, str(simulation.ROOT / "simulation.py"), *JOBS_GRID,
            "--rounds", "500", "--output", str(out), "--jobs", "2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = set()
        for line in proc.stdout:  # wait until both jobs report a round
            if "Round 1:" in line:
                started.add(line.split()[1])
            if len(started) == 2:
                break
        tree = process_tree(proc.pid)
        assert len(tree) >= 3  # the grid and its two jobs
        proc.terminate()
        assert proc.wait(timeout=60) == 130
        assert "the same command resumes the grid" in proc.stdout.read()
        time.sleep(0.5)
        assert [p.pid for p in tree if alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
