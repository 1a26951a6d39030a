"""A ServerApp that sends one query and waits; a ClientApp that sleeps without a word."""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Ask every node once; wait for the answers as long as it takes."""
    nodes = []
    while not nodes:
        nodes = list(grid.get_node_ids())
        time.sleep(0.5)
    messages = [Message(RecordDict({"config": ConfigRecord({})}), message_type=MessageType.QUERY,
                        dst_node_id=n) for n in nodes]
    grid.send_and_receive(messages)


@client.query()
def query(msg: Message, context: Context) -> Message:
    """Sleep, printing nothing."""
    time.sleep(float(context.run_config["sleep-seconds"]))
    return Message(RecordDict(), reply_to=msg)
