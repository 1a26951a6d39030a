"""Client discovery: the query round that maps nodes to clients, and clients that cannot start
(a missing data folder, a wrong number of clients, a partition without its node)."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from fedamp_flwr import client_app
from fedamp_flwr.server.discovery import discover_clients

from .helpers import LocalGrid, needs_data

RD = RecordDict


def _context(run_config, pid=0, n=2):
    return Context(run_id=1, node_id=1, node_config={"partition-id": pid, "num-partitions": n},
                   state=RecordDict(), run_config=run_config)


def _query(ctx):
    msg = Message(RD({"config": ConfigRecord({"query": "client-info"})}),
                  message_type=MessageType.QUERY, dst_node_id=1)
    return client_app.query(msg, ctx)


def test_client_reports_missing_data_folder_and_too_many_clients():
    info = _query(_context({"dataset": "mnist", "data-dir": "/no/such/folder"})).content["info"]
    assert "data-dir" in info["error"] and "/no/such/folder" in info["error"]
    ok = _query(_context({})).content["info"]
    assert "error" not in ok and ok["client-id"] == 0 and ok["num-train"] == 500


def test_client_reports_a_federated_task_with_another_number_of_clients():
    folder = needs_data("tpt48")
    run_config = {"dataset": "tpt48", "strategy": "fedavg", "data-dir": str(folder)}
    info = _query(_context(run_config, pid=0, n=40)).content["info"]
    assert "defines 48 clients but num-partitions = 40" in info["error"]


def test_discover_clients_stops_on_a_client_error():
    good = {"client-id": 0, "num-partitions": 2, "num-train": 5, "num-test": 5}
    bad = {"client-id": 1, "error": "ConfigError: run config 'data-dir' = 'x' ..."}
    with pytest.raises(RuntimeError, match="client 1 .*data-dir"):
        discover_clients(LocalGrid(infos={11: good, 12: bad}), min_nodes=2)
    clients = discover_clients(LocalGrid(infos={11: good, 12: {**good, "client-id": 1}}), min_nodes=2)
    assert {n: i.client_id for n, i in clients.items()} == {11: 0, 12: 1}


def test_many_clients_failing_alike_are_one_line():
    """207 nodes without their road graph are one line naming how many, the first three and
    the reason once; other reasons keep their own lines, in the order of the node ids."""
    good = {"num-partitions": 9, "num-train": 5, "num-test": 5}
    reason = "ConfigError: run config 'data-dir' = 'x': no road graph"
    infos = {10 + i: {"client-id": i, "error": reason} for i in range(7)}
    infos[9] = {"client-id": 8, "error": "ConfigError: other"}
    infos[30] = {**good, "client-id": 7}
    with pytest.raises(RuntimeError) as err:
        discover_clients(LocalGrid(infos=infos), min_nodes=9)
    assert str(err.value).splitlines() == [
        "clients could not start:",
        "  client 8 (node 9): ConfigError: other",
        "  7 nodes (client 0 (node 10), client 1 (node 11), client 2 (node 12) and 4 more): "
        + reason]


def test_failures_are_grouped_by_reason_not_by_parsing_the_line():
    """A reason is a node's own words: words that look like another line's ``(node N): ``
    do not move where its reason starts; a line that is not a ``Problem`` is said as it is."""
    from fedamp_flwr.server.discovery import Problem, setup_failures

    odd = "ConfigError: no file (node 3): here"
    said = setup_failures({4: Problem("client 1 (node 4)", odd), 3: Problem("node 3", odd),
                           5: "node 5: its own line"})
    assert said.splitlines()[1:] == [f"  2 nodes (node 3, client 1 (node 4)): {odd}",
                                     "  node 5: its own line"]
    import copy

    said = Problem("node 3", odd)
    # copy goes through __reduce_ex__, as pickling would: both rebuild it from (who, reason)
    assert said.__reduce_ex__(4)[1][1:] == ("node 3", odd)
    for again in (copy.deepcopy(said), copy.copy(said)):
        assert (again, again.who, again.reason) == (f"node 3: {odd}", "node 3", odd)


def test_discovery_needs_every_partition():
    good = {"num-partitions": 3, "num-train": 5, "num-test": 5}
    with pytest.raises(RuntimeError, match="set min-nodes = 3"):
        discover_clients(LocalGrid(infos={1: {**good, "client-id": 0}, 2: {**good, "client-id": 2}}), 2)


def test_a_deployed_grid_is_pulled_often_and_within_the_timeout(monkeypatch):
    """On Flower's deployed grid the replies are pulled every PULL_INTERVAL seconds (not
    Flower's 3 s), until all came or the timeout passed."""
    from types import SimpleNamespace

    from flwr.superlink.grid.http_grid import HttpGrid

    from fedamp_flwr.server import transport

    class FakeHttpGrid(HttpGrid):
        def __init__(self, ready_after: int):
            self.pulls, self.ready_after = 0, ready_after

        def push_messages(self, messages):
            return ["m1", "m2"]

        def pull_messages(self, message_ids):
            self.pulls += 1
            if self.pulls < self.ready_after:
                return []
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m))
                    for m in sorted(message_ids)]

    sleeps = []
    monkeypatch.setattr(transport.time, "sleep", sleeps.append)
    msgs = [Message(RD(), message_type=MessageType.TRAIN, dst_node_id=n) for n in (1, 2)]
    grid = FakeHttpGrid(ready_after=3)
    got = transport.send_and_receive(grid, msgs, timeout=60)
    assert len(got) == 2 and grid.pulls == 3 and sleeps == [transport.PULL_INTERVAL] * 2
    assert transport.PULL_INTERVAL <= 0.2
    never = FakeHttpGrid(ready_after=10**9)
    assert transport.send_and_receive(never, msgs, timeout=0) == [] and never.pulls == 1


