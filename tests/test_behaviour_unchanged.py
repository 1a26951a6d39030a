"""Every strategy's results, recorded before the one-method-one-module redesign, must not change.

``tests/data/two_rounds.json`` holds, for every strategy (and four scenario
runs), the per-round records of a 2-round in-process run on the default task
(seed 42, 1 local epoch): every client's test accuracy, the mean accuracy,
the mean training loss and the mean test loss, and which clients trained.
They were recorded with the code before the redesign (commit "Deterministic
rounds: ..."); this test runs the same runs now and compares. Accuracies
are counts of correct test samples, compared exactly (to the last digit);
losses are compared to 1e-6 relative, because float sums in the loss may
round differently on another CPU (the same machine reproduced them exactly).

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

Re-record only for a change that is meant to change results:
``python -m tests.test_behaviour_unchanged --record``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .conftest import run_local

RECORD = Path(__file__).parent / "data" / "two_rounds.json"
SCENARIOS = {"novel-client-fraction": 0.2, "attack-ratio": 0.25, "drop-rate": 0.4,
             "heterogeneous-epochs": True, "local-epochs": 2}
FIELDS = ("round", "mean_accuracy", "client_accuracy", "train_loss", "mean_loss", "trained_clients")
EXACT = ("round", "mean_accuracy", "client_accuracy", "trained_clients")
PROXIMAL = ("fedprox", "fedprox-ft", "fedamp", "heurfedamp")


def case(key: str) -> tuple[str, int, dict]:
    """Strategy, clients and run-config overrides of a recorded run."""
    name, _, scenario = key.partition("+")
    overrides = dict(SCENARIOS) if scenario else {}
    if name == "fedamp" and scenario:  # the mix of all training clients, as before the option
        overrides["fedamp-offline-clients"] = "include"
    if name == "nonconvex":  # normalised alphas, as before the literal sum became the default
        overrides["nonconvex-normalize"] = True
    if name == "pfedhn":  # the settings of then, before pFedHN's reference values became its own
        overrides.update({"local-steps": 0, "panacea-client-lr": 0.1, "panacea-server-lr": 0.1,
                          "panacea-server-steps": 10, "panacea-client-momentum": 0.0,
                          "panacea-client-weight-decay": 0.0, "panacea-client-clip": 0.0,
                          "panacea-server-weight-decay": 0.0, "panacea-server-clip": 0.0})
    if name.startswith("panacea"):  # the default task has no graph: its 5 groups', with 6 clients
        overrides["graph"] = "groups"
        if scenario:
            overrides["local-steps"] = 3
    return name, 6 if name.startswith("panacea") else (5 if scenario else 3), overrides


def run(key: str, tmp_path: Path) -> list[dict]:
    name, n, overrides = case(key)
    metrics, _ = run_local(tmp_path, name, n=n, **overrides)
    return [{f: r.get(f) for f in FIELDS} for r in metrics["rounds"]]


RECORDED = json.loads(RECORD.read_text()) if RECORD.is_file() else {}


@pytest.mark.parametrize("key", list(RECORDED))
def test_results_are_those_recorded_before_the_redesign(key, tmp_path):
    now = run(key, tmp_path)
    before = RECORDED[key]
    assert len(now) == len(before)
    for got, want in zip(now, before):
        for f in EXACT:
            assert got[f] == want[f], (key, got["round"], f)
        assert got["mean_loss"] == pytest.approx(want["mean_loss"], rel=1e-6), (key, got["round"])
        if case(key)[0] in PROXIMAL:
            assert got["train_loss"] <= want["train_loss"] * (1 + 1e-6), (key, got["round"])
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-3)
        else:
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6), (key, got["round"])


def test_every_registered_strategy_is_recorded():
    import strategies

    assert set(strategies.STRATEGIES) <= {case(k)[0] for k in RECORDED}


if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    from flwr.supercore.task_identity import TaskIdentity

    import strategies

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    keys = list(strategies.STRATEGIES) + [f"{s}+scenarios" for s in
                                          ("fedamp", "fedavg", "panacea", "scaffold")]
    out = {}
    for key in keys:
        with tempfile.TemporaryDirectory() as d:
            out[key] = run(key, Path(d))
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RECORD}")
