"""One tuning protocol for every method: the same number of trials, on validation data.

``simulation.py --tune K`` turns a preset's grid into a tuning grid
(:func:`tuning_runs`): for every data setting and every method, ``K`` trials
(run variants ``<strategy>@t<i>``), all with the grid's first seed:

* trial 0 is the method's settings as the preset runs it (its "auto" values
  resolved without ``strategies/tuned.json``: a tuning starts from the
  defaults, whatever an earlier one chose), the others multiply them by factors drawn, seeded and without
  repeats, from the method's search space (:func:`space`): the generic local
  training (:data:`GENERIC_SPACE`: the optimizer, Adam or plain SGD, each with its
  own learning rate x 1/3, 1, 3 (:data:`START_LEARNING_RATE`); local epochs,
  or local steps where the task counts steps, x 1/2, 1, 2, and one local step a
  round, FedAvg's own regime, :data:`ONE_STEP`) and the method's own
  keys (``register_strategy(tune=...)``, e.g. Panacea's clients' and server's
  learning rates, which replace the generic learning rate and optimizer it does
  not use);
* the trials after trial 0 are drawn so that every value of every key is tried
  before a value is tried twice (:func:`draw`): with 12 trials, every learning
  rate of both optimizers and every local work, one local step included, is in
  some trial;
* every trial holds out ``validation-fraction`` (0.2) of each client's training
  data, trains on the rest and is scored on that share (BMTA, or best mean MSE
  for regression), never on the test data: a tuning run does not load it.

:func:`choose` picks each method's best trial per data setting and writes
``tuned.json`` (the chosen values, their validation score, trial 0's, every
trial's, the command) and ``tuned.md``. Copied to ``strategies/tuned.json``,
the chosen values are what "auto" gives (:func:`fedamp_flwr.config.auto_values`);
``simulation.py --tuned FILE`` runs a preset with them where it sets the keys
itself (e.g. the FedAMP paper's learning rate in ``quick``). Values chosen under a
``--budget`` go to ``strategies/tuned.json``'s ``budgets`` (``python -m
experiments.tuning merge FILE`` puts a tuning's choices where they belong), which
``simulation.py --budget`` applies by itself. Every key of a
space takes "auto", so that a tuned value can be its default.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.budget import budget_of
from experiments.presets import Grid, PlannedRun, expand
from experiments.scores import complete, is_regression, load_runs, score
from fedamp_flwr.config import GENERIC_AUTO, RunConfig
from fedamp_flwr.server.results import strict_json
from strategies import STRATEGIES
from strategies.core.registry import untuned

#: The search space every method shares: factors of the run's own value, or (strings) the
#: values to choose from.
GENERIC_SPACE: dict[str, tuple[float, ...] | tuple[str, ...]] = {
    "learning-rate": (1 / 3, 1.0, 3.0),
    "local-epochs": (0.5, 1.0, 2.0),  # or local-steps, where the task counts steps
    "optimizer": ("adam", "sgd"),
}
#: A learning rate belongs to its optimizer: the ladder of an optimizer other than the run's
#: own is centred here. Adam's 1e-3 is the generic "auto" value; SGD's 0.1 is its usual
#: starting point on small networks (not tuned on this project's tasks).
START_LEARNING_RATE = {"adam": 1e-3, "sgd": 0.1}
LR, OPTIMIZER = "learning-rate", "optimizer"
#: Where the task counts local steps, one step a round is in every method's space too: the
#: regime in which FedAvg is at its best (many short rounds). Under a step budget
#: (``simulation.py --budget steps=S``) such a trial takes S rounds, the others S / k.
ONE_STEP = 1
#: Share of each client's training data a trial holds out and is scored on.
VALIDATION_FRACTION = 0.2
TUNED_JSON, TUNED_MD = "tuned.json", "tuned.md"


def space(strategy: str, steps: bool) -> dict[str, tuple[float, ...] | tuple[str, ...]]:
    """The search space of ``strategy`` (key -> factors, or choices): the generic one, with
    local steps for epochs where ``steps``, then the strategy's own (``()`` removes a key; a
    method without the generic learning rate has no generic optimizer either)."""
    generic = dict(GENERIC_SPACE)
    if steps:
        generic["local-steps"] = generic.pop("local-epochs")
    merged = {**generic, **STRATEGIES[strategy].tune}
    out = {k: v for k, v in merged.items() if v}
    if LR not in out:
        out.pop(OPTIMIZER, None)
    for key in out:
        settings = STRATEGIES[strategy].settings
        if key not in GENERIC_AUTO and key not in settings.AUTO:
            raise ValueError(f"strategy {strategy!r}: tuned key {key!r} does not take 'auto'; "
                             f"allowed: {', '.join(sorted({*GENERIC_AUTO, *settings.AUTO}))}")
    return out


def base_values(run_config: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The values of ``keys`` in a run with ``run_config`` ("auto" resolved)."""
    values = RunConfig.from_run_config(run_config).to_dict()
    return {k: values[k] for k in keys}


