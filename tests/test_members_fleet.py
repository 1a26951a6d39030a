"""Members bring their own data, on a real loopback fleet: a SuperLink and SuperNodes, each
SuperNode reading only its own file (node config ``data-path`` and ``client-id``).

One fleet serves the whole story, in order: FedAMP (every key of its own at its default:
sigma from the data) with a misfit member left out by name; HeurFedAMP with the roster
of the names and keys the FedAMP run bound, while another node claims a member's
client-id with a key of its own (it is refused at once, the member trains); every
SuperNode stopped, the FedAMP run resumed while an impostor claims an absent member's
name (it gets nothing, and that member's stored model is kept to the byte), then every
member restarted in another order (new node ids) and the run resumed again, every member
keeping its client id and its personalized model. Then the next season: site-c gone and
site-d new, a run warm-started from the FedAMP run with site-a and site-d kept apart, and
site-c forgotten by the FedAMP run (fedamp-flwr forget). Panacea over a graph file, or a graph
inferred, that names the members runs the same server and client code in process
(tests/test_members.py, tests/test_graph_inference.py). No SuperNode authentication here
(the hardened fleet, with it, is tests/test_fleet_e2e.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.processes import stop_tree

from .conftest import free_port
from .test_flower_e2e import FLWR, ROOT, _start_superlink

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]

FEATURES, CLASSES = 6, 3
SCHEMA = (f"dataset='members' member-input-shape='{FEATURES}' member-outputs={CLASSES} "
          "local-epochs=2 batch-size=20")


def _member_file(path: Path, seed: int, features: int = FEATURES) -> Path:
    """A member's own data: 3 classes around centres that differ from member to member."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(CLASSES, features))
    y = rng.integers(0, CLASSES, size=120)
    x = (centres[y] + rng.normal(size=(120, features))).astype(np.float32)
    np.savez(path, x=x[:100], y=y[:100], x_test=x[100:], y_test=y[100:])
    return path


def _supernode(processes, port: int, data: Path, name: str, log: str):
    """A member's SuperNode: its own data, its own model-dir (``<tmp>/<log>-models``) and its
    own key (``<tmp>/<log>-identity``)."""
    home = log.removesuffix("-again")
    models, keys = processes.tmp / f"{home}-models", processes.tmp / f"{home}-identity"
    return processes.start(
        ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
         "--port", str(free_port()), "--node-config",
         f"data-path='{data}' client-id='{name}' model-dir='{models}' identity-dir='{keys}'"],
        log)


def _store(results: Path, run: str, server_round: int) -> list[bytes]:
    """Each member's row of FedAMP's store in the run's checkpoint of ``server_round``."""
    import torch

    path = results / run / "checkpoint" / f"round-{server_round:06d}.pt"
    state = torch.load(path, weights_only=True)  # tensors only: no code from the file
    return [row.numpy().tobytes() for row in state["strategy"]["models"]]


def _member_models(processes, name: str, run: str) -> list[str]:
    folder = processes.tmp / f"{name}-models" / run
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _predict_test_rows(processes, name: str, run: str, data: Path) -> str:
    """``fedamp-flwr predict`` (the console script) on a member's test rows: its score line."""
    with np.load(data) as site:
        np.savez(processes.tmp / f"{name}-test.npz", x=site["x_test"], y=site["y_test"])
    model = processes.tmp / f"{name}-models" / run / f"{name}.safetensors"
    out = subprocess.run([str(Path(FLWR).parent / "fedamp-flwr"), "predict", str(model),
                          str(processes.tmp / f"{name}-test.npz"), "--out",
                          str(processes.tmp / "p.csv")], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1].split(" on ")[0]


def _run(processes, config: str, timeout: float = 600) -> str:
    out = subprocess.run([FLWR, "run", str(ROOT), "--stream", "--run-config", config],
                         env=processes.env, cwd=processes.tmp, capture_output=True, text=True,
                         timeout=timeout)
    return out.stdout + out.stderr


def _metrics(results: Path, name: str, log: str) -> dict:
    path = results / name / "metrics.json"
    assert path.is_file(), log[-4000:]
    return json.loads(path.read_text())


