"""Several runs of a grid at once (``simulation.py --jobs N``): how many, and a pool of workers.

One run of a small model leaves a GPU mostly idle (small kernels: the launch
overhead dominates), and on a many-core CPU a run's client trains on a few
threads only; several runs side by side use the machine. Each job is a
separate process (:mod:`experiments.runner` runs one run per child process),
so a crash, a hang or an interrupt of one run never touches another, and the
CPU threads are split between the jobs: ``jobs x threads <= cores``.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from .processes import stop_tree

T = TypeVar("T")
R = TypeVar("R")

#: the most runs ``--jobs auto`` puts on one GPU (four runs side by side on one H100
#: gave 2.3x the throughput of one: issue 23; more only share the same kernels' queue)
GPU_JOBS = 4
#: threads a run of ``--jobs auto`` gets on a CPU-only machine (a client's convolutions
#: and matrix products scale well up to about this many cores)
CPU_THREADS = 8


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def auto_jobs(num_cores: int, num_gpus: int) -> int:
    """``--jobs auto``: with a GPU, up to :data:`GPU_JOBS` runs per GPU, two cores each at
    least; without one, one run per :data:`CPU_THREADS` cores (one run on a small machine)."""
    if num_gpus > 0:
        return max(1, min(GPU_JOBS * num_gpus, num_cores // 2))
    return max(1, num_cores // CPU_THREADS)


def visible_gpus() -> int:
    """The CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parse_jobs(text: str) -> int:
    """``--jobs``'s value: a positive integer or ``auto`` (:func:`auto_jobs` of this machine)."""
    if text == "auto":
        return auto_jobs(cores(), visible_gpus())
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"--jobs = {text!r} is invalid; allowed: a positive integer or 'auto'")
    return jobs


def threads_per_job(jobs: int, num_cores: int | None = None) -> int:
    """CPU threads of each of ``jobs`` runs at once: the cores split evenly, at least one."""
    return max(1, (num_cores or cores()) // jobs)


class Children:
    """The child processes of the jobs under way, stopped together (with what each one
    started) on an interrupt; once stopped, no new child starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def run(self, args: Sequence[str], env: dict[str, str],
            on_line: Callable[[str], None] | None = None) -> int | None:
        """Run ``args`` to its end; its exit code, or None if the jobs were stopped.
        ``on_line``: gets each line the child prints (stdout and stderr), else they are the
        child's own."""
        with self._lock:
            if self.stopping.is_set():
                return None
            piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True,
                     "errors": "replace"} if on_line is not None else {}
            proc = subprocess.Popen(list(args), env=env, **piped)  # type: ignore[call-overload]
            self._live.add(proc)
        try:
            if on_line is not None:
                for line in proc.stdout:  # to its end, whatever a line does: a full pipe
                    try:                  # would hold the child up
                        on_line(line.rstrip("\n"))
                    except Exception as err:
                        print(f"{line.rstrip()} ({type(err).__name__}: {err})", flush=True)
            code = proc.wait()
        finally:
            with self._lock:
                self._live.discard(proc)
        return None if self.stopping.is_set() else code

    def stop(self) -> None:
        """Stop every child under way (SIGTERM, then SIGKILL), and start no new one."""
        with self._lock:
            self.stopping.set()
            live = list(self._live)
        for proc in live:
            stop_tree(proc.pid)
            proc.wait()


def pool(items: Sequence[T], jobs: int, work: Callable[[int, T], R]) -> list[R]:
    """``work(i, item)`` for every item, ``jobs`` at a time, in the order given; the results
    in that order. One job: in this thread. Several: daemon threads (each one mostly waits
    on a child process), joined so that Ctrl-C reaches this thread at once; the first
    exception of a worker is raised here after the others have finished."""
    if jobs <= 1 or len(items) <= 1:
        return [work(i, item) for i, item in enumerate(items)]
    results: dict[int, R] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    queue = iter(enumerate(items))

    def worker() -> None:
        while True:
            with lock:
                nxt = next(queue, None)
            if nxt is None or errors:
                return
            try:
                results[nxt[0]] = work(*nxt)
            except BaseException as err:  # raised in the caller's thread below
                errors.append(err)
                return

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(jobs, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(items))]
