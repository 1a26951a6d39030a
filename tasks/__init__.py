"""Tasks: a registry from dataset name to its model, its data and its paper settings.

torchvision is imported only by :func:`tasks.models.resnet18` (CIFAR tasks): the
only torchvision wheel on the package index of CPU-only machines here is a
CUDA build whose compiled ops fail to load beside the CPU torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import data as _data
from .models import MLP, McMahanCNN, resnet18
from .partitioners import PRACTICAL_SIZES, PRACTICAL_SIZES_DEFAULT, build_partitioner, partition_pool


@dataclass(frozen=True)
class TaskSpec:
    """Everything the app needs to know about one dataset.

    Parameters
    ----------
    name : str
        Registry name (the ``dataset`` run-config value).
    num_classes : int
        Number of classes.
    build_model : Callable[[], nn.Module]
        Returns a freshly initialised target model.
    load_local : Callable[[Path, int], tuple[Split, Split]]
        Loads (train, test) from a local folder (``data-dir``); gets the seed.
    hub : tuple[str, str, str] | None
        (Hugging Face dataset, image column, label column) for flwr-datasets;
        None for an embedded task, whose ``load_local`` generates the data.
    paper_sigma : dict[str, float]
        The FedAMP paper's sigma per strategy ("fedamp", "heurfedamp") for the
        practical setting; used when the run config says "auto".
    practical_sizes : tuple[int, ...]
        Training samples per client of each practical group.
    client_view : Callable[[Split, int, int, int], Split] | None
        Optional per-client transform of a client's data, given (split,
        partition_id, num_partitions, seed); the synthetic task's group rotations.
    """

    name: str
    num_classes: int
    build_model: Callable[[], nn.Module]
    load_local: Callable[[Path, int], tuple[_data.Split, _data.Split]]
    hub: tuple[str, str, str] | None
    paper_sigma: dict[str, float] = field(default_factory=dict)
    practical_sizes: tuple[int, ...] = PRACTICAL_SIZES_DEFAULT
    client_view: Callable[[_data.Split, int, int, int], _data.Split] | None = None

    @property
    def embedded(self) -> bool:
        """True when the data is generated locally and needs no ``data-dir``."""
        return self.hub is None


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "synthetic", _data.SYNTHETIC_CLASSES,
            lambda: MLP(_data.SYNTHETIC_FEATURES, _data.SYNTHETIC_CLASSES),
            lambda _folder, seed: _data.make_synthetic(seed), None,
            # Not from the paper: chosen for this task's MLP (see README).
            paper_sigma={"fedamp": 1.0, "heurfedamp": 25.0},
            client_view=_data.synthetic_group_view,
        ),
        TaskSpec(
            "mnist", 10, lambda: McMahanCNN(1, 10),
            lambda folder, _seed: _data.load_idx_folder(folder), ("ylecun/mnist", "image", "label"),
            paper_sigma={"fedamp": 100.0, "heurfedamp": 25.0},
            practical_sizes=PRACTICAL_SIZES["mnist"],
        ),
        TaskSpec(
            "fmnist", 10, lambda: McMahanCNN(1, 10),
            lambda folder, _seed: _data.load_idx_folder(folder),
            ("zalando-datasets/fashion_mnist", "image", "label"),
            paper_sigma={"fedamp": 10.0, "heurfedamp": 100.0},
            practical_sizes=PRACTICAL_SIZES["fmnist"],
        ),
        TaskSpec(
            "emnist", 62, lambda: McMahanCNN(1, 62),
            lambda folder, _seed: _data.load_idx_folder(folder, transpose=True),
            ("flwrlabs/femnist", "image", "character"),
            paper_sigma={"fedamp": 10.0, "heurfedamp": 50.0},
        ),
        TaskSpec(
            "cifar10", 10, lambda: resnet18(10),
            lambda folder, _seed: _data.load_cifar_binary(folder, 10), ("uoft-cs/cifar10", "img", "label"),
        ),
        TaskSpec(
            "cifar100", 100, lambda: resnet18(100),
            lambda folder, _seed: _data.load_cifar_binary(folder, 100),
            ("uoft-cs/cifar100", "img", "fine_label"),
            paper_sigma={"fedamp": 1e6, "heurfedamp": 10.0},
        ),
    )
}


def get_task(name: str) -> TaskSpec:
    """Return the task called ``name``, or raise with the allowed names."""
    if name not in TASKS:
        raise ValueError(f"unknown dataset '{name}'; allowed: {', '.join(TASKS)}")
    return TASKS[name]


@functools.lru_cache(maxsize=2)
def load_pool(dataset: str, data_dir: str, seed: int) -> tuple[_data.Split, _data.Split]:
    """Load the whole (train, test) pool of ``dataset`` (cached per process)."""
    spec = get_task(dataset)
    if spec.embedded:
        return spec.load_local(Path("."), seed)
    if data_dir:
        folder = Path(data_dir).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"data-dir '{data_dir}' is not a folder")
        return spec.load_local(folder, seed)
    if spec.hub is None:
        raise ValueError(f"dataset '{dataset}' needs a data-dir")
    return _data.load_from_hub(*spec.hub)


@functools.lru_cache(maxsize=4)
def _partition(
    dataset: str, data_dir: str, partitioning: str, num_partitions: int,
    seed: int, dirichlet_alpha: float, test_samples: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    train, test = load_pool(dataset, data_dir, seed)
    partitioner = build_partitioner(
        partitioning, num_partitions, seed, dirichlet_alpha, get_task(dataset).practical_sizes
    )
    return partition_pool(train.y, test.y, partitioner, test_samples, seed)


@dataclass(frozen=True)
class ClientData:
    """One client's tensors: training and test inputs and labels (on the CPU)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_client_data(
    dataset: str, data_dir: str, partitioning: str, partition_id: int, num_partitions: int,
    seed: int, dirichlet_alpha: float = 0.5, test_samples: int = 100,
) -> ClientData:
    """Return the training and test data of client ``partition_id``.

    The whole pool is partitioned once per process (deterministically by
    ``seed``) and cached, so every client of a simulation worker shares it.
    """
    train, test = load_pool(dataset, data_dir, seed)
    train_idx, test_idx = _partition(
        dataset, data_dir, partitioning, num_partitions, seed, dirichlet_alpha, test_samples
    )
    parts = [train.subset(train_idx[partition_id]), test.subset(test_idx[partition_id])]
    view = get_task(dataset).client_view
    if view is not None:
        parts = [view(p, partition_id, num_partitions, seed) for p in parts]
    (xtr, ytr), (xte, yte) = (_data.to_tensors(p) for p in parts)
    return ClientData(xtr, ytr, xte, yte)
