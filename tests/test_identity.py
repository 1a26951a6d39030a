"""A member's name is bound to a key (fedamp_flwr/identity.py): a node that cannot prove the
name it claims gets nothing for it, changes nothing stored under it and holds no one back;
its attempt is recorded. In process; the loopback fleets (with and without SuperNode
authentication) are in tests/test_members_fleet.py and tests/test_fleet_e2e.py."""

from __future__ import annotations

import json
import logging
import stat
import threading
from pathlib import Path

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

import tasks
from experiments.make_sites import member_name, write_sites
from fedamp_flwr import client_app, identity, server_app
from fedamp_flwr.config import ConfigError
from fedamp_flwr.server.results import checkpoint_files
from fedamp_flwr.tools.inprocess import InProcessGrid, task_identity

SIGNED = (b"\x01" * 32, "site-3", 12345)


def test_a_members_key_is_made_once_owner_only_and_proves_its_name(tmp_path):
    folder = tmp_path / "state" / "identity"
    key = identity.member_key(folder, "site-3")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "site-3.key").stat().st_mode) == 0o600
    again = identity.member_key(folder, "site-3")
    public = identity.public_bytes(key)
    assert identity.public_bytes(again) == public and len(public) == 32
    proof = identity.sign(key, *SIGNED)
    assert identity.verify(public, proof, *SIGNED)
    challenge, name, node = SIGNED
    assert not identity.verify(public, proof, b"\x02" * 32, name, node)  # another challenge
    assert not identity.verify(public, proof, challenge, "site-4", node)  # another name
    assert not identity.verify(public, proof, challenge, name, node + 1)  # another node
    other = identity.public_bytes(identity.member_key(folder, "site-4"))
    assert other != public and not identity.verify(other, proof, *SIGNED)
    for bad_key, bad_proof in ((public, proof[:-1]), (public[:-1], proof), ("x", proof),
                               (public, None), (b"\x00" * 32, proof)):
        assert not identity.verify(bad_key, bad_proof, *SIGNED)
    assert identity.parse_key(identity.key_text(public)) == public


def test_processes_starting_at_once_end_with_one_key(tmp_path):
    keys: list[bytes] = []

    def make() -> None:
        keys.append(identity.public_bytes(identity.member_key(tmp_path, "site-1")))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site-1.key"]


def test_a_key_others_could_read_or_plant_is_refused(tmp_path):
    folder = tmp_path / "keys"
    identity.member_key(folder, "site-1")
    (folder / "site-1.key").chmod(0o644)
    with pytest.raises(identity.IdentityError, match=r"site-1.key: this member's key can be "
                                                     r"read by other accounts \(mode 0o644\)"):
        identity.member_key(folder, "site-1")
    (folder / "site-1.key").chmod(0o600)
    folder.chmod(0o777)
    with pytest.raises(identity.IdentityError, match="key folder can be written by other "
                                                     "accounts"):
        identity.member_key(folder, "site-1")
    folder.chmod(0o700)
    (folder / "site-2.key").symlink_to(folder / "site-1.key")
    with pytest.raises(identity.IdentityError, match="is a symbolic link"):
        identity.member_key(folder, "site-2")


def test_a_damaged_key_is_never_replaced(tmp_path):
    (tmp_path / "site-1.key").write_text("not a key")
    (tmp_path / "site-1.key").chmod(0o600)
    with pytest.raises(identity.IdentityError, match="site-1.key: this member's key cannot be "
                                                     "read"):
        identity.member_key(tmp_path, "site-1")
    assert (tmp_path / "site-1.key").read_text() == "not a key"


def test_a_roster_lists_every_problem_with_its_line(tmp_path):
    a = identity.key_text(identity.public_bytes(identity.member_key(tmp_path, "a")))
    b = identity.key_text(identity.public_bytes(identity.member_key(tmp_path, "b")))
    good = tmp_path / "roster.txt"
    good.write_text(f"# the consortium\nsite-a {a}\n\nsite-b {b}  # joined in May\n")
    roster = identity.read_roster(str(good))
    assert sorted(roster) == ["site-a", "site-b"] and identity.key_text(roster["site-a"]) == a
    bad = tmp_path / "bad.txt"
    bad.write_text(f"site-a {a}\nsite-a {b}\nsite-c {a}\nsite d {b}\nsite-e ed25519:AAAA\n"
                   "site-f rsa:xyz\n")
    with pytest.raises(identity.IdentityError) as err:
        identity.read_roster(str(bad))
    said = str(err.value)
    assert said.startswith(f"{bad}: 5 problem(s): ") and "\n" not in said
    for part in ("line 2: member 'site-a' is named twice", "line 3: member 'site-c' has the "
                 "key of 'site-a'", "line 4: not '<client-id> ed25519:<key>'",
                 "line 5: member 'site-e': 3 bytes, a key has 32", "line 6: member 'site-f': "):
        assert part in said, said
    with pytest.raises(identity.IdentityError, match="names no member"):
        (tmp_path / "empty.txt").write_text("# nobody\n")
        identity.read_roster(str(tmp_path / "empty.txt"))


