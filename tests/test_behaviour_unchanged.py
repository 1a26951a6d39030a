"""Every strategy's results for a fixed seed, as recorded, must not change.

``tests/data/behaviour/<key>.json`` holds, for every strategy (and four
scenario runs), the per-round records of a 2-round in-process run on the
default task (seed 42, 1 local epoch): every client's test accuracy, the mean
accuracy, the mean training loss and the mean test loss, and which clients
trained. They were recorded with the code of commit "Deterministic rounds:
..."; this test runs the same runs now and compares.

Since then, FedAMP mixes only the clients that train in a round by default
(``fedamp-offline-clients = "exclude"``); the recorded drop-out scenario
ran with the mix of every training client, ``"include"``, as it did then; and
``nonconvex`` combines the models as the paper writes them by default, so
its recorded run is pinned to the normalised alphas it used then
(``nonconvex-normalize = true``); pFedHN takes its reference trainer's
settings by default, so its recorded run is pinned to the settings of then. The methods
with a proximal term (FedProx, FedAMP, HeurFedAMP) add its gradient directly
since, and report the data loss alone as ``train_loss``: their models and test
numbers are compared as before, their training loss must be at most the
recorded one (which included (mu / 2) ||w - w_start||^2) and within 0.1% of it.

Tolerances that summation order, thread count and hardware cannot break:
accuracies are compared as counts of correct test samples (to the sample);
losses to a relative 1e-4 (float sums in a loss round differently with another
number of threads or another CPU or GPU: seen up to 1e-5 relative).

Each run is recorded in its own file, ``tests/data/behaviour/<key>.json``, so
that a new method records only its own numbers. Record only for a change that
is meant to change results, and only the runs it changes:
``python -m tests.test_behaviour_unchanged --record KEY [KEY ...]`` (a key is a
strategy name, or ``<strategy>+scenarios``).

Since then, too, the synthetic task has values of its own: FedAMP's and HeurFedAMP's sigma
(0.1 and 300, chosen on validation rows), Panacea's server clip (50), each method's local
training tuned for it (``strategies/tuned.json``), and its clients also train alone; the
recorded runs are pinned to the values of then (sigma 1 and 25, no clip, the declared
defaults, ``strategies.core.registry.untuned``, and ``alone = false``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .helpers import BEHAVIOUR_RECORDS, recorded, run_local

LOSS_RTOL = 1e-4
SCENARIOS = {"novel-client-fraction": 0.2, "attack-ratio": 0.25, "drop-rate": 0.4,
             "heterogeneous-epochs": True, "local-epochs": 2}
FIELDS = ("round", "mean_accuracy", "client_accuracy", "train_loss", "mean_loss", "trained_clients")
EXACT = ("round", "mean_accuracy", "client_accuracy", "trained_clients")
PROXIMAL = ("fedprox", "fedprox-ft", "fedamp", "heurfedamp")


def case(key: str) -> tuple[str, int, dict]:
    """Strategy, clients and run-config overrides of a recorded run."""
    name, _, scenario = key.partition("+")
    overrides: dict = {**(SCENARIOS if scenario else {}), "alone": False}
    if name == "fedamp" and scenario:  # the mix of all training clients, as before the option
        overrides["fedamp-offline-clients"] = "include"
    if name in ("fedamp", "heurfedamp"):  # the synthetic task's sigma of then
        overrides[f"{name}-sigma"] = 1.0 if name == "fedamp" else 25.0
    if name in ("panacea", "panacea-gn"):  # no server clip then
        overrides["panacea-server-clip"] = 0.0
    if name == "nonconvex":  # normalised alphas, as recorded (the default again since)
        overrides["nonconvex-normalize"] = True
    if name == "pfedhn":  # the settings of then, before pFedHN's reference values became its own
        overrides.update({"local-steps": 0, "panacea-client-lr": 0.1, "panacea-server-lr": 0.1,
                          "panacea-server-steps": 10, "panacea-client-momentum": 0.0,
                          "panacea-client-weight-decay": 0.0, "panacea-client-clip": 0.0,
                          "panacea-server-weight-decay": 0.0, "panacea-server-clip": 0.0})
    graph = name.startswith("panacea") or name == "sfl"
    if graph:  # its 5 groups (the task's own graph since), with 6 clients
        overrides["graph"] = "groups"
        if scenario and name != "sfl":
            overrides["local-steps"] = 3
    return name, 6 if graph else (5 if scenario else 3), overrides


def run(key: str, tmp_path: Path, **extra) -> list[dict]:
    from strategies.core.registry import untuned

    name, n, overrides = case(key)
    overrides.update(extra)
    with untuned():  # the declared defaults, as recorded (not strategies/tuned.json's)
        metrics, _ = run_local(tmp_path, name, n=n, **overrides)
    return [{f: r.get(f) for f in FIELDS} for r in metrics["rounds"]]


KEYS = sorted(p.stem for p in BEHAVIOUR_RECORDS.glob("*.json"))


def counts(accuracies: dict, num_test: int) -> dict:
    """Client accuracies as counts of correct test samples."""
    return {c: round(a * num_test) for c, a in accuracies.items()}


def assert_as_recorded(key: str, tmp_path, **extra) -> None:
    """Run case ``key`` and compare every round with its record (the tolerances above)."""
    now = run(key, tmp_path, **extra)
    before = recorded(key)
    num_test = 100  # test-samples of the recorded runs (the default)
    assert len(now) == len(before)
    for got, want in zip(now, before, strict=True):
        rnd = got["round"]
        assert rnd == want["round"] and got["trained_clients"] == want["trained_clients"], key
        assert counts(got["client_accuracy"], num_test) == counts(want["client_accuracy"],
                                                                  num_test), (key, rnd)
        assert round(got["mean_accuracy"] * num_test * len(got["client_accuracy"])) ==\
            round(want["mean_accuracy"] * num_test * len(want["client_accuracy"])), (key, rnd)
        assert got["mean_loss"] == pytest.approx(want["mean_loss"], rel=LOSS_RTOL), (key, rnd)
        if case(key)[0] in PROXIMAL:
            # recorded with the proximal term in the loss; now the data loss alone: at most it
            assert got["train_loss"] <= want["train_loss"] * (1 + LOSS_RTOL), (key, rnd)
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-3)
        else:
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=LOSS_RTOL), (key, rnd)


@pytest.mark.parametrize("key", KEYS)
def test_results_are_those_recorded(key, tmp_path):
    assert_as_recorded(key, tmp_path)


@pytest.mark.parametrize("key", ["fedavg", "fedamp+scenarios", "panacea", "scaffold"])
def test_results_hold_one_client_after_another(key, tmp_path):
    """The records hold with the engine's clients trained one by one (``client-batching =
    "off"``) as with the default, stacked (tests/test_stacked.py)."""
    assert_as_recorded(key, tmp_path, **{"client-batching": "off"})


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("key", ["fedavg", "panacea"])
def test_results_hold_with_another_thread_count(key, threads, tmp_path):
    """Sums in threads round differently; the tolerances above hold whatever the count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.get_num_threads() == threads
        assert_as_recorded(key, tmp_path)
    finally:
        torch.set_num_threads(before)


def test_every_registered_strategy_is_recorded():
    import strategies

    assert set(strategies.STRATEGIES) <= {case(k)[0] for k in KEYS}


if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    keys = sys.argv[sys.argv.index("--record") + 1:]
    if not keys:
        raise SystemExit("name the runs to record: --record KEY [KEY ...] (a strategy, or "
                         "<strategy>+scenarios)")
    BEHAVIOUR_RECORDS.mkdir(parents=True, exist_ok=True)
    for key in keys:
        with tempfile.TemporaryDirectory() as d:
            rounds = run(key, Path(d))
        (BEHAVIOUR_RECORDS / f"{key}.json").write_text(json.dumps(rounds, indent=1) + "\n")
        print(f"wrote {BEHAVIOUR_RECORDS / f'{key}.json'}")
