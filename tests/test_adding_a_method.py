"""Adding a method: a toy method defined in this file alone, run end to end by the real apps.

The worked example of the README's "Adding a method": *damped FedAvg*, whose
clients train as usual and send back only a share ``keep`` of their update
(``w_sent + keep * (w_trained - w_sent)``), and whose server is Flower's
FedAvg. Its two halves are below; registering them (as a module of
``strategies/`` does with the decorators) is all it takes: the ClientApp is
not touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import strategies
from strategies.client import ClientJob, ClientUpdate, register_client_update, unregister_client_update
from strategies.flower import FedAvg
from strategies.registry import flower_kwargs, register_strategy, unregister_strategy

from .conftest import run_local
from .test_behaviour_unchanged import RECORDED

KEEP = "damped-keep"  # the method's own message key


class DampedClient(ClientUpdate):
    """Client half: train as usual, then keep only a share ``damped-keep`` of the update."""

    name = "damped"
    train_keys = (KEEP,)

    def train(self, job: ClientJob) -> tuple[float, dict]:
        sent = {k: v.clone() for k, v in job.model.state_dict().items()}
        loss = job.fit()
        keep = float(job.config[KEEP])
        with torch.no_grad():
            for k, v in job.model.state_dict().items():
                if v.is_floating_point():
                    v.copy_(torch.lerp(sent[k], v, keep))  # sent + keep * (trained - sent)
        return loss, {}


class DampedFedAvg(FedAvg):
    """Server half: Flower's FedAvg; train messages name ``damped`` and carry ``damped-keep``."""

    client_update = DampedClient.name

    def __init__(self, keep: float, **kwargs) -> None:
        self.keep = keep
        super().__init__(**kwargs)

    def train_keys(self) -> dict:
        return {KEEP: self.keep}


@pytest.fixture
def damped():
    """Register the toy method (as ``@register_client_update`` / ``@register_strategy`` would)."""
    def register(keep: float) -> str:
        register_client_update(DampedClient)
        register_strategy("damped-fedavg")(lambda cfg, run: DampedFedAvg(keep, **flower_kwargs(cfg, run)))
        return "damped-fedavg"

    yield register
    unregister_strategy("damped-fedavg")
    unregister_client_update(DampedClient.name)


def test_a_toy_method_runs_end_to_end_and_keep_1_is_fedavg(tmp_path, damped):
    metrics, grid = run_local(tmp_path, damped(keep=1.0))
    assert metrics["strategy"] == "damped-fedavg"
    configs = grid.sent_configs("train")
    assert configs and all(c["client-update"] == "damped" and c[KEEP] == 1.0 for c in configs)
    # keeping the whole update is FedAvg: the same numbers as the recorded FedAvg run
    for got, want in zip(metrics["rounds"], RECORDED["fedavg"]):
        assert got["client_accuracy"] == want["client_accuracy"]


def test_a_toy_method_keep_0_never_moves_the_global_model(tmp_path, damped):
    metrics, _ = run_local(tmp_path, damped(keep=0.0))
    first, second = metrics["rounds"]
    assert first["client_accuracy"] == second["client_accuracy"]  # the initial model, twice
    assert first["client_accuracy"] != RECORDED["fedavg"][0]["client_accuracy"]


def test_the_client_app_names_no_method_and_no_methods_key():
    source = (Path(__file__).parents[1] / "fedamp_flwr" / "client_app.py").read_text().lower()
    from strategies.client import _REGISTRY

    names = set(strategies.STRATEGIES) | set(strategies.CLIENT_UPDATES) - {"local"}
    for word in sorted(names | set(_REGISTRY.owner)):
        assert word not in source, word
