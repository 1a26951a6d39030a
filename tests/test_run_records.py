"""metrics.json says whom its score covers: a client that never produced a result is named
with its reason, the headline says over how many clients it is, and min-clients-evaluated
makes too few a failed round."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedamp_flwr import client_app
from fedamp_flwr.server.rounds import RoundsFailedError
from fedamp_flwr.tools.inprocess import run_inprocess


def _crashing_client_0() -> ClientApp:
    """The project's ClientApp, but partition 0 raises in every train and evaluate message
    (as a node whose data breaks the loop does)."""
    app = ClientApp()

    def crash_on_0(handler):
        def run(msg: Message, context: Context) -> Message:
            if context.node_config.get("partition-id") == 0:
                raise RuntimeError("labels out of range in batch 3")
            return handler(msg, context)
        return run

    app.query()(client_app.query)
    app.train()(crash_on_0(client_app.train))
    app.evaluate()(crash_on_0(client_app.evaluate))
    return app


def _cfg(tmp_path, **extra) -> dict:
    return {"num-server-rounds": 2, "results-dir": str(tmp_path), "run-name": "run",
            "server-device": "cpu", "min-nodes": 4, "strategy": "fedavg", "local-epochs": 1,
            "save-models": "none", **extra}


def test_a_client_that_crashes_every_round_is_named_and_the_bmta_says_whom_it_covers(
        tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        run_inprocess(_cfg(tmp_path), 4, client_app=_crashing_client_0())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    cover = metrics["coverage"]
    assert cover["num_clients"] == 4 and cover["clients_in_best_round"] == 3
    assert list(cover["never_evaluated"]) == ["0"]
    assert "labels out of range in batch 3" in cover["never_evaluated"]["0"]
    assert f"BMTA {metrics['bmta']:.2f}% over 2 rounds, over 3 of 4 clients" in caplog.text
    assert "Client 0 never produced a result in this run" in caplog.text


def test_min_clients_evaluated_makes_it_a_stop(tmp_path):
    with pytest.raises(RoundsFailedError, match=r"round 1: only 3 client\(s\) evaluated, "
                       r"min-clients-evaluated = 4; left out: client 0: .*labels out of range"):
        run_inprocess(_cfg(tmp_path, **{"min-clients-evaluated": 4}), 4,
                      client_app=_crashing_client_0())


@pytest.mark.slow
def test_one_sampling_rule_fedavg_and_fedamp_train_the_same_clients(tmp_path):
    """fraction-train is one rule for every strategy: of the connected clients that train
    (not novel), a seeded max(1, round(f x n)); Flower's own strategies and the personalized
    ones train the same clients in every round."""
    trained = {}
    for strategy in ("fedavg", "fedamp", "scaffold", "pfedhn"):
        cfg = _cfg(tmp_path, strategy=strategy, **{"run-name": strategy, "fraction-train": 0.5,
                                                    "novel-client-fraction": 0.2,
                                                    "num-server-rounds": 3, "min-nodes": 5})
        run_inprocess(cfg, 5)
        metrics = json.loads((tmp_path / strategy / "metrics.json").read_text())
        trained[strategy] = [r["trained_clients"] for r in metrics["rounds"]]
    novel = metrics["novel_clients"]
    assert len(novel) == 1
    # 4 clients train at all; round(0.5 x 4) = 2 of them each round
    assert all(len(t) == 2 and not set(t) & set(novel) for t in trained["fedavg"])
    assert trained["fedavg"] == trained["fedamp"] == trained["scaffold"] == trained["pfedhn"]
