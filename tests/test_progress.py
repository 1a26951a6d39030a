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
from experiments.presets import PlannedRun
from experiments.progress import GridProgress, RunState, fitted, grid_eta, no_eta_yet
from fedamp_flwr.server.dashboards import EXPERIMENT


def _run(name: str, rounds: int, strategy: str = "fedamp", dataset: str = "mnist") -> PlannedRun:
    return PlannedRun(name, 3, {"strategy": strategy, "dataset": dataset, "num-server-rounds": rounds})


def test_the_eta_by_hand():
    now = 100.0
    # A: 4 of 10 rounds, 2 s each after its first; its 5th under way for 1 s: 6 x 2 - 1 = 11 s;
    # its head: its first round ended 2 s after its start, less a round at its pace: 0 s
    a = RunState(_run("a", 10), started=now - 9, done=4, seconds=[3.0, 2.0, 2.0, 2.0],
                 first_at=now - 7, last_at=now - 1)
    # B: started 1 s ago, no round yet: its group's pace (A's, 2 s) and head (A's, 0 s):
    # 0 + 2 - 1 + 4 x 2 = 9 s
    b = RunState(_run("b", 5), started=now - 1)
    # C: not started, another strategy: the pace of all rounds, 2 s, x 3 = 6 s, on the job
    # that is free first (B's, at 9 s): 15 s
    c = RunState(_run("c", 3, strategy="fedavg"))
    assert grid_eta([a, b, c], jobs=2, now=now) == pytest.approx(15.0)
    # D ended: its one round of 1 s ended 3 s after its start (a head of 2 s), and the run 2 s
    # later (a tail of 2 s); all rounds' pace: (3 x 2 + 1) / 4 = 1.75 s; all heads: 1 s.
    # A: 11 + 2 = 13; B (A's head): 0 + 2 - 1 + 8 + 2 = 11; C: 1 + 3 x 1.75 + 2 = 8.25 after 11
    d = RunState(_run("d", 1, strategy="x"), started=0.0, ended=5.0, done=1, seconds=[1.0],
                 first_at=3.0, last_at=3.0)
    assert grid_eta([a, b, c, d], jobs=2, now=now) == pytest.approx(19.25)
    assert grid_eta([a, c, d], jobs=1, now=now) == pytest.approx(21.25)  # C after A
    assert grid_eta([a, c, d], jobs=2, now=now) == pytest.approx(13.0)  # C beside A
    assert grid_eta([RunState(_run("e", 3))], jobs=1, now=now) is None  # nothing measured
    # A resumed grid whose machine slept through a round (7,500 s, over 10 x the median 2 s):
    # that round says nothing of the pace, and A's 11 s left stand
    a.seconds = [3.0, 2.0, 7500.0, 2.0, 2.0]
    assert a.steady == [2.0, 2.0, 2.0]
    assert grid_eta([a], jobs=1, now=now) == pytest.approx(11.0)
    # ... and a run whose start the machine slept through (S: a head of 7,201 s, beside A's
    # 0 s and D's 2 s; one round of 1 s, a tail of 2 s) says nothing of C's head: all rounds'
    # pace (3 x 2 + 1 + 1) / 5 = 1.6 s; heads (0 + 2) / 2 = 1 s; tails 2 s: C = 1 + 3 x 1.6 + 2
    # = 7.8 s, after A's 13 s on one job
    slept = RunState(_run("s", 1, strategy="y"), started=0.0, ended=7205.0, done=1,
                     seconds=[1.0], first_at=7202.0, last_at=7203.0)
    assert grid_eta([a, c, d, slept], jobs=1, now=now) == pytest.approx(13.0 + 7.8)


