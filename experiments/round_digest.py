"""Every round of a grid's finished runs in one small file, for the docs beside its table.

    python -m experiments.round_digest results/traffic-steps1000 --out docs/traffic-steps1000/rounds.json

It also prints them as a Markdown table (:func:`table`).

For each run under ``<grid>/runs`` that finished (its ``metrics.json`` says so), by run name:
its headline (``best_mean_mse`` for regression, else ``bmta``), each round's mean test score
(``mean_mse``, else ``mean_accuracy``) and clients' training loss, its recorded
``wall_time_s``, and the seconds its rounds took by its log (``log.txt``'s "Round N done in"
lines; a round run twice, once before a resume, counted at its last): in all, and without the
rounds the machine slept through (:func:`fedamp_flwr.server.rounds.unpaused`: over 10 times
the median). A grid run in pieces, on a machine paused between sittings, has a wall time that
counts the pauses; its rounds' seconds without the paused ones are what the runs cost.
An earlier digest in ``--out`` is never lost: its runs that this folder finished are replaced;
where it holds others, ``--add`` keeps them beside (a grid run in pieces, the earlier pieces'
folders gone), and without it the command refuses, writing nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedamp_flwr.server.rounds import ROUND_DONE, unpaused
from strategies.core.records import (
    MEAN_TRAIN_LOSS,
    SCORES,
    RunFile,
    is_number,
    mean_key,
    mean_score,
)
from tasks.files import strict_json


def round_seconds(log: str) -> dict[int, float]:
    """Each round's seconds by its log's "Round N done in S s" lines (the last of a round)."""
    return {int(m.group(1)): float(m.group(2)) for m in ROUND_DONE.finditer(log)}


def digest(run_dir: Path) -> dict[str, Any] | None:
    """One run's digest (the module's docstring), or None where it has not finished."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        return None
    run = RunFile.read(path)
    if not run.finished or not run.rounds:
        return None
    score, best = run.headline()
    rounds = [{"round": r.get("round"), mean_key(score.metric): mean_score(r, score),
               MEAN_TRAIN_LOSS: r.get(MEAN_TRAIN_LOSS)} for r in run.rounds]
    log = run_dir / "log.txt"
    seconds = list(round_seconds(log.read_text(errors="replace")).values()) \
        if log.is_file() else []
    steady = unpaused(seconds)
    return {"strategy": run.strategy, score.headline: best, "wall_time_s": run.wall_time_s,
            "rounds_s": round(sum(seconds), 2), "rounds_s_unpaused": round(sum(steady), 2),
            "paused_rounds": len(seconds) - len(steady), "rounds": rounds}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.round_digest",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("grid", type=Path, help="a grid's output folder (simulation.py --output)")
    p.add_argument("--out", type=Path, required=True,
                   help="the JSON file to write (an earlier digest there: its runs that this "
                        "folder finished are replaced; one with others is refused, but --add)")
    p.add_argument("--add", action="store_true",
                   help="keep the runs of an earlier digest in --out that this folder has not "
                        "finished (a grid run in pieces, the earlier pieces' folders gone)")
    p.add_argument("--scale", type=float, default=1e3,
                   help="the table's scores and losses times this (default 1e3: MSE x1e-3)")
    args = p.parse_args(argv)
    runs = args.grid / "runs"
    if not runs.is_dir():
        raise SystemExit(f"{runs} is not a folder: give a grid's output folder "
                         "(simulation.py --output)")
    found = {d.name: s for d in sorted(runs.iterdir()) if d.is_dir()
             for s in [digest(d)] if s is not None}
    earlier = load(args.out, "--out") if args.out.exists() else {}
    kept = {name: run for name, run in earlier.items() if name not in found}
    if kept and not args.add:
        raise SystemExit(f"--out {args.out} holds {len(kept)} run(s) this grid's folder has not "
                         f"finished ({', '.join(sorted(kept)[:3])}{', ...' if len(kept) > 3 else ''})"
                         ": give --add to keep them beside this folder's, or another file")
    out = dict(sorted({**kept, **found}.items()))
    temporary = args.out.with_name(args.out.name + ".tmp")
    temporary.write_text(json.dumps(strict_json(out), indent=1, allow_nan=False) + "\n")
    os.replace(temporary, args.out)  # the earlier digest is never half written
    print(f"{len(found)} finished run(s) written to {args.out}"
          + (f" ({len(earlier) - len(kept)} of its earlier runs replaced, {len(kept)} kept)"
             if earlier else "") + "\n")
    print(table(out, args.scale))


def load(path: Path, option: str) -> dict[str, dict[str, Any]]:
    """The runs of a digest this command wrote at ``path``; refused (SystemExit naming
    ``option``, the command-line option that gave it) where it is not one."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise SystemExit(f"{option} {path} is not a round digest ({ex}): give "
                         "another file, or remove it") from ex
    if not isinstance(earlier, dict) or not all(_is_digest(run) for run in earlier.values()):
        raise SystemExit(f"{option} {path} is not a round digest (a JSON object of "
                         "runs by name, each with its score, rounds and seconds, as "
                         "experiments.round_digest writes them): give another file, or remove it")
    return earlier


def _is_digest(run: Any) -> bool:
    """Whether ``run`` is one run's digest as :func:`digest` writes it (:func:`table` reads it)."""
    return (isinstance(run, dict) and isinstance(run.get("rounds"), list) and bool(run["rounds"])
            and all(isinstance(r, dict) and _is_whole(r.get("round"))
                    and all(v is None or is_number(v) for v in r.values())
                    for r in run["rounds"])
            and any(s.headline in run for s in SCORES)
            and all(isinstance(run.get(k), (int, float))
                    for k in ("rounds_s_unpaused", "paused_rounds")))


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def table(runs: dict[str, dict[str, Any]], scale: float) -> str:
    """The digest as a Markdown table: each run's best mean test score (and its round), its
    score after a tenth, half and all of its rounds, its clients' training loss in its last
    round (both x ``scale``), its rounds' minutes without the paused ones, and how many."""
    lines = ["| run | best (round) | after {10%, 50%, 100%} of the rounds | training loss, "
             "last round | rounds' minutes (paused rounds left out) |",
             "|---|---:|---:|---:|---:|"]
    for name, run in runs.items():
        rounds = run["rounds"]
        score = next(s for s in SCORES if s.headline in run)  # the run's, as digest wrote it
        values = [r[mean_key(score.metric)] for r in rounds]
        known = {r["round"]: v for v, r in zip(values, rounds) if v is not None}
        best = score.best(known.values()) if known else None
        at = next((r for r, v in known.items() if v == best), None)
        marks = [values[max(0, round(len(values) * f) - 1)] for f in (0.1, 0.5, 1.0)]
        loss = rounds[-1].get(MEAN_TRAIN_LOSS)
        lines.append(f"| {name} | {_x(best, scale)} ({at}) | "
                     f"{' / '.join(_x(v, scale) for v in marks)} | {_x(loss, scale)} | "
                     f"{run['rounds_s_unpaused'] / 60:.0f} ({run['paused_rounds']}) |")
    return "\n".join(lines)


def _x(value: float | None, scale: float) -> str:
    return "none" if value is None else f"{value * scale:.2f}"


if __name__ == "__main__":
    main()
