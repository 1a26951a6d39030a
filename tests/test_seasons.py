"""A consortium over seasons, in process (the real ServerApp and ClientApp): a run that starts
from another run's last state by member name (``warm-start``), a newcomer's first model, and
what a warm start refuses. The loopback fleet's two seasons: tests/test_members_fleet.py."""

from __future__ import annotations

import ast
import copy
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from fedamp_flwr.config import ConfigError, RunConfig
from fedamp_flwr.tools.inprocess import InProcessGrid
from strategies.core.registry import STRATEGIES

from .helpers import initial_accuracy, member_file, run_app


def _season(tmp_path: Path, strategy: str, n: int = 4, **extra) -> tuple[dict, list[dict]]:
    """``n`` members' files (3 classes around centres of each member's own, as in
    tests/test_members_fleet.py) and the run config of a season of ``strategy``."""
    folder = tmp_path / "sites"
    folder.mkdir(exist_ok=True)
    nodes = [{"data-path": str(member_file(folder / f"client-{i}.npz", i)),
              "client-id": f"client-{i}"} for i in range(n)]
    cfg = {"dataset": "members", "member-input-shape": "6", "member-outputs": 3,
           "batch-size": 20, "strategy": strategy, "local-epochs": 1, "min-nodes": 3,
           "results-dir": str(tmp_path), "server-device": "cpu", **extra}
    return cfg, nodes


def _newest(run_dir: Path) -> dict:
    """The strategy state of a run's newest checkpoint (tensors only: no code from the file)."""
    newest = sorted((run_dir / "checkpoint").glob("round-*.pt"))[-1]
    return torch.load(newest, weights_only=True)["strategy"]


def _store(run_dir: Path) -> torch.Tensor:
    return _newest(run_dir)["models"]


def test_a_fedamp_season_starts_from_the_last_by_member_name(tmp_path, caplog):
    cfg, nodes = _season(tmp_path, "fedamp")
    s1 = {**cfg, "num-server-rounds": 5, "run-name": "s1"}
    first = run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    last = first["rounds"][-1]["client_accuracy"]
    kept = _store(tmp_path / "s1")
    # season 2: client-2 gone, client-3 new, the members in another order; one round
    season = {**cfg, "num-server-rounds": 1, "run-name": "s2", "seed": 7,
              "warm-start": str(tmp_path / "s1"), "checkpoint-every": 1}
    with caplog.at_level(logging.INFO):
        second = run_app(InProcessGrid(season, node_configs=[nodes[3], nodes[1], nodes[0]]), season)
    names = second["client_names"]
    assert names == ["client-0", "client-1", "client-3"]
    warm = second["warm_start"]
    assert (warm["run"], warm["round"], warm["returning"], warm["new"]) == (
        "s1", 5, ["client-0", "client-1"], ["client-3"])
    assert len(warm["sha256"]) == 64 and "Warm start from run 's1' (round 5" in caplog.text
    # the returning members' first round is no worse than their last (their models go on)
    now = second["rounds"][0]["client_accuracy"]
    for name, before in (("client-0", last["0"]), ("client-1", last["1"])):
        cid = names.index(name)
        assert now[str(cid)] >= before - 0.02, (name, now, last)
    # the newcomer starts from the returning members' mean (docs/federation.md, "Seasons"),
    # and its first round is above what the initial model gives it
    assert now["2"] > initial_accuracy(second, Path(nodes[3]["data-path"])), now
    # a resumed second season keeps its warm start's record, and does not start again
    again = {**season, "num-server-rounds": 2, "resume": True}
    resumed = run_app(InProcessGrid(again, node_configs=[nodes[0], nodes[1], nodes[3]]), again)
    assert resumed["warm_start"] == warm and resumed["rounds"][0] == second["rounds"][0]
    assert kept.shape[0] == 3