def test_no_eta_from_a_first_round_alone():
    # A's first round (which also loads the data) says nothing of the pace: no ETA yet
    a = RunState(_run("a", 5), started=0.0, done=1, seconds=[100.0], first_at=150.0,
                 last_at=150.0)
    b = RunState(_run("b", 5, strategy="fedavg"))
    assert grid_eta([a, b], jobs=1, now=150.0) is None
    assert no_eta_yet([a, b]) == "ETA after round 2"
    assert no_eta_yet([RunState(_run("c", 5), resumed_from=3)]) == \
        "ETA after a run's second round"
    assert no_eta_yet([RunState(_run("c", 1))]) == "ETA after the first run"
    # its second round: a pace (50 s); its head from its own start: 150 - 50 = 100 s.
    # A: 3 x 50 = 150 s; B: 100 + 5 x 50 = 350 s after it
    a.done, a.seconds, a.last_at = 2, [100.0, 50.0], 200.0
    assert grid_eta([a, b], jobs=1, now=200.0) == pytest.approx(500.0)
    # a run that ended after its only round: that round is its pace
    one = RunState(_run("c", 1), started=0.0, ended=12.0, done=1, seconds=[8.0], first_at=10.0,
                   last_at=10.0)
    assert grid_eta([one, RunState(_run("d", 1))], jobs=1, now=12.0) == \
        pytest.approx(2.0 + 8.0 + 2.0)  # head 2 s, a round of 8 s, tail 2 s
    one.failed = True  # a failed one says nothing
    assert grid_eta([one, RunState(_run("d", 1))], jobs=1, now=12.0) is None
    assert grid_eta([one], jobs=1, now=12.0) == 0.0  # every run ended: nothing left


def test_a_trials_pace_follows_its_local_work():
    # one method's trials measured at 50 and 100 local steps: 1.5 s and 2.8 s a round
    assert fitted([(50, 1.5), (100, 2.8)], 25) == pytest.approx(0.85)
    assert fitted([(50, 1.5), (100, 2.8)], 1) == pytest.approx(0.226)
    assert fitted([(50, 1.0)], 100) == pytest.approx(2.0)  # one work measured: in proportion
    assert fitted([(50, 1.5), (100, 0.5)], 200) == pytest.approx(0.05)  # never below a tenth
    # in the ETA: C (25 steps) after A (50 steps, 1.5 s a round, its second round just ended)
    # and B (100 steps, 2.8 s a round, ended): 2 rounds at 0.85 s
    run = lambda name, steps: PlannedRun(name, 3, {"strategy": "s", "dataset": "d",  # noqa: E731
                                            "num-server-rounds": 2, "local-steps": steps})
    a = RunState(PlannedRun("a", 3, {**run("a", 50).run_config, "num-server-rounds": 3}), started=0.0,
                 done=2, seconds=[1.5, 1.5], first_at=1.5, last_at=3.0)
    b = RunState(run("b", 100), started=0.0, ended=5.6, done=2, seconds=[2.8, 2.8],
                 first_at=2.8, last_at=5.6)
    c = RunState(run("c", 25))
    assert grid_eta([a, b, c], jobs=1, now=3.0) == pytest.approx(1.5 + 2 * 0.85)
    # a run resumed from its checkpoint's round 1: one round left to run
    assert grid_eta([a, b, RunState(run("c", 25), resumed_from=1)], jobs=1, now=3.0) == \
        pytest.approx(1.5 + 0.85)


@pytest.mark.parametrize("live", [False, True])
def test_events_as_lines_or_bars(live):
    out = io.StringIO()
    now = [0.0]
    runs = [_run("a", 2), _run("b", 2)]
    with GridProgress(runs, jobs=1, out=out, live=live, clock=lambda: now[0]) as progress:
        progress.start(runs[0])
        for at, line in [
                (3.0, "[1/2] a: submitted as run 7"),
                (9.0, "[1/2] a   Run 'a': strategy fedamp, data mnist/practical; results in /r/a"),
                (40.0, "[1/2] a   Found 3 clients (partition ids 0..2), 100 to 500 training "
                       "samples each"),
                (40.0, "[1/2] a   [ROUND 1/2]")]:
            now[0] = at
            progress.line(runs[0], line)
        if live:  # the run's bar says its newest milestone
            assert "[1/2] a: round 1/2 under way" in [t.description for t in progress._bars.tasks]
        now[0] = 42.5
        progress.line(runs[0], "[1/2] a   INFO : Round 1: mean test accuracy 50%")
        progress.line(runs[0], "[1/2] a   Round 1 done in 2.50s; 1 round left")
        progress.line(runs[0], "[1/2] a   [ROUND 2/2]")  # a later round's start: not said
        now[0] = 44.0
        progress.line(runs[0], "[1/2] a   Round 2 done in 1.50s")
        now[0] = 45.0
        progress.end(runs[0], True)
        progress.start(runs[1])
        assert progress.counts() == (1, 1, 0, 2)
        # b: a's head (its first round ended 42.5 s after its start, less a round of 1.5 s:
        # 41 s), 2 rounds at a's 1.5 s, a's tail (1 s)
        assert progress.eta() == pytest.approx(45.0)
        progress.end(runs[1], False)
    text = out.getvalue()
    assert "Round 1: mean test accuracy 50%" in text
    for said in ("[1/2] a: submitted as run 7 (3s in)", "[1/2] a: ServerApp started (9s in)",
                 "[1/2] a: 3 clients found (40s in)", "[1/2] a: round 1/2 under way (40s in)"):
        assert said in text
    assert "ROUND 2/2" not in text and "round 2/2 under way" not in text
    if not live:
        # no ETA from a first round alone; after a's second: b's head and 2 rounds, 44 s
        assert "[1/2] a: round 1/2 done in 2.5s; grid: 0/2 runs done, 1 running, 0 failed; " \
               "ETA after round 2\n" in text
        assert re.search(r"\[1/2\] a: round 2/2 done in 1.5s; grid: 0/2 runs done, 1 running, "
                         r"0 failed; ETA 0:00:44 ", text)
        assert "grid: 1/2 runs done, 0 running, 1 failed" in text
    else:  # rich drew the bars: the grid's line with its counts
        assert "grid: " in text and "runs done" in text


