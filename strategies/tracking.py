"""The checks, scenario and records of one run: a :class:`Tracker`, held by every strategy."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message
from flwr.supercore import log

from tasks.scenarios import Roles

from .discovery import ClientInfo
from .history import RunHistory, client_order
from .protocol import LOCAL_EPOCHS, LOCAL_STEPS, REFUSED
from .replies import reply_problem


class Tracker:
    """Who the clients are, what the scenario asks of them, and what they answered.

    A strategy holds one (``strategy.tracker``; the ServerApp sets it up from
    the query round with :meth:`Strategy.setup_tracking`). It

    * maps Flower node ids to client ids (:meth:`client_of`),
    * stops the run when a client refuses a message (:meth:`stop_on_refusals`),
    * leaves unusable training replies out, with a warning naming the client
      (:meth:`valid_train_replies`), so they never reach a stored model,
    * applies the scenario: novel clients and drop-outs (:meth:`participants`),
      per-client epochs (:meth:`client_config`),
    * records every round in :attr:`history`.

    Parameters
    ----------
    clients : dict[int, ClientInfo] | None
        Node id to what the node said in the query round.
    roles : Roles | None
        The scenario of the run (none by default).
    """

    def __init__(self, clients: dict[int, ClientInfo] | None = None,
                 roles: Roles | None = None) -> None:
        self.clients = dict(clients or {})
        self.roles = roles or Roles(frozenset(), frozenset())
        self.history = RunHistory(novel=self.roles.novel, attackers=self.roles.attackers)
        #: keys and shapes of the model sent for training (what replies must match)
        self.shapes: dict[str, tuple[int, ...]] = {}

    def client_of_node(self, node_id: int) -> int | str:
        """Client id of a node (the node id in brackets if unknown)."""
        info = self.clients.get(node_id)
        return info.client_id if info else f"[node {node_id}]"

    def client_of(self, msg: Message) -> int | str:
        """Client id of a reply's sender (the node id in brackets if unknown)."""
        return self.client_of_node(msg.metadata.src_node_id)

    def stop_on_refusals(self, server_round: int, replies: Iterable[Message]) -> None:
        """Raise RuntimeError naming the clients that refused their message, if any.

        A client refuses a message it cannot carry out (an unknown client
        update, keys of two methods): the fleet runs other code than the
        server, or the strategy sent a wrong message; either way the run stops.
        """
        refused = sorted((m for m in replies if m.has_error() and m.error.code == REFUSED),
                         key=lambda m: client_order(self.client_of(m)))
        refusals = [f"client {self.client_of(m)}: {m.error.reason}" for m in refused]
        if refusals:
            raise RuntimeError(f"round {server_round}: clients refused the message:\n  "
                               + "\n  ".join(refusals))

    def valid_train_replies(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """Return the usable replies, in the order of their client ids; warn about the others.

        Replies arrive in whatever order the clients finish; sorting them makes
        every sum over clients (the average, Panacea's step) the same in every run.
        """
        replies = list(replies)
        self.stop_on_refusals(server_round, replies)
        good = []
        for msg in replies:
            problem = (reply_problem(msg, self.shapes) if msg.metadata.src_node_id in self.clients
                       else "node joined after the start of the run")
            if problem is None:
                good.append(msg)
            else:
                log(WARNING, "Round %d: reply of client %s left out: %s",
                    server_round, self.client_of(msg), problem)
        return sorted(good, key=lambda m: client_order(self.client_of(m)))

    def record_train(self, server_round: int, replies: list[Message]) -> None:
        """Record the valid training replies of a round."""
        self.history.record_train(server_round, replies, self.client_of)

    def record_evaluation(self, server_round: int, replies: Iterable[Message]) -> dict[str, float]:
        """Record every client's test metrics; return the means (see :class:`RunHistory`)."""
        replies = list(replies)
        self.stop_on_refusals(server_round, replies)
        return self.history.record_evaluation(server_round, replies, self.client_of)

    def participants(self, server_round: int, client_ids: Iterable[int]) -> list[int]:
        """The sampled ``client_ids`` that train in ``server_round``: not novel, not dropped out."""
        training = [c for c in client_ids if c not in self.roles.novel]
        kept = self.roles.participants(server_round, training)
        if len(kept) < len(training):
            log(INFO, "Round %d: clients %s drop out (drop-rate %.2f)", server_round,
                sorted(set(training) - set(kept)), self.roles.drop_rate)
        return kept

    def client_config(self, server_round: int, client_id: int, config: ConfigRecord) -> ConfigRecord:
        """``config`` for one client: its own local epochs (or steps) under ``heterogeneous-epochs``."""
        if not self.roles.heterogeneous_epochs:
            return config
        key = LOCAL_STEPS if int(config.get(LOCAL_STEPS, 0)) > 0 else LOCAL_EPOCHS
        if key not in config:
            return config
        own = ConfigRecord(dict(config))
        own[key] = self.roles.local_units(server_round, client_id, int(config[key]))
        return own
