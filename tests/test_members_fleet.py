"""Members bring their own data, on a real loopback fleet: a SuperLink and SuperNodes, each
SuperNode reading only its own file (node config ``data-path`` and ``client-id``).

What only processes show, in two tests. On the test session's shared fleet of three members
(tests/conftest.py ``members_fleet``): FedAMP (every key of its own at its default: sigma
from the data) with a misfit member left out by name, which its own SuperNode's log tells
why; each member's model and card on its own machine, which ``fedamp-flwr predict`` scores
as the run recorded; then the next season, HeurFedAMP warm-started from it without a roster,
while another node claims a member's client-id with a key of its own (the name is bound to
the key the member proved last season: the node is refused at once and gets nothing, its
own log says no more than that, the member trains). On a fleet of its own,
because it stops every SuperNode: the run resumed while an impostor claims an absent
member's name (it gets nothing, and that member's stored model is kept to the byte), then
the members that came back, in another order (new node ids), keeping their client ids and
their personalized models.

The same server and client code in process: the next season warm-started by member name,
with the cards saying how each started (tests/test_seasons.py
``test_a_fedamp_season_starts_from_the_last_by_member_name``,
``test_an_sfl_newcomer_starts_from_the_mean_of_the_members_not_kept_apart``); members kept
apart (tests/test_policy.py ``test_members_kept_apart_weigh_each_other_zero_in_every_round``);
a member forgotten (tests/test_seasons.py ``test_forget_erases_a_member_from_every_file_of_the_run``);
impostors, rosters and a warm start's bindings (tests/test_identity.py); Panacea over a
graph file, or a graph inferred, that names the members (tests/test_members.py,
tests/test_graph_inference.py). No SuperNode authentication here (the hardened fleet, with
it, is tests/test_fleet_e2e.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.processes import stop_tree, stop_trees

from .helpers import (
    FLEET_SCHEMA,
    FLWR,
    MEMBERS,
    fleet_metrics,
    member_file,
    member_supernode,
    members_run,
    start_superlink,
)

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]

NAMES = list(MEMBERS)


def _store(results: Path, run: str, server_round: int) -> list[bytes]:
    """Each member's row of FedAMP's store in the run's checkpoint of ``server_round``."""
    path = results / run / "checkpoint" / f"round-{server_round:06d}.pt"
    state = torch.load(path, weights_only=True)  # tensors only: no code from the file
    return [row.numpy().tobytes() for row in state["strategy"]["models"]]


def _predict_test_rows(tmp: Path, name: str, run: str, data: Path) -> str:
    """``fedamp-flwr predict`` (the console script) on a member's test rows: its score line."""
    with np.load(data) as site:
        np.savez(tmp / f"{name}-test.npz", x=site["x_test"], y=site["y_test"])
    model = tmp / f"{name}-models" / run / f"{name}.safetensors"
    out = subprocess.run([str(Path(FLWR).parent / "fedamp-flwr"), "predict", str(model),
                          str(tmp / f"{name}-test.npz"), "--out", str(tmp / "p.csv")],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1].split(" on ")[0]