def _replay(runs: list[PlannedRun], timeline: list[tuple[float, str, str]]) -> tuple[str, list]:
    """Feed a grid's recorded timeline (seconds, run name, event: "start", "end", or a line of
    the run) to a GridProgress with a fake clock: its lines, and (seconds, ETA) after each
    event."""
    out, now = io.StringIO(), [0.0]
    by_name = {r.name: r for r in runs}
    etas = []
    with GridProgress(runs, jobs=1, out=out, live=False, clock=lambda: now[0]) as progress:
        for at, name, event in timeline:
            now[0] = at
            if event == "start":
                progress.start(by_name[name])
            elif event == "end":
                progress.end(by_name[name], True)
            else:
                progress.line(by_name[name], f"[{runs.index(by_name[name]) + 1}/{len(runs)}] "
                                             f"{name}{event}")
            etas.append((at, progress.eta()))
    return out.getvalue(), etas


def _grid_run(name: str, start: float, head: list[float], rounds: list[float],
              tail: float) -> list[tuple[float, str, str]]:
    """A run's events: submitted, ServerApp started and clients found (the seconds ``head``
    after its start), then its rounds and its tail."""
    submitted, started, found = (start + h for h in head)
    events = [(start, name, "start"), (submitted, name, ": submitted as run 1"),
              (started, name, f"   Run '{name}': strategy s, data mnist/practical; results in /r"),
              (found, name, "   Found 20 clients (partition ids 0..19), 100 to 500 training "
                            "samples each"), (found, name, f"   [ROUND 1/{len(rounds)}]")]
    at = found
    for i, seconds in enumerate(rounds, 1):
        at += seconds
        events.append((at, name, f"   Round {i} done in {seconds:.2f}s"))
    return events + [(at + tail, name, "end")]


def test_the_first_eta_of_a_recorded_grid():
    # the small grid of docs/performance.md ("A grid's ETA"), as its lines came (seconds
    # since simulation.py started): `--datasets mnist --strategies separate,fedavg --rounds 3`
    runs = [PlannedRun(f"{s}-mnist-practical-s0", 20, {"strategy": s, "dataset": "mnist",
                                                 "num-server-rounds": 3})
            for s in ("separate", "fedavg")]
    timeline = (_grid_run(runs[0].name, 6.8, [3.4, 9.3, 45.3], [96.50, 91.64, 94.00], 10.7)
                + _grid_run(runs[1].name, 344.9, [2.2, 8.5, 27.5], [107.30, 100.80, 100.00],
                            9.4))
    text, etas = _replay(runs, timeline)
    end = timeline[-1][0]
    assert end == pytest.approx(689.9, abs=0.1)
    # said before its first round ended: submitted, started, clients found, round 1 under way
    name = f"[1/2] {runs[0].name}"
    assert text.splitlines()[:5] == [
        f"{name}: submitted as run 1 (3s in)", f"{name}: ServerApp started (9s in)",
        f"{name}: 20 clients found (45s in)", f"{name}: round 1/3 under way (45s in)",
        f"{name}: round 1/3 done in 96.5s; grid: 0/2 runs done, 1 running, 0 failed; "
        "ETA after round 2"]
    # no ETA from the first round; the first one after the second (240 s in): separate's
    # round 3 at its 91.64 s, then fedavg: separate's head (its first round's end less its
    # start and a round: 148.6 - 6.8 - 91.64 = 50.16 s) and 3 rounds at 91.64 s: 416.7 s,
    # where the grid had 449.7 s left
    first = next((at, eta) for at, eta in etas if eta is not None)
    assert first[0] == pytest.approx(240.2, abs=0.1)
    assert first[1] == pytest.approx(91.64 + 50.16 + 3 * 91.64, abs=0.01)
    for at, eta in etas:  # every ETA given: within 10% of the truth (or 10 s)
        if eta is not None and at < end:
            assert abs(eta - (end - at)) <= max(0.10 * (end - at), 10.0), (at, eta)