def ladder(value: Any, factors: Sequence[float]) -> list[Any]:
    """The values a key takes in a search space: ``value`` times each factor (floats to 6
    digits); an integer (epochs, steps) rounded, and where rounding makes two alike (1 x 0.5
    is 1), the next ones doubled from the largest, so that every key has as many distinct
    values as factors and ``value`` where the factor is 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"cannot tune the value {value!r}: not a number")
    if not isinstance(value, int):
        return [float(f"{value * f:.6g}") for f in factors]
    chosen: dict[float, int] = {1.0: value}
    prev = value
    for f in sorted(f for f in factors if f > 1):
        prev = chosen[f] = max(round(value * f), prev + 1)
    prev, spill = value, []
    for f in sorted((f for f in factors if f < 1), reverse=True):
        v = min(round(value * f), prev - 1)
        if v >= 1:
            prev = chosen[f] = v
        else:  # no room below: the next value above
            spill.append(f)
    for f in spill:
        chosen[f] = max(chosen.values()) * 2
    return [chosen[f] for f in factors]


def trials(strategy: str, run_config: Mapping[str, Any], k: int, seed: int = 0
           ) -> list[dict[str, Any]]:
    """``k`` trials of ``strategy`` for a run with ``run_config``: its own values first,
    then distinct points of its space, drawn with ``seed`` (fewer where the space is smaller).
    """
    if k < 1:
        raise ValueError(f"--tune {k}: allowed: an integer >= 1 (trials per method)")
    with untuned():  # from the defaults, whatever an earlier tuning chose
        steps = int(RunConfig.from_run_config(run_config).local_steps) > 0
        sp = space(strategy, steps)
        base = base_values(run_config, list(sp))
    points = grid(sp, base)
    return [dict(base), *draw([p for p in points if p != base], base, k - 1,
                              random.Random(f"{seed}-{strategy}"))]


def grid(sp: Mapping[str, Sequence[Any]], base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every point of the space ``sp`` around the run's values ``base``: each numeric key's
    :func:`ladder` (local steps with :data:`ONE_STEP` too), each choice's values, and the
    learning rate's ladder centred on each optimizer's own (:data:`START_LEARNING_RATE`
    where the run's optimizer is another)."""
    ladders: dict[str, list[Any]] = {
        key: list(values) if _is_choice(values) else ladder(base[key], values)
        for key, values in sp.items()}
    if "local-steps" in ladders and ONE_STEP not in ladders["local-steps"]:
        ladders["local-steps"].append(ONE_STEP)
    if OPTIMIZER not in sp:
        return [dict(zip(ladders, p)) for p in itertools.product(*ladders.values())]
    rates = {o: ladder(base[LR] if o == base[OPTIMIZER] else START_LEARNING_RATE[o], sp[LR])
             for o in ladders.pop(OPTIMIZER)}
    ladders.pop(LR)
    return [{**dict(zip(ladders, p)), OPTIMIZER: o, LR: lr}
            for p in itertools.product(*ladders.values()) for o in rates for lr in rates[o]]