def test_an_sfl_newcomer_starts_from_the_mean_of_the_members_not_kept_apart(tmp_path):
    graph = tmp_path / "graph.csv"
    graph.write_text("u,v\nclient-0,client-1\nclient-1,client-2\nclient-2,client-3\n")
    cfg, nodes = _season(tmp_path, "sfl", graph="file", **{"graph-file": str(graph),
                                                          "sfl-train-from": "own"})
    s1 = {**cfg, "num-server-rounds": 2, "run-name": "s1"}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    old = _store(tmp_path / "s1")
    policy = tmp_path / "policy.toml"
    policy.write_text('[[apart]]\nmembers = ["client-3", "client-0"]\n')
    from strategies.sfl import SFLStrategy
    seen = {}
    real = SFLStrategy.warm_start

    def spy(self, state, rows, initial):
        real(self, state, rows, initial)
        seen["store"], seen["from"] = self.store.clone(), dict(self.started_from)
    SFLStrategy.warm_start = spy
    try:
        s2 = {**cfg, "num-server-rounds": 1, "run-name": "s2", "warm-start": str(tmp_path / "s1"),
              "collaboration-policy": str(policy)}
        run_app(InProcessGrid(s2, node_configs=nodes), s2)
    finally:
        SFLStrategy.warm_start = real
    store = seen["store"]
    assert torch.equal(store[:3], old)  # each returning member's own row, by value
    assert torch.allclose(store[3], old[1:3].mean(dim=0))  # not client-0's: kept apart
    assert seen["from"] == {0: "its own model", 1: "its own model", 2: "its own model",
                            3: "the mean of the models of 2 returning member(s)"}


def test_panacea_places_a_newcomers_embedding_by_its_graph_neighbours(tmp_path):
    graph = tmp_path / "graph.csv"
    graph.write_text("u,v\nclient-0,client-1\nclient-1,client-2\nclient-2,client-3\n")
    cfg, nodes = _season(tmp_path, "panacea", graph="file", **{
        "graph-file": str(graph), "panacea-server-lr": 0.01, "local-steps": 3,
        "save-models": "final"})
    s1 = {**cfg, "num-server-rounds": 2, "run-name": "s1"}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    held = _newest(tmp_path / "s1")["hnet"]
    s2 = {**cfg, "num-server-rounds": 1, "run-name": "s2", "warm-start": str(tmp_path / "s1"),
          "panacea-server-steps": 1}
    kept = [{**node, "model-dir": str(tmp_path / "models")} for node in nodes[1:]]
    metrics = run_app(InProcessGrid(s2, node_configs=kept), s2)
    assert metrics["warm_start"]["new"] == ["client-3"]
    cards = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "models" / "s2").glob("*.json")}
    assert cards["client-3"]["started_from"] == "its embedding placed by 1 graph neighbours"
    assert cards["client-1"]["started_from"] == "its own embedding"
    assert cards["client-1"]["warm_start"] == {k: metrics["warm_start"][k]
                                               for k in ("run", "round", "sha256")}
    assert held["embeddings.weight"].shape[0] == 3


def test_what_a_warm_start_refuses_before_round_one(tmp_path):
    cfg, nodes = _season(tmp_path, "fedamp", **{"fedamp-sigma": 1.0})
    s1 = {**cfg, "num-server-rounds": 1, "run-name": "s1"}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    cases = [
        ({"warm-start": str(tmp_path / "nowhere")}, "holds no checkpoint"),
        ({"strategy": "fedavg", "warm-start": str(tmp_path / "s1")},
         "keeps a model per client, strategy 'fedavg' one global model"),
        ({"model": "mlp-16", "warm-start": str(tmp_path / "s1")},
         "does not fit the run's model"),
    ]
    for extra, said in cases:
        s2 = {**cfg, "num-server-rounds": 1, "run-name": "s2", **extra}
        with pytest.raises(ConfigError, match=said):
            run_app(InProcessGrid(s2, node_configs=nodes[:3]), s2)
    with pytest.raises(ConfigError, match="another run's folder"):
        RunConfig.from_run_config({**cfg, "run-name": "s1", "warm-start": str(tmp_path / "s1")})
    with pytest.raises(ConfigError, match='graph = "inferred"'):
        RunConfig.from_run_config({**cfg, "strategy": "panacea", "graph": "inferred",
                                   "num-server-rounds": 8, "warm-start": str(tmp_path / "s1")})


def _tensors(value, out):
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _tensors(v, out)
    return out


