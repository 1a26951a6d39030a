"""Checkpoints that prove they are intact: a digest beside each, the newest ``checkpoint-keep``
kept, a damaged one refused (named, with why) and the run resumed from the one before,
never one written from a state with non-finite values."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from pathlib import Path

import pytest
import torch

from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.server import results
from fedamp_flwr.server.results import (
    RunFolder,
    UnsafeCheckpoint,
    checkpoint_files,
    hold_folder,
)
from fedamp_flwr.tools.inprocess import run_inprocess


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


@pytest.mark.slow
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
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
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


def test_a_checkpoint_of_version_1_resumes_and_one_of_a_newer_version_is_refused(tmp_path):
    """A checkpoint as every version before the typed one wrote it (no ``version``, no
    manifest or generation) resumes to an uninterrupted run's numbers; one of a version this
    app does not know is refused, naming it."""
    from fedamp_flwr.server.checkpoint import VERSION, NewerCheckpoint
    from fedamp_flwr.server.results import digest_path, seal

    from .helpers import as_older_version

    whole = _run(tmp_path, "whole", 3)
    _run(tmp_path, "run", 2)  # checkpoint-keep 2: rounds 1 and 2
    path = checkpoint_files(tmp_path / "run")[0]
    assert torch.load(path, weights_only=True)["version"] == VERSION
    as_older_version(tmp_path / "run")
    assert "version" not in torch.load(path, weights_only=True)
    resumed = _run(tmp_path, "run", 3, resume=True)
    assert [r["client_accuracy"] for r in resumed["rounds"]] == [
        r["client_accuracy"] for r in whole["rounds"]]
    # a newer version's checkpoint stops the resume, naming it: the run never goes back to
    # the older checkpoint (round 2's) it could read
    as_older_version(tmp_path / "run")
    path = checkpoint_files(tmp_path / "run")[0]
    state = torch.load(path, weights_only=True)
    torch.save({**state, "version": VERSION + 1}, path)
    digest_path(path).write_text(f"{seal(path, None, 'run')}  {path.name}\n")
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "run",
                                     "resume": True, "num-server-rounds": 4})
    with pytest.raises(NewerCheckpoint, match=rf"run config 'resume' = true: the checkpoint's "
                                              rf"version is {VERSION + 1}; allowed: 1 to "
                                              rf"{VERSION} .*round-000003.pt"):
        RunFolder(cfg).load_checkpoint()
    assert [p.name for p in checkpoint_files(tmp_path / "run")] == [
        "round-000003.pt", "round-000002.pt"]  # none refused, none renamed


def test_a_checkpoint_reads_back_what_it_wrote_and_names_a_field_it_lacks():
    from fedamp_flwr.identity import key_text
    from fedamp_flwr.server.checkpoint import Checkpoint

    written = Checkpoint(round=2, config={"seed": 0}, num_clients=3,
                         arrays={"w": torch.ones(2)}, random_state=random.getstate(),
                         strategy={"models": torch.zeros(3, 2)}, client_names=["a", "", "c"],
                         member_keys={"a": key_text(bytes(32))}, impostor_count=1)
    state = written.to_state()
    assert "member_scaling" not in state and state["version"] == written.version
    assert Checkpoint.from_state(state, "here") == written
    # version 1 wrote a member's key in hex: read as a roster writes it
    hexed = {k: v for k, v in state.items() if k != "version"} | {"member_keys": {"a": "00" * 32}}
    assert Checkpoint.from_state(hexed, "here").member_keys == written.member_keys
    with pytest.raises(ConfigError, match="here: the checkpoint's member keys cannot be read"):
        Checkpoint.from_state({**state, "member_keys": {"a": "00" * 32}}, "here")  # version 2
    # what a version before wrote none of reads as its default
    old = {k: state[k] for k in (*Checkpoint.REQUIRED, "random_state")}
    read = Checkpoint.from_state(old, "here")
    assert (read.version, read.member_keys, read.client_names, read.names()) == (
        1, None, None, ["0", "1", "2"])
    with pytest.raises(ConfigError, match="here: the checkpoint's 'round' is '2'; allowed: an "
                                          "int >= 0"):
        Checkpoint.from_state({**state, "round": "2"}, "here")
    with pytest.raises(ConfigError, match="'num_clients' is -1; allowed: an int >= 0"):
        Checkpoint.from_state({**state, "num_clients": -1}, "here")
    with pytest.raises(ConfigError, match="'strategy' is None; allowed: dict"):
        Checkpoint.from_state({k: v for k, v in state.items() if k != "strategy"}, "here")
    # a tampered random state is refused here, not by random.setstate in the run
    with pytest.raises(ConfigError, match="here: the checkpoint's 'random_state' cannot be used"):
        Checkpoint.from_state({**state, "random_state": (3, (1, 2), None)}, "here")
    # what is only recorded takes its default where it is not a finite number >= 0
    odd = Checkpoint.from_state({**state, "wall_time_s": float("nan"), "impostor_count": True},
                                "here")
    assert (odd.wall_time_s, odd.impostor_count) == (0.0, None)


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


def _edit(path: Path) -> None:
    """A tampered checkpoint: a client's stored model x 1e6, the file written anew."""
    state = torch.load(path, weights_only=True)
    state["strategy"]["models"][0] *= 1e6
    torch.save(state, path)


