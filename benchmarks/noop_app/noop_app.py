"""Flower's floor: per round a train and an evaluate message to every node, answered at once.

The ServerApp waits for ``min-nodes`` nodes, then each round pushes a train
message to every node, pulls the replies every ``pull-interval`` seconds until
all came, and does the same with an evaluate message, logging "Round k done in
Xs" as this project's ServerApp does. The ClientApp imports only Flower and
replies with an empty record: what a message costs on a SuperNode before any
work of an app.
"""

from __future__ import annotations

import time
from logging import INFO

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


def _exchange(grid: Grid, nodes: list[int], kind: str, pull: float) -> None:
    messages = [Message(RecordDict({"config": ConfigRecord({})}), message_type=kind,
                        dst_node_id=n) for n in nodes]
    waiting = set(grid.push_messages(messages))
    while waiting:
        time.sleep(pull)
        waiting -= {m.metadata.reply_to_message_id for m in grid.pull_messages(waiting)}


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Wait for the nodes, then run the rounds."""
    cfg = context.run_config
    want, pull = int(cfg["min-nodes"]), float(cfg["pull-interval"])
    nodes: list[int] = []
    while len(nodes) < want:
        nodes = sorted(grid.get_node_ids())
        time.sleep(pull)
    for r in range(1, int(cfg["num-server-rounds"]) + 1):
        start = time.perf_counter()
        _exchange(grid, nodes, MessageType.TRAIN, pull)
        _exchange(grid, nodes, MessageType.EVALUATE, pull)
        log(INFO, "Round %d done in %.2fs", r, time.perf_counter() - start)


@client.train()
def train(msg: Message, context: Context) -> Message:
    """Answer at once."""
    return Message(RecordDict(), reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Answer at once."""
    return Message(RecordDict(), reply_to=msg)