def test_members_fleet_fedamp_heurfedamp_panacea_misfit_impostors_restart(processes):
    tmp = processes.tmp
    port = _start_superlink(processes, simulation=False)
    names = ["site-a", "site-b", "site-c"]
    files = {name: _member_file(tmp / f"{name}.npz", seed) for seed, name in enumerate(names)}
    nodes = {name: _supernode(processes, port, files[name], name, name) for name in names}
    bad = _member_file(tmp / "misfit.npz", 9, features=5)
    with np.load(bad) as f:  # and a label outside the run's 3 classes: three problems
        arrays = {k: f[k] for k in f.files}
    arrays["y"][4] = 7
    np.savez(bad, **arrays)
    misfit = _supernode(processes, port, bad, "site-misfit", "misfit")
    results = tmp / "results"
    common = f"{SCHEMA} results-dir='{results}' min-nodes=3"

    # 1. FedAMP: the misfit member is left out by name, the others train
    log = _run(processes, f"{common} strategy='fedamp' num-server-rounds=2 "
                          "run-name='fedamp'")
    fedamp = _metrics(results, "fedamp", log)
    assert fedamp["client_names"] == names and fedamp["completed_rounds"] == 2
    # FedAMP with every one of its keys at its default: sigma from the members' data
    assert fedamp["fedamp_sigma"]["value"] > 0
    assert all(r["trained_clients"] == [0, 1, 2] for r in fedamp["rounds"])
    assert "Left out: member 'site-misfit'" in log and "5 feature(s) per row" in log
    assert list(fedamp["left_out"].values())[0].startswith("member 'site-misfit'")
    # the misfit member sees why in its own SuperNode's log
    own = processes.log("misfit")
    assert "This node cannot take part in the run" in own and "3 problems" in own
    assert "y has labels [7] outside [0, 3)" in own and "at index 4" in own
    stop_tree(misfit.pid, timeout=10)
    # each member's machine holds its own model and card, and no other member's; used on
    # its test rows, the model gives the score the run recorded for that member
    last = fedamp["rounds"][-1]["client_accuracy"]
    for cid, name in enumerate(names):
        assert _member_models(processes, name, "fedamp") == [f"{name}.json", f"{name}.safetensors"]
        card = json.loads((tmp / f"{name}-models" / "fedamp" / f"{name}.json").read_text())
        assert (card["member"], card["client_id"], card["round"]) == (name, cid, 2)
        assert _predict_test_rows(processes, name, "fedamp", files[name]) == \
            f"accuracy {last[str(cid)]!r}"
    assert _member_models(processes, "misfit", "fedamp") == []  # its node wrote nothing
    # each member's inputs standardized by the pooled statistics, and its score alone beside
    # its own in its log, its card and the run's records
    assert fedamp["member_scaling"]["members"] == 3 and sorted(fedamp["alone"]) == ["0", "1", "2"]
    assert "this member's model accuracy" in processes.log("site-a")
    assert "site-a: accuracy" in log and "(the run's model)" in log

    # 2. with the roster of the names and keys the FedAMP run bound, another node claims
    #    site-b's client-id with a key of its own: refused at once, and site-b trains
    roster = tmp / "roster.txt"
    roster.write_text(subprocess.run([str(Path(FLWR).parent / "fedamp-flwr"), "roster",
                                      str(results / "fedamp")], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    assert roster.read_text().count("ed25519:") == 3
    impostor = _supernode(processes, port, files["site-c"], "site-b", "impostor")
    log = _run(processes, f"{common} strategy='heurfedamp' heurfedamp-sigma=25.0 "
                          f"num-server-rounds=1 run-name='heurfedamp' member-roster='{roster}'")
    heur = _metrics(results, "heurfedamp", log)
    assert heur["client_names"] == names and heur["finished"]
    assert heur["rounds"][0]["trained_clients"] == [0, 1, 2]
    (attempt,) = heur["impostors"]
    assert "claims member 'site-b': its key SHA256:" in attempt["why"]
    assert "Impostor refused" in log and "held back" not in log
    # the impostor's own node is told that it could not prove the name, and no more
    told = processes.log("impostor")
    assert "The run leaves this node out: left out: this node could not prove" in told
    assert "SHA256:" not in told

    # 3. every SuperNode stops; the FedAMP run resumes while the impostor (restarted) claims
    #    site-b's name: it gets no model and no record, site-b's stored model stays as it was
    for name in names:
        stop_tree(nodes[name].pid, timeout=10)
    stop_tree(impostor.pid, timeout=10)
    impostor = _supernode(processes, port, files["site-c"], "site-b", "impostor-again")
    for name in ("site-c", "site-a"):
        nodes[name] = _supernode(processes, port, files[name], name, f"{name}-again")
    log = _run(processes, f"{SCHEMA} results-dir='{results}' min-nodes=2 strategy='fedamp' "
                          "num-server-rounds=3 run-name='fedamp' resume=true")
    attacked = _metrics(results, "fedamp", log)
    assert attacked["rounds"][:2] == fedamp["rounds"]  # the first two rounds kept as they were
    third = attacked["rounds"][2]
    assert third["trained_clients"] == [0, 2] and "1" not in third["client_accuracy"]
    assert third["absent_clients"]["1"] == "node not connected"
    assert _store(results, "fedamp", 3)[1] == _store(results, "fedamp", 2)[1]
    assert "claims member 'site-b': its key SHA256:" in attacked["impostors"][0]["why"]
    assert _member_models(processes, "impostor", "fedamp") == []
    stop_tree(impostor.pid, timeout=10)
    #    then every member is back (new node ids, another order): each keeps its client id
    #    and its personalized model, site-b the one the checkpoint kept for it
    for name in ("site-a", "site-c"):
        stop_tree(nodes[name].pid, timeout=10)
    for name in reversed(names):
        nodes[name] = _supernode(processes, port, files[name], name, f"{name}-again")
    log = _run(processes, f"{common} strategy='fedamp' num-server-rounds=4 "
                          "run-name='fedamp' resume=true")
    resumed = _metrics(results, "fedamp", log)
    assert resumed["client_names"] == names and resumed["finished"]
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    assert resumed["rounds"][:3] == attacked["rounds"]
    assert resumed["rounds"][3]["trained_clients"] == [0, 1, 2]
    for name in names:  # the same files, now of round 4
        assert _member_models(processes, name, "fedamp") == [f"{name}.json", f"{name}.safetensors"]
        card = json.loads((tmp / f"{name}-models" / "fedamp" / f"{name}.json").read_text())
        assert card["round"] == 4

    # 4. the next season: site-c has left, site-d joins; the run starts from the FedAMP run's
    #    last state by name (warm-start), with site-a and site-d kept apart
    stop_tree(nodes["site-c"].pid, timeout=10)
    files["site-d"] = _member_file(tmp / "site-d.npz", 3)
    nodes["site-d"] = _supernode(processes, port, files["site-d"], "site-d", "site-d")
    policy = tmp / "policy.toml"
    policy.write_text('[[apart]]\nmembers = ["site-a", "site-d"]\n')
    log = _run(processes, f"{common} strategy='fedamp' num-server-rounds=2 run-name='season-2' "
                          f"warm-start='{results / 'fedamp'}' collaboration-policy='{policy}'")
    season = _metrics(results, "season-2", log)
    warm = season["warm_start"]
    assert (warm["run"], warm["round"], warm["returning"], warm["new"]) == (
        "fedamp", 4, ["site-a", "site-b"], ["site-d"]), log[-3000:]
    first, last = season["rounds"][0]["client_accuracy"], resumed["rounds"][3]["client_accuracy"]
    for name in ("site-a", "site-b"):  # the warm start works: no worse than where they were
        assert first[str(season["client_names"].index(name))] >= \
            last[str(names.index(name))] - 0.02, (first, last)
    newcomer = first[str(season["client_names"].index("site-d"))]
    assert newcomer > _initial_accuracy(season, files["site-d"]), (first, log[-3000:])
    ids = np.load(results / "season-2" / "xi" / "client_ids.npy").tolist()
    a, d = (ids.index(season["client_names"].index(n)) for n in ("site-a", "site-d"))
    for path in sorted((results / "season-2" / "xi").glob("round-*.npy")):
        xi = np.load(path)
        assert xi[a, d] == 0 and xi[d, a] == 0, path.name
    for name in ("site-a", "site-b", "site-d"):  # each card: how it started, whom it learned from
        card = json.loads((tmp / f"{name}-models" / "season-2" / f"{name}.json").read_text())
        assert card["warm_start"] == {k: warm[k] for k in ("run", "round", "sha256")}
        assert card["started_from"] == ("its own model" if name != "site-d" else  # not site-a's
                                        "the mean of the models of 1 returning member(s)")
        assert card["learned_from"]["others"], card
    # kept apart: site-d's card never names site-a
    card = json.loads((tmp / "site-d-models" / "season-2" / "site-d.json").read_text())
    assert "site-a" not in json.dumps(card["learned_from"])

    # 5. site-c withdraws its consent: the coordinator forgets it in the FedAMP run
    held = {p.name: torch.load(p, weights_only=True)["strategy"]["models"][2].clone()
            for p in (results / "fedamp" / "checkpoint").glob("*.pt")}
    out = subprocess.run([str(Path(FLWR).parent / "fedamp-flwr"), "forget",
                          str(results / "fedamp"), "site-c"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    found = [str(p.relative_to(results / "fedamp")) for p in (results / "fedamp").rglob("*")
             if p.is_file() and b"site-c" in p.read_bytes()]
    assert found == ["forgotten.json"]
    for path in (results / "fedamp" / "checkpoint").glob("*.pt"):
        state = torch.load(path, weights_only=True)
        for row in held.values():
            assert not (state["strategy"]["models"] == row).all(dim=1).any(), path.name


def _initial_accuracy(season: dict, data: Path) -> float:
    """What the run's initial model scores on a member's test rows (inputs standardized by
    the run's pooled statistics, as the member's ClientApp does)."""
    import tasks
    from fedamp_flwr.config import RunConfig

    cfg = RunConfig.from_run_config(season["config"])
    torch.manual_seed(cfg.seed)
    model = tasks.build_model(cfg.data_config(len(season["client_names"])), cfg.model)
    scaling = season["member_scaling"]
    with np.load(data) as site:
        x = (site["x_test"] - np.asarray(scaling["mean"])) / np.asarray(scaling["std"])
        y = site["y_test"]
    with torch.no_grad():
        guess = model(torch.as_tensor(x, dtype=torch.float32)).argmax(dim=1).numpy()
    return float((guess == y).mean())