def test_every_message_gets_one_reply_with_its_true_reason(monkeypatch):
    """A message the SuperLink does not take (its node left the federation: the push returns
    no id for it, and a pull answers with an error naming no message) is answered as node
    unavailable by its node, at once; a message unanswered when the phase ends before its
    timeout is not called a timeout; one unanswered at the timeout is."""
    from flwr.common.constant import ErrorCode
    from flwr.superlink.grid.http_grid import HttpGrid

    from fedamp_flwr.server import transport
    from strategies.core.protocol import NO_REPLY
    from strategies.core.screening import error_reason

    class Grid(HttpGrid):
        def __init__(self, answer: bool):
            self.answer = answer

        def push_messages(self, messages):
            ids = []
            for m in messages:  # Flower sets each message's id as it pushes it
                m.metadata.__dict__["_message_id"] = m.object_id
                ids.append(None if m.metadata.dst_node_id == 7 else m.metadata.message_id)
            return ids

        def pull_messages(self, message_ids):
            from flwr.app import Error

            lost = Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="unknown"),
                           reply_to=msgs[0])
            lost.metadata.__dict__["_reply_to_message_id"] = ""  # names no message
            done = [Message(RD(), reply_to=m) for m in msgs if m.metadata.message_id
                    in message_ids and m.metadata.dst_node_id == 8] if self.answer else []
            return [lost, *done]

    monkeypatch.setattr(transport.time, "sleep", lambda s: None)
    msgs = [Message(RD({"config": ConfigRecord({"n": n})}), message_type=MessageType.TRAIN,
                    dst_node_id=n) for n in (7, 8, 9)]
    clock = iter(range(0, 1000, 4))
    monkeypatch.setattr(transport.time, "monotonic", lambda: float(next(clock)))
    replies = transport.send_and_receive(Grid(answer=True), msgs, timeout=300)
    by_node = {r.metadata.src_node_id: r for r in replies}
    assert sorted(by_node) == [7, 8, 9] and len(replies) == 3
    assert by_node[7].error.code == ErrorCode.NODE_UNAVAILABLE
    assert error_reason(by_node[7]).startswith("node unavailable: the SuperLink took no message "
                                               "for node 7")
    assert not by_node[8].has_error()
    assert by_node[9].error.code == NO_REPLY
    assert error_reason(by_node[9]) == "no reply within the round timeout (300 s)"
    # a phase that ends before its timeout (a grid's own loop) never says timeout
    early = transport.unanswered(msgs[1:], [by_node[8]], timeout=300, waited=12.0)
    assert [m.metadata.src_node_id for m in early] == [9]
    assert "timeout" not in error_reason(early[0]).replace("before the round timeout", "")


def test_a_push_that_fails_as_a_whole_is_said_for_every_message():
    from flwr.superlink.grid.http_grid import HttpGrid

    from fedamp_flwr.server import transport
    from strategies.core.screening import error_reason

    class Refusing(HttpGrid):
        def __init__(self):
            pass

        def push_messages(self, messages):
            return []  # what Flower returns when the SuperLink refuses the push (too large)

    msgs = [Message(RD(), message_type=MessageType.TRAIN, dst_node_id=n) for n in (4, 5)]
    replies = transport.send_and_receive(Refusing(), msgs, timeout=300)
    assert [r.metadata.src_node_id for r in replies] == [4, 5]
    assert all(error_reason(r).startswith("the SuperLink took none of this phase's messages")
               for r in replies)