def test_members_train_on_their_own_machines_a_misfit_and_an_impostor_left_out(
        members_fleet, tmp_path):
    fleet, tmp = members_fleet, members_fleet.tmp
    processes = fleet.processes
    bad = member_file(tmp_path / "misfit.npz", 9, features=5)
    with np.load(bad) as f:  # and a label outside the run's 3 classes: three problems
        arrays = {k: f[k] for k in f.files}
    arrays["y"][4] = 7
    np.savez(bad, **arrays)
    misfit = member_supernode(processes, fleet.port, bad, "site-misfit", "misfit")
    results = tmp_path / "results"
    common = f"{FLEET_SCHEMA} results-dir='{results}' min-nodes=3"

    # 1. FedAMP: the misfit member is left out by name, the others train
    try:
        log = fleet.run(f"{common} strategy='fedamp' num-server-rounds=1 run-name='shared-fedamp'")
    finally:
        stop_tree(misfit.pid, timeout=10)
    fedamp = fleet_metrics(results, "shared-fedamp", log)
    assert fedamp["client_names"] == NAMES and fedamp["completed_rounds"] == 1
    # FedAMP with every one of its keys at its default: sigma from the members' data
    assert fedamp["fedamp_sigma"]["value"] > 0
    assert all(r["trained_clients"] == [0, 1, 2] for r in fedamp["rounds"])
    assert "Left out: member 'site-misfit'" in log and "5 feature(s) per row" in log
    assert list(fedamp["left_out"].values())[0].startswith("member 'site-misfit'")
    # the misfit member sees why in its own SuperNode's log
    own = processes.log("misfit")
    assert "This node cannot take part in the run" in own and "3 problems" in own
    assert "y has labels [7] outside [0, 3)" in own and "at index 4" in own
    # each member's machine holds its own model and card, and no other member's; used on
    # its test rows, the model gives the score the run recorded for that member
    last = fedamp["rounds"][-1]["client_accuracy"]
    cards = {}
    for cid, name in enumerate(NAMES):
        assert fleet.models(name, "shared-fedamp") == [f"{name}.json", f"{name}.safetensors"]
        card = cards[name] = json.loads(
            (tmp / f"{name}-models" / "shared-fedamp" / f"{name}.json").read_text())
        assert (card["member"], card["client_id"], card["round"]) == (name, cid, 1)
        # the model it takes home is its own node's choice on its held-out rows, by its
        # metric (log loss): the card records the three models' scores there and on the test
        # rows; a member whose federated model is worse there takes home a model alone and
        # its own log says so at WARNING, once
        choice = card["choice"]
        assert choice["metric"] == "log_loss" and choice["held_out_rows"] == 20
        assert sorted(choice["held_out"]) == sorted(choice["test"]) == [
            "federated", "linear alone", "model alone"]
        kept = choice["held_out"][choice["kept"]]["log_loss"]  # the best, or the reference
        assert choice["kept"] == choice["reference"] == "linear alone" or kept == min(
            s["log_loss"] for s in choice["held_out"].values())
        assert card["score"]["accuracy"] == choice["test"][choice["kept"]]["accuracy"]
        if choice["kept"] != "federated":
            told = [line for line in processes.log(name).splitlines()
                    if "This member's federated model" in line and "on its held-out rows"
                    in line]
            assert told and all("WARNING" in line for line in told), told
            assert f"it takes home the '{choice['kept']}' model" in told[-1]
        else:
            assert card["score"]["accuracy"] == last[str(cid)]
        assert f"{name}: accuracy" in log and "; kept: " in log
    # after one round of two local epochs the run's model does not lead the linear model
    # alone on some member's held-out rows (the members' classes lie around centres of
    # their own)
    assert any(c["choice"]["kept"] != "federated" for c in cards.values())
    assert _predict_test_rows(tmp, "site-b", "shared-fedamp", fleet.files["site-b"]) == \
        f"accuracy {cards['site-b']['score']['accuracy']!r}"
    assert fleet.models("misfit", "shared-fedamp") == []  # its node wrote nothing
    # each member's inputs standardized by the pooled statistics, and its score alone beside
    # its own in its log, its card and the run's records
    assert fedamp["member_scaling"]["members"] == 3 and sorted(fedamp["alone"]) == ["0", "1", "2"]
    assert "this member's model accuracy" in processes.log("site-a")
    assert "site-a: accuracy" in log and "(the run's model)" in log

    # 2. the next season (HeurFedAMP) warm-started from the FedAMP run, without a roster:
    #    another node claims site-b's name with a key of its own; the name is bound to the
    #    key site-b proved last season, so it is refused at once, and site-b trains on
    roster = subprocess.run([str(Path(FLWR).parent / "fedamp-flwr"), "roster",
                             str(results / "shared-fedamp")], capture_output=True, text=True,
                            check=True, timeout=60).stdout  # what a coordinator would pin
    assert roster.count("ed25519:") == 3
    impostor = member_supernode(processes, fleet.port, fleet.files["site-c"], "site-b",
                                "impostor")
    try:
        log = fleet.run(f"{common} strategy='heurfedamp' heurfedamp-sigma=25.0 "
                        f"num-server-rounds=1 run-name='shared-heurfedamp' "
                        f"warm-start='{results / 'shared-fedamp'}' alone=false")
    finally:
        stop_tree(impostor.pid, timeout=10)
    heur = fleet_metrics(results, "shared-heurfedamp", log)
    assert heur["client_names"] == NAMES and heur["finished"]
    assert heur["warm_start"]["returning"] == NAMES
    assert heur["member_keys"] == fedamp["member_keys"]  # last season's keys, site-b's too
    assert heur["rounds"][0]["trained_clients"] == [0, 1, 2]
    (attempt,) = heur["impostors"]
    assert "claims member 'site-b': its key SHA256:" in attempt["why"]
    assert "the one it was first accepted with" in attempt["why"]
    assert "Impostor refused" in log and "held back" not in log
    assert fleet.models("impostor", "shared-heurfedamp") == []  # it got nothing
    # the impostor's own node is told that it could not prove the name, and no more
    told = processes.log("impostor")
    assert "The run leaves this node out: left out: this node could not prove" in told
    assert "SHA256:" not in told


