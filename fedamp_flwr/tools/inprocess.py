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

Run config ``client-batching = "auto"`` (the default): a round's train and evaluate messages
run each in a thread of its own, taking turns (:class:`_Turn`) in the messages' order; the
method's generic training (``ClientJob.fit``) and the test of the round's model wait until
every client has reached them and then run as one stacked model (:mod:`tasks.stacked`: each
client's own batches, steps and loss terms; a model or call it cannot stack runs one by one, said once
in the log). ``"off"``: one client after another.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import cast

from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from flwr.supercore.task_identity import TaskIdentity

from tasks import stacked
from tasks.loading import drop_spare_models, release_thread_models
from tasks.train import STACKING, Evaluation, Fit, Test

#: run config key: "auto" trains a round's clients as one stacked model where it can
CLIENT_BATCHING = "client-batching"


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
        # client-batching (run config, "auto" unless "off"): a round's trainings stacked
        self.batching = self.run_config.get(CLIENT_BATCHING, "auto") != "off"
        self.stacked_any, self.said = False, set[str]()
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
            from ..client_app import app as client_app

            self.client_app = client_app
        clients = sum(m.metadata.message_type in (MessageType.TRAIN, MessageType.EVALUATE)
                      for m in messages)
        if clients > 1 and self.batching:
            return self._run_together(messages)
        return [self._run_client(m) for m in messages]

    def _run_together(self, messages: list[Message]) -> list[Message]:
        """Each message's ClientApp in a thread of its own, one thread running at a time in the
        messages' order; a thread that calls the generic training (``ClientJob.fit``) or the
        test of the round's model waits there, and once every thread waits or is done, the
        waiting calls run together (:func:`_together`), and the threads go on, in order. So
        every client's work before its training runs (in order) before any client's work
        after it; the replies are the ClientApp's own. A thread that raises what is not an
        Exception (its ClientApp's exceptions are error replies) raises it here."""
        turns = [_Turn(self, m) for m in messages]
        pending = turns
        try:
            while pending:
                for turn in pending:
                    turn.go_on()
                    if turn.failure is not None:  # not an Exception (those are error replies)
                        raise turn.failure
                pending = [t for t in pending if t.call is not None]
                if pending:
                    self.stacked_any = True
                    results = _together([t.call for t in pending])  # type: ignore[misc]
                    for turn, result in zip(pending, results):
                        turn.result = result
        finally:  # threads still waiting (the engine stopped): each ends with an error
            for turn in turns:
                turn.cancel()
        if not self.stacked_any:  # this run's model cannot be stacked: one by one from now
            self.batching = False
        return [t.reply for t in turns]  # type: ignore[misc]

    def stacks(self, call: Fit | Test, problem: str | None) -> bool:
        """Whether a client thread's call waits to be stacked; a reason it cannot, once."""
        problem = problem or stacked.call_problem(call)
        if problem is not None and problem not in self.said:
            self.said.add(problem)
            log(INFO, "client-batching: a client trains (or is tested) one by one: %s", problem)
        return problem is None

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


class _Turn:
    """One message's ClientApp in a thread of its own that runs only when told
    (:meth:`go_on`), until it is done or waits with its training or test (:attr:`call`)."""

    def __init__(self, grid: InProcessGrid, msg: Message) -> None:
        self.grid, self.msg = grid, msg
        self.call: Fit | Test | None = None
        self.result: float | Evaluation | BaseException | None = None
        self.reply: Message | None = None
        self.failure: BaseException | None = None
        self._go, self._back = threading.Event(), threading.Event()
        context = contextvars.copy_context()  # the server's log context and the like
        self._thread = threading.Thread(target=context.run, args=(self._main,), daemon=True,
                                        name=f"client-{msg.metadata.dst_node_id}")

    def go_on(self) -> None:
        """Let the thread run until it waits with a training or test, or is done."""
        self.call, self._back = None, threading.Event()
        if not self._thread.is_alive():
            self._thread.start()
        else:
            self._go.set()
        self._back.wait()

    def cancel(self) -> None:
        """End a thread that still waits (its ClientApp raises, as for an error)."""
        if self._thread.is_alive() and self.call is not None:
            self.result = RuntimeError("the in-process engine stopped before this client's "
                                       "turn came back")
            self.go_on()

    def _main(self) -> None:
        STACKING.park, STACKING.stacks = self._park, self.grid.stacks
        try:
            self.reply = self.grid._run_client(self.msg)
        except BaseException as ex:  # the engine's thread raises it
            self.failure = ex
        finally:
            release_thread_models()
            self._back.set()

    def _park(self, call: Fit | Test) -> float | Evaluation:
        self.call = call
        self._go.clear()
        self._back.set()
        self._go.wait()
        result, self.result = self.result, None
        if isinstance(result, BaseException):  # its own, from its call's error
            raise RuntimeError(f"{type(result).__name__}: {result}") from result
        assert result is not None
        return result


def _together(calls: list[Fit | Test]) -> list[float | Evaluation | BaseException]:
    """The calls run stacked, in groups that share the model and the settings
    (:func:`tasks.stacked.group_key`). A group that fails stacked (its models untouched: they
    are written once every chunk is done) runs one by one, so that an error is only the
    client's own (each an error reply)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, call in enumerate(calls):
        groups[stacked.group_key(call)].append(i)
    results: list[float | Evaluation | BaseException] = [0.0] * len(calls)
    for members in groups.values():
        group = [calls[i] for i in members]
        tests = [c for c in group if isinstance(c, Test)]
        fits = [c for c in group if isinstance(c, Fit)]  # a group is all tests or all fits
        try:
            out: list = ([_alone(group[0])] if len(group) == 1
                         else stacked.evaluate_stacked(tests) if tests
                         else stacked.train_stacked(fits))
        except Exception as ex:
            log(WARNING, "client-batching: %d clients' stacked %s failed (%s: %s); one by one",
                len(group), "test" if tests else "training", type(ex).__name__, ex)
            out = [_alone(call) for call in group]
        for i, result in zip(members, out):
            results[i] = result
    return results


def _alone(call: Fit | Test) -> float | Evaluation | BaseException:
    """The call one by one, or its error (which its client's ClientApp raises)."""
    try:
        return call.alone()
    except Exception as ex:
        return ex


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
        from ..server_app import app as default_app

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
        drop_spare_models()  # the clients' threads are done: their models with them
        if handler is not None:
            logging.getLogger("flwr").removeHandler(handler)
            handler.close()
    return grid