def draw(points: Sequence[Mapping[str, Any]], base: Mapping[str, Any], n: int,
         rng: random.Random) -> list[dict[str, Any]]:
    """``n`` of ``points`` in a seeded order, each time the one that tries the most values
    not tried yet (by ``base`` or an earlier pick; ties in the shuffled order): every value
    of every key comes before any is tried twice, where ``n`` allows."""
    left = [dict(p) for p in points]
    rng.shuffle(left)
    seen = set(base.items())
    out: list[dict[str, Any]] = []
    while left and len(out) < n:
        best = max(range(len(left)), key=lambda i: len(set(left[i].items()) - seen))
        out.append(left.pop(best))
        seen |= set(out[-1].items())
    return out


def _is_choice(values: Sequence[Any]) -> bool:
    return all(isinstance(v, str) for v in values)


def tuning_runs(grid: Grid, k: int, data_dir: str | None, output: Path,
                fraction: float = VALIDATION_FRACTION) -> list[PlannedRun]:
    """The tuning grid of ``grid``: ``k`` trials of every strategy in every data setting
    (scenarios and seeds: the grid's first), each scored on its held-out validation share."""
    first = dataclasses.replace(grid, scenarios=grid.scenarios[:1], seeds=grid.seeds[:1])
    runs = []
    for run in expand(first, data_dir, output):
        variant = run.run_config.get("label", "")
        strategy = run.run_config["strategy"]
        base_name = variant or strategy
        for i, values in enumerate(trials(strategy, run.run_config, k)):
            label = f"{base_name}@t{i}"
            name = label + run.name[len(base_name):]
            cfg = {**run.run_config, **values, "validation-fraction": fraction,
                   "label": label, "run-name": name}
            RunConfig.from_run_config(cfg)
            runs.append(PlannedRun(name, run.num_clients, cfg))
    return runs


def _trial_of(label: str) -> tuple[str, int]:
    method, _, trial = label.rpartition("@t")
    return method, int(trial)


def choose(runs: Sequence[PlannedRun], output: Path, command: str = "", budget: str = ""
           ) -> dict[str, Any]:
    """Each method's best trial per data setting by its validation score; written to
    ``output``/tuned.json and tuned.md, and returned. ``budget``: the ``--budget`` every
    trial spent ("" for the preset's rounds), recorded so that the values run only under
    it. A method none of whose trials finished is left out (and named in ``missing``)."""
    by_method: dict[tuple[str, str], list[tuple[int, PlannedRun, float | None]]] = {}
    regression: dict[str, bool] = {}
    for run in runs:
        cfg = RunConfig.from_run_config(run.run_config)
        method, i = _trial_of(run.run_config["label"])
        folder = output / "runs" / run.name
        records = [r for r in (load_runs([folder]) if folder.is_dir() else []) if complete(r)]
        value = score(records[0]) if records else None  # a failed trial is not scored
        if records:
            regression[cfg.tuning_key] = is_regression(records[0])
        by_method.setdefault((method, cfg.tuning_key), []).append((i, run, value))
    chosen: dict[str, dict[str, Any]] = {}
    missing = []
    for (method, setting), rows in sorted(by_method.items()):
        done = [(i, run, v) for i, run, v in rows if v is not None]
        if not done:
            missing.append(f"{method} {setting}")
            continue
        lower = regression.get(setting, False)
        i, run, value = (min if lower else max)(done, key=lambda r: r[2])
        keys = list(trials_keys(run))
        chosen.setdefault(method, {})[setting] = {
            "values": {k: run.run_config[k] for k in keys},
            "validation_score": value, "trial": i, "run": run.name,
            "metric": "best mean MSE (lower is better)" if lower else "BMTA % (higher is better)",
            "trial_0_score": next((v for j, _, v in rows if j == 0), None),
            "trials": {str(j): {"score": v, **{k: r.run_config[k] for k in keys}}
                       for j, r, v in sorted(rows, key=lambda t: t[0])},
            "rounds": run.run_config.get("num-server-rounds"),
            "budget": budget_of(cfg_of(run)),
            "clients": run.num_clients,
            "validation_fraction": run.run_config["validation-fraction"],
            "command": command,
        }
    result = {"command": command, "budget": budget, "strategies": chosen, "missing": missing}
    output.mkdir(parents=True, exist_ok=True)
    (output / TUNED_JSON).write_text(json.dumps(strict_json(result), indent=1,
                                                allow_nan=False) + "\n")
    (output / TUNED_MD).write_text(tuned_table(result))
    return result


