"""One Flower run, controlled through Flower's own CLI: submit, follow, time out, stop, status.

:class:`FlowerRun` submits an app with ``flwr run APP --format json`` (which
returns the run id at once), follows its log with ``flwr log RUN_ID --stream``
(which ends when the run ends), enforces a timeout with a clock (not with log
lines: a run that hangs silently times out too), stops a run with
``flwr stop RUN_ID`` and reads Flower's own status of the run
(``finished:completed``, ``finished:failed``, ``finished:stopped``) with
``flwr ls --run-id RUN_ID --format json``. ``flwr run`` exits 0 even when the
ServerApp fails; that status is how a failed run is told from a finished one.

:func:`app_snapshot` gives the files of an app that Flower sends (its FAB), built once, in
a folder of their own: ``flwr run`` builds the FAB again for every run, and to do so
Flower 1.41 walks every file under the app's folder before it filters them, a virtual
environment inside the project included (58,000 files: ``flwr build`` of the checkout took
7.0 s here, of the snapshot's 150 files 1.4 s, most of it the CLI's start; docs/performance.md).
:func:`build_app` itself gives ``flwr build`` only the files Flower's rules can keep, found
without entering the folders those rules leave out whole (:func:`fab_candidates`). The FAB
built from the snapshot is the same, to its hash.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .processes import stop_tree

COMPLETED, FAILED, STOPPED = "finished:completed", "finished:failed", "finished:stopped"
#: the status of a run whose status Flower's CLI could not give
UNKNOWN = "unknown"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BOX = re.compile("[\u2500-\u257f]")  # the frame the CLI draws around an error


class FlowerCliError(RuntimeError):
    """A ``flwr`` command failed (its output is in the message)."""


def toml_value(value: Any) -> str:
    """A run-config value as TOML for ``--run-config`` (strings quoted, booleans lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def plain(line: str) -> str:
    """A log line without its colour codes."""
    return _ANSI.sub("", line)


@dataclass
class RunOutcome:
    """How a Flower run ended: its id, Flower's status and details, and whether it timed out."""

    run_id: int | None
    status: str
    details: str = ""
    timed_out: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the run id as a string: it exceeds JSON's safe integers)."""
        out = asdict(self)
        out["run_id"] = None if self.run_id is None else str(self.run_id)
        return out


#: a file name no include or exclude pattern of an app is expected to name: a folder whose
#: files Flower's rules exclude whole also excludes this one (:func:`fab_candidates`)
_PROBE = "\x00fedamp-probe\x00/\x00"


def fab_candidates(app: Path) -> list[str] | None:
    """The files under ``app`` (relative POSIX paths) that ``flwr build`` may put in the FAB:
    those its publish rules include, walked as Flower walks (no symbolic link followed or
    kept), without entering a folder that its exclude rules (built-in and the app's
    ``.gitignore``) leave out whole, such as a virtual environment. ``None`` where that
    cannot be told: a Flower without these rules, or a ``.gitignore`` with a negated
    pattern (which could take a file of an excluded folder back); Flower then walks it all.
    Flower filters what is given again, by the same rules: the FAB is the same."""
    try:
        from flwr.cli.utils import build_pathspec, load_gitignore_patterns
        from flwr.supercore.constant import (
            APP_PUBLISH_EXCLUDE_PATTERNS,
            APP_PUBLISH_INCLUDE_PATTERNS,
        )
    except ImportError:
        return None
    ignore = app / ".gitignore"
    patterns = load_gitignore_patterns(ignore) if ignore.is_file() else []
    if any(p.startswith("!") for p in patterns):
        return None
    excluded = build_pathspec([*patterns, *APP_PUBLISH_EXCLUDE_PATTERNS])
    included = build_pathspec(APP_PUBLISH_INCLUDE_PATTERNS)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(app, followlinks=False):
        here = Path(dirpath).relative_to(app)
        dirnames[:] = [d for d in dirnames
                       if not excluded.match_file(f"{(here / d).as_posix()}/{_PROBE}")]
        for name in filenames:
            rel = (here / name).as_posix()
            if not (Path(dirpath) / name).is_symlink() and included.match_file(rel):
                found.append(rel)
    return found


def build_app(app: Path, folder: Path, flwr: str | None = None) -> Path:
    """The files of the Flower app at ``app`` that its FAB holds (``flwr build``: the app's
    own include and exclude rules), written to ``folder`` (made; it must not exist). A
    ``flwr run`` of ``folder`` sends the same FAB, to its hash, as one of ``app``.
    ``flwr build`` is given the files of :func:`fab_candidates` (copied), or ``app`` itself
    where those cannot be told. FlowerCliError if ``flwr build`` fails (its output in the
    message)."""
    app = Path(app).resolve()
    folder.mkdir(parents=True)
    built = folder / ".build"
    built.mkdir()
    try:
        source = app
        if (candidates := fab_candidates(app)) is not None:
            source = built / "source"
            source.mkdir()
            for rel in candidates:
                (source / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(app / rel, source / rel)
        done = subprocess.run([flwr or shutil.which("flwr") or "flwr", "build", "--app",
                               str(source)], cwd=built, capture_output=True,
                              text=True, timeout=600,
                              env={**os.environ, "COLUMNS": "1000"})  # a line, not a box
        fabs = sorted(built.glob("*.fab"))
        if done.returncode != 0 or len(fabs) != 1:
            said = " ".join(_BOX.sub(" ", plain(done.stdout + done.stderr)).split())
            said = said.replace(str(source), str(app))  # the app's own paths, not the copy's
            raise FlowerCliError(f"flwr build --app {app} failed: {said[-2000:]}")
        with zipfile.ZipFile(fabs[0]) as fab:  # our own build; extractall keeps it inside
            fab.extractall(folder)
    finally:
        shutil.rmtree(built, ignore_errors=True)
    return folder


@contextlib.contextmanager
def app_snapshot(app: Path) -> Iterator[Path]:
    """:func:`build_app` of ``app`` into a temporary folder, removed when the context ends:
    the app to give every ``flwr run`` of a grid (the same code for each of its runs)."""
    with tempfile.TemporaryDirectory(prefix="fedamp-app-") as tmp:
        yield build_app(app, Path(tmp) / "app")


class FlowerRun:
    """One run of a Flower app on a SuperLink, through Flower's CLI.

    Parameters
    ----------
    env : dict[str, str]
        Environment of the ``flwr`` commands; its ``FLWR_HOME`` names the
        SuperLink connection to use (see :class:`experiments.processes.SuperLink`).
    app : Path
        The app's folder (its ``pyproject.toml``).
    run_config : dict[str, Any] | str
        Run-config overrides: a dict, or ``--run-config``'s text (``"k1=v1 k2='x'"``).
    federation_config : str
        ``--federation-config`` (simulation: ``num-supernodes=N ...``), or "".
    log_path : Path
        Where the run's log goes (appended to).
    on_line : callable, optional
        Called with every log line (without colour codes), e.g. to print progress.
    """

    def __init__(self, env: dict[str, str], app: Path, run_config: dict[str, Any] | str,
                 federation_config: str, log_path: Path,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.env, self.app = env, Path(app)
        self.config = parse_run_config(run_config) if isinstance(run_config, str) else dict(
            run_config)
        self.run_config = " ".join(f"{k}={toml_value(v)}" for k, v in self.config.items())
        self.federation_config, self.log_path, self.on_line = federation_config, log_path, on_line
        self.run_id: int | None = None
        self._flwr = shutil.which("flwr") or "flwr"

    def _cli(self, *args: str, timeout: float = 120.0) -> dict[str, Any]:
        """Run ``flwr ARGS --format json``; its JSON answer (FlowerCliError if it failed)."""
        try:
            done = subprocess.run([self._flwr, *args, "--format", "json"], env=self.env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise FlowerCliError(f"flwr {args[0]} did not answer within {timeout:.0f}s") from err
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            answer = {}
        if done.returncode != 0 or not answer.get("success", False):
            text = plain(answer.get("error-message", "") or done.stderr or done.stdout).strip()
            raise FlowerCliError(f"flwr {args[0]} failed: {text[-2000:]}")
        return answer

    def submit(self) -> int:
        """Submit the run; return its id."""
        args = ["run", str(self.app)]
        if self.federation_config:
            args += ["--federation-config", self.federation_config]
        if self.run_config:
            args += ["--run-config", self.run_config]
        self.run_id = int(self._cli(*args)["run-id"])
        return self.run_id

    def status(self) -> tuple[str, str]:
        """Flower's status of the run (e.g. ``running``, ``finished:failed``) and its details."""
        runs = self._cli("ls", "--run-id", str(self.run_id)).get("runs", [])
        if not runs:
            return "unknown", ""
        return str(runs[0].get("status", "unknown")), str(runs[0].get("status-details", ""))

    def stop(self) -> None:
        """Ask the SuperLink to stop the run (``flwr stop``); a run already over is left as it is."""
        try:
            self._cli("stop", str(self.run_id))
        except FlowerCliError:
            pass  # it finished in the meantime

    def final_status(self, wait: float = 60.0) -> tuple[str, str]:
        """Flower's status once it says ``finished:...`` (waiting up to ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            status, details = self.status()
            if status.startswith("finished") or time.monotonic() > deadline:
                return status, details
            time.sleep(0.5)

    def follow(self, timeout: float, poll: float = 2.0) -> RunOutcome:
        """Stream the run's log until it ends or ``timeout`` seconds (a clock) have passed.

        The log stream ending is not taken for the run's end: Flower's status is
        read, and while it is not ``finished:...`` (a stream that broke off) it is
        read again every ``poll`` seconds, within the same clock. A run past its
        timeout is stopped with ``flwr stop`` and reported with ``timed_out``;
        the log stream is stopped by its process id. A ``flwr`` command that fails
        while the run is followed gives the status ``unknown`` with its message.
        """
        started = time.monotonic()
        deadline = started + timeout
        timed_out = False
        with open(self.log_path, "a") as log:
            proc = subprocess.Popen([self._flwr, "log", str(self.run_id), "--stream"],
                                    env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)

            def read() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    log.flush()
                    if self.on_line is not None:
                        self.on_line(plain(line))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                reader.join(max(deadline - time.monotonic(), 0.0))
                status, details = ("running", "") if reader.is_alive() else self.status()
                while not status.startswith("finished") and time.monotonic() < deadline:
                    time.sleep(poll)  # the log stream ended, the run did not (yet)
                    status, details = self.status()
                timed_out = not status.startswith("finished")
                if timed_out:
                    self.stop()
            except FlowerCliError as err:
                return RunOutcome(self.run_id, UNKNOWN, str(err), False,
                                  round(time.monotonic() - started, 2))
            except BaseException:  # Ctrl-C, SIGTERM: the run must not go on without us
                self.stop()
                raise
            finally:
                if proc.poll() is None:
                    stop_tree(proc.pid, timeout=10)
                proc.wait()
                reader.join(10)
        try:
            status, details = self.final_status()
        except FlowerCliError as err:
            status, details = UNKNOWN, str(err)
        return RunOutcome(self.run_id, status, details, timed_out,
                          round(time.monotonic() - started, 2))

    def run(self, timeout: float) -> RunOutcome:
        """Submit the run and follow it (:meth:`follow`)."""
        self.submit()
        return self.follow(timeout)

    def resumed(self, fresh: bool = False) -> FlowerRun:
        """The same run, to submit again: continued from its checkpoint (``resume = true``),
        or, ``fresh``, started again over what it left (``overwrite = true``)."""
        config = {**self.config, "resume": not fresh, "overwrite": fresh}
        return FlowerRun(self.env, self.app, config, self.federation_config, self.log_path,
                         self.on_line)

    def follow_through(self, timeout: float, superlink_wait: float, max_resumes: int,
                       recover: Callable[[float], bool] | None = None,
                       say: Callable[[str], None] = print) -> tuple[FlowerRun, RunOutcome]:
        """Follow this submitted run to its end (:meth:`follow`), outliving its SuperLink.

        When the run ended because its SuperLink went away (:func:`lost_superlink`), wait
        for the SuperLink (``recover(seconds)``, default: until ``flwr ls`` answers again,
        at most ``superlink_wait`` seconds), stop what is left of the lost run, and submit
        it again with ``resume = true``: it goes on from its last checkpoint, so at most
        the interrupted round is computed again (with ``checkpoint-every = 1``). At most
        ``max_resumes`` times. Returns the last submission and its outcome.
        """
        run, outcome = self, self.follow(timeout)
        for attempt in range(1, max_resumes + 1):
            if not lost_superlink(outcome):
                break
            say(f"run {run.run_id}: its SuperLink went away ({outcome.status}: "
                f"{outcome.details[-200:]}); waiting up to {superlink_wait:.0f}s for it")
            back = (recover(superlink_wait) if recover is not None
                    else wait_for_superlink(run.env, superlink_wait))
            if not back:
                say(f"run {run.run_id}: the SuperLink did not come back within "
                    f"{superlink_wait:.0f}s; giving up")
                break
            try:
                status, details = run.status()
            except FlowerCliError:
                status, details = UNKNOWN, ""
            if status == COMPLETED:  # it ended before the SuperLink went away
                return run, RunOutcome(run.run_id, status, details, False, outcome.seconds)
            if not status.startswith("finished"):  # no two ServerApps on one run folder
                run.stop()
                try:
                    run.final_status(wait=120.0)
                except FlowerCliError:
                    pass
            lost = run
            run = lost.resumed()
            run.submit()
            say(f"the SuperLink is back: run submitted again as {run.run_id} with resume = true "
                f"({attempt} of at most {max_resumes})")
            outcome = run.follow(timeout)
            if outcome.status == FAILED and NO_CHECKPOINT in outcome.details:
                # lost before its first checkpoint: it starts again from round 1
                run = lost.resumed(fresh=True)
                run.submit()
                say(f"run {lost.run_id} had written no checkpoint: submitted again from round 1 "
                    f"as {run.run_id}")
                outcome = run.follow(timeout)
        return run, outcome


#: what Flower's SuperLink says of a run whose ServerApp it lost: the task's heartbeat stopped
#: (it was restarted, or the ServerApp's process died with it)
LOST_RUN = ("No heartbeat received from the task", "Task failed because the run expired")
#: what a resumed run says when there was no checkpoint to resume (fedamp_flwr/server/results.py)
NO_CHECKPOINT = "holds no checkpoint"


def lost_superlink(outcome: RunOutcome) -> bool:
    """Whether a run ended because its SuperLink went away, not because of the app's own
    error: Flower's CLI lost the SuperLink while following it, or the SuperLink failed the
    run for its ServerApp's lost heartbeat (a SuperLink restarted on its database; also a
    ServerApp process killed from outside, by the out-of-memory killer say: resumed too)."""
    return outcome.status == UNKNOWN or (outcome.status == FAILED
                                         and any(t in outcome.details for t in LOST_RUN))


def wait_for_superlink(env: dict[str, str], timeout: float, poll: float = 2.0) -> bool:
    """Whether the SuperLink of ``env`` answers (``flwr ls``) within ``timeout`` seconds."""
    flwr = shutil.which("flwr") or "flwr"
    deadline = time.monotonic() + timeout
    while True:
        try:
            done = subprocess.run([flwr, "ls", "--format", "json"], env=env, capture_output=True,
                                  text=True, timeout=60)
            if done.returncode == 0 and json.loads(done.stdout or "{}").get("success"):
                return True
        except (subprocess.TimeoutExpired, ValueError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def parse_run_config(text: str) -> dict[str, Any]:
    """``--run-config``'s text (``"k1=v1 k2='x'"``) as a dict, as Flower reads it."""
    from flwr.common.config import parse_config_args

    return dict(parse_config_args([text])) if text.strip() else {}


def write_outcome(path: Path, outcome: RunOutcome, **extra: Any) -> None:
    """Write a run's outcome (and ``extra`` fields) to ``path`` as JSON."""
    # strict JSON: the outcome holds no float but its seconds, the run config only finite ones
    path.write_text(json.dumps({**outcome.to_dict(), **extra}, indent=1, allow_nan=False) + "\n")