def test_a_slow_first_round_is_head_not_pace():
    # the quick preset's shape: 12 runs of 5 rounds, each with 40 s before its first round,
    # a first round of 100 s (the data loaded, the workers warmed up) where its others take
    # 50 s, and 10 s after its last; one method in two 20% slower
    runs = [PlannedRun(f"r{i}", 20, {"strategy": f"s{i}", "dataset": "mnist", "num-server-rounds": 5})
            for i in range(12)]
    timeline: list[tuple[float, str, str]] = []
    at = 0.0
    for i, run in enumerate(runs):
        pace = 50.0 * (1.2 if i % 2 else 1.0)
        events = _grid_run(run.name, at, [5.0, 12.0, 40.0],
                           [pace + 50.0] + [pace] * 4, 10.0)
        timeline += events
        at = events[-1][0]
    text, etas = _replay(runs, timeline)
    first = next((at, eta) for at, eta in etas if eta is not None)
    left = at - first[0]
    # after the first run's second round (190 s in): 3 x 50 + 11 x (90 + 5 x 50) = 3890 s
    # (its head: 140 - 50 = 90 s), where 4310 s were left (-10%); without that head, 2900 s
    # (-33%); the first round as the pace, at its end: 4 x 100 + 11 x 5 x 100 = 5900 s (+35%)
    assert left == pytest.approx(4310.0)
    assert first[0] == pytest.approx(190.0)
    assert first[1] == pytest.approx(3 * 50 + 11 * (90 + 5 * 50))
    assert 0.5 < first[1] / left < 2
    assert "ETA after round 2" in text


def test_the_runner_passes_the_milestones():
    from experiments.runner import _progress

    got: list[str] = []
    show = _progress("[1/2] a", got.append)
    log = ["Run 'a': strategy fedamp, data mnist/practical; results in /r/a",
           "Starting FedAMP, rounds 1 to 5", "Found 20 clients (partition ids 0..19), 100 to 500 "
           "training samples each", "", "[ROUND 1/5]", "configure_train: 20 of 20 clients",
           "Round 1: mean test accuracy over 20 clients 81.65%", "Round 1 done in 96.50s"]
    for line in log:
        show(f"INFO :      {line}")  # as Flower's log has it, without its colours
    assert got == [f"[1/2] a   {line}" for line in log
                   if line and not line.startswith(("Starting", "configure"))]


@pytest.mark.slow
def test_a_two_run_grid_compares_in_one_tensorboard_and_one_mlflow_experiment(tmp_path, capsys):
    out = tmp_path / "grid"
    assert simulation.main(["--engine", "inprocess", "--preset", "quick", "--datasets",
                            "synthetic", "--strategies", "fedavg,fedamp", "--rounds", "2",
                            "--num-supernodes", "3", "--set", "local-epochs=1",
                            "--set", "test-samples=50", "--output", str(out),
                            "--tensorboard", "--mlflow"]) == 0
    printed = capsys.readouterr().out
    assert "round 2/2 done in" in printed and "grid: 2/2 runs done, 0 running, 0 failed" in printed
    for run in ("[1/2] fedavg-synthetic-practical-s0", "[2/2] fedamp-synthetic-practical-s0"):
        for milestone in ("ServerApp started", "3 clients found", "round 1/2 under way"):
            assert f"{run}: {milestone} (" in printed  # in process too
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


