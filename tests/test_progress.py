"""A grid's progress (experiments/progress.py): the ETA worked by hand, the bars in a terminal,
one line per event elsewhere; and a 2-run grid with --tensorboard and --mlflow whose runs both
show their clients' curves in one TensorBoard and one MLflow experiment."""

from __future__ import annotations

import io
import os
import re

import pytest
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

import simulation
from experiments.presets import Run
from experiments.progress import GridProgress, RunState, fitted, grid_eta
from fedamp_flwr.dashboards import EXPERIMENT


def _run(name: str, rounds: int, strategy: str = "fedamp", dataset: str = "mnist") -> Run:
    return Run(name, 3, {"strategy": strategy, "dataset": dataset, "num-server-rounds": rounds})


def test_the_eta_by_hand():
    now = 100.0
    # A: 4 of 10 rounds, 2 s each after its first; its 5th under way for 1 s: 6 x 2 - 1 = 11 s
    a = RunState(_run("a", 10), started=now - 9, done=4, seconds=[3.0, 2.0, 2.0, 2.0],
                 first_at=now - 7, last_at=now - 1)
    # B: started 1 s ago, no round yet: its group's pace (A's, 2 s): 2 - 1 + 4 x 2 = 9 s
    b = RunState(_run("b", 5), started=now - 1)
    # C: not started, another strategy: the pace of all rounds, 2 s, x 3 = 6 s, on the job
    # that is free first (B's, at 9 s): 15 s
    c = RunState(_run("c", 3, strategy="fedavg"))
    assert grid_eta([a, b, c], jobs=2, now=now) == pytest.approx(15.0)
    # D ended: its one round of 1 s ended 3 s after its start (a head of 2 s), and the run 2 s
    # later (a tail of 2 s); all rounds' pace: (3 x 2 + 1) / 4 = 1.75 s.
    # A: 11 + 2 = 13; B: 2 + 2 - 1 + 8 + 2 = 13; C: 2 + 3 x 1.75 + 2 = 9.25 after 13
    d = RunState(_run("d", 1, strategy="x"), started=0.0, ended=5.0, done=1, seconds=[1.0],
                 first_at=3.0, last_at=3.0)
    assert grid_eta([a, b, c, d], jobs=2, now=now) == pytest.approx(22.25)
    assert grid_eta([a, c, d], jobs=1, now=now) == pytest.approx(22.25)  # C after A
    assert grid_eta([a, c, d], jobs=2, now=now) == pytest.approx(13.0)  # C beside A
    assert grid_eta([RunState(_run("e", 3))], jobs=1, now=now) is None  # nothing measured


def test_a_trials_pace_follows_its_local_work():
    # one method's trials measured at 50 and 100 local steps: 1.5 s and 2.8 s a round
    assert fitted([(50, 1.5), (100, 2.8)], 25) == pytest.approx(0.85)
    assert fitted([(50, 1.5), (100, 2.8)], 1) == pytest.approx(0.226)
    assert fitted([(50, 1.0)], 100) == pytest.approx(2.0)  # one work measured: in proportion
    assert fitted([(50, 1.5), (100, 0.5)], 200) == pytest.approx(0.05)  # never below a tenth
    # in the ETA: C (25 steps) after A (50 steps, 1.5 s a round, its last round just ended)
    # and B (100 steps, 2.8 s a round, ended): 2 rounds at 0.85 s
    run = lambda name, steps: Run(name, 3, {"strategy": "s", "dataset": "d",  # noqa: E731
                                            "num-server-rounds": 2, "local-steps": steps})
    a = RunState(run("a", 50), started=0.0, done=1, seconds=[1.5], first_at=1.5, last_at=10.0)
    b = RunState(run("b", 100), started=0.0, ended=5.6, done=2, seconds=[2.8, 2.8],
                 first_at=2.8, last_at=5.6)
    c = RunState(run("c", 25))
    assert grid_eta([a, b, c], jobs=1, now=10.0) == pytest.approx(1.5 + 2 * 0.85)
    # a run resumed from its checkpoint's round 1: one round left to run
    assert grid_eta([a, b, RunState(run("c", 25), resumed_from=1)], jobs=1, now=10.0) == \
        pytest.approx(1.5 + 0.85)


@pytest.mark.parametrize("live", [False, True])
def test_events_as_lines_or_bars(live):
    out = io.StringIO()
    runs = [_run("a", 2), _run("b", 2)]
    with GridProgress(runs, jobs=1, out=out, live=live) as progress:
        progress.start(runs[0])
        progress.line(runs[0], "[1/2] a   INFO : Round 1: mean test accuracy 50%")
        progress.line(runs[0], "[1/2] a   Round 1 done in 2.50s; 1 round left")
        progress.line(runs[0], "[1/2] a   Round 2 done in 1.50s")
        progress.end(runs[0], True)
        progress.start(runs[1])
        assert progress.counts() == (1, 1, 0, 2)
        assert progress.eta() == pytest.approx(3.0, abs=0.5)  # b: 2 rounds at a's 1.5 s
        progress.end(runs[1], False)
    text = out.getvalue()
    assert "Round 1: mean test accuracy 50%" in text
    if not live:
        # a: 1 round left at 2.5 s, then b: 2 rounds at that pace, 7.5 s
        assert re.search(r"\[1/2\] a: round 1/2 done in 2.5s; grid: 0/2 runs done, 1 running, "
                         r"0 failed; ETA 0:00:0[78] ", text)
        assert "grid: 1/2 runs done, 0 running, 1 failed" in text
    else:  # rich drew the bars: the grid's line with its counts
        assert "grid: " in text and "runs done" in text


def test_a_two_run_grid_compares_in_one_tensorboard_and_one_mlflow_experiment(tmp_path, capsys):
    out = tmp_path / "grid"
    assert simulation.main(["--engine", "inprocess", "--preset", "quick", "--datasets",
                            "synthetic", "--strategies", "fedavg,fedamp", "--rounds", "2",
                            "--num-supernodes", "3", "--set", "local-epochs=1",
                            "--set", "test-samples=50", "--output", str(out),
                            "--tensorboard", "--mlflow"]) == 0
    printed = capsys.readouterr().out
    assert "round 2/2 done in" in printed and "grid: 2/2 runs done, 0 running, 0 failed" in printed
    boards = EventMultiplexer(size_guidance={"scalars": 0}).AddRunsFromDirectory(str(out / "runs"))
    boards.Reload()
    runs = boards.Runs()
    assert len(runs) == 2
    for name in runs:
        assert {f"client_accuracy/{c}" for c in range(3)} <= set(runs[name]["scalars"])
        assert [e.step for e in boards.Scalars(name, "client_accuracy/1")] == [1, 2]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    found = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert sorted(r.data.params["strategy"] for r in found) == ['"fedamp"', '"fedavg"']
    # a finished grid asked again with the dashboards off runs nothing again
    assert simulation.main(["--engine", "inprocess", "--preset", "quick", "--datasets",
                            "synthetic", "--strategies", "fedavg,fedamp", "--rounds", "2",
                            "--num-supernodes", "3", "--set", "local-epochs=1",
                            "--set", "test-samples=50", "--output", str(out)]) == 0
    assert "2 runs, 2 already done, 0 to run" in capsys.readouterr().out
