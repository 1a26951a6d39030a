"""Submit one deployed run and see it through, whatever happens to its SuperLink.

``python -m experiments.watch [APP] --run-config "..." [--superlink-wait S] [--resumes K]``

Submits the app (default: this project) to the SuperLink of ``$FLWR_HOME``'s
default connection, follows its log, and, when the run
ends because its SuperLink went away (killed, restarted on its database, its
machine rebooted), waits for the SuperLink to answer again and submits the
run again with ``resume = true``: it continues from its last checkpoint, and
its results are those of an uninterrupted run (at most the interrupted round is
computed again with ``checkpoint-every = 1``). A run needs a ``run-name`` to be
resumed: one is given if the run config has none. Exit status 0 when the run
completed, 1 otherwise (Flower's own ``flwr run`` exits 0 even when the
ServerApp fails).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .flower_cli import COMPLETED, FlowerCliError, FlowerRun, parse_run_config

ROOT = Path(__file__).resolve().parents[1]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.watch",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("app", nargs="?", default=str(ROOT), help="the app's folder (default: this "
                   "project)")
    p.add_argument("--run-config", default="", help="as flwr run takes it")
    p.add_argument("--federation-config", default="", help="as flwr run takes it")
    p.add_argument("--superlink-wait", type=float, default=600.0, help="seconds to wait for a "
                   "SuperLink that went away (default 600)")
    p.add_argument("--resumes", type=int, default=5, help="how often the run may be submitted "
                   "again (default 5)")
    p.add_argument("--timeout", type=float, default=7 * 24 * 3600.0, help="seconds one "
                   "submission may run (default a week)")
    p.add_argument("--log", default="", help="the run's log file (default <run-name>.log)")
    args = p.parse_args(argv)
    try:
        config = parse_run_config(args.run_config)
    except Exception as err:
        print(f"error: --run-config {args.run_config!r}: {err}", file=sys.stderr)
        return 2
    config.setdefault("run-name", f"watched-{time.strftime('%Y%m%d-%H%M%S')}")
    if "checkpoint-every" not in config:
        print("note: checkpoint-every = 1 (the default): a resume recomputes at most the round "
              "that was interrupted", flush=True)
    log = Path(args.log or f"{config['run-name']}.log")
    flower = FlowerRun(dict(os.environ), Path(args.app), config, args.federation_config, log,
                       on_line=lambda line: print(line, end="", flush=True))
    try:
        flower.submit()
        print(f"run {flower.run_id} submitted (run-name {config['run-name']!r}); log in {log}",
              flush=True)
        run, outcome = flower.follow_through(args.timeout, args.superlink_wait, args.resumes,
                                             say=lambda text: print(text, flush=True))
    except FlowerCliError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"run {run.run_id}: {outcome.status} {outcome.details}".rstrip(), flush=True)
    return 0 if outcome.status == COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
