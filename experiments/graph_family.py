"""Panacea with an inferred graph against pFedHN on a family of generated graph tasks: the
defaults chosen on one half of the family, reported on the other (docs/methods.md).

    python -m experiments.graph_family --half choose --out /tmp/family
    python -m experiments.graph_family --half report --out /tmp/family --set graph-k=auto

Each task is GRDA's spiral generator (:mod:`experiments.grda_task`) at a client count, a
number of points per class and client (few: a client needs its neighbours, and the graph
matters a lot; many: a little) and a task seed; the ``choose`` half has the even task seeds,
the ``report`` half the odd ones, so that no default is tested on a task it was chosen on.
Every run is the real app in process (:func:`fedamp_flwr.tools.inprocess.run_inprocess`) at the
run config's defaults but for the keys ``--set`` gives (pFedHN all but the ``graph-*`` keys,
which only the inferred graph reads): pFedHN, and Panacea with ``graph = "inferred"``, at
each run seed. Written: ``<out>/<half>.json`` (one row per task and seed:
both BMTAs and both last rounds' mean accuracies, the differences, the guard's record, the
inferred edges' precision and recall against the task's own graph) and ``<out>/<half>.md``
(the table). Finished runs are kept and not run again (their metrics.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from strategies.core.records import ACCURACY_SCORE, mean_score
from tasks.files import strict_json
from tasks.graphs import edge_agreement

from .grda_task import write as write_task

#: the family: client counts x points per class and client x task seeds (even: choose, odd:
#: report)
CLIENTS = (30, 60, 90, 120)
PER_CLASS = (10, 50)
TASK_SEEDS = {"choose": (2, 4), "report": (1, 3)}


def tasks(half: str) -> list[dict[str, int]]:
    """The half's tasks."""
    return [{"clients": c, "per_class": p, "task_seed": s}
            for c, p, s in itertools.product(CLIENTS, PER_CLASS, TASK_SEEDS[half])]


def task_name(task: dict[str, int]) -> str:
    return f"grda-c{task['clients']}-p{task['per_class']}-t{task['task_seed']}"


def run(out: Path, task: dict[str, int], strategy: str, seed: int, rounds: int,
        extra: dict[str, Any]) -> dict[str, Any]:
    """One run's metrics.json (run now, or kept from before)."""
    from fedamp_flwr.tools.inprocess import run_inprocess

    npz = out / "tasks" / f"{task_name(task)}.npz"
    if not npz.is_file():
        write_task(task["clients"], task["task_seed"], npz, task["per_class"])
    label = "-".join([strategy, *(f"{k}_{v}" for k, v in sorted(extra.items()))])
    folder = out / "runs" / task_name(task) / f"{label}-s{seed}"
    metrics = folder / "metrics.json"
    if metrics.is_file():
        held = json.loads(metrics.read_text())
        if held.get("finished"):
            return held
    cfg = {"dataset": "npz", "data-dir": str(npz), "strategy": strategy,
           "num-server-rounds": rounds, "seed": seed, "results-dir": str(folder.parent),
           "run-name": folder.name, "overwrite": True, "checkpoint-every": 0,
           "save-models": "none", **extra}
    run_inprocess(cfg, task["clients"], log_file=out / "runs.log")
    return json.loads(metrics.read_text())


def _last(metrics: dict[str, Any]) -> float:
    """The mean test accuracy (%) of the run's last round that has one: the model it ends
    with (a BMTA is its best round's)."""
    for rec in reversed(metrics["rounds"]):
        if (value := mean_score(rec, ACCURACY_SCORE)) is not None:
            return 100 * float(value)
    raise ValueError(f"run {metrics.get('run_name')!r} has no round with a mean accuracy")


def row(out: Path, task: dict[str, int], seed: int, rounds: int,
        extra: dict[str, Any]) -> dict[str, Any]:
    """A task and seed: pFedHN's and inferred Panacea's BMTA, the guard, the edges."""
    # pFedHN of the same run config: the keys set but the graph's (which only the inferred
    # graph reads)
    base = run(out, task, "pfedhn", seed, rounds,
               {k: v for k, v in extra.items() if not k.startswith("graph")})
    inferred = run(out, task, "panacea", seed, rounds, {"graph": "inferred", **extra})
    truth = np.load(out / "tasks" / f"{task_name(task)}.npz")["adjacency"]
    found = np.zeros_like(truth)
    for u, v in (inferred.get("inferred_graph") or {}).get("edges", []):
        found[u, v] = found[v, u] = 1
    guard = inferred.get("graph_guard") or {}
    bmta = ACCURACY_SCORE.headline
    last = [_last(m) for m in (base, inferred)]
    return {**task, "seed": seed, "pfedhn": base[bmta], "inferred": inferred[bmta],
            "gain": inferred[bmta] - base[bmta], "last_pfedhn": last[0],
            "last_inferred": last[1], "last_gain": last[1] - last[0],
            "chosen": guard.get("chosen"),
            "switched_back": guard.get("switched_back"),
            "edges": edge_agreement(found, truth), "guard_rounds": guard.get("rounds", [])}


def table(rows: list[dict[str, Any]]) -> str:
    """The half's table, its mean gain and its worst case."""
    lines = ["| task | seed | BMTA: pFedHN | inferred | gain | last round: pFedHN | inferred "
             "| gain | chosen | back to pFedHN | edges: precision, recall |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        e, back = r["edges"], (r.get("switched_back") or {}).get("round", "")
        lines.append(f"| {task_name(r)} | {r['seed']} | {r['pfedhn']:.2f} | {r['inferred']:.2f} "
                     f"| {r['gain']:+.2f} | {r['last_pfedhn']:.2f} | {r['last_inferred']:.2f} | "
                     f"{r['last_gain']:+.2f} | {r['chosen']} | {back} | {e['precision']:.2f}, "
                     f"{e['recall']:.2f} |")
    for what, key in (("BMTA", "gain"), ("the last round's mean", "last_gain")):
        gains = [r[key] for r in rows]
        lines.append(f"\n{len(rows)} runs, {what}: mean gain {np.mean(gains):+.2f} points, "
                     f"worst {min(gains):+.2f}, best {max(gains):+.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--half", choices=sorted(TASK_SEEDS), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a run-config value of the inferred runs (repeatable)")
    p.add_argument("--clients", default=",".join(map(str, CLIENTS)),
                   help="the client counts to run (a part of the family)")
    a = p.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    extra: dict[str, Any] = {}
    for item in a.set:
        key, _, value = item.partition("=")
        try:  # a number or true/false as such; anything else as the text it is
            extra[key] = json.loads(value)
        except ValueError:
            extra[key] = value
    wanted = {int(c) for c in a.clients.split(",")}
    rows = []
    for task in [t for t in tasks(a.half) if t["clients"] in wanted]:
        for seed in (int(s) for s in a.seeds.split(",")):
            rows.append(row(a.out, task, seed, a.rounds, extra))
            r = rows[-1]
            print(f"{task_name(task)} s{seed}: pFedHN {r['pfedhn']:.2f}, inferred "
                  f"{r['inferred']:.2f} ({r['gain']:+.2f}, {r['chosen']})", flush=True)
    label = "-".join([a.half, *(f"{k}_{v}" for k, v in sorted(extra.items()))])
    (a.out / f"{label}.json").write_text(json.dumps(strict_json(rows), indent=1, allow_nan=False))
    (a.out / f"{label}.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