@pytest.mark.slow
def test_a_sealed_checkpoint_edited_with_its_digest_recomputed_is_refused(tmp_path, caplog):
    """With a coordinator secret the digest is an HMAC of the file: a checkpoint edited and
    given a new sha256 is refused like a flipped byte, and so is one given a seal made with
    another secret; without a secret the digest detects damage, not such an edit."""
    from fedamp_flwr.server.results import digest_path, seal

    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 40)
    secret.chmod(0o600)
    sealed = {"checkpoint-secret": str(secret)}
    whole = _run(tmp_path, "whole", 4)
    _run(tmp_path, "run", 3, **sealed)
    newest = checkpoint_files(tmp_path / "run")[0]
    assert digest_path(newest).read_text().startswith("hmac-sha256:")
    _edit(newest)
    digest_path(newest).write_text(f"{seal(newest, None, 'run')}  {newest.name}\n")  # new sha256
    with caplog.at_level(logging.WARNING):
        resumed = _run(tmp_path, "run", 4, resume=True, **sealed)
    assert f"Checkpoint {newest} refused: not sealed (its digest is a plain sha256" in caplog.text
    assert [r["client_accuracy"] for r in resumed["rounds"]] == \
        [r["client_accuracy"] for r in whole["rounds"]]  # resumed from round 2, intact
    # sealed again, with another secret: refused too
    _run(tmp_path, "again", 3, **sealed)
    newest = checkpoint_files(tmp_path / "again")[0]
    _edit(newest)
    digest_path(newest).write_text(f"{seal(newest, b'x' * 40, 'again')}  {newest.name}\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _run(tmp_path, "again", 4, resume=True, **sealed)
    assert "its seal does not verify: the file was changed or damaged, or sealed with another " \
        "secret or for another run or round" in caplog.text
    kept = sorted(p.name for p in (tmp_path / "again" / "checkpoint").iterdir())
    assert "round-000003.pt.refused" in kept and "round-000003.pt.sha256.refused" in kept
    # a run's sealed checkpoints copied into another run's folder do not verify there
    import shutil

    shutil.copytree(tmp_path / "run" / "checkpoint", tmp_path / "moved" / "checkpoint")
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "moved",
                                     "resume": True, "checkpoint-secret": str(secret)})
    with pytest.raises(ConfigError, match="moved/checkpoint/manifest.json's seal does not "
                                          "verify: edited, or sealed with another secret or "
                                          "for another run"):
        RunFolder(cfg).load_checkpoint()
    (tmp_path / "moved" / "checkpoint" / "manifest.json").unlink()  # and without its manifest
    with pytest.raises(ConfigError, match="holds no intact checkpoint .*its seal does not "
                                          "verify"):
        RunFolder(cfg).load_checkpoint()
    # a sealed checkpoint, resumed without the secret: refused, naming what to give
    _run(tmp_path, "third", 2, **sealed)
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "third",
                                     "resume": True})
    before = sorted(p.name for p in (tmp_path / "third" / "checkpoint").iterdir())
    with pytest.raises(ConfigError, match="'checkpoint-secret' = '': the checkpoints of .* are "
                                          "sealed with a coordinator secret; allowed: the file"):
        RunFolder(cfg).load_checkpoint()
    assert sorted(p.name for p in (tmp_path / "third" / "checkpoint").iterdir()) == before
    # nor with another secret: none verifies, and every file stays as it was
    wrong = tmp_path / "wrong"
    wrong.write_bytes(b"w" * 40)
    wrong.chmod(0o600)
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "third",
                                     "resume": True, "checkpoint-secret": str(wrong)})
    with pytest.raises(ConfigError, match="manifest.json's seal does not verify"):
        RunFolder(cfg).load_checkpoint()
    assert sorted(p.name for p in (tmp_path / "third" / "checkpoint").iterdir()) == before
    # without a secret the same edit with a recomputed sha256 is not the file the manifest
    # lists; with the manifest's sha256 recomputed too, it resumes: damage, not tampering
    from fedamp_flwr.server import manifest as manifests

    _run(tmp_path, "open", 2)
    newest = checkpoint_files(tmp_path / "open")[0]
    _edit(newest)
    digest_path(newest).write_text(f"{seal(newest, None, 'open')}  {newest.name}\n")
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "open",
                                     "resume": True, "min-nodes": 3, "local-epochs": 1,
                                     "save-models": "none", "server-device": "cpu"})
    with caplog.at_level(logging.WARNING):
        assert RunFolder(cfg).load_checkpoint().round == 1
    assert "round-000002.pt the folder's manifest (generation 2) records" in caplog.text
    for kept in (newest, digest_path(newest)):  # put back where the resume moved them
        kept.with_name(kept.name + ".refused").rename(kept)
    held = manifests.read(tmp_path / "open", None, "open", "test")
    held.checkpoints[newest.name] = seal(newest, None, "open")
    manifests.write(tmp_path / "open", held, None, "open")
    assert RunFolder(cfg).load_checkpoint().round == 2