def _sites(tmp_path: Path, n: int) -> tuple[dict, list[dict]]:
    dc = tasks.DataConfig(dataset="synthetic", data_dir="", num_clients=n, seed=0)
    run_config = write_sites(dc, tmp_path / "sites")
    return run_config, [{"data-path": str(tmp_path / "sites" / f"{member_name(i, n)}.npz"),
                         "client-id": member_name(i, n)} for i in range(n)]


def _impostor(tmp_path: Path, victim: dict, data_of: dict) -> dict:
    """A node config claiming ``victim``'s name: another member's data, a key of its own."""
    return {**data_of, "client-id": victim["client-id"],
            "identity-dir": str(tmp_path / "impostor-keys")}


class ArrivingGrid(InProcessGrid):
    """Nodes 100, 101, ... of ``nodes``; the ones in ``late`` connect from round 2 on."""

    def __init__(self, run_config: dict, nodes: list[dict], late: int = 0) -> None:
        super().__init__(run_config, node_configs=nodes, keep_sent=True)
        self.round, self.late = 1, late

    def get_node_ids(self) -> list[int]:
        nodes = list(self.contexts)
        return nodes if self.round >= 2 else nodes[:len(nodes) - self.late]

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout)
        if messages and messages[0].metadata.message_type == MessageType.EVALUATE:
            self.round += 1
        return replies

    def sent_to(self, node: int) -> list[str]:
        return [m.metadata.message_type for m in self.sent if m.metadata.dst_node_id == node]


def _app(grid, cfg: dict) -> dict:
    with task_identity():
        server_app.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                     run_config=cfg))
    return json.loads((Path(cfg["results-dir"]) / cfg["run-name"] / "metrics.json").read_text())


def _config(tmp_path: Path, run_config: dict, name: str, rounds: int, **more) -> dict:
    return {**run_config, "strategy": "fedamp", "fedamp-sigma": 1.0, "local-epochs": 1,
            "num-server-rounds": rounds, "min-nodes": 3, "results-dir": str(tmp_path),
            "run-name": name, "server-device": "cpu", **more}


@pytest.mark.slow
def test_an_impostor_of_a_connected_member_gets_nothing_and_the_member_trains(tmp_path,
                                                                            caplog):
    """Node 103 claims client-0's name in round 2, with a key of its own, while client-0's node
    is connected: refused at once (not held back), its attempt recorded; it is sent nothing
    but the query and then why it is refused (which its node logs), and the run's numbers
    are those of the run without it."""
    run_config, nodes = _sites(tmp_path, 3)
    alone = _app(ArrivingGrid(_config(tmp_path, run_config, "alone", 3), nodes),
                 _config(tmp_path, run_config, "alone", 3))
    grid = ArrivingGrid(_config(tmp_path, run_config, "attacked", 3),
                        nodes + [_impostor(tmp_path, nodes[0], nodes[1])], late=1)
    with caplog.at_level(logging.WARNING):
        attacked = _app(grid, _config(tmp_path, run_config, "attacked", 3))
    assert attacked["client_names"] == ["client-0", "client-1", "client-2"]
    assert attacked["rounds"] == alone["rounds"]
    assert grid.sent_to(103) == [MessageType.QUERY, MessageType.QUERY]
    # told that it could not prove the name, and nothing of the key it is bound to
    told = [r.getMessage() for r in caplog.records if "leaves this node out" in r.getMessage()]
    assert told == ["The run leaves this node out: left out: this node could not prove the "
                    "member name it claims with the key the run binds to that name (the key in "
                    "its identity-dir; the coordinator's log says more)"]
    (attempt,) = attacked["impostors"]
    assert attempt["node"] == 103 and "node 103 claims member 'client-0': its key SHA256:" in \
        attempt["why"] and "is not the key bound to 'client-0'" in attempt["why"]
    assert attempt["kind"] == "impostor"
    assert "Impostor refused: node 103 claims member 'client-0'" in caplog.text
    assert sorted(attacked["member_keys"]) == ["client-0", "client-1", "client-2"]


