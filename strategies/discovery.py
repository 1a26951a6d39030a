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

from .protocol import CLIENT_ID, CONFIG, ERROR, NUM_PARTITIONS, NUM_TEST, NUM_TRAIN, QUERY, QUERY_CLIENT_INFO
from .protocol import INFO as INFO_RECORD


@dataclass(frozen=True)
class ClientInfo:
    """What a node said about itself in the query round."""

    node_id: int
    client_id: int
    num_partitions: int
    num_train: int
    num_test: int


def discover_clients(
    grid: Grid, min_nodes: int, timeout: float = 600.0, poll: float = 1.0
) -> dict[int, ClientInfo]:
    """Query every connected node for its client id; return ``{node_id: info}``.

    Waits until at least ``min_nodes`` nodes are connected, sends each a
    ``query`` message, and checks the answers: every node must have loaded its
    data (a node that could not says why, and that reason is raised here,
    before any training), client ids must be unique and all nodes must agree
    on the number of partitions.

    Raises
    ------
    RuntimeError
        If nodes do not connect within ``timeout`` or a node reports an error.
    """
    deadline = time.monotonic() + timeout
    while len(node_ids := sorted(grid.get_node_ids())) < min_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(node_ids)} node(s) connected after {timeout:.0f}s; "
                f"min-nodes is {min_nodes}"
            )
        log(INFO, "Waiting for nodes: %d connected, min-nodes %d", len(node_ids), min_nodes)
        time.sleep(poll)
    messages = [
        Message(RecordDict({CONFIG: ConfigRecord({QUERY: QUERY_CLIENT_INFO})}),
                message_type=MessageType.QUERY, dst_node_id=n)
        for n in node_ids
    ]
    infos: dict[int, ClientInfo] = {}
    errors: list[str] = []
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            errors.append(f"node {node}: {reply.error.reason}")
            continue
        cfg = reply.content[INFO_RECORD]
        if cfg.get(ERROR):
            errors.append(f"client {cfg.get(CLIENT_ID, '?')} (node {node}): {cfg[ERROR]}")
            continue
        infos[node] = ClientInfo(
            node, int(cfg[CLIENT_ID]), int(cfg[NUM_PARTITIONS]),
            int(cfg[NUM_TRAIN]), int(cfg[NUM_TEST]),
        )
    if errors:
        raise RuntimeError("clients could not start:\n  " + "\n  ".join(errors))
    if len(infos) < len(node_ids):
        raise RuntimeError(f"only {len(infos)} of {len(node_ids)} nodes answered the query")
    ids = [i.client_id for i in infos.values()]
    if len(set(ids)) != len(ids):
        raise RuntimeError(f"two nodes have the same partition-id: {sorted(ids)}")
    parts = {i.num_partitions for i in infos.values()}
    if len(parts) != 1:
        raise RuntimeError(f"nodes disagree on num-partitions: {sorted(parts)}")
    (num_partitions,) = parts
    if sorted(ids) != list(range(num_partitions)):
        raise RuntimeError(
            f"found clients {sorted(ids)} but num-partitions = {num_partitions}: every "
            f"partition id 0..{num_partitions - 1} must have one node; set min-nodes = "
            f"{num_partitions} so that the ServerApp waits for all of them"
        )
    sizes = [i.num_train for i in infos.values()]
    log(INFO, "Found %d clients (partition ids 0..%d), %d to %d training samples each",
        len(ids), num_partitions - 1, min(sizes), max(sizes))
    return infos