@pytest.mark.parametrize("strategy, extra", [
    ("fedamp", {"fedamp-sigma": 1.0}),
    ("panacea", {"graph": "file", "panacea-server-lr": 0.01, "local-steps": 3}),
])
def test_forget_erases_a_member_from_every_file_of_the_run(tmp_path, strategy, extra, capsys):
    from fedamp_flwr.server.results import hold_folder
    from fedamp_flwr.tools.cli import main as cli

    graph = tmp_path / "graph.csv"
    graph.write_text("u,v\nclient-0,client-1\nclient-1,client-2\nclient-2,client-3\n")
    cfg, nodes = _season(tmp_path, strategy, **{"graph-file": str(graph), **extra})
    s1 = {**cfg, "num-server-rounds": 3, "run-name": "s1", "checkpoint-keep": 3}
    before = run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    run = tmp_path / "s1"
    held = {p.name: torch.load(p, weights_only=True) for p in (run / "checkpoint").glob("*.pt")}
    if strategy == "fedamp":
        rows = [s["strategy"]["models"][2].clone() for s in held.values()]
    else:
        rows = [s["strategy"]["hnet"]["embeddings.weight"][2].clone() for s in held.values()]
    assert cli(["forget", str(run), "client-2", "--report"]) == 0
    said = capsys.readouterr().out
    assert "its first contribution was round 1" in said and "shaped by it" in said
    lock = hold_folder(run)  # a live run: its ServerApp holds the folder
    assert cli(["forget", str(run), "client-2"]) == 2
    assert "the run is live" in capsys.readouterr().err
    lock.close()
    assert cli(["forget", str(run), "client-2"]) == 0
    assert "forgotten by run 's1'" in capsys.readouterr().out
    # its name is only in forgotten.json, every other file searched byte by byte
    found = [p.name for p in run.rglob("*") if p.is_file() and b"client-2" in p.read_bytes()]
    assert found == ["forgotten.json"]
    audit = json.loads((run / "forgotten.json").read_text())["forgotten"][0]
    assert (audit["member"], audit["client_id"], audit["name_still_found_in"]) == ("client-2", 2, [])
    assert all(f["sha256_before"] != f.get("sha256_after") for f in audit["files"])
    # none of its rows in any kept checkpoint, compared by value; each still verifies
    from fedamp_flwr.server.results import read_checkpoint
    for path in sorted((run / "checkpoint").glob("*.pt")):
        state, problem = read_checkpoint(path, None, "s1")
        assert problem is None, problem
        for tensor in _tensors(state, []):
            flat = tensor.reshape(-1, tensor.shape[-1]) if tensor.ndim else tensor.reshape(1, 1)
            for row in rows:
                if flat.shape[-1] == row.shape[-1] and flat.dtype == row.dtype:
                    assert not (flat == row).all(dim=1).any(), path.name
    after = json.loads((run / "metrics.json").read_text())
    assert after["client_names"] == ["client-0", "client-1", ""]
    for rec in after["rounds"]:
        assert set(rec["client_accuracy"]) == {"0", "1"} and 2 not in rec["trained_clients"]
        assert rec["mean_accuracy"] == pytest.approx(np.mean(list(rec["client_accuracy"].values())))
    assert before["client_names"][2] == "client-2"
    # the forgotten run is not resumed; a new season warm-starts from it: client-2 is new there
    resume = {**s1, "num-server-rounds": 4, "resume": True}
    with pytest.raises(ConfigError, match="has forgotten a member"):
        run_app(InProcessGrid(resume, node_configs=nodes[:3]), resume)
    s2 = {**cfg, "num-server-rounds": 1, "run-name": "s2", "warm-start": str(run)}
    second = run_app(InProcessGrid(s2, node_configs=nodes[:3]), s2)
    assert second["warm_start"]["returning"] == ["client-0", "client-1"]
    assert second["warm_start"]["new"] == ["client-2"]