def test_a_warm_start_keeps_each_returning_name_bound_to_last_seasons_key(tmp_path, caplog):
    """Season 2 warm-starts from season 1, neither with a roster. A node with a key of its own
    claims the returning name client-0 before client-0's node connects: it is refused (the
    name is bound to the key client-0 proved last season), gets nothing (no model, no row,
    no binding); client-0's node then joins with its own key, takes its own model and
    trains."""
    run_config, nodes = _sites(tmp_path, 3)
    models = tmp_path / "impostor-models"
    impostor = {**_impostor(tmp_path, nodes[0], nodes[1]), "model-dir": str(models)}
    first = _app(InProcessGrid(_config(tmp_path, run_config, "season-1", 2), node_configs=nodes),
                 _config(tmp_path, run_config, "season-1", 2))
    cfg = _config(tmp_path, run_config, "season-2", 2, **{
        "warm-start": str(tmp_path / "season-1"), "min-nodes": 2, "seed": 3})
    grid = ArrivingGrid(cfg, [impostor, nodes[1], nodes[2], nodes[0]], late=1)
    with caplog.at_level(logging.INFO):
        second = _app(grid, cfg)
    (attempt,) = second["impostors"]
    assert attempt["node"] == 100 and "node 100 claims member 'client-0': its key" in \
        attempt["why"] and "the one it was first accepted with" in attempt["why"]
    assert grid.sent_to(100) == [MessageType.QUERY, MessageType.QUERY]
    assert not models.exists()  # nothing delivered to the impostor
    assert second["member_keys"] == first["member_keys"]  # client-0's key is last season's
    assert second["warm_start"]["returning"] == ["client-1", "client-2", "client-0"]
    assert second["client_names"] == ["client-1", "client-2", "client-0"]
    assert second["rounds"][0]["trained_clients"] == [0, 1]
    assert second["rounds"][1]["trained_clients"] == [0, 1, 2]  # the real client-0, joined
    assert "Member names bound to the keys they first proved (warm start): client-0 SHA256:" \
        in caplog.text


def _store_row(run: Path, server_round: int, client: int) -> bytes:
    path = next(p for p in checkpoint_files(run) if p.name == f"round-{server_round:06d}.pt")
    state = torch.load(path, weights_only=True)
    return state["strategy"]["models"][client].numpy().tobytes()


def test_an_impostor_of_an_absent_member_on_resume_changes_nothing_of_it(tmp_path, caplog):
    """The run is resumed while client-1's node is away and another node claims its name: it
    gets no model and no record, and client-1's stored model is kept to the byte; client-1,
    back with its own key, gets that model and trains on."""
    run_config, nodes = _sites(tmp_path, 3)
    models = tmp_path / "impostor-models"
    impostor = {**_impostor(tmp_path, nodes[1], nodes[2]), "model-dir": str(models)}
    cfg = _config(tmp_path, run_config, "run", 2)
    first = _app(InProcessGrid(cfg, node_configs=nodes), cfg)
    run = tmp_path / "run"
    cfg = {**cfg, "num-server-rounds": 3, "resume": True, "min-nodes": 2}
    with caplog.at_level(logging.WARNING):
        resumed = _app(InProcessGrid(cfg, node_configs=[impostor, nodes[2], nodes[0]]), cfg)
    assert resumed["client_names"] == first["client_names"]
    third = resumed["rounds"][2]
    assert third["trained_clients"] == [0, 2] and "1" not in third["client_accuracy"]
    assert third["absent_clients"]["1"] == "node not connected"
    assert _store_row(run, 3, 1) == _store_row(run, 2, 1)  # its model, to the byte
    assert not models.exists()  # nothing delivered to the impostor
    assert [a["node"] for a in resumed["impostors"]] == [100]
    assert "node 100 claims member 'client-1': its key" in caplog.text
    cfg = {**cfg, "num-server-rounds": 4, "min-nodes": 3}
    back = _app(InProcessGrid(cfg, node_configs=[nodes[1], nodes[0], nodes[2]]), cfg)
    assert back["rounds"][3]["trained_clients"] == [0, 1, 2]
    assert back["rounds"][:3] == resumed["rounds"]  # the impostor's attempt kept too
    assert back["impostors"] == resumed["impostors"]


