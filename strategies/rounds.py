"""The round loop: Flower's ``Strategy.start`` with what a long run on a real fleet needs.

Like Flower's loop, every round is configure_train, send, aggregate_train,
configure_evaluate, send, aggregate_evaluate. Besides, :func:`run_rounds`

* starts at any round (to resume a run from its checkpoint),
* finds the clients again at the start of every round: a node it has not
  seen is asked who it is (:func:`refresh_clients`), so that a SuperNode that
  was restarted (and got a new node id) gets its own client's model back;
  a client whose node is gone is offline for the round,
* gives the strategies a view of the grid that holds only connected, known
  clients, in client-id order (:class:`OnlineClients`), so that Flower's
  samplers neither wait for a node that is gone nor depend on node ids,
* waits at most ``round_timeout`` seconds for the replies of each phase,
* records the global model's norm per round (``global_norm``; strategies
  that keep a global model),
* calls ``after_round(server_round, arrays)`` at the end of every round
  (the ServerApp writes metrics.json and the checkpoint there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from .discovery import query_nodes, send_and_receive
from .tracking import Tracker


def model_norm(arrays: ArrayRecord) -> float:
    """The L2 norm of all floating-point arrays of a model together."""
    total = 0.0
    for a in arrays.values():
        x = a.numpy()
        if x.dtype.kind == "f":
            total += float(np.square(x, dtype=np.float64).sum())
    return float(np.sqrt(total))


class OnlineClients:
    """A view of a Flower ``Grid`` whose nodes are the connected clients, in client-id order."""

    def __init__(self, grid: Grid, tracker: Tracker) -> None:
        self._grid, self._tracker = grid, tracker

    def get_node_ids(self) -> list[int]:  # noqa: D102
        return [self._tracker.node_of(c) for c in sorted(self._tracker.online)]

    def __getattr__(self, name: str):
        return getattr(self._grid, name)


def refresh_clients(tracker: Tracker, grid: Grid, timeout: float) -> None:
    """Match the connected nodes to clients: ask nodes not seen before who they are.

    A node that answers with the partition id of a known client takes that
    client's place (the old node is gone: a restarted SuperNode gets a new
    node id). Answers that do not fit the run (another num-partitions, an
    error) are logged and the node is left out.
    """
    node_ids = list(grid.get_node_ids())
    new = [n for n in node_ids if n not in tracker.clients]
    if new:
        num_partitions = {i.num_partitions for i in tracker.clients.values()}
        infos, errors = query_nodes(grid, new, timeout)
        for node, info in sorted(infos.items()):
            if info.num_partitions not in num_partitions:
                errors[node] = (f"node {node}: num-partitions = {info.num_partitions}, the run "
                                f"has {sorted(num_partitions)}")
            else:
                tracker.rejoin(info)
        for reason in errors.values():
            log(WARNING, "A node that joined cannot take part: %s", reason)
    tracker.set_online(node_ids)


def run_rounds(
    strategy,
    grid: Grid,
    arrays: ArrayRecord,
    *,
    first_round: int,
    last_round: int,
    train_config: ConfigRecord,
    evaluate_config: ConfigRecord,
    round_timeout: float,
    query_timeout: float,
    after_round: Callable[[int, ArrayRecord], None] | None = None,
) -> ArrayRecord:
    """Run rounds ``first_round..last_round`` of ``strategy``; return the final global arrays.

    ``arrays`` is the global model at the start (the initial model, or the
    checkpoint's when resuming); strategies that keep their own models
    (FedAMP, Panacea) return None from ``aggregate_train`` and it stays.
    """
    tracker: Tracker = strategy.tracker
    tracker.round_timeout = round_timeout
    log(INFO, "Starting %s, rounds %d to %d", type(strategy).__name__, first_round, last_round)
    strategy.summary()
    started = time.monotonic()
    for server_round in range(first_round, last_round + 1):
        round_started = time.monotonic()
        log(INFO, "")
        log(INFO, "[ROUND %d/%d]", server_round, last_round)
        refresh_clients(tracker, grid, query_timeout)
        view = OnlineClients(grid, tracker)
        messages = list(strategy.configure_train(server_round, arrays, train_config, view))
        replies = send_and_receive(grid, messages, round_timeout)
        new_arrays, _ = strategy.aggregate_train(server_round, replies)
        if new_arrays is not None:
            arrays = new_arrays
            strategy.history.record_norm(server_round, model_norm(arrays))
        messages = list(strategy.configure_evaluate(server_round, arrays, evaluate_config, view))
        replies = send_and_receive(grid, messages, round_timeout)
        strategy.aggregate_evaluate(server_round, replies)
        if after_round is not None:
            after_round(server_round, arrays)
        log(INFO, "Round %d done in %.2fs", server_round, time.monotonic() - round_started)
    log(INFO, "Rounds %d to %d done in %.2fs", first_round, last_round, time.monotonic() - started)
    return arrays
