"""A grid's progress (``simulation.py``): runs done, running and failed, each running run's
rounds, and an ETA from the rounds' measured seconds.

In a terminal, rich draws a bar for the grid and one for each running run, and the runs'
lines scroll above them; elsewhere (CI, ``nohup``, a file) every event is one log line:
a run started, a round of it done (with the grid's state), a run ended. Before a run's
first round ends it says its milestones, in both: submitted (the runner's
line, :data:`SUBMITTED`), its ServerApp started, its clients found, its first round under
way (the ServerApp's lines, :data:`MILESTONES`), each with the seconds since the run
started; a running run's bar shows the newest of them.

The ETA (:func:`grid_eta`) is what the runs left take at the pace measured so far, laid out
on the jobs as the grid lays them out (each next run on the job that is free first): a
running run's rounds at its own pace; a run not started at the pace its method's runs
measured, fitted on each run's local work (local steps, else epochs: a tuning grid's trials
differ in it), else all runs'; plus what a run spends before its first round and after its
last (start, data, delivering the models): the head measured on every run whose first round
ended, from the first run on, the tail on the runs that ended. A run's first round may also
load its data and warm its workers up, and be far slower than the rest, so a pace is
measured on the rounds after a run's first (the first's extra counts in the head): the
grid gives no ETA ("ETA after round 2") until a run's second round (or a whole run) has
ended.
"""

from __future__ import annotations

import dataclasses
import heapq
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from experiments.presets import PlannedRun
from fedamp_flwr.server.rounds import (  # a round's start and end in the log, a paused one
    ROUND_DONE,
    ROUND_START,
    unpaused,
)

#: a run submitted to its SuperLink, as the runner says it (experiments.runner.run_one)
SUBMITTED = re.compile(r": submitted as run (\d+)")
#: a run's milestones before its first round, as the ServerApp logs them: its start
#: (fedamp_flwr.server_app, "Run '<name>': strategy ..."), its clients found
#: (fedamp_flwr.server.discovery), its first round's start; each with what the grid says of it
MILESTONES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Run '[^']*': strategy "), "ServerApp started"),
    (re.compile(r"Asking (\d+) node\(s\) which clients"), "asking {0} node(s) who they are "
     "(each loads its data)"),
    (re.compile(r"Found (\d+) (clients|members)"), "{0} {1} found"),
    (ROUND_START, "round {0}/{1} under way"),
)


def shown(line: str) -> bool:
    """Whether a line of a run's log is one the grid reads: a milestone, a round's mean test
    score or its end."""
    return ("mean test" in line or ROUND_DONE.search(line) is not None
            or any(pattern.search(line) for pattern, _ in MILESTONES))


def rounds_of(run: PlannedRun) -> int:
    return int(run.run_config.get("num-server-rounds", 10))


def work_of(run: PlannedRun) -> float:
    """A round's local work, by the run config: its local steps, else its local epochs (1
    where it names neither): the trials of one method differ in it."""
    c = run.run_config
    for key in ("local-steps", "local-epochs"):
        value = c.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 1.0


def fitted(points: Sequence[tuple[float, float]], work: float) -> float:
    """A round's seconds at ``work``, from (work, seconds) of runs measured: a line through
    them where they did different work (at least a tenth of the fastest), else their mean
    scaled by the work."""
    works = [w for w, _ in points]
    paces = [p for _, p in points]
    if len(set(works)) >= 2:
        slope, intercept = np.polyfit(works, paces, 1)
        return max(float(slope * work + intercept), 0.1 * min(paces))
    return _mean(paces) * work / works[0]


def group_of(run: PlannedRun) -> tuple[str, str]:
    """The runs whose rounds take alike: a strategy on a dataset."""
    c = run.run_config
    return str(c.get("strategy", "?")), str(c.get("dataset", "?"))


@dataclass
class RunState:
    run: PlannedRun
    started: float | None = None
    ended: float | None = None
    failed: bool = False
    resumed_from: int = 0  # the rounds its checkpoint holds, when the grid started
    done: int = 0  # the newest round done (a resumed run: counted from its checkpoint)
    seconds: list[float] = field(default_factory=list)  # the rounds measured in this grid
    first_at: float | None = None  # when its first round (in this grid) ended
    last_at: float | None = None  # when its newest round ended
    began: float | None = None  # when its first round (in this grid) began
    phase: str = ""  # its newest milestone, until its first round ends

    @property
    def steady(self) -> list[float]:
        """Its rounds after the first (which also loads the data), but a round the machine
        was paused in (:func:`fedamp_flwr.server.rounds.unpaused`); of a run that ended well
        after one round, that round; else none."""
        return unpaused(self.seconds[1:]) or (
            self.seconds if self.ended is not None and not self.failed else [])

    @property
    def total(self) -> int:
        return rounds_of(self.run)

    @property
    def to_run(self) -> int:
        """The rounds it runs in this grid."""
        return max(0, self.total - self.resumed_from)