def test_a_checkpoint_secret_is_checked_before_any_work(tmp_path, monkeypatch):
    from fedamp_flwr.server.results import SECRET_ENV, checkpoint_secret

    secret = tmp_path / "secret"
    secret.write_bytes(b"short")
    secret.chmod(0o600)
    cfg = RunConfig.from_run_config({"checkpoint-secret": str(secret)})
    with pytest.raises(ConfigError, match=r"run config 'checkpoint-secret' = .*: the checkpoint "
                                          r"secret has 5 bytes; allowed: a file of at least 32"):
        checkpoint_secret(cfg)
    secret.write_bytes(b"k" * 32)
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match="can be read by other accounts"):
        checkpoint_secret(cfg)
    with pytest.raises(ConfigError, match="cannot be read"):
        checkpoint_secret(RunConfig.from_run_config({"checkpoint-secret": str(tmp_path / "no")}))
    secret.chmod(0o600)
    assert checkpoint_secret(cfg) == b"k" * 32
    monkeypatch.setenv(SECRET_ENV, str(secret))
    assert checkpoint_secret(RunConfig.from_run_config({})) == b"k" * 32
    with pytest.raises(ConfigError, match=r"run config 'checkpoint-secret' = '.*no'"):
        _run(tmp_path, "x", 1, **{"checkpoint-secret": str(tmp_path / "no")})


def test_a_runs_records_are_its_owners_alone(tmp_path):
    """metrics.json (every member's scores), the checkpoints (every member's model), their
    digests and FedAMP's weights: files 0600 in folders 0700, whatever the umask."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        _run(tmp_path, "run", 2, **{"save-models": "final"})
    finally:
        os.umask(old)
    run = tmp_path / "run"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"metrics.json", "round-000002.pt",
                                       "round-000002.pt.sha256", "round-0002.npy"}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    for p in [run, *(p for p in run.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p


def test_a_run_waits_for_the_serverapp_of_a_superlink_that_went_away(tmp_path, monkeypatch,
                                                                     caplog):
    """The ServerApp of a killed SuperLink holds its folder for the seconds it takes to notice;
    the run resubmitted with resume = true meanwhile waits for it, and one held for longer
    than the wait is refused, naming the holder's process."""
    cfg = RunConfig.from_run_config({"results-dir": str(tmp_path), "run-name": "run"})
    (tmp_path / "run").mkdir()
    orphan = hold_folder(tmp_path / "run")  # the old ServerApp, still ending
    assert (tmp_path / "run" / ".lock").read_text() == f"{os.getpid()}\n"
    assert hold_folder(tmp_path / "run") is None
    threading.Timer(0.6, orphan.close).start()
    folder = RunFolder(cfg)
    with caplog.at_level(logging.INFO):
        folder.hold()  # waits for it
    assert f"held by process {os.getpid()}" in caplog.text and "held by this run, after" in caplog.text
    assert hold_folder(tmp_path / "run") is None  # now this run's
    folder.release()
    monkeypatch.setattr(results, "HOLD_WAIT", 0.3)
    live = hold_folder(tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"'run-name' = 'run': .* is in use by another run of "
                                          rf"the ServerApp, or fedamp-flwr forget \(process "
                                          rf"{os.getpid()}\), still after 0 s; allowed"):
        RunFolder(cfg).hold()
    live.close()
    (tmp_path / "run" / ".lock").write_text("../../etc\n")  # a file it did not write
    assert results.holder_of(tmp_path / "run") == "unknown"
