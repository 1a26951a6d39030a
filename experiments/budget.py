"""A comparison's budget, stated and spent equally: communication rounds, local gradient steps.

Two methods compared at "60 rounds" may do very different work: one with 20 local steps a
round, another with 1. Every table says its budget in the two units that matter
(:func:`budget_of`, :func:`describe`), and ``simulation.py --budget`` gives every run of a
grid the same one (:func:`apply_budget`):

* ``--budget rounds=R``: every run takes ``R`` communication rounds (its local work per
  round as its config says);
* ``--budget steps=S``: every run takes ``S`` local gradient steps per client in all,
  spent as its own regime chooses: ``local-steps`` k a round (its run config's, its tuned
  "auto" value, or a trial's) for ``S / k`` rounds. ``S`` must be a multiple of k (spent
  exactly, never rounded), and the run must count its local work in steps
  (``local-steps`` > 0): a run of local epochs takes a number of steps per round that
  depends on each client's data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.presets import PlannedRun
from fedamp_flwr.config import ConfigError, RunConfig

UNITS = ("rounds", "steps")


@dataclasses.dataclass(frozen=True)
class Budget:
    """``amount`` communication rounds (``unit`` = "rounds") or local gradient steps per client
    (``unit`` = "steps")."""

    unit: str
    amount: int

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``rounds=R`` or ``steps=S`` (a positive integer), or a ConfigError naming it."""
        unit, sep, value = text.partition("=")
        allowed = "rounds=R or steps=S, a positive integer"
        if not sep or unit.strip() not in UNITS:
            raise ConfigError(f"--budget {text!r} is invalid; allowed: {allowed}")
        try:
            amount = int(value.strip())
        except ValueError:
            raise ConfigError(f"--budget {text!r} is invalid; allowed: {allowed}") from None
        if amount < 1:
            raise ConfigError(f"--budget {text!r} is invalid; allowed: {allowed}")
        return cls(unit.strip(), amount)

    def rounds_for(self, local_steps: int, what: str = "the run") -> int:
        """The rounds that spend this budget at ``local_steps`` a round (0: local epochs)."""
        if self.unit == "rounds":
            return self.amount
        if local_steps < 1:
            raise ConfigError(f"--budget steps={self.amount}: {what} counts its local work in "
                              "epochs (its steps per round depend on each client's data); "
                              "allowed: local-steps > 0 (--set local-steps=K)")
        if self.amount % local_steps:
            fits = ", ".join(map(str, divisors(self.amount)))
            raise ConfigError(f"--budget steps={self.amount}: {what} takes {local_steps} local "
                              f"steps a round, which does not divide the budget; allowed: "
                              f"local-steps that divide it ({fits})")
        return self.amount // local_steps


#: A run a budget gives more rounds than this writes its checkpoint and metrics.json at most
#: this many times (``checkpoint-every``, unless the run sets it): each write holds the whole
#: history, so writing every one of 1,200 short rounds would cost time quadratic in them.
MOST_WRITES = 50


def apply_budget(runs: Sequence[PlannedRun], budget: Budget | None) -> list[PlannedRun]:
    """``runs`` with the rounds that spend ``budget`` (each run's local steps resolved as it
    will run them: "auto" and tuned values included), and at most :data:`MOST_WRITES`
    checkpoints where the run does not say how often."""
    if budget is None:
        return list(runs)
    out = []
    for run in runs:
        steps = int(RunConfig.from_run_config(run.run_config).local_steps)
        rounds = budget.rounds_for(steps, f"run {run.name}")
        every = {"checkpoint-every": -(-rounds // MOST_WRITES)} if (
            rounds > MOST_WRITES and "checkpoint-every" not in run.run_config) else {}
        cfg = {**run.run_config, "num-server-rounds": rounds, **every}
        RunConfig.from_run_config(cfg)
        out.append(dataclasses.replace(run, run_config=cfg))
    return out


def budget_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The budget a run config (a resolved one, as ``metrics.json`` records it) spends:
    ``rounds``, ``local_steps`` per round (None: it trains ``local_epochs``) and
    ``steps_per_client`` in all (None for epochs)."""
    rounds = int(config.get("num-server-rounds", 0))
    steps = int(config.get("local-steps", 0) or 0)
    return {"rounds": rounds, "local_steps": steps or None,
            "local_epochs": None if steps else config.get("local-epochs"),
            "steps_per_client": rounds * steps if steps else None}


def describe(budget: Mapping[str, Any]) -> str:
    """A budget in words: ``60 rounds x 20 local steps = 1,200 steps per client``."""
    rounds = budget["rounds"]
    if budget["local_steps"]:
        return (f"{rounds} rounds x {budget['local_steps']} local steps = "
                f"{budget['steps_per_client']:,} steps per client")
    epochs = budget.get("local_epochs")
    return f"{rounds} rounds x {epochs} local epochs" if epochs else f"{rounds} rounds"


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (the local steps a step budget ``n`` can be spent at)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))