def test_with_a_roster_only_its_members_join_each_with_its_key(tmp_path, caplog):
    """A roster (the lines fedamp-flwr identity prints): a member not on it is refused, and an
    impostor that connects at the same time as the member it names is refused at once
    rather than holding the member back."""
    from fedamp_flwr.tools.cli import main

    run_config, nodes = _sites(tmp_path, 3)
    roster = tmp_path / "roster.txt"
    lines = []
    for node in nodes[:2]:
        lines.append(identity.key_text(identity.public_bytes(identity.member_key(
            identity.identity_dir({}), node["client-id"]))))
        assert main(["identity", "--client-id", node["client-id"]]) == 0
    roster.write_text("".join(f"{n['client-id']} {k}\n" for n, k in zip(nodes, lines)))
    cfg = _config(tmp_path, run_config, "rostered", 2, **{"member-roster": str(roster),
                                                          "min-nodes": 2})
    grid = ArrivingGrid(cfg, [_impostor(tmp_path, nodes[0], nodes[2]), *nodes])
    with caplog.at_level(logging.WARNING):
        metrics = _app(grid, cfg)
    assert metrics["client_names"] == ["client-0", "client-1"]
    assert all(r["trained_clients"] == [0, 1] for r in metrics["rounds"])
    why = {a["node"]: a["why"] for a in metrics["impostors"]}
    assert "(SHA256:" in why[100] and "the roster's" in why[100]
    assert why[103] == "node 103 claims member 'client-2': 'client-2' is not on the run's " \
        "member-roster"
    assert metrics["member_roster"] == str(roster)
    assert "held back" not in caplog.text
    # the node whose name is not on the roster is logged and told as that, not as an impostor
    assert "Not on the member-roster, refused: node 103 claims member 'client-2'" in caplog.text
    assert "Impostor refused: node 103" not in caplog.text
    told = [r.getMessage() for r in caplog.records if "leaves this node out" in r.getMessage()]
    assert sorted(told) == [
        "The run leaves this node out: left out: the member name this node claims is not on "
        "the run's member-roster (give the coordinator the line `fedamp-flwr identity` prints "
        "on this machine)",
        "The run leaves this node out: left out: this node could not prove the member name it "
        "claims with the key the run binds to that name (the key in its identity-dir; the "
        "coordinator's log says more)"]


def test_a_bad_roster_stops_the_run_naming_the_key(tmp_path):
    run_config, nodes = _sites(tmp_path, 2)
    (tmp_path / "roster.txt").write_text("client-0 ed25519:nope\n")
    cfg = _config(tmp_path, run_config, "r", 1, **{"member-roster": str(tmp_path /
                                                                       "roster.txt")})
    with pytest.raises(ConfigError, match=r"run config 'member-roster' = '.*roster.txt': "
                                          r".*line 1: member 'client-0'"):
        _app(InProcessGrid(cfg, node_configs=nodes), cfg)
    with pytest.raises(ConfigError, match="'member-roster' = 'x' is invalid; allowed: "):
        _app(InProcessGrid({}, num_clients=2), {"member-roster": "x", "results-dir":
                                                str(tmp_path), "run-name": "p"})


def _query(node_config: dict, run_config: dict, challenge: object) -> ConfigRecord:
    config = {"query": "client-info"} | ({"challenge": challenge} if challenge is not None
                                         else {})
    msg = Message(RecordDict({"config": ConfigRecord(config)}), message_type=MessageType.QUERY,
                  dst_node_id=7)
    ctx = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                  run_config=run_config)
    with task_identity():
        return client_app.query(msg, ctx).content["info"]


def test_a_member_answers_with_its_proof_or_says_why_it_cannot(tmp_path, caplog):
    run_config, nodes = _sites(tmp_path, 2)
    node = {**nodes[0], "identity-dir": str(tmp_path / "keys")}
    info = _query(node, run_config, b"\x05" * 32)
    assert identity.verify(info["member-key"], info["proof"], b"\x05" * 32, "client-0", 7)
    assert info["member-key"] == identity.public_bytes(identity.member_key(tmp_path / "keys",
                                                                           "client-0"))
    with caplog.at_level(logging.WARNING):
        old = _query(node, run_config, None)  # a server of another version
    assert "proof" not in old and "no challenge of 32 bytes" in old["error"]
    assert "This node cannot prove its member name" in caplog.text
    (tmp_path / "file").write_text("")
    bad = _query({**node, "identity-dir": str(tmp_path / "file")}, run_config, b"\x05" * 32)
    assert "proof" not in bad and bad["error"]


