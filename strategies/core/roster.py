"""Who the clients of a run are: what each node said of itself in the query round
(:class:`ClientInfo`), and which node each client is on and whether it is connected now
(:class:`Roster`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO

from flwr.app import Message
from flwr.supercore import log


@dataclass(frozen=True)
class ClientInfo:
    """What a node said about itself in the query round.

    ``client_id`` is the client's id in the run (its partition id, or a member's
    number in the order of the members' names); ``name`` a member's name (its
    node config's ``client-id``), "" in a partitioned run. A negative
    ``node_id`` stands for a member known from a checkpoint whose node has not
    connected (yet). ``key``: the raw public key with which a member proved its name
    (:mod:`fedamp_flwr.identity`), empty in a partitioned run.
    """

    node_id: int
    client_id: int
    num_partitions: int
    num_train: int
    num_test: int
    name: str = ""
    key: bytes = b""
    #: a member's training rows' count, per-column sums and sums of squares (the pooled
    #: standardizing statistics, tasks/tabular.py); empty where it gave none
    stats: tuple = ()

    @property
    def label(self) -> str:
        """How log lines name the client: ``member 'site-3'`` or ``client 3``."""
        return f"member '{self.name}'" if self.name else f"client {self.client_id}"


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


class Roster:
    """The run's clients by Flower node id, and which are connected now.

    It maps node ids to client ids and back (:meth:`client_of`, :meth:`node_of`); a
    client that comes back on a new node is mapped again (:meth:`rejoin`); a member who
    joins late is added (:meth:`add`); :meth:`set_online` takes the nodes connected now.
    """

    def __init__(self, clients: dict[int, ClientInfo] | None = None) -> None:
        self.clients: dict[int, ClientInfo] = dict(clients or {})
        self.online: set[int] = {i.client_id for i in self.clients.values() if i.node_id >= 0}

    def add(self, info: ClientInfo) -> None:
        """Take a client that joined the run (a new member) on its node."""
        self.clients[info.node_id] = info
        log(INFO, "%s joins the run as client %d, on node %d", _upper(info.label),
            info.client_id, info.node_id)

    def client_of_node(self, node_id: int) -> int | str:
        """Client id of a node (the node id in brackets if unknown)."""
        info = self.clients.get(node_id)
        return info.client_id if info else f"[node {node_id}]"

    def client_of(self, msg: Message) -> int | str:
        """Client id of a reply's sender (the node id in brackets if unknown)."""
        return self.client_of_node(msg.metadata.src_node_id)

    def known_client_of(self, msg: Message) -> int:
        """Client id of a reply that :meth:`screen` let through (its sender is a known node)."""
        return self.clients[msg.metadata.src_node_id].client_id

    def node_of(self, client_id: int) -> int:
        """The node a client is on now."""
        for node, info in self.clients.items():
            if info.client_id == client_id:
                return node
        raise KeyError(f"client {client_id} has no node")

    def names(self) -> dict[int, str]:
        """Client id -> a member's name ("" for a partitioned run's client)."""
        return {i.client_id: i.name for i in self.clients.values()}

    def info(self, client_id: int) -> ClientInfo:
        """What the client said in the query round."""
        return self.clients[self.node_of(client_id)]

    def rejoin(self, info: ClientInfo) -> None:
        """Map a client that answered from a new node to that node (its old node is forgotten)."""
        old = [n for n, i in self.clients.items() if i.client_id == info.client_id]
        for node in old:
            del self.clients[node]
        self.clients[info.node_id] = info
        old = [n for n in old if n >= 0]  # a placeholder (negative) is no node
        log(INFO, "%s is back, on node %d (was %s)", _upper(info.label), info.node_id,
            ", ".join(str(n) for n in old) or "unknown")

    def set_online(self, node_ids: Iterable[int]) -> None:
        """The nodes connected now; clients whose node is not among them are offline."""
        connected = set(node_ids)
        self.online = {i.client_id for n, i in self.clients.items() if n in connected}

    def is_online(self, client_id: int) -> bool:
        """Whether the client's node is connected now."""
        return client_id in self.online
