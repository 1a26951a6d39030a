"""A client's message at its floor, counted rather than timed (speed is benchmarked in
benchmarks/bench_round.py): per message, at most one model built (none once the process
has one), the client's tensors sent to the device once (never per mini-batch), and one
read back from the device (the loss; no step waits for the device).

The counts come from PyTorch's own dispatcher (a ``TorchDispatchMode`` around each
ClientApp call, put there by a ClientApp mod, as a user's mod would be): every read of a
device value by the host (``aten._local_scalar_dense``, ``.item()``), every copy between
devices. On a machine without a GPU nothing crosses devices, so only the reads and the
models built can go wrong there; on a GPU the copies are counted too. Training runs with
SGD: PyTorch's Adam reads its step counters (kept on the host) with ``.item()``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from torch.utils._python_dispatch import TorchDispatchMode

import tasks
from fedamp_flwr import client_app
from fedamp_flwr.tools.inprocess import run_inprocess
from tasks import loading

aten = torch.ops.aten


class Count(TorchDispatchMode):
    """Counts host reads and copies between devices (by the number of values copied)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.copies: list[tuple[str, int]] = []  # (direction, values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten._local_scalar_dense.default:
            self.reads += 1
        elif func in (aten._to_copy.default, aten.copy_.default):
            src = args[1] if func is aten.copy_.default else args[0]
            dst = args[0] if func is aten.copy_.default else out
            if isinstance(src, torch.Tensor) and src.device != dst.device:
                direction = "to host" if dst.device.type == "cpu" else "to device"
                self.copies.append((direction, src.numel()))
                if direction == "to host" and src.numel() <= 2:
                    self.reads += 1  # a scalar or two copied back is a read
        return out


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp"])
def test_a_message_builds_no_model_sends_the_data_once_and_reads_back_once(tmp_path,
                                                                          monkeypatch, strategy):
    built: Counter[str] = Counter()
    for name, builder in list(tasks.MODELS.items()):
        def counted(shape, out, _builder=builder, _name=name):
            if torch.get_default_device().type != "meta":  # the memory estimate's: no storage
                built[_name] += 1
            return _builder(shape, out)
        monkeypatch.setitem(tasks.MODELS, name, counted)
    monkeypatch.setattr(loading, "_REUSED", {})
    per_message: list[dict] = []

    def counting_mod(msg: Message, context: Context, call_next) -> Message:
        before = sum(built.values())
        with Count() as count:
            reply = call_next(msg, context)
        per_message.append({"type": msg.metadata.message_type, "reads": count.reads,
                            "built": sum(built.values()) - before, "copies": count.copies})
        return reply

    app = ClientApp(mods=[counting_mod])
    app.query()(client_app.query)
    app.train()(client_app.train)
    app.evaluate()(client_app.evaluate)
    n, rounds, steps = 3, 2, 4
    run_inprocess({"strategy": strategy, "num-server-rounds": rounds, "local-steps": steps,
                   "batch-size": 10, "optimizer": "sgd", "learning-rate": 0.1, "min-nodes": n,
                   "results-dir": str(tmp_path), "run-name": "floor", "server-device": "cpu",
                   "alone": False},  # the run's own work: no model trained alone besides
                  n, client_app=app)
    work = [m for m in per_message if m["type"] in ("train", "evaluate")]
    assert len(work) == 2 * n * rounds
    data = tasks.load_client_data(tasks.DataConfig("synthetic", "", n, 42), 0)
    sizes = {data.x_train.numel(), data.y_train.numel(), data.x_test.numel(),
             data.y_test.numel()}
    for m in work:
        assert m["reads"] <= 1, m
        uploads = [v for d, v in m["copies"] if d == "to device" and v in sizes]
        assert len(uploads) <= 2, m  # x and y once, whatever the number of steps
    # one model for the whole process: the server's initial one and the clients' one
    assert sum(m["built"] for m in per_message) <= 1
    assert sum(built.values()) <= 2