def clock(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _mean(values: Sequence[float], default: float = 0.0) -> float:
    return sum(values) / len(values) if values else default


def grid_eta(states: Iterable[RunState], jobs: int, now: float) -> float | None:
    """Seconds until the grid ends at the measured pace (None: no pace measured yet, i.e. no
    run has ended a round after its first, nor ended well; 0 when every run has ended).

    A run's pace is the mean of its rounds after its first (which also loads its data); a
    run with none yet takes its method's, else all runs'. Its head, the seconds from its
    start to its first round's end less that pace (the SuperLink, Ray and the ServerApp
    starting, the data loaded, round 1's own extra); its tail, from its last round's end to
    its end (the models delivered, the files written). A run not started takes head +
    rounds x pace + tail; a running one the rest of that; head is the mean over the runs of
    its method whose first round ended (else of all such runs: from the first run's first
    round on), tail over the ended runs of its method (else of all; 0 before any ended); a
    round, head or tail the machine was paused in left out (:func:`rounds.unpaused`).
    """
    states = list(states)
    if states and all(st.ended is not None for st in states):
        return 0.0
    if not (measured := [st for st in states if st.steady]):
        return None
    overall = _mean([s for st in measured for s in st.steady])
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for st in measured:
        points.setdefault(group_of(st.run), []).append((work_of(st.run), _mean(st.steady)))

    def pace(st: RunState) -> float:
        if st.steady:
            return _mean(st.steady)
        # its method's runs at its local work, else all runs' mean (the work of one method
        # says little of another's seconds)
        fits = points.get(group_of(st.run))
        return fitted(fits, work_of(st.run)) if fits else overall

    heads: dict[Any, list[float]] = {}
    tails: dict[Any, list[float]] = {}
    for st in states:  # by its method's runs, and (None) over all
        if st.first_at is None or st.started is None or st.failed:
            continue
        for key in (group_of(st.run), None):
            heads.setdefault(key, []).append(max(0.0, st.first_at - st.started - pace(st)))
            if st.ended is not None and st.last_at is not None:
                tails.setdefault(key, []).append(max(0.0, st.ended - st.last_at))

    def head(st: RunState) -> float:  # (a start or an end the machine slept in: left out)
        return _mean(unpaused(heads.get(group_of(st.run)) or heads.get(None) or []))

    def tail(st: RunState) -> float:
        return _mean(unpaused(tails.get(group_of(st.run)) or tails.get(None) or []))

    running = []
    for st in states:
        if st.started is None or st.ended is not None:
            continue
        if st.last_at is None:  # its first round under way
            left = (max(0.0, head(st) + pace(st) - (now - st.started))
                    + max(0, st.to_run - 1) * pace(st) + tail(st))
        else:  # its rounds left, then its tail, less the time since its last round
            left = max(0.0, (st.total - st.done) * pace(st) + tail(st) - (now - st.last_at))
        running.append(left)
    return _laid_out(running, [head(st) + st.to_run * pace(st) + tail(st) for st in states
                               if st.started is None], jobs)


def _laid_out(running: list[float], waiting: list[float], jobs: int) -> float:
    """When the last job ends: the running runs' seconds left, each on a job of its own, then
    each waiting run's seconds, in turn, on the job that is free first."""
    loads = running + [0.0] * max(0, max(jobs, 1) - len(running))
    heapq.heapify(loads)
    for seconds in waiting:
        heapq.heappush(loads, heapq.heappop(loads) + seconds)
    return max(loads) if loads else 0.0


def no_eta_yet(states: Iterable[RunState]) -> str:
    """What the grid's line says while it has no ETA: when it will."""
    states = list(states)
    if any(st.to_run >= 2 and st.resumed_from == 0 for st in states):
        return "ETA after round 2"
    if any(st.to_run >= 2 for st in states):
        return "ETA after a run's second round"
    return "ETA after the first run"


class GridProgress:
    """The grid's progress, fed by :meth:`start`, :meth:`line` and :meth:`end` from the jobs'
    threads; drawn by rich in a terminal (``live``), else one line per event to ``out``.
    ``clock``: the seconds it reads (tests give a fake one)."""

    def __init__(self, runs: Sequence[PlannedRun], jobs: int, out: TextIO | None = None,
                 live: bool | None = None, resumed: Mapping[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out or sys.stdout
        self.jobs = jobs
        self.clock = clock
        self.states = {r.name: RunState(r, resumed_from=(resumed or {}).get(r.name, 0))
                       for r in runs}
        self._view: tuple[RunState, ...] = ()  # a copy, for rich's thread (no lock there)
        self.order = {r.name: i for i, r in enumerate(runs)}
        self.live = self.out.isatty() if live is None else live
        self._lock = threading.RLock()
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}
        self._grid: Any = None

    # --- what the jobs tell ---
    def start(self, run: PlannedRun) -> None:
        with self._lock:
            st = self.states[run.name]
            st.started, st.ended, st.done = self.clock(), None, st.resumed_from
            st.seconds, st.first_at, st.last_at, st.began = [], None, None, None
            st.phase = "starting"
            if self._bars is not None:
                self._tasks[run.name] = self._bars.add_task(self._described(st), total=st.total,
                                                            completed=st.done)
            self._refresh()

    def line(self, run: PlannedRun, text: str) -> None:
        """One of a run's lines: a round's end is counted (and said with the grid's state); a
        milestone before its first round's end (:data:`SUBMITTED`, :data:`MILESTONES`) is
        said once, with the seconds since the run started; a later round's start is not
        said; other lines are shown as they are."""
        match = ROUND_DONE.search(text)
        with self._lock:
            st = self.states[run.name]
            if match is None:
                event = self._milestone(st, text)
                if event is None:
                    self.say(text)
                elif event:
                    st.phase = event
                    now = self.clock()
                    since = now - (now if st.started is None else st.started)
                    self.say(f"{self._name(run)}: {event} ({since:.0f}s in)")
                    self._refresh()
                    self._describe(st)
                return
            st.done = int(match.group(1))
            st.seconds.append(float(match.group(2)))
            st.last_at = self.clock()
            st.first_at = st.first_at or st.last_at
            st.phase = ""
            self._refresh()
            if self._bars is not None:
                self._bars.update(self._tasks[run.name], completed=st.done,
                                  description=self._described(st))
            else:
                self.say(f"{self._name(run)}: round {st.done}/{st.total} done in "
                         f"{float(match.group(2)):.1f}s; grid: {self.summary()}")

    def _milestone(self, st: RunState, text: str) -> str | None:
        """What the grid says of a milestone line ("": a line it does not say; None: not a
        milestone). Only those before the run's first round ends are said (of the rounds'
        starts, the first's alone)."""
        submitted = SUBMITTED.search(text)
        if submitted is not None:
            return f"submitted as run {submitted.group(1)}"
        for pattern, said in MILESTONES:
            found = pattern.search(text)
            if found is None:
                continue
            if pattern is ROUND_START:
                if st.began is not None:  # a later round: its end says it
                    return ""
                st.began = self.clock()
            return said.format(*found.groups()) if st.first_at is None else ""
        return None

    def end(self, run: PlannedRun, ok: bool) -> None:
        with self._lock:
            st = self.states[run.name]
            st.ended, st.failed = self.clock(), not ok
            st.phase = ""
            self._refresh()
            if self._bars is not None and run.name in self._tasks:
                self._bars.remove_task(self._tasks.pop(run.name))
            else:
                self.say(f"grid: {self.summary()}")

    def say(self, text: str) -> None:
        """A line above the bars (or a log line)."""
        with self._lock:
            if self._bars is not None:
                self._bars.console.print(text, markup=False, highlight=False)
            else:
                print(text, file=self.out, flush=True)

    # --- what it shows ---
    def counts(self) -> tuple[int, int, int, int]:
        """Runs done, running, failed, and in all (as of the newest event)."""
        st = self._view or tuple(self.states.values())
        return (sum(s.ended is not None and not s.failed for s in st),
                sum(s.started is not None and s.ended is None for s in st),
                sum(s.failed for s in st), len(st))

    def eta(self) -> float | None:
        return grid_eta(self._view or self.states.values(), self.jobs, self.clock())

    def summary(self) -> str:
        done, running, failed, total = self.counts()
        eta = self.eta()
        when = (no_eta_yet(self._view or self.states.values()) if eta is None else
                f"ETA {clock(eta)} ({time.strftime('%H:%M', time.localtime(time.time() + eta))})")
        return f"{done}/{total} runs done, {running} running, {failed} failed; {when}"

    def _name(self, run: PlannedRun) -> str:
        return f"[{self.order[run.name] + 1}/{len(self.states)}] {run.name}"

    def _described(self, st: RunState) -> str:
        """A running run's bar: its name, and its newest milestone until its first round ends."""
        return f"{self._name(st.run)}: {st.phase}" if st.phase else self._name(st.run)

    def _describe(self, st: RunState) -> None:
        if self._bars is not None and st.run.name in self._tasks:
            self._bars.update(self._tasks[st.run.name], description=self._described(st))

    def _refresh(self) -> None:
        """After an event (under the lock): the copy the summary reads, and the grid's bar."""
        self._view = tuple(dataclasses.replace(st, seconds=list(st.seconds))
                           for st in self.states.values())
        if self._bars is not None:
            done, running, failed, total = self.counts()
            self._bars.update(self._grid, completed=done + failed)

    # --- the terminal's bars ---
    def __enter__(self) -> GridProgress:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            grid = self

            class Described(TextColumn):  # the grid's line, its ETA as of each drawing
                def render(self, task: Any) -> Any:
                    from rich.text import Text

                    return Text(f"grid: {grid.summary()}" if task.id == grid._grid
                                else task.description)

            self._bars = Progress(Described(""), BarColumn(), MofNCompleteColumn(),
                                  console=Console(file=self.out), refresh_per_second=2)
            self._grid = self._bars.add_task("grid", total=len(self.states))
            self._bars.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bars is not None:
            self._bars.stop()
            self._bars = None
