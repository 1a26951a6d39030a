"""What was sent, what came back: every reply of a round screened before a strategy sees it.

A :class:`ReplyScreen` remembers which nodes were sent a message in a round's phase
(:meth:`ReplyScreen.expect`) and screens the replies (:meth:`ReplyScreen.screen`): a refusal
stops the run (a member's is its absence); a reply from a node that was sent nothing, or a
second reply of a node, is dropped with a warning; error replies, missing replies and replies
that fail the checks of :mod:`strategies.core.replies` are recorded as absent (and rejected)
with their reason, so that they never reach a stored model.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING

from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.supercore import log

from .history import RunHistory, client_order
from .protocol import DECLINED, NO_REPLY, REFUSED
from .replies import ArraySpec, evaluate_reply_problem, train_reply_problem
from .roster import Roster

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


#: how every reason a client is absent for begins (the rest is the case's own words): the
#: kinds the run's dashboards count absences by
REASON_KINDS = (*(n for n in _ERROR_NAMES.values() if n), "node not connected",
                "no reply within the round timeout", "no reply", "rejected", "error code")


def error_reason(msg: Message) -> str:
    """A Flower error reply in words: what happened, and the reply's own reason."""
    name = _ERROR_NAMES.get(msg.error.code, f"error code {msg.error.code}")
    reason = str(msg.error.reason or "").strip().splitlines()
    if not name:
        return reason[-1][:300] if reason else "no reply"
    return f"{name}: {reason[-1][:300]}" if reason else name


class ReplyScreen:
    """The replies of a run's rounds, screened against what was sent (see the module).

    ``roster``: the run's clients; ``history``: where absences are recorded; ``novel``: the
    clients that never train (not absent from training when offline). ``spec``: keys,
    shapes and dtype kinds of the model sent for training (what replies must match);
    ``round_timeout``: said in a timeout's reason; ``refusals_are_absences``: a run over
    members' own data, where one member must not be able to stop the federation.
    """

    def __init__(self, roster: Roster, history: RunHistory, novel: frozenset = frozenset()
                 ) -> None:
        self.roster, self.history, self.novel = roster, history, novel
        self.spec: ArraySpec = {}
        self.round_timeout: float | None = None
        self.refusals_are_absences = False
        # phase -> {node id: client id ("[node N]" for a node no client is on)}
        self._expected: dict[str, dict[int, int | str]] = {}
        self._sent: dict[str, list[Message]] = {}

    def expect(self, phase: str, messages: Iterable[Message]) -> None:
        """Remember the nodes (and so the clients) sent a ``phase`` message this round, and
        the messages (their ids, set when they are sent, match each reply to its message)."""
        messages = list(messages)
        self._expected[phase] = {m.metadata.dst_node_id: self.roster.client_of_node(
            m.metadata.dst_node_id) for m in messages}
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
                         key=lambda m: client_order(self.roster.client_of(m)))
        refusals = [f"client {self.roster.client_of(m)}: {m.error.reason}" for m in refused]
        if refusals:
            raise RuntimeError(f"round {server_round}: clients refused the message:\n  "
                               + "\n  ".join(refusals))

    def record_offline(self, server_round: int, phase: str = TRAIN) -> None:
        """Record the clients of ``phase`` whose node is not connected this round as absent
        (training: not the novel clients, which never train)."""
        offline = {i.client_id: "node not connected" for i in self.roster.clients.values()
                   if i.client_id not in self.roster.online
                   and (phase != TRAIN or i.client_id not in self.novel)}
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
            if node not in self.roster.clients or (expected is not None and node not in expected):
                log(WARNING, "Round %d: %s reply from node %d dropped: that node was not sent a "
                    "%s message this round", server_round, phase, node, phase)
                continue
            if node in seen:
                log(WARNING, "Round %d: a second %s reply of client %s dropped", server_round,
                    phase, self.roster.client_of(msg))
                continue
            seen.add(node)
            cid = self.roster.clients[node].client_id  # a known node (checked above)
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
        return sorted(good, key=lambda m: client_order(self.roster.client_of(m)))

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
        info = self.roster.info(cid)
        if phase == TRAIN:
            return train_reply_problem(msg, self.spec, info.num_train, cid, server_round,
                                       extra_records)
        return evaluate_reply_problem(msg, info.num_test, cid, server_round)
