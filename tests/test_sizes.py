"""Nothing is allocated before it is checked: a model card and its weights file are compared
(from the weights' header alone, the card's model built on the meta device) before anything
is read or built, and a run config whose sizes would not fit the machine's memory is one line
naming the key most responsible (fedamp_flwr/sizes.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from experiments.presets import PRESETS, expand
from fedamp_flwr import sizes
from fedamp_flwr.config import ConfigError, RunConfig
from tasks.export import MAX_INPUTS, ModelFileError, load_model, schema_record, write_model
from tasks.members import MemberSchema
from tasks.models import MODELS

ROOT = Path(__file__).resolve().parents[1]


def _tiny_model(folder: Path) -> Path:
    """A real tiny model's weights (an MLP over 4 inputs, 2 classes) and its card."""
    schema = MemberSchema((4,), "classification", 2, (), "label", ())
    card = {"member": "site-a", "client_id": 0, "run": "run", "round": 1,
            "schema": schema_record(schema), "model": {"name": "mlp"}}
    return write_model(folder, "0", MODELS["mlp"]((4,), 2).state_dict(), card)


def _edit_card(weights: Path, **schema) -> Path:
    card_path = weights.with_suffix(".json")
    card = json.loads(card_path.read_text())
    card["schema"].update(schema)
    card_path.write_text(json.dumps(card))  # its sha256 still the weights'
    return card_path


# a child that imports everything first, then may take only 100 MB more than it holds
CHILD = textwrap.dedent("""
    import resource, sys
    import numpy, pandas, safetensors.torch, torch
    import fedamp_flwr.tools.cli

    def virtual_size():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    limit = virtual_size() + 100 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.exit(fedamp_flwr.tools.cli.main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_a_card_claiming_1e8_inputs_is_one_line_under_a_memory_limit(tmp_path):
    weights = _tiny_model(tmp_path)
    card = _edit_card(weights, input_shape=[MAX_INPUTS])
    data = tmp_path / "rows.npz"
    np.savez(data, x=np.zeros((3, 4), np.float32))
    done = subprocess.run([sys.executable, "-c", CHILD, "predict", str(weights), str(data),
                           "--out", str(tmp_path / "p.csv")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {card}: the card's model 'mlp' for inputs of shape "
                               "[100000000] and 2 outputs would have 6,400,004,354 values, "
                               "more than 100,000,000 (MAX_PARAMETERS)"), lines[0]
    assert not (tmp_path / "p.csv").exists()


def test_weights_that_do_not_fit_the_card_are_refused_from_their_header(tmp_path):
    weights = _tiny_model(tmp_path)
    assert load_model(weights).schema.input_shape == (4,)
    _edit_card(weights, input_shape=[5])
    with pytest.raises(ModelFileError, match=r"do not fit the card's model 'mlp' \(net.0.weight: "
                                             r"the file's \[64, 4\], the model's \[64, 5\]\)"):
        load_model(weights)


@pytest.mark.parametrize("header, says", [
    ((10**12).to_bytes(8, "little"), "a header of 1000000000000 bytes"),
    ((20).to_bytes(8, "little") + b"[1, 2, 3]" + b" " * 11, "not a JSON object"),
    (None, "bytes, where its header describes"),
])
def test_a_damaged_weights_file_is_refused_before_it_is_read(tmp_path, header, says):
    weights = _tiny_model(tmp_path)
    data = weights.read_bytes()
    weights.write_bytes(data[:-4] if header is None else header)
    with pytest.raises(ModelFileError, match=f"not a safetensors file of this app .*{says}"):
        load_model(weights)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_builds_on_the_meta_device_with_its_real_shapes(name):
    shape = (3, 32, 32) if name in ("cnn", "resnet18") else (20,)
    try:
        real = MODELS[name](shape, 7).state_dict()
    except (ImportError, RuntimeError) as err:  # ResNet-18 where torchvision does not load
        pytest.skip(f"{name} cannot be built here: {err}")
    with torch.device("meta"):
        meta = MODELS[name](shape, 7).state_dict()
    assert {k: v.shape for k, v in meta.items()} == {k: v.shape for k, v in real.items()}
    assert all(v.device.type == "meta" for v in meta.values())


def test_a_hypernetwork_too_wide_for_the_machine_stops_the_server_with_one_line(tmp_path, caplog):
    from fedamp_flwr import server_app
    from fedamp_flwr.tools.inprocess import InProcessGrid

    cfg = {"strategy": "panacea", "panacea-hidden": 100000, "results-dir": str(tmp_path)}
    RunConfig.from_run_config(cfg)  # within the key's bound: the clients' check passes
    caplog.set_level(logging.INFO, logger="flwr")
    with pytest.raises(ConfigError):
        server_app.main(InProcessGrid(cfg, 2), Context(run_id=1, node_id=0, node_config={},
                                                       state=RecordDict(), run_config=cfg))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert errors[0].startswith("Run stopped: run config 'panacea-hidden' = 100000 is invalid; "
                                "allowed: a size whose models fit this machine's memory: the "
                                "server would hold about "), errors[0]
    assert "GB (the hypernetwork; 2 clients" in errors[0] and "this machine has" in errors[0]
    assert not (tmp_path / "results").exists() and not list(tmp_path.iterdir())


def test_a_members_input_too_large_for_the_machine_names_member_input_shape():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"dataset": "members", "member-input-shape": "100000000",
                                   "member-outputs": 2})
    message = str(err.value)
    assert message.startswith("run config 'member-input-shape' = '100000000' is invalid; "
                              "allowed: a size whose models fit this machine's memory: a client "
                              "would need about "), message
    assert "GB to train" in message and "this machine has" in message and "\n" not in message
    with pytest.raises(ConfigError, match="'member-input-shape' = '100001,1000' is invalid"):
        RunConfig.from_run_config({"dataset": "members", "member-input-shape": "100001,1000",
                                   "member-outputs": 2})


def test_the_key_named_is_the_one_that_at_its_default_fits():
    with pytest.raises(ConfigError, match=r"^run config 'batch-size' = 1000000 is invalid; .*a "
                                          "client would need about"):
        RunConfig.from_run_config({"dataset": "members", "member-input-shape": "100000",
                                   "member-outputs": 2, "batch-size": 1000000})


def test_the_default_run_needs_little():
    cfg = RunConfig.from_run_config({})
    size = sizes.model_size(cfg)
    assert size == sizes.ModelSize(params=6922, inputs=32)  # the MLP 32-64-64-10
    assert sizes.client_bytes(cfg, size) < 10**6
    assert sizes.server_bytes(cfg, size, 2) < 10**6
    sizes.check_server_memory(cfg, 2)


def test_fl60_panacea_and_every_presets_run_fit():
    cfg = RunConfig.from_run_config({"strategy": "panacea", "dataset": "fl60", "min-nodes": 60})
    size = sizes.model_size(cfg)
    assert size is not None and sizes.server_bytes(cfg, size, 60) < 10**9
    sizes.check_server_memory(cfg, 60)
    for grid in PRESETS.values():
        for run in expand(grid, "data", Path("out"), check_data=False):  # the clients' check
            sizes.check_server_memory(RunConfig.from_run_config(run.run_config), run.num_clients)
