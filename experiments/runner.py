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
import time
from pathlib import Path
from typing import Any

from experiments import report
from experiments.flower_cli import (
    COMPLETED,
    FAILED,
    FlowerCliError,
    FlowerRun,
    RunOutcome,
    write_outcome,
)
from experiments.presets import Run
from experiments.processes import SuperLink

ROOT = Path(__file__).resolve().parents[1]
# Each run's outcome (Flower's run id and status), beside its metrics.json.
STATUS_FILE = report.STATUS_FILE
# The status of a run that Flower refused to start (flwr run failed).
NOT_SUBMITTED = "not-submitted"


def metrics_path(output: Path, run: Run) -> Path:
    return output / "runs" / run.name / "metrics.json"


def previous_run(output: Path, run: Run) -> dict | None:
    """The metrics.json ``run`` left before, if its run config is the same."""
    path = metrics_path(output, run)
    try:
        metrics = json.loads(path.read_text())
        config = metrics["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    same = all(config.get(k) == v for k, v in run.run_config.items()
               if k != "num-server-rounds")
    return metrics if same else None


def is_done(output: Path, run: Run) -> bool:
    """Whether ``run`` finished before with the same run config (resume)."""
    metrics = previous_run(output, run)
    rounds = run.run_config.get("num-server-rounds")
    return bool(metrics and metrics.get("finished")
                and metrics["config"].get("num-server-rounds") == rounds)


def resumable(output: Path, run: Run) -> int:
    """The rounds a half-finished ``run`` has done and checkpointed (0: start afresh)."""
    metrics = previous_run(output, run)
    checkpoint = output / "runs" / run.name / "checkpoint" / "state.pt"
    if not metrics or not checkpoint.is_file():
        return 0
    done = int(metrics.get("completed_rounds", 0))
    return done if done <= int(run.run_config.get("num-server-rounds", done)) else 0


def federation_config(num_clients: int, cpus: float, gpus: float) -> str:
    """The ``--federation-config`` of a run: SuperNodes and each ClientApp's resources."""
    def num(v: float) -> str:  # Flower wants integral resources as integers
        return str(int(v)) if float(v).is_integer() else repr(float(v))

    parts = [f"num-supernodes={num_clients}", f"client-resources-num-cpus={num(cpus)}",
             f"client-resources-num-gpus={num(gpus)}"]
    return " ".join(parts)


def _progress(prefix: str):
    """A log-line handler that prints the ServerApp's per-round test line under ``prefix``."""
    def show(line: str) -> None:
        if "mean test" in line:
            print(f"{prefix}   {line.split('INFO :', 1)[-1].strip()}", flush=True)
    return show


def _start(output: Path, run: Run, prefix: str) -> tuple[Path, dict[str, Any], bool]:
    """The run's folder and run config: continue a half-finished run from its checkpoint,
    else start afresh over what is there. The bool: whether it resumes."""
    run_dir = output / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    done = resumable(output, run)
    if done:
        print(f"{prefix}: resuming after round {done} from its checkpoint", flush=True)
    extra = {"resume": True} if done else {"overwrite": True}
    return run_dir, {**run.run_config, **extra}, bool(done)


def run_one(link: SuperLink, output: Path, run: Run, fed_config: str, prefix: str,
            timeout: float, app: Path = ROOT) -> RunOutcome:
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
    flower = FlowerRun(link.env, app, run_config, fed_config, log_path, _progress(prefix))
    try:
        flower.submit()
    except FlowerCliError as err:
        outcome = RunOutcome(None, NOT_SUBMITTED, str(err))
        with open(log_path, "a") as log:
            log.write(f"ERROR : {err}\n")
    else:
        outcome = flower.follow(timeout)
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


def run_one_inprocess(output: Path, run: Run, prefix: str) -> RunOutcome:
    """One run of this app's ServerApp and ClientApp in this process (``--engine inprocess``);
    prints a line per round; its outcome goes to ``runs/<name>/status.json`` too."""
    from fedamp_flwr.inprocess import run_inprocess  # torch and the app: only in process

    run_dir, run_config, _ = _start(output, run, prefix)
    show = _progress(prefix)

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


def _identity(run: Run) -> dict[str, Any]:
    """What ``status.json`` says of the run besides its outcome (its row in results.csv
    when it wrote no metrics.json)."""
    c = run.run_config
    return {"run_name": run.name, "run": {
        "strategy": c.get("strategy"), "label": c.get("label", ""), "dataset": c.get("dataset"),
        "partitioning": c.get("partitioning"), "seed": c.get("seed"),
        "num_clients": run.num_clients, "config": c}}


def succeeded(output: Path, run: Run, outcome: RunOutcome) -> bool:
    """Whether a run ended well: Flower says ``finished:completed`` and its metrics.json says
    it finished."""
    return outcome.status == COMPLETED and is_done(output, run)


def run_grid(runs: list[Run], output: Path, cpus: float, gpus: float, ray_address: str | None,
             timeout: float, engine: str = "flower") -> list[str]:
    """Run every run not done yet; return the names of the runs that failed."""
    todo = [r for r in runs if not is_done(output, r)]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run", flush=True)
    failed: list[str] = []
    if not todo:
        return failed
    link_or_none: contextlib.AbstractContextManager[SuperLink | None] = (
        SuperLink(output / ".flwr-home", ray_address) if engine == "flower"
        else contextlib.nullcontext())
    with link_or_none as link:
        for i, run in enumerate(todo, 1):
            prefix = f"[{i}/{len(todo)}] {run.name}"
            print(f"{prefix}: {run.num_clients} clients", flush=True)
            started = time.monotonic()
            fed = federation_config(run.num_clients, cpus, gpus)
            outcome = (run_one(link, output, run, fed, prefix, timeout) if link is not None
                       else run_one_inprocess(output, run, prefix))
            if succeeded(output, run, outcome):
                m = json.loads(metrics_path(output, run).read_text())
                score = (f"BMTA {m['bmta']:.2f}%" if "bmta" in m
                         else f"best mean MSE {m.get('best_mean_mse', float('nan')):.4g}")
                print(f"{prefix}: {score} ({time.monotonic() - started:.0f}s)", flush=True)
            else:
                failed.append(run.name)
                why = f"{outcome.status}{' (timed out)' if outcome.timed_out else ''}"
                print(f"{prefix}: FAILED ({why}), see {output / 'runs' / run.name / 'log.txt'}",
                      flush=True)
    return failed