def test_a_roster_on_resume_rotates_and_revokes_keys_and_an_old_checkpoint_needs_one(tmp_path,
                                                                                    caplog):
    """Resumed with a roster that gives client-0 a new key and drops client-2: the keys in
    effect are the roster's (client-0's old key and client-2's are gone from the run's
    records and checkpoint), and client-0's node with its old key is refused. A members'
    checkpoint that binds no name (an older version's) resumes only with a roster."""
    run_config, nodes = _sites(tmp_path, 3)
    cfg = _config(tmp_path, run_config, "run", 1)
    first = _app(InProcessGrid(cfg, node_configs=nodes), cfg)
    old = identity.parse_key(first["member_keys"]["client-0"])
    moved = {**nodes[0], "identity-dir": str(tmp_path / "new-keys")}  # client-0's new key
    new = identity.public_bytes(identity.member_key(tmp_path / "new-keys", "client-0"))
    roster = tmp_path / "roster.txt"
    roster.write_text(f"client-0 {identity.key_text(new)}\n"
                      f"client-1 {first['member_keys']['client-1']}\n")
    cfg = {**cfg, "num-server-rounds": 2, "resume": True, "member-roster": str(roster),
           "min-nodes": 2}
    with caplog.at_level(logging.WARNING):
        resumed = _app(InProcessGrid(cfg, node_configs=[nodes[0], moved, nodes[1], nodes[2]]),
                       cfg)
    assert "Member 'client-0': the roster binds its name to the key" in caplog.text
    assert "Member 'client-2' of the run is not on the roster" in caplog.text
    assert sorted(resumed["member_keys"]) == ["client-0", "client-1"]
    assert identity.parse_key(resumed["member_keys"]["client-0"]) == new != old
    assert resumed["rounds"][1]["trained_clients"] == [0, 1]
    why = " ".join(a["why"] for a in resumed["impostors"])
    assert "node 100 claims member 'client-0'" in why and "not on the run's member-roster" in why
    kinds = {a["kind"] for a in resumed["impostors"] if "not on the run's" in a["why"]}
    assert kinds == {"not on the roster"}
    state = torch.load(checkpoint_files(tmp_path / "run")[0], weights_only=True)
    assert sorted(state["member_keys"]) == ["client-0", "client-1"]
    # client-2, dropped by the roster, binds no key: a warm start without a roster would give
    # its stored model to whoever claims its name first, and is refused
    season = {k: v for k, v in {**cfg, "run-name": "season-2", "num-server-rounds": 1,
                                "warm-start": str(tmp_path / "run")}.items()
              if k not in ("resume", "member-roster")}
    with pytest.raises(ConfigError, match=r"binds no key to its member\(s\) \['client-2'\]"):
        _app(InProcessGrid(season, node_configs=nodes), season)
    # a checkpoint of an older version binds no name: refused without a roster
    from fedamp_flwr.server.results import digest_path, seal

    from .helpers import as_older_version

    as_older_version(tmp_path / "run")
    path = checkpoint_files(tmp_path / "run")[0]
    state = torch.load(path, weights_only=True)
    del state["member_keys"]
    torch.save(state, path)
    digest_path(path).write_text(f"{seal(path, None, 'run')}  {path.name}\n")
    cfg = {k: v for k, v in {**cfg, "num-server-rounds": 3}.items() if k != "member-roster"}
    with pytest.raises(ConfigError, match=r"'member-roster' = '': the checkpoint \(run config "
                                          r"'resume' = true\) binds no member name to a key"):
        _app(InProcessGrid(cfg, node_configs=nodes), cfg)
    # nor is a warm start from it (a new season) without a roster
    season = {k: v for k, v in {**cfg, "run-name": "season-2", "warm-start": str(
        tmp_path / "run")}.items() if k != "resume"}
    with pytest.raises(ConfigError, match=r"'member-roster' = '': the checkpoint \(run config "
                                          r"'warm-start' = '.*run'\) binds no member name"):
        _app(InProcessGrid(season, node_configs=nodes), season)
