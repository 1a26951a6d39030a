"""Who the members of a run are: their names, their data's schema, who is left out, who is
held back. The app's own state (the strategies never see it), kept by the ServerApp and
used by the query round (:mod:`fedamp_flwr.server.discovery`) and the rounds
(:func:`fedamp_flwr.server.rounds.refresh_clients`).

A member is named by its node config's ``client-id`` and numbered in the order of the
names (a checkpoint's members keep their numbers). A name is bound to a key
(:mod:`fedamp_flwr.identity`): the roster's (run config ``member-roster``) or, without
one, the key the name was first accepted with, kept in the checkpoint (``keys``). A node
that cannot prove the name it claims with that key is refused for good, and its attempt
recorded (``attempts``, :class:`Impostor`): it gets nothing, changes nothing, and holds no
one back (its node is told only that it could not prove the name). A member whose data
does not fit the run is left out for good (``refused``); a
node that proves a name another connected node has (a restarted SuperNode, whose old node
counts as connected for a minute) is held back (``pending``) until that node is gone; two
new nodes claiming a name not bound yet are both held back until only one is left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import WARNING

from flwr.supercore import log

from strategies.core.roster import ClientInfo
from tasks.members import MemberSchema

#: how many refused attempts a run keeps (the newest; their number is kept too)
KEPT_ATTEMPTS = 100


class Refusal(str):
    """Why a member cannot take part (a member may be left out; the others go on)."""


class Impostor(Refusal):
    """Why a node cannot speak for the member it names: it cannot prove the name's key."""


class NotOnRoster(Impostor):
    """Why a node that proved a key cannot speak for the member it names: the run has a
    roster, and the name is not on it. Refused and recorded as an :class:`Impostor` is, but
    logged, and told to its node, as what it is (its key may be fine)."""


def number_members(infos: dict[int, ClientInfo], known: list[str]) -> tuple[dict[int, ClientInfo],
                                                                           list[str]]:
    """Give every member its client id: members ``known`` (a checkpoint's, in its order) keep
    theirs, new ones follow in the order of their names. Returns the infos with their ids and
    the names by id."""
    names = list(known) + sorted({i.name for i in infos.values()} - set(known))
    index = {name: i for i, name in enumerate(names)}
    return ({node: ClientInfo(i.node_id, index[i.name], 0, i.num_train, i.num_test, i.name,
                              i.key, i.stats)
             for node, i in infos.items()}, names)


def accept_members(found: dict[int, ClientInfo], taken: dict[str, int]
                   ) -> tuple[dict[int, ClientInfo], dict[int, str]]:
    """The members of ``found`` (new nodes) whose name no other node claims; for the others,
    why they are held back.

    ``taken``: name -> node of the members the run has on connected nodes; a new node
    claiming one of those names is held back (a restarted SuperNode's old node may still
    count as connected for a minute). Two or more new nodes claiming one name are all
    held back until only one of them is left. (Every node here has proved its name with
    the key bound to it, :meth:`Membership.binding_problem`; two new nodes with different
    keys claim a name not bound yet: nothing tells which is the member's.)
    """
    claims: dict[str, list[int]] = {}
    for node in sorted(found):
        claims.setdefault(found[node].name, []).append(node)
    accepted: dict[int, ClientInfo] = {}
    refused: dict[int, str] = {}
    for name, nodes in claims.items():
        if name in taken:
            for node in nodes:
                refused[node] = Refusal(
                    f"member '{name}' (node {node}): node {taken[name]} already has client-id "
                    f"'{name}'; held back until that node is gone (every member needs its own "
                    "client-id)")
        elif len(nodes) > 1:
            for node in nodes:
                others = ", ".join(str(n) for n in nodes if n != node)
                refused[node] = Refusal(
                    f"member '{name}' (node {node}): node(s) {others} claim the same client-id "
                    f"'{name}'; all are held back until only one is left, every member needs "
                    "its own client-id")
        else:
            accepted[nodes[0]] = found[nodes[0]]
    return accepted, refused