def test_members_stopped_and_restarted_keep_their_ids_and_models(processes):
    """What only processes show: SuperNodes that stop (the SuperLink keeps no session of
    theirs) and come back as new nodes, in another order, with their own keys on disk, while
    a node claims the name of a member that stayed away. The member that stayed away coming
    back later with its personalized model: in process (tests/test_members.py
    ``test_a_member_on_a_new_node_keeps_its_id_and_its_personalized_model``,
    tests/test_identity.py ``test_an_impostor_of_an_absent_member_on_resume_changes_nothing_of_it``)."""
    tmp = processes.tmp
    port = start_superlink(processes, simulation=False)
    files = {name: member_file(tmp / f"{name}.npz", seed) for seed, name in enumerate(NAMES)}
    nodes = {name: member_supernode(processes, port, files[name], name, name, keep="federated")
             for name in NAMES}
    results = tmp / "results"
    common = f"{FLEET_SCHEMA} results-dir='{results}' run-name='fedamp' alone=false"
    log = members_run(processes, f"{common} min-nodes=3 strategy='fedamp' num-server-rounds=1")
    first = fleet_metrics(results, "fedamp", log)
    assert first["client_names"] == NAMES and first["rounds"][0]["trained_clients"] == [0, 1, 2]

    # every SuperNode stops; site-c and site-a come back (new node ids, another order) and
    # the run resumes while an impostor claims site-b's name: site-a and site-c keep their
    # client ids and their models; the impostor gets no model and no record, and site-b's
    # stored model stays as it was
    stop_trees([nodes[name].pid for name in NAMES], timeout=10)  # each leaves the SuperLink
    member_supernode(processes, port, files["site-c"], "site-b", "impostor")  # stopped at teardown
    for name in ("site-c", "site-a"):
        nodes[name] = member_supernode(processes, port, files[name], name, f"{name}-again",
                                       keep="federated")
    log = members_run(processes, f"{common} min-nodes=2 strategy='fedamp' num-server-rounds=2 "
                                 "resume=true")
    attacked = fleet_metrics(results, "fedamp", log)
    assert attacked["client_names"] == NAMES and attacked["finished"]
    assert attacked["rounds"][:1] == first["rounds"]  # the first round kept as it was
    second = attacked["rounds"][1]
    assert second["trained_clients"] == [0, 2] and "1" not in second["client_accuracy"]
    assert second["absent_clients"]["1"] == "node not connected"
    assert _store(results, "fedamp", 2)[1] == _store(results, "fedamp", 1)[1]
    assert _store(results, "fedamp", 2)[0] != _store(results, "fedamp", 1)[0]  # site-a trained
    assert "claims member 'site-b': its key SHA256:" in attacked["impostors"][0]["why"]
    assert not (tmp / "impostor-models" / "fedamp").exists()
    for cid, name in ((0, "site-a"), (2, "site-c")):  # the same files, now of round 2
        card = json.loads((tmp / f"{name}-models" / "fedamp" / f"{name}.json").read_text())
        assert (card["member"], card["client_id"], card["round"]) == (name, cid, 2)
    card = json.loads((tmp / "site-b-models" / "fedamp" / "site-b.json").read_text())
    assert card["round"] == 1  # site-b's own machine keeps the model of the round it trained