@pytest.mark.parametrize("strategy, extra", [
    ("fedamp", {}), ("panacea", {"graph": "file", "panacea-server-lr": 0.01, "local-steps": 3}),
])
def test_a_returning_member_that_joins_under_way_takes_its_own_model(tmp_path, strategy, extra):
    from .helpers import JoiningGrid

    graph = tmp_path / "graph.csv"
    graph.write_text("u,v\nclient-0,client-1\nclient-1,client-2\nclient-2,client-3\n")
    cfg, nodes = _season(tmp_path, strategy, **{"graph-file": str(graph), **extra})
    s1 = {**cfg, "num-server-rounds": 2, "run-name": "s1"}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    held = _newest(tmp_path / "s1")
    # season 2: client-0, client-1 and the new client-3 start; client-2 comes back in round 2
    s2 = {**cfg, "num-server-rounds": 2, "run-name": "s2", "warm-start": str(tmp_path / "s1"),
          "checkpoint-every": 1}
    second = run_app(JoiningGrid(s2, [nodes[0], nodes[1], nodes[3], nodes[2]], joins_at=2), s2)
    assert second["warm_start"]["returning"] == ["client-0", "client-1", "client-2"]
    assert second["warm_start"]["new"] == ["client-3"]
    first, last = (torch.load(p, weights_only=True)["strategy"]
                   for p in sorted((tmp_path / "s2" / "checkpoint").glob("*.pt")))
    cid = second["client_names"].index("client-2")
    assert cid not in second["rounds"][0]["trained_clients"]  # it joined in round 2
    assert last["started_from"][str(cid)] == ("its own model" if strategy == "fedamp"
                                              else "its own embedding")
    assert str(cid) not in first["started_from"]
    if strategy == "panacea":  # GH has its row from round 2 on
        assert [len(s["hnet"]["embeddings.weight"]) for s in (held, first, last)] == [3, 3, 4]


def test_forget_takes_the_members_place_from_the_sealed_checkpoints_and_names_exactly(tmp_path):
    from fedamp_flwr.tools.erasure import Erasure, _scrub_run

    cfg, nodes = _season(tmp_path, "fedamp")
    s1 = {**cfg, "num-server-rounds": 1, "run-name": "s1"}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    run = tmp_path / "s1"
    metrics = json.loads((run / "metrics.json").read_text())
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    # whoever can write metrics.json (not sealed) swaps two names: forget refuses, changes nothing
    swapped = dict(metrics, client_names=["client-0", "client-2", "client-1"])
    (run / "metrics.json").write_text(json.dumps(swapped))
    with pytest.raises(ConfigError, match="holds member 'client-2' as client 2, metrics.json "
                                          "as client 1; nothing was changed"):
        Erasure(run, "client-2", None).forget()
    assert not (run / "forgotten.json").exists()
    assert all(p.read_bytes() == b for p, b in before.items() if p.name != "metrics.json")
    # a name inside another's ("site-1" in "site-10") and a run-config value equal to a name
    record = {"client_names": ["site-1", "site-10"], "config": {"model": "site-1"},
              "impostors": [{"node": 7, "why": "claims member 'site-10': its key ...", "at": "x"}],
              "left_out": {"9": "member 'site-10' cannot join"},
              "collaboration_policy": {"file": "p", "sha256": "0", "apart": [["site-1", "b", "c"]]},
              "rounds": [{"round": 1, "trained_clients": [0, 1],
                          "client_accuracy": {"0": 0.5, "1": 1.0}, "mean_accuracy": 0.75}]}
    out = _scrub_run(record, 0, "site-1")
    assert out["client_names"] == ["", "site-10"] and out["config"]["model"] == "site-1"
    assert out["impostors"] == record["impostors"] and out["left_out"] == record["left_out"]
    assert out["collaboration_policy"]["apart"] == [["b", "c"]]
    assert out["rounds"][0]["mean_accuracy"] == 1.0 and out["bmta"] == 100.0


