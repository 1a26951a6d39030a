"""Adding a method: the worked example of docs/adding-a-method.md, one module, run end to end.

*Damped FedAvg* (``tests/examples/damped.py``, whose source the docs show
verbatim): its settings, client half and server half live in that module
alone; importing it registers the method, as a line in ``strategies/__init__.py``
does for the project's own. Neither the app (``fedamp_flwr/``) nor the
ClientApp is touched. The example is device-aware: its client half trains on
``job.optim.device`` (a GPU where there is one).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

import strategies
from fedamp_flwr.config import ConfigError, RunConfig
from strategies.core.client import unregister_client_update
from strategies.core.registry import unregister_strategy

from .helpers import ROOT, recorded, run_local

KEEP = "damped-keep"
EXAMPLE = ROOT / "tests" / "examples" / "damped.py"


@pytest.fixture
def damped():
    """Import the example module (which registers the method); unregister it afterwards."""
    module = importlib.import_module("tests.examples.damped")
    yield "damped-fedavg"
    unregister_strategy("damped-fedavg")
    unregister_client_update("damped")
    sys.modules.pop(module.__name__, None)


def test_a_toy_method_runs_end_to_end_and_keep_1_is_fedavg(tmp_path, damped):
    metrics, grid = run_local(tmp_path, damped, **{KEEP: 1.0})
    assert metrics["strategy"] == "damped-fedavg"
    configs = grid.sent_configs("train")
    assert configs and all(c["client-update"] == "damped" and c[KEEP] == 1.0 for c in configs)
    # keeping the whole update is FedAvg: the same numbers as the recorded FedAvg run
    for got, want in zip(metrics["rounds"], recorded("fedavg"), strict=True):
        assert got["client_accuracy"] == want["client_accuracy"]


def test_a_toy_method_keep_0_never_moves_the_global_model(tmp_path, damped):
    metrics, _ = run_local(tmp_path, damped, **{KEEP: 0.0})
    first, second = metrics["rounds"]
    assert first["client_accuracy"] == second["client_accuracy"]  # the initial model, twice
    assert first["client_accuracy"] != recorded("fedavg")[0]["client_accuracy"]


def test_the_example_checks_its_own_setting(damped):
    with pytest.raises(ConfigError, match="'damped-keep' = 1.5 is invalid; allowed: a number in"):
        RunConfig.from_run_config({"strategy": damped, KEEP: 1.5})
    assert RunConfig.from_run_config({"strategy": damped}).settings.damped_keep == 0.5


def test_the_docs_show_the_example_module_as_it_is():
    doc = (ROOT / "docs" / "adding-a-method.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    assert EXAMPLE.read_text() in blocks


def test_the_client_app_names_no_method_and_no_methods_key():
    source = (Path(__file__).parents[1] / "fedamp_flwr" / "client_app.py").read_text().lower()
    from strategies.core.client import _REGISTRY

    names = set(strategies.STRATEGIES) | set(strategies.CLIENT_UPDATES) - {"local"}
    for word in sorted(names | set(_REGISTRY.owner)):
        assert word not in source, word
