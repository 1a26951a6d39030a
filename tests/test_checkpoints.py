"""Checkpoints that prove they are intact: a digest beside each, the newest ``checkpoint-keep``
kept, a damaged one refused (named, with why) and the run resumed from the one before,
never one written from a state with non-finite values."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.inprocess import run_inprocess
from fedamp_flwr.results import RunFolder, UnsafeCheckpoint, checkpoint_files


def _run(tmp_path: Path, name: str, rounds: int, **extra) -> dict:
    cfg = {"num-server-rounds": rounds, "results-dir": str(tmp_path), "run-name": name,
           "server-device": "cpu", "min-nodes": 3, "strategy": "fedamp", "local-epochs": 1,
           "save-models": "none", **extra}
    run_inprocess(cfg, 3)
    return json.loads((tmp_path / name / "metrics.json").read_text())


def _flip(path: Path, count: int = 64) -> None:
    """Flip ``count`` bytes in the middle of the file (its tensor data), keeping its size."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped bytes", "truncated", "no digest"])
def test_a_damaged_checkpoint_is_refused_and_the_run_resumes_from_the_one_before(
        tmp_path, caplog, damage):
    whole = _run(tmp_path, "whole", 4)
    _run(tmp_path, "run", 3)
    files = checkpoint_files(tmp_path / "run")
    assert [p.name for p in files] == ["round-000003.pt", "round-000002.pt"]  # checkpoint-keep 2
    newest = files[0]
    if damage == "flipped bytes":
        _flip(newest)
    elif damage == "truncated":
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    else:
        newest.with_name(newest.name + ".sha256").unlink()
    with caplog.at_level(logging.WARNING):
        resumed = _run(tmp_path, "run", 4, resume=True)
    refused = [r.getMessage() for r in caplog.records if "Checkpoint" in r.getMessage()]
    assert refused[0].startswith(f"Checkpoint {newest} refused: ")
    why = {"flipped bytes": "its sha256", "truncated": "its sha256",
           "no digest": "no digest beside it"}[damage]
    assert why in refused[0]
    assert "Resuming from round-000002.pt (round 2), the newest intact checkpoint" in caplog.text
    # rounds 3 and 4 computed again from round 2's state: the numbers of an uninterrupted run
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    for got, want in zip(resumed["rounds"], whole["rounds"], strict=True):
        assert got["client_accuracy"] == want["client_accuracy"]
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)


def test_no_intact_checkpoint_is_one_clear_line(tmp_path):
    _run(tmp_path, "run", 2, **{"checkpoint-keep": 1})
    files = checkpoint_files(tmp_path / "run")
    assert [p.name for p in files] == ["round-000002.pt"]
    _flip(files[0])
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "run",
                                     "resume": True})
    with pytest.raises(ConfigError, match=r"holds no intact checkpoint \(round-000002.pt: its "
                                          r"sha256 .*; allowed: overwrite = true"):
        RunFolder(cfg).load_checkpoint()


def test_a_state_with_non_finite_values_is_never_checkpointed(tmp_path):
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "run"})
    folder = RunFolder(cfg)
    state = {"round": 3, "config": cfg.to_dict(), "strategy": {"models": torch.tensor(
        [[1.0, float("nan")]])}}
    with pytest.raises(UnsafeCheckpoint, match=r"non-finite values in state\['strategy'\]"
                                               r"\['models'\]"):
        folder.save_checkpoint(state)
    assert checkpoint_files(tmp_path / "run") == []
    with pytest.raises(ConfigError, match="'checkpoint-keep' = 0"):
        RunConfig.from_run_config({"checkpoint-keep": 0})
