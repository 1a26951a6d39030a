"""Client discovery: the query round that maps Flower node ids to client ids.

Flower's node ids are random per run (and change when a SuperNode restarts).
In a partitioned run a client's id is the ``partition-id`` of its node's
``node_config``: :func:`discover_clients` asks every node, once before round
1, who it is and whether it could load its data. In a run over members' own
data a client is a member, named by its node config's ``client-id``:
:func:`discover_members` asks every node for its name, the proof of that name (its
signature over a fresh challenge, :mod:`fedamp_flwr.identity`) and its data's schema,
refuses a node that cannot prove the name (its attempt recorded), leaves out (with one
line naming it) a member whose data does not fit the run or whose name another
connected node has, and numbers the members in the order of their names (members
known from a checkpoint keep their numbers).
"""

from __future__ import annotations

import secrets
import time
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.core.protocol import (
    CHALLENGE,
    CLIENT_ID,
    CONFIG,
    ERROR,
    FEATURE_COUNT,
    FEATURE_M2,
    FEATURE_ROW_MEAN,
    INPUT_SHAPE,
    MEMBER,
    MEMBER_KEY,
    NUM_OUTPUTS,
    NUM_PARTITIONS,
    NUM_TEST,
    NUM_TRAIN,
    PROOF,
    QUERY,
    QUERY_CLIENT_INFO,
    QUERY_LEFT_OUT,
    TASK_KIND,
    is_name,
)
from strategies.core.protocol import INFO as INFO_RECORD
from strategies.core.roster import ClientInfo
from tasks.members import MemberSchema
from tasks.tabular import stats_problem

from .. import identity
from .membership import Impostor, Membership, Refusal, number_members
from .transport import send_and_receive


class ClientSetupError(RuntimeError):
    """The clients cannot run: one could not load its data, too few joined, or they disagree."""


class Problem(str):
    """Why a node cannot take part, as its line says it (``who: reason``), with who and the
    reason kept apart: :func:`setup_failures` groups nodes by their reason without parsing
    the line back (a reason is an untrusted node's own words)."""

    who: str
    reason: str

    def __new__(cls, who: str, reason: str) -> Problem:
        said = super().__new__(cls, f"{who}: {reason}")
        said.who, said.reason = who, reason
        return said

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  # copied, pickled
        return self.who, self.reason