@dataclass
class Membership:
    """The members of a run (empty, with no ``schema``, for a partitioned run).

    Attributes
    ----------
    names : list[str]
        The members' names by client id.
    schema : MemberSchema | None
        What every member's data must look like (None: a partitioned run).
    refused : dict[int, str]
        Node id -> why its member is left out for good (its data does not fit, or it
        cannot join); not asked again.
    blocked : set[int]
        The connected nodes refused for a name they could not prove (in :attr:`attempts`);
        not asked again while they are connected.
    told : set[int]
        The nodes told why the run does not take them (once each).
    pending : dict[int, ClientInfo]
        Nodes held back: their member's name is another connected node's.
    keys : dict[str, bytes]
        Name -> the public key bound to it (the roster's, or pinned when the name was
        first accepted; a checkpoint keeps them).
    roster : dict[str, bytes] | None
        The run's ``member-roster`` (None: none; names are pinned on first use).
    attempts : list[dict]
        The newest :data:`KEPT_ATTEMPTS` nodes refused for a name they could not prove:
        ``node``, ``kind`` ("impostor": a key that is not the one bound to the name; "not on
        the roster": a name the roster does not list), ``why`` (which names the member),
        ``at`` (UTC); ``impostors`` counts all.
    """

    names: list[str] = field(default_factory=list)
    schema: MemberSchema | None = None
    refused: dict[int, str] = field(default_factory=dict)
    pending: dict[int, ClientInfo] = field(default_factory=dict)
    keys: dict[str, bytes] = field(default_factory=dict)
    roster: dict[str, bytes] | None = None
    attempts: list[dict] = field(default_factory=list)
    impostors: int = 0
    blocked: set[int] = field(default_factory=set)
    #: the nodes of :attr:`blocked` whose name is not on the roster (:class:`NotOnRoster`)
    unlisted: set[int] = field(default_factory=set)
    #: the nodes told why the run does not take them (:func:`discovery.tell_new_nodes`)
    told: set[int] = field(default_factory=set)

    def bound_key(self, name: str) -> bytes | None:
        """The key bound to ``name``: the roster's, else the one pinned (None: not bound)."""
        return self.roster.get(name) if self.roster is not None else self.keys.get(name)

    def binding_refusal(self, node: int, name: str, key: bytes) -> Impostor | None:
        """Why node ``node``, holding ``key``, may not speak for ``name`` (None: it may)."""
        problem = self.binding_problem(name, key)
        if problem is None:
            return None
        kind = NotOnRoster if self.roster is not None and name not in self.roster else Impostor
        return kind(f"node {node} claims member '{name}': {problem}")

    def binding_problem(self, name: str, key: bytes) -> str | None:
        """Why the holder of ``key`` may not speak for ``name`` (None: it may)."""
        from ..identity import fingerprint

        if self.roster is not None and name not in self.roster:
            return f"'{name}' is not on the run's member-roster"
        bound = self.bound_key(name)
        if bound is not None and key != bound:
            whose = "the roster's" if self.roster is not None else "the one it was first accepted with"
            return (f"its key {fingerprint(key)} is not the key bound to '{name}' "
                    f"({fingerprint(bound)}, {whose})")
        return None

    def refuse(self, node: int, reason: str, what: str = "Left out: %s") -> None:
        """Leave node ``node`` out for good with ``reason`` (logged once with ``what``, a
        format of one ``%s``); an :class:`Impostor` is recorded in :attr:`attempts` too."""
        self.pending.pop(node, None)
        if isinstance(reason, Impostor):  # not asked again while it is connected
            self.blocked.add(node)
            if isinstance(reason, NotOnRoster):
                self.unlisted.add(node)
            self.impostors += 1
            self.attempts.append({"node": node, "kind": "not on the roster" if isinstance(
                reason, NotOnRoster) else "impostor", "why": str(reason),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            del self.attempts[:-KEPT_ATTEMPTS]  # the newest: a node may come back for ever
            log(WARNING, "Not on the member-roster, refused: %s" if isinstance(
                reason, NotOnRoster) else "Impostor refused: %s", reason)
        else:
            self.refused[node] = str(reason)
            log(WARNING, what, reason)

    def id_of_name(self, name: str) -> int | None:
        """The client id of the member ``name`` (None if the run does not know it)."""
        return self.names.index(name) if name in self.names else None

    def joined(self, info: ClientInfo) -> None:
        """Take the name (and bind the key) of a member that joined with the next client id."""
        if info.name and info.client_id == len(self.names):
            self.names.append(info.name)
            self.pin(info)

    def claim(self, found: dict[int, ClientInfo], taken: dict[str, int], live: set[int],
              held_back: str) -> dict[int, ClientInfo]:
        """The nodes of ``found`` (and of those held back before) whose member's name no
        other node claims (:func:`accept_members`); the others are held back, each logged
        once with ``held_back`` (a format of one ``%s``: why). Nodes gone from ``live`` are
        forgotten."""
        self.pending = {n: i for n, i in self.pending.items() if n in live}
        self.blocked &= live  # a node that comes back with a new id proves itself again
        self.unlisted &= live
        candidates = {**self.pending, **found}
        for node, info in list(candidates.items()):  # a key bound since it was held back
            refusal = self.binding_refusal(node, info.name, info.key)
            if refusal is not None:
                self.refuse(node, refusal)
                del candidates[node]
        accepted, conflicts = accept_members(candidates, taken)
        for node, reason in conflicts.items():
            if node not in self.pending:
                log(WARNING, held_back, reason)
            self.pending[node] = candidates[node]
        for node in accepted:
            self.pending.pop(node, None)
        return accepted

    def pin(self, info: ClientInfo) -> None:
        """Bind ``info``'s name to the key it proved, once it is a member of the run (the
        roster's key, or its first; a name that never joins binds nothing)."""
        if info.key and info.name:
            self.keys[info.name] = info.key
