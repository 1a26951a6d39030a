"""The checks, scenario and records of one run: a :class:`Tracker`, held by every strategy."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common.constant import ErrorCode
from flwr.supercore import log

from tasks.scenarios import Roles

from .clients import ClientInfo
from .history import RunHistory, client_order
from .protocol import (
    CLIENT_INDEX,
    DECLINED,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    NO_REPLY,
    REFUSED,
    TRAINED_ROUNDS,
    as_int,
)
from .replies import ArraySpec, evaluate_reply_problem, train_reply_problem

TRAIN, EVALUATE = "train", "evaluate"

_ERROR_NAMES = {
    ErrorCode.NODE_UNAVAILABLE: "node unavailable",
    ErrorCode.CLIENT_APP_RAISED_EXCEPTION: "the ClientApp raised an exception",
    ErrorCode.CLIENT_APP_CRASHED: "the ClientApp crashed",
    ErrorCode.LOAD_CLIENT_APP_EXCEPTION: "the ClientApp could not be loaded",
    ErrorCode.MESSAGE_UNAVAILABLE: "message unavailable",
    ErrorCode.REPLY_MESSAGE_UNAVAILABLE: "reply unavailable",
    REFUSED: "the client refused the message",
    DECLINED: "the member declined",
    NO_REPLY: "",  # the server's own reason says it all
}


@dataclass(frozen=True)
class RunTracking:
    """What a strategy is given of the run to track it, beside its settings: the clients
    found (node id -> what each said), the scenario's ``roles``, the update-norm bound (a
    training reply w is left out when ``||w - w_sent||`` exceeds ``max_update_ratio`` x
    ``max(||w_sent||, 1)`` + ``update_noise``, what a member's own noise may add:
    ``dp = "update"``, :func:`tasks.privacy.noise_allowance`), whether a refusal is an
    absence (a run of members, where a member may refuse what its node does not allow)
    rather than a fault that stops the run, and where FedAMP's weight matrices go
    (``xi_sink``; None: kept in the history)."""

    clients: dict[int, ClientInfo] = field(default_factory=dict)
    roles: Roles | None = None
    max_update_ratio: float = 100.0
    update_noise: float = 0.0
    refusals_are_absences: bool = False
    xi_sink: Callable | None = None


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def error_reason(msg: Message) -> str:
    """A Flower error reply in words: what happened, and the reply's own reason."""
    name = _ERROR_NAMES.get(msg.error.code, f"error code {msg.error.code}")
    reason = str(msg.error.reason or "").strip().splitlines()
    if not name:
        return reason[-1][:300] if reason else "no reply"
    return f"{name}: {reason[-1][:300]}" if reason else name


