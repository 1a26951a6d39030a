"""Runs that survive, in process: checkpoint and resume, no result lost, clients that leave and
come back, replies that never come, and the wait for nodes."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Context, MessageType, RecordDict

from fedamp_flwr import server_app
from fedamp_flwr.config import ConfigError
from fedamp_flwr.server.discovery import discover_clients
from fedamp_flwr.server.results import checkpoint_files, load_xi
from fedamp_flwr.server.rounds import RoundsFailedError

from .helpers import Crash, FaultyGrid, LocalGrid, client_infos, grid_config, run_on_grid


def rounds(metrics: dict) -> list[dict]:
    keys = ("round", "client_accuracy", "mean_accuracy", "train_loss", "mean_loss",
            "trained_clients", "absent_clients")
    return [{k: r.get(k) for k in keys} for r in metrics["rounds"]]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, n, overrides", [
    ("fedamp", 3, {}),
    ("panacea", 6, {"graph": "groups", "local-steps": 3, "min-nodes": 6, "panacea-server-lr": 0.01}),
    # an inferred graph (round 1's), one whose warm-up the crash cuts (rounds 1-3), and
    # guarded ones the crash cuts in the guard's rounds (a warm-up of 1, a guard of 2) and at
    # its start (a warm-up of 2, a guard of 1)
    *[("panacea", 6, {"graph": "inferred", "graph-k": 2, "graph-warmup-rounds": w,
                      "graph-guard-rounds": g, "local-steps": 3, "min-nodes": 6,
                      "panacea-server-lr": 0.01})
      for w, g in ((1, 0), (3, 0), (1, 2), (2, 1))],
    ("scaffold", 3, {}),
    ("fedavg", 4, {"fraction-train": 0.5, "min-nodes": 4}),
])
def test_a_serverapp_killed_and_resumed_gives_the_uninterrupted_numbers(tmp_path, strategy, n,
                                                                         overrides):
    whole = run_on_grid(LocalGrid(cfg := grid_config(tmp_path / "whole", strategy, **overrides), n), cfg)
    cut = grid_config(tmp_path / "cut", strategy, **overrides)
    grid = FaultyGrid(cut, n, crash_at=(3, MessageType.TRAIN))  # the SuperNodes stay up
    with pytest.raises(Crash):
        run_on_grid(grid, cut)
    half = json.loads((tmp_path / "cut" / "run" / "metrics.json").read_text())
    assert half["completed_rounds"] == 2 and half["finished"] is False and len(half["rounds"]) == 2
    resumed = run_on_grid(grid, {**cut, "resume": True})
    assert resumed["finished"] is True and resumed["completed_rounds"] == 4
    assert rounds(resumed) == rounds(whole)  # every number, to the last digit
    assert resumed["bmta"] == whole["bmta"]


@pytest.mark.slow
def test_a_run_cut_in_the_guards_watch_resumes_to_the_last_digit(tmp_path, monkeypatch):
    """The inferred graph won the guard (round 2) and is watched against pFedHN trained on the
    side; the ServerApp dies in round 4: the resumed run has both hypernetworks, the watch's
    record and every number of the uninterrupted run."""
    import strategies.panacea_guard as panacea_guard
    from strategies.graph_guard import GRAPH

    monkeypatch.setattr(panacea_guard, "choose", lambda rounds: GRAPH)
    overrides = {"graph": "inferred", "graph-k": 2, "graph-warmup-rounds": 1,
                 "graph-guard-rounds": 1, "local-steps": 3, "min-nodes": 6,
                 "panacea-server-lr": 0.01}
    whole = run_on_grid(LocalGrid(cfg := grid_config(tmp_path / "whole", "panacea",
                                                     **overrides), 6), cfg)
    cut = grid_config(tmp_path / "cut", "panacea", **overrides)
    grid = FaultyGrid(cut, 6, crash_at=(4, MessageType.TRAIN))
    with pytest.raises(Crash):
        run_on_grid(grid, cut)
    resumed = run_on_grid(grid, {**cut, "resume": True})
    assert rounds(resumed) == rounds(whole)
    watched = [r for r in whole["graph_guard"]["rounds"] if r.get("stage") == "watch"]
    assert [r["round"] for r in watched] == [3, 4]
    assert resumed["graph_guard"]["rounds"] == whole["graph_guard"]["rounds"]


@pytest.mark.parametrize("every, written", [(2, 2), (0, 3)])
def test_metrics_json_is_written_with_each_checkpoint(tmp_path, every, written):
    # killed in round 4: with a checkpoint every 2 rounds metrics.json holds rounds 1-2 (what
    # a resume continues from), not 3; without checkpoints it holds every finished round
    cfg = grid_config(tmp_path, "fedavg", **{"checkpoint-every": every})
    with pytest.raises(Crash):
        run_on_grid(FaultyGrid(cfg, 3, crash_at=(4, MessageType.TRAIN)), cfg)
    half = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert half["completed_rounds"] == written == len(half["rounds"])


def test_resume_on_new_nodes_and_with_more_rounds(tmp_path, caplog):
    cfg = grid_config(tmp_path, "fedamp")
    with pytest.raises(Crash):
        run_on_grid(FaultyGrid(cfg, 3, crash_at=(2, MessageType.EVALUATE)), cfg)
    # a new fleet: other node ids (the clients are found again by partition id)
    grid = LocalGrid({**cfg}, 3)
    grid.contexts = {n + 50: ctx for n, ctx in grid.contexts.items()}
    resumed = run_on_grid(grid, {**cfg, "resume": True, "num-server-rounds": 5})
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4, 5]
    assert "resuming after round 1" in caplog.text and resumed["finished"]


def test_resume_refuses_a_changed_config_and_fewer_rounds(tmp_path):
    cfg = grid_config(tmp_path, "fedamp")
    run_on_grid(LocalGrid(cfg, 3), cfg)
    with pytest.raises(ConfigError, match=r"'learning-rate' = 0.5 \(was 0.001\)"):
        run_on_grid(LocalGrid(cfg, 3), {**cfg, "resume": True, "learning-rate": 0.5})
    with pytest.raises(ConfigError, match="'num-server-rounds' = 3 is below the 4 rounds"):
        run_on_grid(LocalGrid(cfg, 3), {**cfg, "resume": True, "num-server-rounds": 3})
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        run_on_grid(LocalGrid(cfg, 3), {**cfg, "resume": True, "run-name": "other"})


def test_a_checkpoint_of_an_older_version_resumes_when_its_missing_keys_are_defaults():
    """A run checkpointed before a config key existed resumes with that key at its default
    (a code upgrade between the crash and the resume), and only then."""
    from fedamp_flwr.config import RunConfig

    cfg = RunConfig.from_run_config({"strategy": "fedamp"})
    older = {k: v for k, v in cfg.to_dict().items() if k not in ("xi-every", "label")}
    assert cfg.differences(older) == []
    changed = RunConfig.from_run_config({"strategy": "fedamp", "xi-every": 5})
    assert changed.differences(older) == ["xi-every"]
    # a key removed since changes nothing; one that only measures beside the run may change
    assert cfg.differences({**older, "member-alone": True}) == []
    from fedamp_flwr.server.results import RESUMABLE_CHANGES

    assert cfg.differences({**older, "alone": not cfg.alone}, RESUMABLE_CHANGES) == []


@pytest.mark.slow
def test_no_result_is_overwritten(tmp_path):
    cfg = grid_config(tmp_path, "fedavg", **{"num-server-rounds": 1})
    first = run_on_grid(LocalGrid(cfg, 3), cfg)
    with pytest.raises(ConfigError, match="already holds a finished run; allowed: another "
                                          "run-name, resume = true .* or overwrite = true"):
        run_on_grid(LocalGrid(cfg, 3), cfg)
    again = run_on_grid(LocalGrid(cfg, 3), {**cfg, "overwrite": True})
    assert rounds(again) == rounds(first)
    # without a run-name every run gets a folder of its own
    anonymous = {**cfg, "run-name": ""}
    for _ in range(2):
        server_app.main(LocalGrid(anonymous, 3), Context(run_id=1, node_id=0, node_config={},
                                                         state=RecordDict(), run_config=anonymous))
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != "run")
    assert len(names) == 2 and all(n.startswith("fedavg-synthetic-practical-s42-") for n in names)


def test_metrics_json_is_strict_json_after_every_round(tmp_path):
    cfg = grid_config(tmp_path, "fedamp")
    with pytest.raises(Crash):
        run_on_grid(FaultyGrid(cfg, 3, crash_at=(2, MessageType.TRAIN)), cfg)
    text = (tmp_path / "run" / "metrics.json").read_text()

    def refuse(constant):
        raise AssertionError(f"{constant} in metrics.json")

    metrics = json.loads(text, parse_constant=refuse)
    assert metrics["completed_rounds"] == 1 and not metrics["finished"]


def test_a_client_that_leaves_and_comes_back_on_a_new_node(tmp_path, caplog):
    cfg = grid_config(tmp_path, "fedamp", **{"num-server-rounds": 5})
    # client 1's SuperNode is gone in rounds 2 and 3, and restarts (node 777) in round 4
    grid = FaultyGrid(cfg, 3, offline={1: (2, 3)}, moves={1: (4, 777)})
    metrics = run_on_grid(grid, cfg)
    by_round = {r["round"]: r for r in metrics["rounds"]}
    for r in (2, 3):
        assert by_round[r]["trained_clients"] == [0, 2]
        assert by_round[r]["absent_clients"] == {"1": "node not connected"}
        assert set(by_round[r]["client_accuracy"]) == {"0", "2"}
        # "exclude": client 1's frozen model does not enter the others' cloud models
        xi = load_xi(tmp_path / "run")[1][r]
        assert xi[0][1] == 0 and xi[2][1] == 0 and xi[1].tolist() == [0.0, 1.0, 0.0]
    for r in (4, 5):
        assert by_round[r]["trained_clients"] == [0, 1, 2] and "absent_clients" not in by_round[r]
    assert "Client 1 is back, on node 777" in caplog.text


def test_absent_replies_are_recorded_with_their_reason(tmp_path):
    cfg = grid_config(tmp_path, "fedavg", **{"num-server-rounds": 2, "round-timeout": 7})
    metrics = run_on_grid(FaultyGrid(cfg, 3, silent={(1, 2)}, failing={(2, 0)}), cfg)
    first, second = metrics["rounds"]
    assert first["absent_clients"] == {"2": "no reply within the round timeout (7 s)"}
    assert second["absent_clients"] == {"0": "node unavailable: node is gone"}
    assert first["trained_clients"] == [0, 1] and second["trained_clients"] == [1, 2]


def test_a_scaffold_client_that_lost_its_state_starts_afresh_with_a_warning(tmp_path, caplog):
    cfg = grid_config(tmp_path, "scaffold", **{"num-server-rounds": 3})
    metrics = run_on_grid(FaultyGrid(cfg, 3, moves={2: (3, 555)}), cfg)
    assert metrics["rounds"][2]["trained_clients"] == [0, 1, 2]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("Client state 'scaffold-control' is missing although this client trained in 2"
               in w for w in warned)


def test_waiting_for_nodes_names_the_missing_partition_ids():
    infos = {k: v for k, v in client_infos(4).items() if v["client-id"] in (0, 2)}
    with pytest.raises(RuntimeError, match=r"min-nodes is 4: partition ids \[1, 3\] of "
                                           r"num-partitions = 4 are missing"):
        discover_clients(LocalGrid(infos=infos), min_nodes=4, timeout=0.3, poll=0.1)
    with pytest.raises(RuntimeError, match="no node has connected"):
        discover_clients(LocalGrid(infos={}), min_nodes=1, timeout=0.2, poll=0.1)


def test_xi_goes_to_compact_files_every_kth_round_and_the_last(tmp_path):
    cfg = grid_config(tmp_path, "fedamp", **{"num-server-rounds": 5, "xi-every": 2,
                                        "xi-dtype": "float16"})
    metrics = run_on_grid(LocalGrid(cfg, 3), cfg)
    assert metrics["xi"] == {"client_ids": [0, 1, 2], "recorded_rounds": [2, 4, 5], "folder": "xi"}
    ids, rounds = load_xi(tmp_path / "run")
    assert ids == [0, 1, 2] and sorted(rounds) == [2, 4, 5]
    assert rounds[5].dtype == "float16" and abs(rounds[5].astype(float).sum(1) - 1).max() < 1e-3
    assert "rounds" not in metrics["xi"]  # no matrix in metrics.json
    import torch

    state = torch.load(checkpoint_files(tmp_path / "run")[0], weights_only=True)
    history = state["strategy"]["history"]
    assert history["xi"] == {} and history["xi_rounds"] == [2, 4, 5]


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp"])
def test_a_round_with_every_reply_rejected_stops_the_run_with_its_reason(tmp_path, strategy):
    # every update is longer than 1e-9 x max(||w_sent||, 1): every training reply is rejected
    cfg = grid_config(tmp_path, strategy, **{"max-update-ratio": 1e-9})
    with pytest.raises(RoundsFailedError, match=(
            r"round 1: no client's training could be used: 3 client\(s\) left out, 3 of them "
            r"because rejected: update norm .* exceeds .*max-failed-rounds = 0")):
        run_on_grid(FaultyGrid(cfg, 3), cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["completed_rounds"] == 1 and not metrics["finished"]
    assert set(metrics["rounds"][0]["rejected"]) == {"0", "1", "2"}


def test_max_failed_rounds_allows_rounds_in_a_row_without_replies(tmp_path, caplog):
    cfg = grid_config(tmp_path, "fedavg", **{"num-server-rounds": 5, "max-failed-rounds": 2})
    # every training reply of rounds 2 and 3 is an error (2 in a row: allowed)
    failing = {(r, c) for r in (2, 3) for c in range(3)}
    metrics = run_on_grid(FaultyGrid(cfg, 3, failing=failing), cfg)
    assert metrics["finished"]
    assert [r["trained_clients"] for r in metrics["rounds"]] == [[0, 1, 2], [], [], [0, 1, 2],
                                                                 [0, 1, 2]]
    assert "(2 of max-failed-rounds = 2 in a row)" in caplog.text
    # three in a row are too many; the round that stops the run is written as a last one
    # (checkpoint and metrics.json, whatever checkpoint-every says), with its reasons
    cfg = {**cfg, "run-name": "run2", "checkpoint-every": 3}
    failing = {(r, c) for r in (2, 3, 4) for c in range(3)}
    with pytest.raises(RoundsFailedError, match=r"round 4: no client's training could be used: 3 "
                                                r"client\(s\) left out, 3 of them because node "
                                                r"unavailable: node is gone.*3 rounds in a row"):
        run_on_grid(FaultyGrid(cfg, 3, failing=failing), cfg)
    stopped = json.loads((tmp_path / "run2" / "metrics.json").read_text())
    assert stopped["completed_rounds"] == 4 and not stopped["finished"]
    assert set(stopped["rounds"][3]["absent_clients"]) == {"0", "1", "2"}


def test_a_round_with_no_client_connected_stops_the_run_instead_of_waiting(tmp_path):
    # Flower's own sampler would wait for a node for ever; the run stops and says why
    cfg = grid_config(tmp_path, "fedavg")
    with pytest.raises(RoundsFailedError, match=r"round 2: no client's training could be used: "
                                                r"3 client\(s\) left out, 3 of them because node "
                                                r"not connected"):
        run_on_grid(FaultyGrid(cfg, 3, offline={c: (2, 3, 4) for c in range(3)}), cfg)