@pytest.mark.parametrize("sealed", [True, False], ids=["secret", "no-secret"])
def test_an_erasure_rolled_back_is_refused_by_resume_warm_start_and_forget(tmp_path, sealed):
    """Whoever can write the run folder puts back the checkpoints from before ``forget`` and
    deletes forgotten.json (then the manifest of then too, then the manifest at all): resume,
    warm start and ``forget`` itself refuse each, naming what does not match; the folder as
    forget left it is still a season's start."""
    from fedamp_flwr.server.manifest import register_path
    from fedamp_flwr.tools.erasure import Erasure

    secret = tmp_path / "secret"
    secret.write_bytes(b"k" * 40)
    secret.chmod(0o600)
    cfg, nodes = _season(tmp_path, "fedamp",
                         **({"checkpoint-secret": str(secret)} if sealed else {}))
    s1 = {**cfg, "num-server-rounds": 3, "run-name": "s1", "checkpoint-keep": 3}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    run, key = tmp_path / "s1", secret.read_bytes().strip() if sealed else None
    before = {p.name: p.read_bytes() for p in (run / "checkpoint").iterdir()}
    Erasure(run, "client-2", key).forget()
    after = {p.name: p.read_bytes() for p in (run / "checkpoint").iterdir()}
    assert json.loads(after["manifest.json"])["generation"] == 5  # 3 rounds, 2 for the erasure
    assert b"client-2" not in after["manifest.json"]  # a mark of the name, not the name

    def put(files: dict[str, bytes], *, manifest: bool) -> None:
        for name, data in files.items():
            if manifest or name != "manifest.json":
                (run / "checkpoint" / name).write_bytes(data)

    resume = {**s1, "num-server-rounds": 4, "resume": True}
    s2 = {**cfg, "num-server-rounds": 1, "run-name": "s2", "warm-start": str(run)}

    def refused(match: str) -> None:
        with pytest.raises(ConfigError, match=match):
            run_app(InProcessGrid(s2, node_configs=nodes[:3]), s2)
        with pytest.raises(ConfigError, match="'resume' = true: .*(" + match + "|has forgotten "
                                              "a member)"):
            run_app(InProcessGrid(resume, node_configs=nodes[:3]), resume)
        with pytest.raises(ConfigError, match=match):
            Erasure(run, "client-1", key).forget()

    # the checkpoints of before, forgotten.json gone: not the files the manifest lists
    put(before, manifest=False)
    (run / "forgotten.json").unlink()
    refused("not the round-000003.pt the folder's manifest \\(generation 5\\) records: an "
            "older copy restored")
    # the manifest of before with them: older than the coordinator's register
    put(before, manifest=True)
    refused("is generation 3, and the coordinator's register .* records generation 5 of this "
            "folder: the folder was restored from an older copy")
    # no manifest at all (and then no register either): each checkpoint's own generation says
    # there was one
    (run / "checkpoint" / "manifest.json").unlink()
    refused("it was written with the folder's manifest \\(generation 3\\), and "
            "checkpoint/manifest.json is missing")
    register_path(run).unlink()
    refused("it was written with the folder's manifest \\(generation 3\\), and "
            "checkpoint/manifest.json is missing")
    # the folder as forget left it: a season starts from it; it is still not resumed
    for name in [p.name for p in (run / "checkpoint").iterdir()]:
        (run / "checkpoint" / name).unlink()
    put(after, manifest=True)
    # nor is a link put in the run folder's place (the register knows folders by their place)
    run.rename(tmp_path / "elsewhere")
    run.symlink_to(tmp_path / "elsewhere")
    refused("is a symbolic link")
    run.unlink()
    (tmp_path / "elsewhere").rename(run)
    second = run_app(InProcessGrid(s2, node_configs=nodes[:3]), s2)
    assert second["warm_start"]["new"] == ["client-2"]
    with pytest.raises(ConfigError, match="has forgotten a member \\(its checkpoint/manifest"):
        run_app(InProcessGrid(resume, node_configs=nodes[:3]), resume)


