"""Running the app in one process, without Flower's engine: for quick, exact small-model grids.

:class:`InProcessGrid` is a Flower ``Grid`` whose nodes are this app's real
``ClientApp``, called as Flower calls it (``app(message, context)``: its mods
and lifespan run as under Flower), each node with its own ``Context`` (so its
``context.state`` lives across rounds, as on a SuperNode); :func:`run_inprocess`
runs the real ``ServerApp`` on it the same way (``app(grid, context)``). The
messages are real Flower ``Message`` objects, and a ClientApp that raises gives
the error reply a SuperNode gives; what is left out is Flower's transport, the
simulation engine's scheduling and process isolation. The
numbers are those of the simulation engine: the same code, seeds and order
(float sums can differ in the last digits where torch runs with another
number of threads). ``simulation.py --engine inprocess`` uses it; the tests
use it too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from logging import ERROR
from pathlib import Path
from typing import cast

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from flwr.supercore.task_identity import TaskIdentity


@contextlib.contextmanager
def task_identity(run_id: int = 1) -> Iterator[None]:
    """Messages made outside a Flower process need a run, node and task id."""
    names = ("_run_id", "_node_id", "_task_id")
    saved = [getattr(TaskIdentity, n) for n in names]  # the unset ones are None
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, 1
    try:
        yield
    finally:
        for name, value in zip(names, saved):
            setattr(TaskIdentity, name, value)


class InProcessGrid:
    """A Flower ``Grid`` in this process: node ``first_node + i`` is the client with
    ``partition-id`` i of ``num_clients``, answering with the real ClientApp
    (``client_app``: this app's by default).

    With ``node_configs`` (one per node) the nodes have those node configs instead
    (members: ``data-path`` and ``client-id``). With ``infos`` (node id -> the
    ``info`` record a node answers the query round with) the nodes only answer
    queries, as given (for tests of the query round).
    """

    def __init__(self, run_config: dict | None = None, num_clients: int = 0,
                 infos: dict[int, dict] | None = None, first_node: int = 100,
                 keep_sent: bool = False, client_app: ClientApp | None = None,
                 node_configs: list[dict] | None = None) -> None:
        self.run_config = dict(run_config or {})
        self.client_app = client_app
        self.infos = infos
        if node_configs is not None:
            num_clients = len(node_configs)
        nodes = list(infos) if infos is not None else [first_node + i for i in range(num_clients)]
        configs = node_configs or [{"partition-id": i, "num-partitions": num_clients}
                                   for i in range(len(nodes))]
        self.contexts = {
            node: Context(run_id=1, node_id=node, state=RecordDict(), run_config=self.run_config,
                          node_config=dict(node_config))
            for node, node_config in zip(nodes, configs)
        }
        # the messages sent, for tests (``keep_sent``): a run keeps none, since a
        # personalized strategy's messages hold a model per client and round
        self.keep_sent = keep_sent
        self.sent: list[Message] = []

    def get_node_ids(self) -> list[int]:
        """The nodes (all connected)."""
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None) -> list[Message]:
        """Hand each message to the ClientApp with its node's context; return the replies."""
        messages = list(messages)
        if self.keep_sent:
            self.sent += messages
        if self.infos is not None:
            return [Message(RecordDict({"info": ConfigRecord(self.infos[m.metadata.dst_node_id])}),
                            reply_to=m) for m in messages]
        if self.client_app is None:
            from .client_app import app as client_app

            self.client_app = client_app
        return [self._run_client(m) for m in messages]

    def _run_client(self, msg: Message) -> Message:
        """The ClientApp's reply, or, as a SuperNode gives it when the ClientApp raises, an
        error reply (``CLIENT_APP_RAISED_EXCEPTION``, Flower's reason text), the error logged."""
        assert self.client_app is not None
        try:
            return self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as ex:
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                           reply_to=msg)

    def sent_configs(self, message_type: str) -> list[ConfigRecord]:
        """The config records of the messages of one type sent so far."""
        return [m.content.config_records["config"] for m in self.sent
                if m.metadata.message_type == message_type]


def run_inprocess(run_config: dict, num_clients: int, log_file: Path | None = None,
                  keep_sent: bool = False, server_app: ServerApp | None = None,
                  client_app: ClientApp | None = None,
                  node_configs: list[dict] | None = None) -> InProcessGrid:
    """Run the real ServerApp with ``run_config`` on ``num_clients`` in-process clients.

    ``log_file``: where the run's log goes (Flower's logger), besides the console;
    ``keep_sent``: the grid keeps the messages it sent (tests); ``server_app``,
    ``client_app``: other apps than this project's (tests: apps with mods);
    ``node_configs``: the nodes' own node configs (members), one per client.
    Returns the grid (its nodes' contexts hold the clients' state).
    """
    if server_app is None:
        from .server_app import app as default_app

        server_app = default_app

    grid = InProcessGrid(run_config, num_clients, keep_sent=keep_sent, client_app=client_app,
                         node_configs=node_configs)
    handler = None
    if log_file is not None:
        handler = logging.FileHandler(log_file, mode="a")
        handler.setFormatter(logging.Formatter("%(levelname)s : %(message)s"))
        logging.getLogger("flwr").addHandler(handler)
    try:
        with task_identity():
            # duck-typed: the ServerApp uses get_node_ids and send_and_receive of its grid
            server_app(cast(Grid, grid), Context(run_id=1, node_id=0, node_config={},
                                                 state=RecordDict(), run_config=run_config))
    finally:
        if handler is not None:
            logging.getLogger("flwr").removeHandler(handler)
            handler.close()
    return grid