class Tracker:
    """Who the clients are, what the scenario asks of them, and what they answered.

    A strategy holds one (``strategy.tracker``; the ServerApp sets it up from
    the query round with ``strategy.setup_tracking``). It

    * maps Flower node ids to client ids, and back (:meth:`client_of`,
      :meth:`node_of`); a client that comes back on a new node is mapped
      again (:meth:`rejoin`);
    * knows which clients are connected now (:meth:`set_online`);
    * remembers which nodes it sent messages to in a round
      (:meth:`expect`), and screens the replies (:meth:`screen`): a refusal
      stops the run; a reply from a node that was sent nothing, or a second
      reply of a node, is dropped with a warning; error replies, missing
      replies and replies that fail the checks of :mod:`strategies.core.replies`
      are recorded as absent (and rejected) with their reason, so that they
      never reach a stored model;
    * applies the scenario: novel clients and drop-outs (:meth:`participants`),
      per-client epochs (:meth:`client_config`);
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
        self.clients: dict[int, ClientInfo] = dict(clients or {})
        self.roles = roles or Roles(frozenset(), frozenset())
        self.history = RunHistory(novel=self.roles.novel, attackers=self.roles.attackers)
        #: keys, shapes and dtype kinds of the model sent for training (what replies must match)
        self.spec: ArraySpec = {}
        self.online: set[int] = {i.client_id for i in self.clients.values() if i.node_id >= 0}
        # phase -> {node id: client id ("[node N]" for a node no client is on)}
        self._expected: dict[str, dict[int, int | str]] = {}
        self._sent: dict[str, list[Message]] = {}
        self.round_timeout: float | None = None
        #: a run over members' own data: a client's refusal of a message is its absence
        #: (one member must not be able to stop the federation), not the end of the run
        self.refusals_are_absences = False

    def add(self, info: ClientInfo) -> None:
        """Take a client that joined the run (a new member) on its node."""
        self.clients[info.node_id] = info
        log(INFO, "%s joins the run as client %d, on node %d", _upper(info.label),
            info.client_id, info.node_id)

    # -- who is who ----------------------------------------------------------
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

    # -- what was sent, what came back ---------------------------------------
    def expect(self, phase: str, messages: Iterable[Message]) -> None:
        """Remember the nodes (and so the clients) sent a ``phase`` message this round, and
        the messages (their ids, set when they are sent, match each reply to its message)."""
        messages = list(messages)
        self._expected[phase] = {m.metadata.dst_node_id: self.client_of_node(m.metadata.dst_node_id)
                                 for m in messages}
        self._sent[phase] = messages

    def stop_on_refusals(self, server_round: int, replies: Iterable[Message]) -> None:
        """Raise RuntimeError naming the clients that refused their message, if any.

        A client refuses a message it cannot carry out (an unknown client
        update, keys of two methods): the fleet runs other code than the
        server, or the strategy sent a wrong message; either way the run stops.
        In a run over members' own data a refusal is that member's absence (one
        member must not be able to stop the federation), recorded by :meth:`screen`.
        """
        if self.refusals_are_absences:
            return
        refused = sorted((m for m in replies if m.has_error() and m.error.code == REFUSED),
                         key=lambda m: client_order(self.client_of(m)))
        refusals = [f"client {self.client_of(m)}: {m.error.reason}" for m in refused]
        if refusals:
            raise RuntimeError(f"round {server_round}: clients refused the message:\n  "
                               + "\n  ".join(refusals))

    def evaluate_config(self, client_id: int, config: ConfigRecord) -> ConfigRecord:
        """``config`` for one client's evaluation: its id in the run (``client-index``)."""
        own = ConfigRecord(dict(config))
        own[CLIENT_INDEX] = client_id
        return own

    def record_offline(self, server_round: int, phase: str = TRAIN) -> None:
        """Record the clients of ``phase`` whose node is not connected this round as absent
        (training: not the novel clients, which never train)."""
        offline = {i.client_id: "node not connected" for i in self.clients.values()
                   if i.client_id not in self.online
                   and (phase != TRAIN or i.client_id not in self.roles.novel)}
        if offline:
            self.record_absent(server_round, phase, offline, {})

    def screen(self, server_round: int, replies: Iterable[Message], phase: str,
               extra_records: tuple[str, ...] = ()) -> list[Message]:
        """The usable replies of a round's ``phase``, in client-id order; record the others.

        ``extra_records``: names of ArrayRecords a train reply carries beside
        ``arrays`` (checked by the strategy).

        Replies arrive in whatever order the clients finish; sorting them makes
        every sum over clients (the average, Panacea's step) the same in every run.
        """
        replies = list(replies)
        self.stop_on_refusals(server_round, replies)
        expected = self._expected.get(phase)
        # the node each message went to, by message id: Flower's own error reply for a node
        # that is gone (node unavailable) comes from the SuperLink, not from that node
        sent_to = {m.metadata.message_id: m.metadata.dst_node_id
                   for m in self._sent.get(phase, []) if m.metadata.message_id}
        seen: set[int] = set()
        good, absent, rejected = [], {}, {}
        for msg in replies:
            node = msg.metadata.src_node_id
            target = sent_to.get(msg.metadata.reply_to_message_id)
            if msg.has_error() and target is not None and node != target:
                node = target
            if node not in self.clients or (expected is not None and node not in expected):
                log(WARNING, "Round %d: %s reply from node %d dropped: that node was not sent a "
                    "%s message this round", server_round, phase, node, phase)
                continue
            if node in seen:
                log(WARNING, "Round %d: a second %s reply of client %s dropped", server_round,
                    phase, self.client_of(msg))
                continue
            seen.add(node)
            cid = self.clients[node].client_id  # a known node (checked above)
            if msg.has_error():
                absent[cid] = error_reason(msg)
                continue
            problem = self._content_problem(server_round, msg, phase, cid, extra_records)
            if problem is not None:
                absent[cid] = rejected[cid] = f"rejected: {problem}"
                continue
            good.append(msg)
        timeout = f" ({self.round_timeout:g} s)" if self.round_timeout else ""
        for node, expected_cid in (expected or {}).items():
            if node not in seen and isinstance(expected_cid, int):
                absent[expected_cid] = f"no reply within the round timeout{timeout}"
        self.record_absent(server_round, phase, absent, rejected)
        return sorted(good, key=lambda m: client_order(self.client_of(m)))

    def reject(self, server_round: int, phase: str, client_id: int | str, reason: str) -> None:
        """Record a reply that passed :meth:`screen` but that the strategy refuses."""
        self.record_absent(server_round, phase, {client_id: f"rejected: {reason}"},
                           {client_id: f"rejected: {reason}"})

    def record_absent(self, server_round: int, phase: str, absent: dict, rejected: dict) -> None:
        """Warn about and record the clients that did not take part (and why)."""
        for cid in sorted(absent, key=client_order):
            log(WARNING, "Round %d: client %s left out of %s: %s", server_round, cid, phase,
                absent[cid])
        self.history.record_absent(server_round, phase, absent, rejected)

    def _content_problem(self, server_round: int, msg: Message, phase: str, cid: int,
                         extra_records: tuple[str, ...]) -> str | None:
        info = self.info(cid)
        if phase == TRAIN:
            return train_reply_problem(msg, self.spec, info.num_train, cid, server_round,
                                       extra_records)
        return evaluate_reply_problem(msg, info.num_test, cid, server_round)

    # -- records -------------------------------------------------------------
    def record_train(self, server_round: int, replies: list[Message]) -> None:
        """Record the valid training replies of a round."""
        self.history.record_train(server_round, replies, self.client_of)

    def record_evaluation(self, server_round: int, replies: list[Message]) -> dict[str, float]:
        """Record the valid evaluation replies; return the means (see :class:`RunHistory`)."""
        return self.history.record_evaluation(server_round, replies, self.client_of)

    # -- the scenario --------------------------------------------------------
    def sample_training(self, server_round: int, client_ids: Iterable[int], fraction: float,
                        seed: int) -> list[int]:
        """The clients that train in ``server_round``, one rule for every strategy: of the
        given (connected) ``client_ids``, those that train at all (not novel), a seeded
        sample of ``max(1, round(fraction x their number))``, less those that drop out
        (``drop-rate``). In client-id order."""
        pool = sorted(c for c in client_ids if c not in self.roles.novel)
        if not pool:
            return []
        k = max(1, int(round(fraction * len(pool))))
        rng = np.random.default_rng([seed, server_round])
        sampled = sorted(int(c) for c in rng.choice(pool, size=k, replace=False))
        return self.participants(server_round, sampled)

    def participants(self, server_round: int, client_ids: Iterable[int]) -> list[int]:
        """The sampled ``client_ids`` that train in ``server_round``: not novel, not dropped out."""
        training = [c for c in client_ids if c not in self.roles.novel]
        kept = self.roles.participants(server_round, training)
        if len(kept) < len(training):
            log(INFO, "Round %d: clients %s drop out (drop-rate %.2f)", server_round,
                sorted(set(training) - set(kept)), self.roles.drop_rate)
        return kept

    def client_config(self, server_round: int, client_id: int, config: ConfigRecord) -> ConfigRecord:
        """``config`` for one client: its id in the run (``client-index``), how often it
        trained before (so that it can tell a lost state), and its own local epochs (or
        steps) under ``heterogeneous-epochs``."""
        own = ConfigRecord(dict(config))
        own[CLIENT_INDEX] = client_id
        own[TRAINED_ROUNDS] = self.history.times_trained(client_id)
        if self.roles.heterogeneous_epochs:
            key = LOCAL_STEPS if as_int(config.get(LOCAL_STEPS, 0), LOCAL_STEPS) > 0 \
                else LOCAL_EPOCHS
            if key in config:
                own[key] = self.roles.local_units(server_round, client_id,
                                                  as_int(config[key], key))
        return own