def test_an_erasure_cut_short_is_refused_until_forget_is_run_again(tmp_path, monkeypatch):
    """``forget`` dies after rewriting one checkpoint: the manifest already lists the new
    seals, so the checkpoint not yet rewritten (still holding the member) is refused by a warm
    start; ``forget`` of the same member (and only it) takes it and finishes the erasure."""
    from fedamp_flwr.tools import erasure

    cfg, nodes = _season(tmp_path, "fedamp")
    s1 = {**cfg, "num-server-rounds": 3, "run-name": "s1", "checkpoint-keep": 3}
    run_app(InProcessGrid(s1, node_configs=nodes[:3]), s1)
    run, write, calls = tmp_path / "s1", erasure._write, []

    def dies(path, data):
        calls.append(path.name)
        if len(calls) == 3:  # round 3's checkpoint and its seal written; then round 2's
            raise OSError("the machine went down")
        write(path, data)

    monkeypatch.setattr(erasure, "_write", dies)
    with pytest.raises(OSError, match="went down"):
        erasure.Erasure(run, "client-2", None).forget()
    monkeypatch.setattr(erasure, "_write", write)
    audit = json.loads((run / "forgotten.json").read_text())["forgotten"]
    assert [e["status"] for e in audit] == ["erasing"]
    s2 = {**cfg, "num-server-rounds": 1, "run-name": "s2", "warm-start": str(run)}
    (run / "checkpoint" / "round-000003.pt").unlink()  # only round 2's is left: refused
    with pytest.raises(ConfigError, match="no intact checkpoint \\(round-000002.pt: it is not "
                                          "the round-000002.pt the folder's manifest"):
        run_app(InProcessGrid(s2, node_configs=nodes[:3]), s2)
    with pytest.raises(ConfigError, match="cannot be rewritten: it is not the round-000002.pt"):
        erasure.Erasure(run, "client-1", None).forget()
    assert erasure.Erasure(run, "client-2", None).forget()["status"] == "done"
    found = [p.name for p in run.rglob("*") if p.is_file() and b"client-2" in p.read_bytes()]
    assert found == ["forgotten.json"]


def _strategy_tensors(value, path=()) -> dict[tuple, torch.Tensor]:
    """Every tensor of a checkpoint's strategy state, by its path of keys."""
    if isinstance(value, torch.Tensor):
        return {path: value}
    out: dict[tuple, torch.Tensor] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(_strategy_tensors(v, (*path, k)))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            out.update(_strategy_tensors(v, (*path, i)))
    return out


def _state_keys(value) -> set[str]:
    """Every key of a checkpoint's strategy state, at any depth, but the run's records
    (``history``: the same for every strategy, erased by their own rules)."""
    if not isinstance(value, dict):
        return set()
    return {k for k in value if isinstance(k, str)} | set().union(
        *(_state_keys(v) for k, v in value.items() if k != "history"))


