"""Who the clients of a run are: what a node says about itself in the query round."""

from __future__ import annotations

from dataclasses import dataclass


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
