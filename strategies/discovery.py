"""Client discovery: the query round that maps Flower node ids to client ids.

Flower's node ids are random per run; a client's id is the ``partition-id``
of its node's ``node_config``. :func:`discover_clients` asks every node, once
before round 1, who it is and whether it could load its data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import INFO

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

try:  # the grid of a deployed ServerApp (Flower 1.41)
    from flwr.superlink.grid.http_grid import HttpGrid
except ImportError:  # another Flower: its own pulling
    HttpGrid = ()  # type: ignore[assignment,misc]

from .protocol import CLIENT_ID, CONFIG, ERROR, NUM_PARTITIONS, NUM_TEST, NUM_TRAIN, QUERY, QUERY_CLIENT_INFO
from .protocol import INFO as INFO_RECORD


#: Seconds between two pulls of replies from the SuperLink. Flower's deployed grid
#: (``HttpGrid``) pulls every 3 s, its simulation grid every 0.1 s: a reply that comes in
#: just after a pull would wait up to 3 s per phase of a deployed round.
PULL_INTERVAL = 0.1


def send_and_receive(grid: Grid, messages: list[Message], timeout: float | None
                     ) -> list[Message]:
    """Flower's ``Grid.send_and_receive`` (push the messages, pull the replies until all
    came or ``timeout`` seconds passed), pulling every :data:`PULL_INTERVAL` seconds on
    a deployed grid; other grids (simulation, tests) use their own."""
    if not messages:
        return []
    if not isinstance(grid, HttpGrid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    end = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    while True:
        got = list(grid.pull_messages(waiting))
        replies += got
        waiting -= {m.metadata.reply_to_message_id for m in got}
        if not waiting or (end is not None and time.monotonic() >= end):
            return replies
        time.sleep(PULL_INTERVAL)


class ClientSetupError(RuntimeError):
    """The clients cannot run: one could not load its data, too few joined, or they disagree."""


@dataclass(frozen=True)
class ClientInfo:
    """What a node said about itself in the query round."""

    node_id: int
    client_id: int
    num_partitions: int
    num_train: int
    num_test: int


def _parse_info(node: int, reply: Message) -> ClientInfo | str:
    """A node's query answer as a ClientInfo, or why it cannot take part (an untrusted reply)."""
    if reply.has_error():
        return f"node {node}: {reply.error.reason}"
    cfg = reply.content.config_records.get(INFO_RECORD)
    if cfg is None:
        return f"node {node}: no '{INFO_RECORD}' record in the query answer"
    if cfg.get(ERROR):
        return f"client {cfg.get(CLIENT_ID, '?')} (node {node}): {cfg[ERROR]}"
    values = {}
    for key, low in ((CLIENT_ID, 0), (NUM_PARTITIONS, 1), (NUM_TRAIN, 0), (NUM_TEST, 0)):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return f"node {node}: query answer '{key}' = {v!r} is not an integer >= {low}"
        values[key] = v
    if values[CLIENT_ID] >= values[NUM_PARTITIONS]:
        return (f"node {node}: query answer '{CLIENT_ID}' = {values[CLIENT_ID]} is outside "
                f"[0, num-partitions = {values[NUM_PARTITIONS]})")
    return ClientInfo(node, values[CLIENT_ID], values[NUM_PARTITIONS], values[NUM_TRAIN],
                      values[NUM_TEST])


def query_nodes(grid: Grid, node_ids: list[int], timeout: float
                ) -> tuple[dict[int, ClientInfo], dict[int, str]]:
    """Ask ``node_ids`` who they are; return their infos and, for the others, why not."""
    messages = [Message(RecordDict({CONFIG: ConfigRecord({QUERY: QUERY_CLIENT_INFO})}),
                        message_type=MessageType.QUERY, dst_node_id=n) for n in node_ids]
    infos: dict[int, ClientInfo] = {}
    errors: dict[int, str] = {}
    for reply in send_and_receive(grid, messages, timeout):
        node = reply.metadata.src_node_id
        if node not in node_ids or node in infos or node in errors:
            continue  # not asked, or a second answer
        parsed = _parse_info(node, reply)
        if isinstance(parsed, ClientInfo):
            infos[node] = parsed
        else:
            errors[node] = parsed
    for node in node_ids:
        if node not in infos and node not in errors:
            errors[node] = f"node {node}: no answer to the query within {timeout:.0f}s"
    return infos, errors


def discover_clients(
    grid: Grid, min_nodes: int, timeout: float = 600.0, poll: float = 1.0
) -> dict[int, ClientInfo]:
    """Query every connected node for its client id; return ``{node_id: info}``.

    Waits until at least ``min_nodes`` nodes are connected and have answered
    (asking each node once, as it connects), then checks the answers: every
    node must have loaded its data (a node that could not says why, and that
    reason is raised here, before any training), client ids must be unique
    and all nodes must agree on the number of partitions.

    Raises
    ------
    RuntimeError
        If ``min_nodes`` nodes do not connect within ``timeout`` (naming the
        partition ids still missing) or a node reports an error.
    """
    deadline = time.monotonic() + timeout
    infos: dict[int, ClientInfo] = {}
    while True:
        node_ids = sorted(grid.get_node_ids())
        infos = {n: i for n, i in infos.items() if n in node_ids}  # forget nodes that left
        new = [n for n in node_ids if n not in infos]
        if new:
            found, errors = query_nodes(grid, new, max(deadline - time.monotonic(), 1.0))
            if errors:
                raise ClientSetupError("clients could not start:\n  " + "\n  ".join(errors.values()))
            infos.update(found)
        if len(infos) >= min_nodes:
            break
        if time.monotonic() > deadline:
            parts = {i.num_partitions for i in infos.values()}
            have = {i.client_id for i in infos.values()}
            missing = (f"partition ids {sorted(set(range(max(parts))) - have)} of "
                       f"num-partitions = {max(parts)} are missing" if parts else
                       "no node has connected")
            raise ClientSetupError(f"only {len(infos)} node(s) connected after {timeout:.0f}s "
                               f"(node-wait-timeout); min-nodes is {min_nodes}: {missing}")
        log(INFO, "Waiting for nodes: %d connected, min-nodes %d", len(infos), min_nodes)
        time.sleep(poll)
    ids = [i.client_id for i in infos.values()]
    if len(set(ids)) != len(ids):
        raise ClientSetupError(f"two nodes have the same partition-id: {sorted(ids)}")
    parts = {i.num_partitions for i in infos.values()}
    if len(parts) != 1:
        raise ClientSetupError(f"nodes disagree on num-partitions: {sorted(parts)}")
    (num_partitions,) = parts
    if sorted(ids) != list(range(num_partitions)):
        raise ClientSetupError(
            f"found clients {sorted(ids)} but num-partitions = {num_partitions}: every "
            f"partition id 0..{num_partitions - 1} must have one node; set min-nodes = "
            f"{num_partitions} so that the ServerApp waits for all of them"
        )
    sizes = [i.num_train for i in infos.values()]
    log(INFO, "Found %d clients (partition ids 0..%d), %d to %d training samples each",
        len(ids), num_partitions - 1, min(sizes), max(sizes))
    return infos