def cfg_of(run: PlannedRun) -> dict[str, Any]:
    """A run's config as it runs ("auto" resolved)."""
    return RunConfig.from_run_config(run.run_config).to_dict()


def trials_keys(run: PlannedRun) -> list[str]:
    """The keys a trial of ``run``'s strategy sets (its search space's)."""
    steps = int(RunConfig.from_run_config(run.run_config).local_steps) > 0
    method = _trial_of(run.run_config["label"])[0]
    return list(space(method.split("@")[0], steps))


def tuned_table(result: Mapping[str, Any]) -> str:
    """``tuned.json`` as a markdown table: setting, method, chosen values, validation scores."""
    lines = [f"Tuned by: `{result.get('command', '')}`", "",
             "| setting | method | chosen | validation score | trial 0 (defaults) | trials |",
             "|---|---|---|---:|---:|---:|"]
    for method, settings in result["strategies"].items():
        for setting, row in settings.items():
            values = ", ".join(f"{k} = {v}" for k, v in row["values"].items())
            t0 = row["trial_0_score"]
            lines.append(f"| {setting} | {method} | {values} (trial {row['trial']}) | "
                         f"{row['validation_score']:.4g} | "
                         f"{'-' if t0 is None else f'{t0:.4g}'} | {len(row['trials'])} |")
    if result.get("missing"):
        lines += ["", f"No finished trial: {', '.join(result['missing'])}"]
    return "\n".join(lines) + "\n"


def apply_tuned(runs: Sequence[PlannedRun], tuned: Mapping[str, Any], forced: Sequence[str] = ()
                ) -> list[PlannedRun]:
    """``runs`` with the values of a ``tuned.json`` for their strategy (or variant) and data
    setting, except the keys in ``forced`` (``--set``, ``--rounds``)."""
    out = []
    for run in runs:
        cfg = RunConfig.from_run_config(run.run_config)
        method = run.run_config.get("label") or run.run_config["strategy"]
        row = tuned.get("strategies", {}).get(method, {}).get(cfg.tuning_key)
        if row is None and method != run.run_config["strategy"]:
            row = tuned.get("strategies", {}).get(run.run_config["strategy"], {}).get(
                cfg.tuning_key)
        # a learning rate belongs to its optimizer: forcing either leaves both to the run
        paired = {LR, OPTIMIZER} if {LR, OPTIMIZER} & set(forced) else set()
        values = {k: v for k, v in (row or {}).get("values", {}).items()
                  if k not in forced and k not in paired}
        new = {**run.run_config, **values}
        RunConfig.from_run_config(new)
        out.append(PlannedRun(run.name, run.num_clients, new))
    return out


def merge(result: Mapping[str, Any], into: Path) -> None:
    """Put a tuning's choices (``tuned.json``) into ``into`` (``strategies/tuned.json``): under
    ``strategies`` (what "auto" gives), or under ``budgets`` for a tuning under a ``--budget``;
    a method and data setting tuned again is replaced, the others are kept."""
    data = json.loads(into.read_text()) if into.is_file() else {"strategies": {}}
    target = (data.setdefault("budgets", {}).setdefault(result["budget"], {"strategies": {}})
              if result.get("budget") else data)
    for method, settings in result["strategies"].items():
        target.setdefault("strategies", {}).setdefault(method, {}).update(settings)
    into.write_text(json.dumps(strict_json(data), indent=1, allow_nan=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m experiments.tuning merge FILE [--into PATH]``."""
    import argparse

    from strategies.core.registry import TUNED_FILE

    p = argparse.ArgumentParser(prog="python -m experiments.tuning", description=merge.__doc__)
    p.add_argument("action", choices=["merge"])
    p.add_argument("file", type=Path, help="a tuned.json written by simulation.py --tune")
    p.add_argument("--into", type=Path, default=TUNED_FILE)
    args = p.parse_args(argv)
    result = json.loads(args.file.read_text())
    merge(result, args.into)
    where = f"budgets[{result['budget']!r}]" if result.get("budget") else "strategies"
    print(f"merged {sum(map(len, result['strategies'].values()))} choices into {args.into} "
          f"({where})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
