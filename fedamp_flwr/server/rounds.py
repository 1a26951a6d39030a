"""The round loop: Flower's ``Strategy.start`` with what a long run on a real fleet needs.

Like Flower's loop, every round is configure_train, send, aggregate_train,
configure_evaluate, send, aggregate_evaluate. Besides, :func:`run_rounds`

* starts at any round (to resume a run from its checkpoint),
* finds the clients again at the start of every round: a node it has not
  seen is asked who it is (:func:`refresh_clients`), so that a SuperNode that
  was restarted (and got a new node id) gets its own client's model back;
  a client whose node is gone is offline for the round,
* gives the strategies a view of the grid that holds only connected, known
  clients, in client-id order (:func:`online_view`), so that Flower's
  samplers neither wait for a node that is gone nor depend on node ids,
* waits at most ``round_timeout`` seconds for the replies of each phase,
* records the global model's norm per round (``global_norm``; strategies
  that keep a global model),
* calls ``after_round(server_round, arrays, stopping)`` at the end of every round
  (the ServerApp writes metrics.json and the checkpoint there),
* stops the run (:class:`RoundsFailedError`) when no client's training, or
  no client's evaluation, could be used in more than ``max_failed_rounds``
  rounds in a row: every client absent, or every reply rejected (or fewer
  clients evaluated than ``min_clients_evaluated``). A run whose models
  stopped learning never goes on to its end as if it were fine.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.core.base import GridView, RoundStrategy
from strategies.core.layout import read
from strategies.core.records import ABSENT, TRAINED, client_scores, evaluated_clients
from strategies.core.tracking import Tracker

from .delivery import ModelDelivery
from .discovery import ClientInfo, query_nodes, tell_new_nodes
from .membership import Membership, Refusal
from .transport import send_and_receive

#: the log lines of a round's start and end, and their patterns: the runner's progress grid
#: reads a run's log by them (experiments/progress.py)
ROUND_START_LINE, ROUND_DONE_LINE = "[ROUND %d/%d]", "Round %d done in %.2fs%s"
ROUND_START = re.compile(r"\[ROUND (\d+)/(\d+)\]")
ROUND_DONE = re.compile(r"Round (\d+) done in ([0-9.]+)s")


def model_norm(arrays: ArrayRecord) -> float:
    """The L2 norm of all floating-point arrays of a model together."""
    total = 0.0
    for a in arrays.values():
        x = read(a)
        if x.dtype.kind == "f":
            total += float(np.square(x, dtype=np.float64).sum())
    return float(np.sqrt(total))


def online_view(grid: Grid, tracker: Tracker) -> Grid:
    """A view of a Flower ``Grid`` whose nodes are the connected clients', in client-id order
    (a :class:`GridView`: a ``Grid`` to the strategy, every other call its grid's)."""
    return cast(Grid, GridView(grid, [tracker.roster.node_of(c)
                                      for c in sorted(tracker.roster.online)]))


def refresh_clients(tracker: Tracker, members: Membership, grid: Grid, timeout: float,
                    on_join: Callable[[ClientInfo], None] | None = None) -> None:
    """Match the connected nodes to clients: ask nodes not seen before who they are.

    A node that answers with the partition id (or, a member, the name) of a known
    client takes that client's place (the old node is gone: a restarted SuperNode
    gets a new node id). A member the run does not know yet joins through
    ``on_join`` (which gives it the next client id). A member whose name another
    connected node has is held back (``members.pending``) and takes its place once
    that node is gone, a restarted SuperNode's old node counting as connected for
    a minute; two new nodes claiming one name are both held back until one is left.
    A node that cannot prove the member name it claims is refused for good, its attempt
    recorded (``members.attempts``). A member whose data does not fit is left out for
    good (``members.refused``);
    a node that does not answer, or another error, is logged and asked again in
    the next round.
    """
    node_ids = list(grid.get_node_ids())
    live = set(node_ids)
    new = [n for n in node_ids if n not in tracker.roster.clients and n not in members.refused
           and n not in members.blocked
           and n not in members.pending]
    infos: dict[int, ClientInfo] = {}
    errors: dict[int, str] = {}
    if new:
        infos, errors = query_nodes(grid, new, timeout,
                                    members if members.schema is not None else None)
    if members.schema is None:
        num_partitions = {i.num_partitions for i in tracker.roster.clients.values()}
        for node, info in sorted(infos.items()):
            if info.num_partitions not in num_partitions:
                errors[node] = (f"node {node}: num-partitions = {info.num_partitions}, the "
                                f"run has {sorted(num_partitions)}")
            else:
                tracker.roster.rejoin(info)
    else:
        taken = {i.name: n for n, i in tracker.roster.clients.items() if n in live}
        accepted = members.claim(infos, taken, live, "A node that joined is held back: %s")
        for node, info in sorted(accepted.items()):
            cid = members.id_of_name(info.name)
            if cid is not None:
                tracker.roster.rejoin(dataclasses.replace(info, client_id=cid))
                members.pin(info)
            elif on_join is not None:
                on_join(dataclasses.replace(info, client_id=len(members.names)))
            else:
                errors[node] = Refusal(f"{info.label} (node {node}) is not a member of this run")
    for node, reason in errors.items():
        if isinstance(reason, Refusal):  # a member's data that does not fit, or an impostor
            members.refuse(node, reason, "A node that joined cannot take part: %s")
        else:
            log(WARNING, "A node that joined cannot take part: %s", reason)
    if members.schema is not None and new:  # each member not taken hears why, in its log
        tell_new_nodes(grid, members, new, set(tracker.roster.clients))
    tracker.roster.set_online(node_ids)


_NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")


class RoundsFailedError(RuntimeError):
    """No client's training or evaluation could be used in too many rounds in a row."""


def round_failure(record: dict[str, Any], min_evaluated: int = 0) -> str | None:
    """Why no client's training or no client's evaluation was used in a round, or None.

    ``record`` is the round's entry of :class:`strategies.core.history.RunHistory`.
    The reason names the phase, how many clients were left out and the most
    common reason they were; or, with ``min_evaluated``, that fewer clients were
    evaluated.
    """
    evaluated = bool(evaluated_clients(record))
    for phase, used, key in (("training", bool(record.get(TRAINED)), ABSENT["train"]),
                             ("evaluation", evaluated, ABSENT["evaluate"])):
        if used:
            continue
        reasons = [str(r) for r in record.get(key, {}).values()]
        if not reasons:
            return f"no client took part in {phase} (none was connected or sampled)"
        # reasons of one kind differ in their numbers (update norms, counts): count kinds
        kinds = Counter(_NUMBER.sub("#", r) for r in reasons)
        kind, count = kinds.most_common(1)[0]
        example = next(r for r in reasons if _NUMBER.sub("#", r) == kind)
        return (f"no client's {phase} could be used: {len(reasons)} client(s) left out, "
                f"{count} of them because {example}")
    count = len(client_scores(record))
    if count < min_evaluated:
        left = record.get(ABSENT["evaluate"], {})
        why = f"; left out: {_first(left)}" if left else ""
        return (f"only {count} client(s) evaluated, min-clients-evaluated = {min_evaluated}"
                f"{why}")
    return None


def _first(reasons: dict) -> str:
    cid = next(iter(reasons))
    more = f" and {len(reasons) - 1} more" if len(reasons) > 1 else ""
    return f"client {cid}: {reasons[cid]}{more}"


def play_round(strategy: RoundStrategy, grid: Grid, arrays: ArrayRecord, server_round: int,
               train_config: ConfigRecord, evaluate_config: ConfigRecord,
               round_timeout: float, delivery: ModelDelivery | None) -> ArrayRecord:
    """One round's training and evaluation over the connected clients; the global arrays
    after it (unchanged for strategies that keep their own models)."""
    tracker: Tracker = strategy.tracker
    view = online_view(grid, tracker)
    messages = list(strategy.configure_train(server_round, arrays, train_config, view))
    replies = send_and_receive(grid, messages, round_timeout)
    new_arrays, _ = strategy.aggregate_train(server_round, replies)
    if new_arrays is not None:
        arrays = new_arrays
        strategy.history.record_norm(server_round, model_norm(arrays))
    messages = list(strategy.configure_evaluate(server_round, arrays, evaluate_config, view))
    if delivery is not None:
        messages = delivery.instruct(server_round, messages)
    replies = send_and_receive(grid, messages, round_timeout)
    replies, models = ModelDelivery.take(replies)  # a model record never reaches the strategy
    strategy.aggregate_evaluate(server_round, replies)
    if delivery is not None:
        delivery.after_evaluation(server_round, replies, models, tracker.roster.client_of_node)
    return arrays


def run_rounds(
    strategy: RoundStrategy,
    grid: Grid,
    arrays: ArrayRecord,
    *,
    first_round: int,
    last_round: int,
    train_config: ConfigRecord,
    evaluate_config: ConfigRecord,
    round_timeout: float,
    query_timeout: float,
    after_round: Callable[[int, ArrayRecord, bool], None] | None = None,
    max_failed_rounds: int = 0,
    on_join: Callable[[ClientInfo], None] | None = None,
    members: Membership | None = None,
    delivery: ModelDelivery | None = None,
    min_clients_evaluated: int = 0,
) -> ArrayRecord:
    """Run rounds ``first_round..last_round`` of ``strategy``; return the final global arrays.

    ``arrays``: the global model at the start (the initial one, or the checkpoint's);
    strategies that keep their own models (FedAMP, Panacea) leave it as it is. ``on_join``:
    how a member the run does not know yet joins (:func:`refresh_clients`; None: refused).
    ``members``: the run's (none: a partitioned run). ``delivery``: asks for the models of
    the rounds that keep them, and writes those replied (:mod:`fedamp_flwr.server.delivery`).
    Raises :class:`RoundsFailedError` when more than ``max_failed_rounds`` rounds in a row had
    no usable training or evaluation (:func:`round_failure`), after that round's ``after_round``.
    """
    tracker: Tracker = strategy.tracker
    tracker.replies.round_timeout = round_timeout
    members = Membership() if members is None else members
    log(INFO, "Starting %s, rounds %d to %d", type(strategy).__name__, first_round, last_round)
    strategy.summary()
    started = time.monotonic()
    failed_in_a_row = 0
    seconds: list[float] = []  # each round's, for the ETA
    for server_round in range(first_round, last_round + 1):
        round_started = time.monotonic()
        log(INFO, "")
        log(INFO, ROUND_START_LINE, server_round, last_round)
        refresh_clients(tracker, members, grid, query_timeout, on_join)
        arrays = play_round(strategy, grid, arrays, server_round, train_config,
                            evaluate_config, round_timeout, delivery)
        failure = round_failure(strategy.history.rounds.get(server_round, {}),
                                min_clients_evaluated)
        failed_in_a_row = failed_in_a_row + 1 if failure else 0
        stops = bool(failure) and failed_in_a_row > max_failed_rounds
        if after_round is not None:  # a round that stops the run is written as a last one
            after_round(server_round, arrays, stops)
        if stops:
            in_a_row = f"{failed_in_a_row} rounds in a row, " if failed_in_a_row > 1 else ""
            raise RoundsFailedError(
                f"round {server_round}: {failure}; the run stops ({in_a_row}max-failed-rounds = "
                f"{max_failed_rounds}: rounds in a row allowed without usable replies)")
        if failure:
            log(WARNING, "Round %d: %s (%d of max-failed-rounds = %d in a row)", server_round,
                failure, failed_in_a_row, max_failed_rounds)
        _round_done(server_round, round_started, seconds, last_round)
    log(INFO, "Rounds %d to %d done in %.2fs", first_round, last_round, time.monotonic() - started)
    return arrays


def _round_done(server_round: int, round_started: float, seconds: list[float],
                last_round: int) -> None:
    """Add the round's seconds to ``seconds`` and say them, with the rounds left (:func:`eta`)."""
    seconds.append(time.monotonic() - round_started)
    log(INFO, ROUND_DONE_LINE, server_round, seconds[-1], eta(seconds, last_round - server_round))


#: a round over this many times the median of a run's rounds (and over PAUSED_LEAST
#: seconds) is left out of its pace: the machine was paused or asleep during it (a laptop's
#: lid, a VM between sittings), and its seconds say nothing of the rounds left
PAUSED, PAUSED_LEAST = 10.0, 10.0


def unpaused(seconds: Sequence[float]) -> list[float]:
    """The ``seconds`` (a run's rounds, its start's or end's) but those over :data:`PAUSED`
    times their median and over :data:`PAUSED_LEAST` (a paused machine); of two, the longer
    where it is so over the shorter; one as it is."""
    if len(seconds) < 2:
        return list(seconds)
    typical = float(np.median(seconds) if len(seconds) > 2 else min(seconds))
    limit = max(PAUSED * typical, PAUSED_LEAST)
    return [s for s in seconds if s <= limit]


def eta(seconds: Sequence[float], left: int) -> str:
    """The rest of a round's log line: the rounds left and how long they take at the mean
    pace of the rounds done so far (their ``seconds``, each round's, the newest last; a round
    the machine was paused in left out, :func:`unpaused`, and said where it is the newest),
    e.g. "; 8 rounds left, about 0:04:10 (ETA 14:32, at this run's mean pace)"; "" when none
    is left."""
    steady = unpaused(seconds)
    if left <= 0 or not steady:
        return ""
    rest = sum(steady) / len(steady) * left
    clock = time.strftime("%H:%M", time.localtime(time.time() + rest))
    newest_left_out = len(steady) < len(seconds) and seconds[-1] not in steady
    return (f"; {left} round{'s' if left > 1 else ''} left, about "
            f"{int(rest) // 3600}:{int(rest) // 60 % 60:02d}:{int(rest) % 60:02d} "
            f"(ETA {clock}, at this run's mean pace"
            + (f", this round left out: over {PAUSED:g} times the others, the machine paused?"
               if newest_left_out else "") + ")")
