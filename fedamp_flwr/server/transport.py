"""Messages out and replies in: Flower's ``Grid.send_and_receive``, with exactly one reply,
with a true reason, for every message sent.

The one module that knows Flower's deployed grid (``HttpGrid``, a private class of Flower
1.41): on it the replies are pulled every :data:`PULL_INTERVAL` seconds; any other grid
(simulation, the in-process engine, tests) uses its own ``send_and_receive``.
"""

from __future__ import annotations

import sys
import time

from flwr.app import Error, Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from strategies.core.protocol import NO_REPLY

#: the module of the grid of a deployed ServerApp (Flower 1.41's ``HttpGrid``). Not imported
#: here: it imports the SuperLink's state (about 1 s, which every in-process run paid for a
#: class it never meets); a grid that is an ``HttpGrid`` has its module imported already.
_HTTP_GRID = "flwr.superlink.grid.http_grid"


def _is_http_grid(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's deployed grid (another Flower, without one: never)."""
    http_grid = getattr(sys.modules.get(_HTTP_GRID), "HttpGrid", None)
    return isinstance(http_grid, type) and isinstance(grid, http_grid)

#: Seconds between two pulls of replies from the SuperLink. Flower's deployed grid
#: (``HttpGrid``) pulls every 3 s, its simulation grid every 0.1 s: a reply that comes in
#: just after a pull would wait up to 3 s per phase of a deployed round.
PULL_INTERVAL = 0.1


def send_and_receive(grid: Grid, messages: list[Message], timeout: float | None
                     ) -> list[Message]:
    """Flower's ``Grid.send_and_receive`` (push the messages, pull the replies until all
    came or ``timeout`` seconds passed), pulling every :data:`PULL_INTERVAL` seconds on
    a deployed grid; other grids (simulation, tests) use their own.

    Every message with an id gets one reply, with a true reason where its node gave none
    (:func:`unanswered`): a message the SuperLink did not take (its node has left the
    federation: Flower stores no message for it, and its pull returns an error that names
    no message) is answered as node unavailable at once, not waited for; one still
    unanswered when the phase ends is answered as a timeout only if the phase ran until
    its ``timeout``."""
    if not messages:
        return []
    started = time.monotonic()
    if not _is_http_grid(grid):
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        return replies + unanswered(messages, replies, timeout, time.monotonic() - started)
    ids = list(grid.push_messages(messages))
    if not ids:  # Flower's push failed as a whole (a message too large, say: its log says)
        return [_reply(m, NO_REPLY, "the SuperLink took none of this phase's messages "
                       "(Flower's push failed; the ServerApp's log says why)") for m in messages]
    # the order of the ids is the messages' (Flower's push_messages); None or "": not taken
    replies = [_reply(m, ErrorCode.NODE_UNAVAILABLE, f"the SuperLink took no message for "
                      f"node {m.metadata.dst_node_id}: the node has left the federation")
               for m, i in zip(messages, ids) if not i]
    waiting = {i for i in ids if i}
    end = None if timeout is None else started + timeout
    while waiting:
        got = [m for m in grid.pull_messages(waiting)
               if m.metadata.reply_to_message_id in waiting]  # never one naming no message
        replies += got
        waiting -= {m.metadata.reply_to_message_id for m in got}
        if not waiting or (end is not None and time.monotonic() >= end):
            break
        time.sleep(PULL_INTERVAL)
    return replies + unanswered(messages, replies, timeout, time.monotonic() - started)


def _reply(msg: Message, code: int, reason: str) -> Message:
    """An error reply to ``msg``, as if from its node (the server's own words)."""
    return Message(Error(code=code, reason=reason), reply_to=msg)


def unanswered(messages: list[Message], replies: list[Message], timeout: float | None,
               waited: float) -> list[Message]:
    """Error replies (:data:`NO_REPLY`) for the ``messages`` with an id that no reply
    answers: "no reply within the round timeout" where the phase waited ``timeout``
    seconds, else that no reply came although the phase ended sooner (a message of a
    grid without ids, an in-process one, is left as it is)."""
    answered = {r.metadata.reply_to_message_id for r in replies}
    missing = [m for m in messages if m.metadata.message_id and m.metadata.message_id
               not in answered]
    if timeout is not None and waited >= timeout:
        reason = f"no reply within the round timeout ({timeout:g} s)"
    else:
        reason = (f"no reply, and none from the SuperLink for it: the phase ended after "
                  f"{waited:.0f} s, before the round timeout")
    return [_reply(m, NO_REPLY, reason) for m in missing]