def test_a_grids_round_digest_counts_its_rounds_without_the_paused_one(tmp_path):
    import json

    from experiments.round_digest import main

    done, running = tmp_path / "runs" / "sfl-a-s0", tmp_path / "runs" / "sfl-b-s0"
    for d in (done, running):
        d.mkdir(parents=True)
    rounds = [{"round": r, "mean_mse": 0.1 / r, "train_loss": 0.2 / r, "client_mse": {}}
              for r in (1, 2, 3, 4)]
    done.joinpath("metrics.json").write_text(json.dumps(
        {"strategy": "sfl", "finished": True, "wall_time_s": 7530.0, "best_mean_mse": 0.025,
         "rounds": rounds}))
    # round 3 ran twice (before and after a resume: the last counts), round 2 slept
    done.joinpath("log.txt").write_text(
        "INFO : Round 1 done in 2.00s; 3 rounds left\nRound 2 done in 7500.00s\n"
        "Round 3 done in 9.00s\nresuming\nRound 3 done in 3.00s\nRound 4 done in 2.50s\n")
    running.joinpath("metrics.json").write_text(json.dumps({"finished": False, "rounds": []}))
    out = tmp_path / "rounds.json"
    main([str(tmp_path), "--out", str(out)])
    digest = json.loads(out.read_text())
    assert list(digest) == ["sfl-a-s0"]  # the unfinished run is left out
    run = digest["sfl-a-s0"]
    assert run["rounds_s"] == 7507.5 and run["rounds_s_unpaused"] == 7.5
    assert run["paused_rounds"] == 1 and run["wall_time_s"] == 7530.0
    assert run["best_mean_mse"] == 0.025
    assert run["rounds"][1] == {"round": 2, "mean_mse": 0.05, "train_loss": 0.1}
    from experiments.round_digest import table

    # best 0.025 in round 4; after 10% (round 1), 50% (round 2), 100% (round 4); x1e3
    assert table(digest, 1e3).splitlines()[2] == \
        "| sfl-a-s0 | 25.00 (4) | 100.00 / 50.00 / 25.00 | 50.00 | 0 (1) |"


def test_a_round_digest_adds_to_an_earlier_one_and_refuses_a_foreign_file(tmp_path, capsys):
    """A grid run in pieces: with --add, a later piece's digest keeps the earlier runs it does
    not hold and replaces those it does; without --add, or where the file is not a digest, the
    command refuses and the file is left as it was."""
    import json

    from experiments.round_digest import main

    run = tmp_path / "runs" / "pfedme-a-s0"
    run.mkdir(parents=True)
    run.joinpath("metrics.json").write_text(json.dumps(
        {"strategy": "pfedme", "finished": True, "wall_time_s": 5.0, "best_mean_mse": 0.5,
         "rounds": [{"round": 1, "mean_mse": 0.5, "train_loss": 1.0}]}))
    out = tmp_path / "rounds.json"
    sfl = {"strategy": "sfl", "best_mean_mse": 0.1, "rounds_s_unpaused": 60.0,
           "paused_rounds": 0, "rounds": [{"round": 1, "mean_mse": 0.1}]}
    earlier = {"sfl-a-s0": sfl, "pfedme-a-s0": {**sfl, "strategy": "pfedme"}}
    out.write_text(json.dumps(earlier))
    with pytest.raises(SystemExit, match="holds 1 run.*sfl-a-s0.*--add"):
        main([str(tmp_path), "--out", str(out)])
    assert json.loads(out.read_text()) == earlier
    main([str(tmp_path), "--out", str(out), "--add"])
    digest = json.loads(out.read_text())
    assert list(digest) == ["pfedme-a-s0", "sfl-a-s0"]  # by name
    assert digest["sfl-a-s0"] == sfl  # kept as it was
    assert digest["pfedme-a-s0"]["wall_time_s"] == 5.0  # replaced by this folder's
    assert "1 of its earlier runs replaced, 1 kept" in capsys.readouterr().out
    for foreign in ("[1, 2]", json.dumps({"x": {"rounds": []}})):
        out.write_text(foreign)
        with pytest.raises(SystemExit, match="is not a round digest"):
            main([str(tmp_path), "--out", str(out), "--add"])
        assert out.read_text() == foreign
