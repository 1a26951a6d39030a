"""Models with BatchNorm: integer buffers survive every strategy's aggregation.

Flower's aggregation helpers return integer arrays (BatchNorm's
``num_batches_tracked``) as float64. Sent on as they come, every honest reply
(which holds the integer) failed the reply check, and from round 2 on no client
trained while the run went on as if nothing were wrong. These tests train a
small BatchNorm model for 3 rounds under every registered strategy and check
that every client trains in every round; the last one runs torchvision's
ResNet-18 on CIFAR-10-shaped files written by the test, where torchvision's
compiled ops load.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn

import strategies
import tasks
from strategies.core.layout import with_dtypes

from .helpers import run_local

BN_TASK = "synthetic-bn"


class BatchNormMLP(nn.Module):
    """Linear, BatchNorm, ReLU, Linear: a model with float and integer buffers."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, 32)
        self.bn = nn.BatchNorm1d(32)
        self.out = nn.Linear(32, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.fc(x.flatten(1)))))


@pytest.fixture
def bn_task():
    """The default synthetic task with :class:`BatchNormMLP` as its model."""
    tasks.MODELS["mlp-bn"] = lambda shape, out: BatchNormMLP(int(np.prod(shape)), out)
    tasks.TASKS[BN_TASK] = dataclasses.replace(tasks.TASKS["synthetic"], name=BN_TASK,
                                               model="mlp-bn")
    yield BN_TASK
    del tasks.TASKS[BN_TASK], tasks.MODELS["mlp-bn"]


def test_with_dtypes_rounds_integers_back_and_keeps_floats():
    sent = ArrayRecord(OrderedDict(w=torch.ones(2), n=torch.tensor(3), b=torch.tensor([True])))
    aggregated = ArrayRecord(OrderedDict(w=torch.full((2,), 0.5, dtype=torch.float64),
                                         n=torch.tensor(4.6, dtype=torch.float64),
                                         b=torch.tensor([0.7], dtype=torch.float64)))
    out = with_dtypes(aggregated, {k: v.numpy().dtype for k, v in sent.items()})
    assert [out[k].numpy().dtype for k in ("w", "n", "b")] == [np.float32, np.int64, np.bool_]
    assert out["n"].numpy() == 5 and out["b"].numpy().tolist() == [True]
    assert out["w"].numpy().tolist() == [0.5, 0.5]
    assert with_dtypes(sent, {k: v.numpy().dtype for k, v in sent.items()}) is sent


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(strategies.STRATEGIES))
def test_every_strategy_trains_a_batchnorm_model_in_every_round(strategy, tmp_path, bn_task):
    graph = strategies.STRATEGIES[strategy].uses_graph
    n = 6 if graph else 3  # the synthetic task has 5 groups: 6 clients give its graph an edge
    metrics, grid = run_local(tmp_path, strategy, n=n, dataset=bn_task, **{
        "num-server-rounds": 3, "local-steps": 2,
        **({"graph": "groups", "panacea-server-lr": 0.01} if graph else {}),
        # a task of the test's own: no paper sigma
        **({"fedamp-sigma": 1.0, "heurfedamp-sigma": 25.0} if "fedamp" in strategy else {})})
    assert len(metrics["rounds"]) == 3
    for record in metrics["rounds"]:
        assert record["trained_clients"] == list(range(n)), (record["round"], record)
        assert "absent_clients" not in record and "absent_evaluation" not in record, record
        assert len(record["client_accuracy"]) == n
    # what was sent to the clients keeps the integer counter, in every round
    sent = [m.content["arrays"]["bn.num_batches_tracked"].numpy() for m in grid.sent
            if "arrays" in m.content]
    assert sent and all(a.dtype == np.int64 for a in sent)


def test_fedavg_sends_the_clients_mean_count_of_batches(tmp_path, bn_task):
    _, grid = run_local(tmp_path, "fedavg", n=3, dataset=bn_task,
                        **{"num-server-rounds": 3, "local-steps": 2})
    counts = [int(m.content["arrays"]["bn.num_batches_tracked"].numpy()) for m in grid.sent
              if m.metadata.message_type == "train"]
    # 2 steps a round on every client: the averaged counter grows by 2 each round
    assert counts == [0] * 3 + [2] * 3 + [4] * 3


def _write_cifar10(folder, rng: np.random.Generator, n_train: int = 600, n_test: int = 200):
    """CIFAR-10 binary files (``data_batch_1..5.bin``, ``test_batch.bin``) of random images."""
    folder.mkdir()

    def batch(n: int) -> bytes:
        rows = np.empty((n, 3073), dtype=np.uint8)
        rows[:, 0] = np.arange(n) % 10
        rows[:, 1:] = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        return rows.tobytes()

    for i in range(1, 6):
        (folder / f"data_batch_{i}.bin").write_bytes(batch(n_train // 5))
    (folder / "test_batch.bin").write_bytes(batch(n_test))


def _torchvision_ops_load() -> str | None:
    try:
        import torchvision  # noqa: F401

        torch.ops.torchvision.nms  # noqa: B018 - fails where the compiled ops do not load
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedavg", "fedamp"])
def test_resnet18_on_cifar10_files_trains_every_client_in_every_round(strategy, tmp_path):
    problem = _torchvision_ops_load()
    if problem is not None:
        # tests/test_install.py fails for this, once, with the way out; a skip here (not
        # a second failure of the same cause) keeps this test's own failures its own
        pytest.skip(f"torchvision's compiled ops do not load with this torch build ({problem}); "
                    "tests/test_install.py fails for it (README.md, section Install)")
    data = tmp_path / "cifar10"
    _write_cifar10(data, np.random.default_rng(0))
    metrics, _ = run_local(tmp_path, strategy, n=2, dataset="cifar10", partitioning="iid",
                           **{"data-dir": str(data), "num-server-rounds": 3, "local-steps": 1,
                              "batch-size": 16, "test-samples": 20, "fedamp-sigma": 1e6})
    assert [r["trained_clients"] for r in metrics["rounds"]] == [[0, 1]] * 3