def _text(value: object) -> str:
    """A value of an untrusted reply as text (bytes decoded, at most 1,000 characters)."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text[:1000]


def _parse_info(node: int, reply: Message, members: Membership | None = None,
                challenge: bytes = b"") -> ClientInfo | str:
    """A node's query answer as a ClientInfo, or why it cannot take part (an untrusted reply).

    With ``members`` (a run over members' own data) the answer must be a member's, proved
    with the key bound to its name (``challenge``: what this node was asked to sign), and
    a member whose data does not fit is a :class:`Refusal`.
    """
    if reply.has_error():
        return Problem(f"node {node}", str(reply.error.reason))
    cfg = reply.content.config_records.get(INFO_RECORD)
    if cfg is None:
        return Problem(f"node {node}", f"no '{INFO_RECORD}' record in the query answer")
    if members is not None and members.schema is not None:
        return _parse_member(node, cfg, members, members.schema, challenge)
    if cfg.get(ERROR):
        return Problem(f"client {_text(cfg.get(CLIENT_ID, '?'))} (node {node})", _text(cfg[ERROR]))
    values = {}
    for key, low in ((CLIENT_ID, 0), (NUM_PARTITIONS, 1), (NUM_TRAIN, 0), (NUM_TEST, 0)):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return Problem(f"node {node}", f"query answer '{key}' = {v!r} is not an integer >= {low}")
        values[key] = v
    if values[CLIENT_ID] >= values[NUM_PARTITIONS]:
        return Problem(f"node {node}", f"query answer '{CLIENT_ID}' = {values[CLIENT_ID]} is "
                       f"outside [0, num-partitions = {values[NUM_PARTITIONS]})")
    return ClientInfo(node, values[CLIENT_ID], values[NUM_PARTITIONS], values[NUM_TRAIN],
                      values[NUM_TEST])


def _parse_member(node: int, cfg, members: Membership, schema: MemberSchema,
                  challenge: bytes) -> ClientInfo | str:
    name = cfg.get(MEMBER)
    if not is_name(name):
        return Problem(f"node {node}", f"the query answer names no member ('{MEMBER}' = "
                       f"{_text(repr(name))[:80]}); is the fleet running this app with dataset "
                       '= "members" (client-id: letters, digits and - _ . @, at most 64)?')
    who = f"member '{name}' (node {node})"
    # nothing a node says is believed before it proves the name it claims
    key, proof = cfg.get(MEMBER_KEY), cfg.get(PROOF)
    if not isinstance(key, bytes) or not isinstance(proof, bytes):
        why = _text(cfg[ERROR]) if cfg.get(ERROR) else (
            "no proof of the name in its answer (a node of another version of this app?)")
        return Impostor(f"node {node} claims member '{name}' and cannot prove it: {why}")
    if not identity.verify(key, proof, challenge, name, node):
        return Impostor(f"node {node} claims member '{name}': its proof does not verify (it "
                        f"does not hold the key {identity.fingerprint(key)} it names)")
    refusal = members.binding_refusal(node, name, key)
    if refusal is not None:
        return refusal
    if cfg.get(ERROR):
        return Refusal(f"{who}: {_text(cfg[ERROR])}")
    values = {}
    for k, low in ((NUM_TRAIN, 1), (NUM_TEST, 1), (NUM_OUTPUTS, 1)):
        v = cfg.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return Refusal(f"{who}: query answer '{k}' = {v!r} is not an integer >= {low}")
        values[k] = v
    shape = _text(cfg.get(INPUT_SHAPE, ""))[:60]
    want = ",".join(map(str, schema.input_shape))
    if shape != want:
        return Refusal(f"{who}: its data has inputs of shape ({shape}), the run expects ({want})")
    kind = cfg.get(TASK_KIND)
    if kind != schema.kind:
        return Refusal(f"{who}: its data is for {_text(repr(kind))[:40]}, the run is a "
                       f"{schema.kind}")
    outputs = values[NUM_OUTPUTS]
    if (outputs > schema.num_outputs if kind == "classification" else outputs != schema.num_outputs):
        what = "labels up to" if kind == "classification" else "outputs"
        return Refusal(f"{who}: its data has {what} {outputs}, the run has "
                       f"{schema.num_outputs} (member-outputs)")
    stats = _column_stats(cfg, values[NUM_TRAIN], schema)
    if isinstance(stats, str):
        return Refusal(f"{who}: {stats}")
    return ClientInfo(node, -1, 0, values[NUM_TRAIN], values[NUM_TEST], name, key, stats)


def _column_stats(cfg, num_train: int, schema: MemberSchema) -> tuple | str:
    """A member's training rows' count and per-column means and centred sums of squares,
    checked (an untrusted answer: :func:`tasks.tabular.stats_problem`); () where it gave
    none, or why they cannot be used."""
    if FEATURE_COUNT not in cfg:
        return ()
    count, means, m2 = cfg.get(FEATURE_COUNT), cfg.get(FEATURE_ROW_MEAN), cfg.get(FEATURE_M2)
    features = schema.input_shape[0] if len(schema.input_shape) == 1 else -1
    problem = stats_problem(count, means, m2, num_train, features)
    if problem is not None:
        return f"its column statistics cannot be pooled: {problem}"
    return (count, tuple(means), tuple(m2))


#: the longest reason a node is told (a reason names a few nodes and one problem)
MOST_TOLD = 2000
#: seconds to wait for nodes told why they are left out to take the word
TELL_WAIT = 10.0


def tell_left_out(grid: Grid, reasons: dict[int, str]) -> None:
    """Tell each node of ``reasons`` why the run leaves it out (or holds it back), so that the
    member reads it in its own node's log (:func:`fedamp_flwr.client_app.query` logs it as a
    WARNING): one query message each, their answers waited for at most :data:`TELL_WAIT`
    seconds (a node that does not answer delays its discovery step by that, once: a node
    refused for good is not asked again while it stays connected)."""
    if not reasons:
        return
    messages = [Message(RecordDict({CONFIG: ConfigRecord({
        QUERY: QUERY_LEFT_OUT, ERROR: str(reason)[:MOST_TOLD]})}),
        message_type=MessageType.QUERY, dst_node_id=node) for node, reason in reasons.items()]
    try:
        send_and_receive(grid, messages, TELL_WAIT)
    except Exception as err:  # a word to a node left out never stops the run
        log(WARNING, "Could not tell node(s) %s why they are left out (%s: %s)",
            sorted(reasons), type(err).__name__, err)


def query_nodes(grid: Grid, node_ids: list[int], timeout: float,
                members: Membership | None = None) -> tuple[dict[int, ClientInfo], dict[int, str]]:
    """Ask ``node_ids`` who they are; return their infos and, for the others, why not
    (``members``: a run over members' own data, see :func:`_parse_info`). Each node is
    sent a challenge of its own, fresh random bytes that a member signs."""
    challenges = {n: secrets.token_bytes(identity.CHALLENGE_BYTES) for n in node_ids}
    messages = [Message(RecordDict({CONFIG: ConfigRecord({QUERY: QUERY_CLIENT_INFO,
                                                          CHALLENGE: challenges[n]})}),
                        message_type=MessageType.QUERY, dst_node_id=n) for n in node_ids]
    infos: dict[int, ClientInfo] = {}
    errors: dict[int, str] = {}
    sent = {m.metadata.message_id: m.metadata.dst_node_id for m in messages
            if m.metadata.message_id}  # ids set as they were pushed (none in process)
    for reply in send_and_receive(grid, messages, timeout):
        # the node asked: an error reply of the SuperLink or the grid names another sender
        node = sent.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        if node not in node_ids or node in infos or node in errors:
            continue  # not asked, or a second answer
        parsed = _parse_info(node, reply, members, challenges[node])
        if isinstance(parsed, ClientInfo):
            infos[node] = parsed
        else:
            errors[node] = parsed
    for node in node_ids:
        if node not in infos and node not in errors:
            errors[node] = Problem(f"node {node}", f"no answer to the query within {timeout:.0f}s")
    return infos, errors


def setup_failures(errors: dict[int, str]) -> str:
    """The nodes that could not start (``errors``: node id -> what :func:`query_nodes` said),
    one line per reason: where several nodes give the same reason (207 sensors without their
    road graph), it is said once, after how many gave it and the first three, in the order of
    their node ids. A reason that is not a :class:`Problem` is its node's own line."""
    by_reason: dict[str, list[str]] = {}
    alone: dict[str, str] = {}  # a reason given once -> its node's whole line
    for node in sorted(errors):
        said = errors[node]
        who, reason = (said.who, said.reason) if isinstance(said, Problem) else (f"node {node}", said)
        by_reason.setdefault(reason, []).append(who)
        alone[reason] = str(said)
    lines = []
    for reason, nodes in by_reason.items():
        if len(nodes) == 1:
            lines.append(alone[reason])
        else:
            more = f" and {len(nodes) - 3} more" if len(nodes) > 3 else ""
            lines.append(f"{len(nodes)} nodes ({', '.join(nodes[:3])}{more}): {reason}")
    return "clients could not start:\n  " + "\n  ".join(lines)


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
            log(INFO, "Asking %d node(s) which clients they are (each loads its data first)",
                len(new))
            found, errors = query_nodes(grid, new, max(deadline - time.monotonic(), 1.0))
            if errors:
                raise ClientSetupError(setup_failures(errors))
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


def tell_new_nodes(grid: Grid, members: Membership, new: list[int], taken: set[int]) -> None:
    """Tell each node of ``new`` (asked who it is just now) that the run did not take (not in
    ``taken``) why, in its own log (:func:`tell_left_out`), once per node id: its data does
    not fit (the reason, as the coordinator's log has it), it is held back while another
    connected node has or claims its name, its name is not on the roster (a node that
    proved its key learns that much: whether the name it claims is on the roster), or it
    could not prove the name it claims (no more than that: a node that proved nothing
    learns nothing of the roster or the bound keys). A node that did not answer is not told
    (it is asked again later)."""
    said: dict[int, str] = {}
    for node in new:
        if node in taken or node in members.told:
            continue
        if node in members.unlisted:  # it proved its key: it learns only this
            said[node] = ("left out: the member name this node claims is not on the run's "
                          "member-roster (give the coordinator the line `fedamp-flwr identity` "
                          "prints on this machine)")
        elif node in members.blocked:
            said[node] = ("left out: this node could not prove the member name it claims with "
                          "the key the run binds to that name (the key in its identity-dir; "
                          "the coordinator's log says more)")
        elif node in members.pending:
            said[node] = ("held back: another connected node has or claims the client-id "
                          f"'{members.pending[node].name}' (a restarted SuperNode's old node "
                          "counts as connected for about a minute); asked again once only one "
                          "is left")
        elif node in members.refused:
            said[node] = f"left out: {members.refused[node]}"
    members.told.update(said)
    tell_left_out(grid, said)


def discover_members(grid: Grid, min_nodes: int, members: Membership, timeout: float = 600.0,
                     poll: float = 1.0, known: list[str] | None = None
                     ) -> dict[int, ClientInfo]:
    """Query every connected node for its member name and data: the members (node id ->
    info, with their client ids); ``members`` (the run's :class:`Membership`, with its
    ``schema``, the keys a checkpoint bound and the roster) records the rest.

    Waits until at least ``min_nodes`` members have answered with data that fits
    the schema (asking each node once, as it connects). A node that cannot prove
    the name it claims with the key bound to it is refused, and its attempt
    recorded (:meth:`Membership.refuse`). A member whose data does not fit, or that
    could not load it, is left out with a WARNING line naming it, and the others go
    on; so is a node that does not answer (the round loop asks it again). Two nodes
    claiming one name not bound yet are both held back until one of them is gone.
    ``known``: the names of a checkpoint's members, which keep their client ids
    (those not connected now get placeholder entries with negative node ids,
    offline until they come back).

    Raises
    ------
    ClientSetupError
        If fewer than ``min_nodes`` members fit within ``timeout`` (naming the
        nodes left out).
    """
    deadline = time.monotonic() + timeout
    accepted: dict[int, ClientInfo] = {}
    asked: set[int] = set()
    while True:
        node_ids = sorted(grid.get_node_ids())
        live = set(node_ids)
        accepted = {n: i for n, i in accepted.items() if n in live}  # forget nodes that left
        new = [n for n in node_ids if n not in asked]
        found: dict[int, ClientInfo] = {}
        if new:
            asked.update(new)
            found = _ask_new(grid, new, max(deadline - time.monotonic(), 1.0), members)
        accepted.update(members.claim(found, {i.name: n for n, i in accepted.items()}, live,
                                      "Held back: %s"))
        if new:  # each node left out or held back now hears why, in its own log
            tell_new_nodes(grid, members, new, set(accepted))
        if len(accepted) >= min_nodes:
            break
        _check_waiting(members, live, accepted, min_nodes, timeout, deadline)
        log(INFO, "Waiting for members: %d ready, min-nodes %d", len(accepted), min_nodes)
        time.sleep(poll)
    return _numbered(members, accepted, known)


def _ask_new(grid: Grid, new: list[int], timeout: float, members: Membership
             ) -> dict[int, ClientInfo]:
    """The new nodes' answers; impostors refused, nodes whose data does not fit logged."""
    found, errors = query_nodes(grid, new, timeout, members)
    for node, reason in errors.items():
        if isinstance(reason, Refusal):
            members.refuse(node, reason)
        else:
            log(WARNING, "Left out: %s", reason)
    return found


def _check_waiting(members: Membership, live: set[int], accepted: dict[int, ClientInfo],
                   min_nodes: int, timeout: float, deadline: float) -> None:
    """Raise :class:`ClientSetupError` when no wait can give ``min_nodes`` members: the
    fleet ``min-nodes`` asks for is there and every node is left out for good (impostors do
    not count: no one stops a run by opening connections with names it cannot prove), or
    the time is up."""
    left = list(members.refused.values()) + [
        f"member '{i.name}' (node {n}): its name is claimed twice"
        for n, i in members.pending.items()] + [
        a["why"] for a in members.attempts if a["node"] in members.blocked]
    why = ("; left out: " + "; ".join(left)) if left else ""
    fleet = live - members.blocked
    if len(fleet) >= min_nodes and not accepted and not members.pending and all(
            n in members.refused for n in fleet):
        raise ClientSetupError(f"every one of the {len(fleet)} connected node(s) is left "
                               f"out, none can take part (min-nodes is {min_nodes}){why}")
    if time.monotonic() > deadline:
        raise ClientSetupError(f"only {len(accepted)} member(s) with fitting data after "
                               f"{timeout:.0f}s (node-wait-timeout); min-nodes is "
                               f"{min_nodes}{why}")


def _numbered(members: Membership, accepted: dict[int, ClientInfo],
              known: list[str] | None) -> dict[int, ClientInfo]:
    """The accepted members with their client ids (a checkpoint's keep theirs; those not
    connected get offline placeholders), their names bound to their keys."""
    infos, members.names = number_members(accepted, list(known or []))
    for info in accepted.values():  # the members of the run: their names bound to their keys
        members.pin(info)
    present = {i.name for i in infos.values()}
    for cid, name in enumerate(members.names):
        if name not in present:  # a checkpoint's member not connected now: offline
            infos[-(cid + 1)] = ClientInfo(-(cid + 1), cid, 0, 0, 0, name)
    sizes = [i.num_train for i in infos.values() if i.node_id >= 0]
    log(INFO, "Found %d members (%s), %d to %d training samples each", len(present),
        ", ".join(sorted(present)), min(sizes), max(sizes))
    return infos