def _words(module: Path) -> set[str]:
    """Every string constant of a module's source."""
    return {n.value for n in ast.walk(ast.parse(module.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


_EVERY = [(name, {"graph": "file"} if STRATEGIES[name].uses_graph else {})
          for name in sorted(STRATEGIES)] + [
    ("panacea", {"graph": "inferred", "graph-warmup-rounds": 1, "graph-guard-rounds": 1,
                 "graph-k": 1})]  # checkpoints in the warm-up and in the guard


@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", _EVERY,
                         ids=[f"{s}-{e.get('graph', 'nograph')}" for s, e in _EVERY])
def test_every_strategy_forgets_a_members_rows_and_only_those(tmp_path, strategy, extra):
    """Every registered strategy (and Panacea's graph guard) runs 3 rounds of 5 members,
    a checkpoint each round; ``forget`` erases client-3. In every checkpoint, every tensor of
    the strategy's state that has an axis of the 5 clients is one the strategy declares per
    client (``client_state``); client-3's row (and column) of each is zero, byte for byte, and
    every other byte of every tensor is what it was."""
    from fedamp_flwr.server.results import read_checkpoint
    from fedamp_flwr.tools.cli import main as cli
    from strategies.core.client_state import CLIENT_STATE

    graph = tmp_path / "graph.csv"
    graph.write_text("u,v\nclient-0,client-1\nclient-1,client-2\nclient-2,client-3\n"
                     "client-3,client-4\n")
    cfg, nodes = _season(tmp_path, strategy, n=5, **{"graph-file": str(graph), "min-nodes": 5,
                                                      "local-steps": 2, **extra})
    if extra.get("graph") != "file":
        cfg.pop("graph-file")
    run = {**cfg, "num-server-rounds": 3, "run-name": "r", "checkpoint-keep": 3}
    run_app(InProcessGrid(run, node_configs=nodes), run)
    files = sorted((tmp_path / "r" / "checkpoint").glob("*.pt"))
    before = {p.name: torch.load(p, weights_only=True)["strategy"] for p in files}
    assert len(before) == 3
    assert cli(["forget", str(tmp_path / "r"), "client-3"]) == 0
    guarded = False
    for path in files:
        state, problem = read_checkpoint(path, None, "r")
        assert problem is None, problem
        old, new = (_strategy_tensors(s) for s in (before[path.name], state["strategy"]))
        declared = state["strategy"][CLIENT_STATE]
        rows = {tuple(p) for p in declared["rows"]}
        matrices = {tuple(p) for p in declared["matrices"]}
        assert set(old) == set(new)
        guarded = guarded or any(k in rows and "arms" in k for k in new)
        for key, tensor in new.items():
            was = old[key].clone()
            if key[0] == "history":
                continue  # the rounds' records: erased by their own rules (other tests)
            if key in rows or key in matrices:
                assert (tensor[3] == 0).all(), (strategy, path.name, key)
                was[3] = 0
                if key in matrices:
                    assert (tensor[:, 3] == 0).all()
                    was[:, 3] = 0
            else:  # a tensor the strategy keeps of no one client has no axis of the clients
                assert 5 not in tuple(tensor.shape), (strategy, path.name, key, tensor.shape)
            assert tensor.numpy().tobytes() == was.numpy().tobytes(), (strategy, key)
    # with the guard, one checkpoint at least held its own hypernetworks' embeddings to erase
    assert guarded == (extra.get("graph") == "inferred")
    # a checkpoint of a version before the declaration: erased by the keys those versions
    # wrote, to the same bytes (the guard's sums, graph on trial and hypernetworks included)
    from strategies.core.client_state import forget_client

    for name, held in before.items():
        declared, legacy = copy.deepcopy(held), copy.deepcopy(held)
        forget_client(declared, 3)
        legacy.pop(CLIENT_STATE)
        forget_client(legacy, 3)
        want, got = _strategy_tensors(declared), _strategy_tensors(legacy)
        for key, tensor in want.items():
            assert got[key].numpy().tobytes() == tensor.numpy().tobytes(), (strategy, name, key)
    # forget and the warm start name none of the method's keys: the base's are its records
    # (history), how each model started and the declaration; a word the run's metrics.json
    # also uses at its top ("models": the models delivered) is the run's
    own = set().union(*(_state_keys(s) for s in before.values())) - {
        "history", "started_from", CLIENT_STATE} - set(json.loads(
            (tmp_path / "r" / "metrics.json").read_text()))
    app = Path(__file__).resolve().parents[1] / "fedamp_flwr"
    for module in ("tools/erasure.py", "server/seasons.py"):
        assert own & _words(app / module) == set(), (strategy, module)


def test_a_clients_declared_part_of_a_state_is_zeroed_by_hand_worked_values():
    """``forget_client`` on a state with a row tensor, a matrix, a map and an optimizer's int
    key; a declaration that is broken (not a list, a path to nothing, to a number, a row
    beyond the tensor) changes nothing else and raises nothing."""
    from strategies.core.client_state import declaration, forget_client

    state = {"models": torch.arange(6.0).reshape(3, 2), "graph": torch.ones(3, 3),
             "opt": {"state": {0: {"momentum_buffer": torch.full((3, 1), 2.0)}}},
             "started_from": {"1": "its own", "2": "mean"}, "shared": torch.ones(3),
             "client_state": declaration(rows=[["models"], ["opt", "state", 0, "momentum_buffer"],
                                               ["missing"], ["started_from"]],
                                         matrices=[["graph"]], maps=[["started_from"]])}
    changed = forget_client(state, 1)
    assert changed == ["models", "opt/state/0/momentum_buffer", "graph", "started_from"]
    assert state["models"].tolist() == [[0.0, 1.0], [0.0, 0.0], [4.0, 5.0]]
    assert state["graph"].tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    assert state["opt"]["state"][0]["momentum_buffer"].tolist() == [[2.0], [0.0], [2.0]]
    assert state["started_from"] == {"2": "mean"} and state["shared"].tolist() == [1.0] * 3
    assert forget_client(state, 7) == [] and forget_client(state, -1) == []
    for broken in ({"rows": "models"}, {"rows": [["models"], "x", 3]}, "rows", None):
        assert forget_client({"models": torch.ones(2, 2), "client_state": broken}, 0) in (
            [], ["models"])
