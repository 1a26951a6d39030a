"""How right a grid's ETA is: run ``simulation.py`` in a terminal (tmux) and read its bars.

    python -m experiments.eta_check --every 15 -- --engine inprocess --preset panacea-tables \\
        --scenarios 0 --datasets tpt48/time --tune 4 --rounds 20 --jobs 2 --output /tmp/eta

Starts the grid in a detached tmux session (a real terminal: rich draws its bars), reads
the screen every ``--every`` seconds (``tmux capture-pane``), and keeps the ETA the
grid's line shows then (a reading before the grid has its first ETA, "ETA after round 2",
is kept without one). When the grid has ended, each reading is set against the real time
left, and the table (elapsed, ETA shown, real time left, error) goes to stdout and, with
``--out``, to a JSON file; then the first ETA shown against the truth (the issue's "within a
factor of 2"), and when the screen first showed a line. Needs tmux.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRID_LINE = re.compile(r"grid: (\d+)/(\d+) runs done, (\d+) running, (\d+) failed; ETA "
                       r"(?:(\d+):(\d\d):(\d\d)|after)")


def read_eta(screen: str) -> tuple[int, int, float | None] | None:
    """(runs ended, runs in all, the ETA's seconds: None before the grid has one) of the
    newest grid line on a screen."""
    found = GRID_LINE.findall(screen)
    if not found:
        return None
    done, total, _, failed, h, m, s = found[-1]
    eta = int(h) * 3600 + int(m) * 60 + float(s) if h else None
    return int(done) + int(failed), int(total), eta


def show(readings: list[dict[str, Any]], end: float, first_line: float | None) -> None:
    """Print the readings against the real time left (each reading gets its ``left_s`` and
    ``error``), the second half's largest error, the first ETA against the truth and when the
    screen first showed a line."""
    print(f"grid ended after {end:.0f} s; {len(readings)} readings")
    print("| elapsed (s) | runs ended | ETA shown (s) | real time left (s) | error |")
    print("|---:|---:|---:|---:|---:|")
    for r in readings:
        r["left_s"] = round(end - r["elapsed_s"], 1)
        r["error"] = round((r["eta_s"] - r["left_s"]) / r["left_s"], 3) \
            if r["left_s"] > 0 and r["eta_s"] is not None else None
        error = f"{r['error']:+.0%}" if r["error"] is not None else "-"
        shown = f"{r['eta_s']:.0f}" if r["eta_s"] is not None else "none yet"
        print(f"| {r['elapsed_s']:.0f} | {r['runs_ended']}/{r['runs']} | {shown} | "
              f"{r['left_s']:.0f} | {error} |")
    second_half = [r for r in readings if r["elapsed_s"] >= end / 2 and r["error"] is not None]
    if second_half:
        worst = max(abs(r["error"]) for r in second_half)
        print(f"second half: {len(second_half)} readings, the largest error {worst:.0%}")
    first = next((r for r in readings if r["eta_s"] is not None and r["left_s"] > 0), None)
    if first is not None:
        print(f"first ETA: {first['eta_s']:.0f} s, read at {first['elapsed_s']:.0f} s; the grid "
              f"had {first['left_s']:.0f} s left: {first['eta_s'] / first['left_s']:.2f} times "
              "the truth")
    if first_line is not None:
        print(f"the screen's first line: read at {first_line:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.eta_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=float, default=15.0, help="seconds between two readings")
    p.add_argument("--out", type=Path, default=None, help="the readings as JSON")
    p.add_argument("grid", nargs=argparse.REMAINDER, help="-- then simulation.py's options")
    args = p.parse_args(argv)
    if shutil.which("tmux") is None:
        raise SystemExit("error: tmux is not installed (apt-get install tmux)")
    grid = [a for a in args.grid if a != "--"]
    session = f"eta-{int(time.time())}"
    done_file = Path(f"/tmp/{session}.done")
    command = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} simulation.py "
               f"{shlex.join(grid)}; touch {done_file}; sleep 5")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50",
                    command], check=True)
    start = time.monotonic()
    readings: list[dict[str, Any]] = []
    first_line: float | None = None
    try:
        while not done_file.exists():
            time.sleep(args.every)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True).stdout
            if first_line is None and screen.strip():
                first_line = round(time.monotonic() - start, 1)
            seen = read_eta(screen)
            if seen is not None:
                readings.append({"elapsed_s": round(time.monotonic() - start, 1),
                                 "runs_ended": seen[0], "runs": seen[1], "eta_s": seen[2]})
        end = time.monotonic() - start
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        done_file.unlink(missing_ok=True)
    show(readings, end, first_line)
    if args.out:
        args.out.write_text(json.dumps({"grid": grid, "seconds": round(end, 1),
                                        "first_line_s": first_line, "readings": readings},
                                       indent=1, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
