"""Running a grid: each run through Flower's CLI on a local SuperLink, or in process.

A run that already has ``runs/<name>/metrics.json`` with the same run config
and ``finished`` is not run again; a half-finished one continues from its
checkpoint. Each run's outcome (Flower's run id and status, whether it timed
out) goes to ``runs/<name>/status.json`` beside its ``metrics.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from experiments import report
from experiments.flower_cli import (
    COMPLETED,
    FAILED,
    FlowerCliError,
    FlowerRun,
    RunOutcome,
    app_snapshot,
    wait_for_superlink,
    write_outcome,
)
from experiments.jobs import Children, pool, threads_per_job
from experiments.presets import PlannedRun
from experiments.processes import SuperLink
from experiments.progress import GridProgress, shown
from fedamp_flwr.config import RunConfig, default_values
from fedamp_flwr.server.results import checkpoint_files
from strategies.core.records import RunFile

ROOT = Path(__file__).resolve().parents[1]
# Each run's outcome (Flower's run id and status), beside its metrics.json.
STATUS_FILE = report.STATUS_FILE
# What changes where a run's records go, not the run: a finished run is not run again for them.
DASHBOARD_KEYS = ("tensorboard", "mlflow", "mlflow-uri")
# The status of a run that Flower refused to start (flwr run failed).
NOT_SUBMITTED = "not-submitted"


def metrics_path(output: Path, run: PlannedRun) -> Path:
    return output / "runs" / run.name / "metrics.json"


def previous_run(output: Path, run: PlannedRun) -> RunFile | None:
    """The metrics.json ``run`` left before, if its run config is the same."""
    try:
        metrics = RunFile.read(metrics_path(output, run))
    except (OSError, ValueError):
        return None
    config = metrics.config
    same = all(config.get(k) == v for k, v in run.run_config.items()
               if k not in ("num-server-rounds", *DASHBOARD_KEYS))
    # the keys left at "auto" must resolve as they did (a tuning or a task's defaults may
    # have changed what "auto" gives since)
    resolved = RunConfig.from_run_config(run.run_config).to_dict()
    auto = [k for k, v in default_values().items() if v == "auto" and k not in run.run_config]
    same = same and all(config.get(k) == resolved[k] for k in auto if k in config)
    return metrics if same else None


def is_done(output: Path, run: PlannedRun) -> bool:
    """Whether ``run`` finished before with the same run config (resume)."""
    metrics = previous_run(output, run)
    rounds = run.run_config.get("num-server-rounds")
    return bool(metrics and metrics.finished and metrics.completed_rounds == rounds
                and metrics.config.get("num-server-rounds") == rounds)


def resumable(output: Path, run: PlannedRun) -> int:
    """The rounds a half-finished ``run`` has done and checkpointed (0: start afresh)."""
    metrics = previous_run(output, run)
    if not metrics or not checkpoint_files(output / "runs" / run.name):
        return 0
    done = metrics.completed_rounds
    return done if done <= int(run.run_config.get("num-server-rounds", done)) else 0


def federation_config(num_clients: int, cpus: float, gpus: float) -> str:
    """The ``--federation-config`` of a run: SuperNodes and each ClientApp's resources."""
    def num(v: float) -> str:  # Flower wants integral resources as integers
        return str(int(v)) if float(v).is_integer() else repr(float(v))

    parts = [f"num-supernodes={num_clients}", f"client-resources-num-cpus={num(cpus)}",
             f"client-resources-num-gpus={num(gpus)}"]
    return " ".join(parts)


def _progress(prefix: str, emit: Callable[[str], None] | None = None):
    """A log-line handler that passes the ServerApp's lines the grid reads (its milestones
    before its first round, each round's test line and end: :func:`experiments.progress.shown`)
    under ``prefix`` to ``emit`` (default: print)."""
    say = _teller(emit)

    def show(line: str) -> None:
        if shown(line):
            say(f"{prefix}   {line.split('INFO :', 1)[-1].strip()}")
    return show


def _teller(emit: Callable[[str], None] | None) -> Callable[[str], None]:
    """``emit``, else print (a job's process: its lines go to the grid through its stdout)."""
    if emit is not None:
        return emit
    return lambda text: print(text, flush=True)


def _start(output: Path, run: PlannedRun, prefix: str) -> tuple[Path, dict[str, Any], bool]:
    """The run's folder and run config: continue a half-finished run from its checkpoint,
    else start afresh over what is there. The bool: whether it resumes."""
    run_dir = output / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    done = resumable(output, run)
    if done:
        print(f"{prefix}: resuming after round {done} from its checkpoint", flush=True)
    extra = {"resume": True} if done else {"overwrite": True}
    return run_dir, {**run.run_config, **extra}, bool(done)


def run_one(link: SuperLink, output: Path, run: PlannedRun, fed_config: str, prefix: str,
            timeout: float, app: Path = ROOT, emit: Callable[[str], None] | None = None
            ) -> RunOutcome:
    """One run of ``app`` through Flower's CLI (:class:`experiments.flower_cli.FlowerRun`),
    continuing a half-finished one from its checkpoint; prints a line per round.

    Its outcome (Flower's run id and status, whether it timed out) is written to
    ``runs/<name>/status.json`` and returned. A run still going after ``timeout``
    seconds (a clock, whatever the log says) is stopped with ``flwr stop``.
    """
    run_dir, run_config, resumed = _start(output, run, prefix)
    log_path = run_dir / "log.txt"
    if not resumed:
        log_path.write_text("")
    flower = FlowerRun(link.env, app, run_config, fed_config, log_path, _progress(prefix, emit))
    try:
        flower.submit()
    except FlowerCliError as err:
        outcome = RunOutcome(None, NOT_SUBMITTED, str(err))
        with open(log_path, "a") as log:
            log.write(f"ERROR : {err}\n")
    else:
        _teller(emit)(f"{prefix}: submitted as run {flower.run_id}")  # a milestone (progress)

        def recover(wait: float) -> bool:  # the grid's own SuperLink: started again if it died
            if not link.alive:
                print(f"{prefix}: the SuperLink died; starting it again", flush=True)
                link.restart()
            return wait_for_superlink(link.env, wait)

        flower, outcome = flower.follow_through(timeout, superlink_wait=120.0, max_resumes=3,
                                                recover=recover,
                                                say=lambda text: print(f"{prefix}: {text}",
                                                                       flush=True))
    if outcome.timed_out:
        print(f"{prefix} timed out after {timeout:.0f}s: stopped with flwr stop {outcome.run_id}",
              flush=True)
    if not outcome.status.startswith("finished") and outcome.status != NOT_SUBMITTED:
        # flwr stop did not end it, or Flower's CLI could not say: a fresh SuperLink, so that
        # the next run never shares the machine with this one
        print(f"{prefix}: Flower's status is {outcome.status!r}; restarting the SuperLink",
              flush=True)
        link.restart()
    write_outcome(run_dir / STATUS_FILE, outcome, engine="flower", **_identity(run))
    return outcome


def run_one_inprocess(output: Path, run: PlannedRun, prefix: str,
                      emit: Callable[[str], None] | None = None) -> RunOutcome:
    """One run of this app's ServerApp and ClientApp in this process (``--engine inprocess``);
    prints a line per round; its outcome goes to ``runs/<name>/status.json`` too."""
    from fedamp_flwr.tools.inprocess import run_inprocess  # torch and the app: only in process

    run_dir, run_config, _ = _start(output, run, prefix)
    show = _progress(prefix, emit)

    class Progress(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            show("INFO : " + record.getMessage())

    progress = Progress()
    logging.getLogger("flwr").addHandler(progress)
    started = time.monotonic()
    outcome = RunOutcome(None, COMPLETED)
    try:
        run_inprocess(run_config, run.num_clients, run_dir / "log.txt")
    except Exception as err:  # recorded in the log and reported; the grid goes on
        outcome = RunOutcome(None, FAILED, f"{type(err).__name__}: {err}")
        with open(run_dir / "log.txt", "a") as log:
            log.write(f"ERROR : {type(err).__name__}: {err}\n")
    finally:
        logging.getLogger("flwr").removeHandler(progress)
    outcome.seconds = round(time.monotonic() - started, 2)
    write_outcome(run_dir / STATUS_FILE, outcome, engine="inprocess", **_identity(run))
    return outcome


def _identity(run: PlannedRun) -> dict[str, Any]:
    """What ``status.json`` says of the run besides its outcome (its row in results.csv
    when it wrote no metrics.json)."""
    c = run.run_config
    return {"run_name": run.name, "run": {
        "strategy": c.get("strategy"), "label": c.get("label", ""), "dataset": c.get("dataset"),
        "partitioning": c.get("partitioning"), "seed": c.get("seed"),
        "num_clients": run.num_clients, "config": c}}


def succeeded(output: Path, run: PlannedRun, outcome: RunOutcome) -> bool:
    """Whether a run ended well: Flower says ``finished:completed`` and its metrics.json says
    it finished."""
    return outcome.status == COMPLETED and is_done(output, run)


def _report(output: Path, run: PlannedRun, outcome: RunOutcome, prefix: str, started: float) -> bool:
    """Print how a run ended; whether it succeeded."""
    if succeeded(output, run, outcome):
        kind, best = RunFile.read(metrics_path(output, run)).headline()
        score = (f"BMTA {best if best is not None else float('nan'):.2f}%"
                 if kind.higher_is_better else
                 f"best mean MSE {best if best is not None else float('nan'):.4g}")
        print(f"{prefix}: {score} ({time.monotonic() - started:.0f}s)", flush=True)
        return True
    why = f"{outcome.status}{' (timed out)' if outcome.timed_out else ''}"
    print(f"{prefix}: FAILED ({why}), see {output / 'runs' / run.name / 'log.txt'}", flush=True)
    return False


def federation_for(run: PlannedRun, cpus: float, gpus: float, ray_address: str | None,
                   threads: int | None) -> str:
    """A run's ``--federation-config``; with ``threads`` (one of several jobs on a local Ray),
    Ray gets that many CPUs (at least one client's), so the jobs share the cores."""
    fed = federation_config(run.num_clients, cpus, gpus)
    if threads is not None and not ray_address:
        fed += f" init-args-num-cpus={max(threads, math.ceil(cpus))}"
    return fed


def run_grid(runs: list[PlannedRun], output: Path, cpus: float, gpus: float, ray_address: str | None,
             timeout: float, engine: str = "flower", jobs: int = 1) -> list[str]:
    """Run every run not done yet, ``jobs`` at a time; return the names of the runs that failed.

    One job: the runs one after another in this process (``--engine inprocess``) or on one
    SuperLink. Several: each run in a child process of its own (``python -m
    experiments.runner``), with ``cores // jobs`` CPU threads (torch, OpenMP and, for the
    Flower engine, the CPUs of its own local SuperLink's Ray instance); a worker slot's
    SuperLink keeps its ``FLWR_HOME`` (``.flwr-home-<slot>``). The results are those of one
    job, run by run: each run is the same code with the same run config and seed. On the
    Flower engine every run submits the app's files as they were when the grid started
    (:func:`experiments.flower_cli.app_snapshot`: its FAB built once, not once a run).
    """
    todo = [r for r in runs if not is_done(output, r)]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run", flush=True)
    if not todo:
        return []
    resumed = {r.name: resumable(output, r) for r in todo}
    app_or_root: contextlib.AbstractContextManager[Path] = contextlib.nullcontext(ROOT)
    if engine == "flower":
        print("grid: building the app's FAB once for its runs (flwr build)", flush=True)
        app_or_root = app_snapshot(ROOT)
    with app_or_root as app, GridProgress(todo, min(jobs, len(todo)),
                                          resumed=resumed) as progress:
        ok = _run_all(todo, output, cpus, gpus, ray_address, timeout, engine, jobs, progress,
                      app)
    if progress.live:  # the bars are gone: the grid's end in the terminal's scrollback
        print(f"grid: {progress.summary()}", flush=True)
    return [run.name for run, good in zip(todo, ok) if not good]


def _run_all(todo: list[PlannedRun], output: Path, cpus: float, gpus: float, ray_address: str | None,
             timeout: float, engine: str, jobs: int, progress: GridProgress, app: Path
             ) -> list[bool]:
    """:func:`run_grid`'s runs (of ``app`` on the Flower engine): whether each succeeded."""
    if jobs > 1 and len(todo) > 1:
        ok = _run_parallel(todo, output, cpus, gpus, ray_address, timeout, engine, jobs,
                           progress, app)
    else:
        link_or_none: contextlib.AbstractContextManager[SuperLink | None] = (
            _said_superlink(output / ".flwr-home", ray_address, progress.say, "grid")
            if engine == "flower" else contextlib.nullcontext())
        with link_or_none as link:
            def one(i: int, run: PlannedRun) -> bool:
                prefix = f"[{i + 1}/{len(todo)}] {run.name}"
                print(f"{prefix}: {run.num_clients} clients", flush=True)
                started = time.monotonic()
                progress.start(run)
                fed = federation_config(run.num_clients, cpus, gpus)

                def emit(text: str) -> None:
                    progress.line(run, text)

                outcome = (run_one(link, output, run, fed, prefix, timeout, app, emit)
                           if link is not None else run_one_inprocess(output, run, prefix, emit))
                good = _report(output, run, outcome, prefix, started)
                progress.end(run, good)
                return good

            ok = pool(todo, 1, one)
    return ok


@contextlib.contextmanager
def _said_superlink(home: Path, ray_address: str | None, say: Callable[[str], None],
                    who: str) -> Iterator[SuperLink]:
    """:class:`SuperLink` (``home``), saying that it starts and when it is up."""
    say(f"{who}: starting a SuperLink ({home})")
    started = time.monotonic()
    with SuperLink(home, ray_address) as link:
        say(f"{who}: the SuperLink is up on 127.0.0.1:{link.port} "
            f"({time.monotonic() - started:.1f}s)")
        yield link


def _run_parallel(todo: list[PlannedRun], output: Path, cpus: float, gpus: float,
                  ray_address: str | None, timeout: float, engine: str, jobs: int,
                  progress: GridProgress, app: Path) -> list[bool]:
    """:func:`run_grid` with several jobs: one child process per run, ``jobs`` at a time."""
    threads = threads_per_job(jobs)
    print(f"{jobs} jobs at a time, {threads} CPU thread(s) each", flush=True)
    children = Children()
    slots = list(range(jobs))
    slot_lock = threading.Lock()

    def one(i: int, run: PlannedRun) -> bool:
        prefix = f"[{i + 1}/{len(todo)}] {run.name}"
        with slot_lock:
            slot = slots.pop()
        try:
            # under the progress's lock: a line of its own beside the other jobs'
            progress.say(f"{prefix}: {run.num_clients} clients (job {slot + 1})")
            started = time.monotonic()
            progress.start(run)
            spec = {"output": str(output), "name": run.name, "num_clients": run.num_clients,
                    "run_config": run.run_config, "prefix": prefix, "engine": engine,
                    "timeout": timeout, "threads": threads, "ray_address": ray_address,
                    "home": str(output / f".flwr-home-{slot}"), "app": str(app),
                    "federation": federation_for(run, cpus, gpus, ray_address, threads)}
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")])))
            code = children.run([sys.executable, "-m", "experiments.runner",
                                 json.dumps(spec, allow_nan=False)],
                                env, on_line=lambda text: progress.line(run, text))
        finally:
            with slot_lock:
                slots.append(slot)
        if code is None:  # interrupted: the run resumes with the grid
            return False
        outcome = read_outcome(output, run, code)
        good = _report(output, run, outcome, prefix, started)
        progress.end(run, good)
        return good

    try:
        return pool(todo, jobs, one)
    finally:
        children.stop()


def read_outcome(output: Path, run: PlannedRun, exit_code: int) -> RunOutcome:
    """The outcome a child process wrote to the run's status.json (FAILED with the exit code
    if it wrote none)."""
    try:
        data = json.loads((output / "runs" / run.name / STATUS_FILE).read_text())
        return RunOutcome(None if data.get("run_id") is None else int(data["run_id"]),
                          str(data["status"]), str(data.get("details", "")),
                          bool(data.get("timed_out", False)), float(data.get("seconds", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return RunOutcome(None, FAILED, f"the job's process exited with code {exit_code} "
                          "and wrote no status")


def _child(spec_text: str) -> int:
    """One run of a grid in this process (a job of :func:`run_grid`): ``spec_text`` is the
    JSON :func:`_run_parallel` writes. Exit code 0 whatever the run's outcome (in status.json);
    130 when interrupted."""
    spec = json.loads(spec_text)
    output = Path(spec["output"])
    run = PlannedRun(spec["name"], int(spec["num_clients"]), dict(spec["run_config"]))
    # the previous status of a resumed run must not be read as this one's
    (output / "runs" / run.name / STATUS_FILE).unlink(missing_ok=True)
    if spec["engine"] == "flower":
        say = _teller(None)
        with _said_superlink(Path(spec["home"]), spec["ray_address"], say, spec["prefix"]) as link:
            run_one(link, output, run, spec["federation"], spec["prefix"], float(spec["timeout"]),
                    Path(spec["app"]))
    else:
        import torch
        from flwr.common.logger import console_handler

        torch.set_num_threads(int(spec["threads"]))
        # the run's whole log goes to its log.txt; the console shows its progress lines, which
        # stay readable beside the other jobs'
        logging.getLogger("flwr").removeHandler(console_handler)
        run_one_inprocess(output, run, spec["prefix"])
    return 0


if __name__ == "__main__":
    def _interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupted)  # stopped by the grid: clean up like Ctrl-C
    try:
        sys.exit(_child(sys.argv[1]))
    except KeyboardInterrupt:
        sys.exit(130)
