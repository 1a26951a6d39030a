"""Tasks: a registry from dataset name to its model, its data and its paper settings.

Three kinds of task:

* pool tasks (synthetic, MNIST, FMNIST, EMNIST, CIFAR): one dataset pool,
  split among the clients by a partitioner (``partitioning``);
* federated tasks (fl60, tpt48, npz): the data defines the clients (and
  usually their graph); ``partitioning`` does not apply;
* ``members``: every SuperNode reads its own data, named by its node config
  (:mod:`tasks.members`); the run config gives only its schema.

The first two end as a :class:`tasks.federated.FederatedData`, built once per
process and cached (:func:`load_federated`); :func:`load_client_data` returns
one client's tensors (a member's, from its own file).

torchvision is imported only by :func:`tasks.models.resnet18` (CIFAR tasks): the
only torchvision wheel on the package index of CPU-only machines here is a
CUDA build whose compiled ops fail to load beside the CPU torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from . import cache
from . import data as _data
from .federated import FederatedData, load_npz, load_tpt48, make_fl60, make_fl60_grda
from .members import MemberDataError, MemberSchema, load_member_data
from .models import MODEL_OF_TASK, MODELS, auto_model
from .partitioners import (PARTITIONINGS, PRACTICAL_SIZES, PracticalRecipe, cifar100_recipe,
                           emnist_recipe)

CLASSIFICATION, REGRESSION = "classification", "regression"


@dataclass(frozen=True)
class DataConfig:
    """What identifies a federated dataset (hashable: the cache key)."""

    dataset: str
    data_dir: str
    num_clients: int
    seed: int
    partitioning: str = "practical"
    dirichlet_alpha: float = 0.5
    test_samples: int = 100
    fl60_noise_std: float = 1.0
    fl60_variant: str = "text"
    tpt48_split: str = "time"
    member: str = ""  # members: this node's member name (node config client-id)
    schema: MemberSchema | None = None  # members: what the run expects of the data


#: The dataset of a run over members' own data.
MEMBERS = "members"


@dataclass(frozen=True)
class DataInfo:
    """Shape of a task's data: input shape, model outputs, kind."""

    input_shape: tuple[int, ...]
    num_outputs: int
    kind: str


@dataclass(frozen=True)
class TaskSpec:
    """Everything the app needs to know about one dataset.

    Parameters
    ----------
    name : str
        Registry name (the ``dataset`` run-config value).
    model : str
        The task's model (a name of :data:`tasks.models.MODELS`); "" for a choice
        by input shape (:func:`tasks.models.auto_model`).
    load_pool : Callable[[Path, int, int], tuple[Split, Split]] | None
        Pool tasks: loads (train, test) from a local folder (``data-dir``) or
        generates them; gets the seed and the number of clients (a generated
        pool grows with it).
    hub : tuple[str, ...] | None
        Pool tasks: (Hugging Face dataset, image column, label column[, coarse
        label column]) for flwr-datasets, used when ``data-dir`` is empty.
    load_federated : Callable[[DataConfig], FederatedData] | None
        Federated tasks: builds the clients' data (and graph).
    paper_sigma : dict[str, dict[str, float]]
        The FedAMP paper's sigma per data setting (partitioning) and strategy
        ("fedamp", "heurfedamp"), from its Tables 4-6; used when the run config
        says "auto". Only the cells this project has are here.
    practical : PracticalRecipe
        Pool tasks: the practical setting (groups, dominant classes, sizes).
    client_view : Callable[[Split, int, int, int], Split] | None
        Optional per-client transform (split, client id, clients, seed); the
        synthetic task's group rotations.
    needs_data_dir : bool
        Whether ``data-dir`` must be set (no generator, no hub).
    info : DataInfo | None
        Shape of the data when known without loading it (all tasks but npz),
        so that a server without the data can build the model.
    auto : dict[str, dict[str, Any]]
        The task's values of run-config settings left at "auto", for every
        strategy (``"*"``) or one (its name); see ``fedamp_flwr.config.auto_settings``.
    """

    name: str
    model: str
    load_pool: Callable[[Path, int, int], tuple[_data.Split, _data.Split]] | None = None
    hub: tuple[str, ...] | None = None
    load_federated: Callable[[DataConfig], FederatedData] | None = None
    paper_sigma: dict[str, dict[str, float]] = field(default_factory=dict)
    practical: PracticalRecipe = PracticalRecipe()
    client_view: Callable[[_data.Split, int, int, int], _data.Split] | None = None
    needs_data_dir: bool = False
    info: DataInfo | None = None
    auto: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def federated(self) -> bool:
        """True when the data defines the clients (partitioning does not apply)."""
        return self.load_federated is not None


def _members_have_their_data(dc: DataConfig) -> FederatedData:
    raise ValueError("dataset 'members': each member's data lives on its own node (node config "
                     "data-path); there is no pooled data to load")


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "synthetic", MODEL_OF_TASK["synthetic"],
            lambda _folder, seed, n: _data.make_synthetic(seed, _data.synthetic_pool_size(n)),
            # Not from the paper: chosen for this task's MLP (see README), in every setting.
            paper_sigma={p: {"fedamp": 1.0, "heurfedamp": 25.0} for p in PARTITIONINGS},
            client_view=_data.synthetic_group_view,
            info=DataInfo((_data.SYNTHETIC_FEATURES,), _data.SYNTHETIC_CLASSES, CLASSIFICATION),
        ),
        TaskSpec(
            "mnist", MODEL_OF_TASK["mnist"], lambda folder, _seed, _n: _data.load_idx_folder(folder),
            ("ylecun/mnist", "image", "label"),
            paper_sigma={"practical": {"fedamp": 100.0, "heurfedamp": 25.0}},
            practical=PracticalRecipe(group_sizes=PRACTICAL_SIZES["mnist"]),
            info=DataInfo((1, 28, 28), 10, CLASSIFICATION),
        ),
        TaskSpec(
            "fmnist", MODEL_OF_TASK["fmnist"], lambda folder, _seed, _n: _data.load_idx_folder(folder),
            ("zalando-datasets/fashion_mnist", "image", "label"),
            paper_sigma={"practical": {"fedamp": 10.0, "heurfedamp": 100.0}},
            practical=PracticalRecipe(group_sizes=PRACTICAL_SIZES["fmnist"]),
            info=DataInfo((1, 28, 28), 10, CLASSIFICATION),
        ),
        TaskSpec(
            "emnist", MODEL_OF_TASK["emnist"], lambda folder, _seed, _n: _data.load_idx_folder(folder, transpose=True),
            ("flwrlabs/femnist", "image", "character"),
            paper_sigma={"practical": {"fedamp": 10.0, "heurfedamp": 50.0}},
            practical=emnist_recipe(), info=DataInfo((1, 28, 28), 62, CLASSIFICATION),
        ),
        TaskSpec(
            "cifar10", MODEL_OF_TASK["cifar10"],
            lambda folder, _seed, _n: _data.load_cifar_binary(folder, 10),
            ("uoft-cs/cifar10", "img", "label"), info=DataInfo((3, 32, 32), 10, CLASSIFICATION),
        ),
        TaskSpec(
            "cifar100", MODEL_OF_TASK["cifar100"],
            lambda folder, _seed, _n: _data.load_cifar_binary(folder, 100),
            ("uoft-cs/cifar100", "img", "fine_label", "coarse_label"),
            paper_sigma={"practical": {"fedamp": 1e6, "heurfedamp": 10.0}},
            practical=cifar100_recipe(),
            info=DataInfo((3, 32, 32), 100, CLASSIFICATION),
        ),
        TaskSpec(
            "fl60", MODEL_OF_TASK["fl60"], info=DataInfo((2,), 2, CLASSIFICATION),
            # 80 training points per client: short rounds of small batches (see the README)
            auto={"*": {"local-steps": 20, "batch-size": 16}},
            load_federated=lambda dc: (
                make_fl60_grda(dc.num_clients, dc.seed) if dc.fl60_variant == "grda"
                else make_fl60(dc.num_clients, dc.seed, noise_std=dc.fl60_noise_std)),
        ),
        TaskSpec(
            "tpt48", MODEL_OF_TASK["tpt48"],
            load_federated=lambda dc: load_tpt48(Path(dc.data_dir).expanduser(), dc.tpt48_split,
                                                 dc.seed),
            needs_data_dir=True, info=DataInfo((6,), 6, REGRESSION),
            # measured in the README: one epoch of batch 16 per round keeps FedAvg's drift
            # lowest; Panacea and Panacea-GN need longer local training and server fits
            auto={"*": {"local-epochs": 1, "batch-size": 16},
                  **{s: {"local-steps": 50, "batch-size": 16, "panacea-client-lr": 0.2,
                         "panacea-server-lr": 0.1, "panacea-server-steps": 20}
                     for s in ("panacea", "panacea-gn")},
                  "pfedhn": {"batch-size": 16}},
        ),
        TaskSpec(
            "npz", MODEL_OF_TASK["npz"],
            load_federated=lambda dc: load_npz(Path(dc.data_dir).expanduser(), dc.seed),
            needs_data_dir=True,
        ),
        # every member's own data (tasks.members); the model by input shape unless named
        TaskSpec(MEMBERS, "", load_federated=_members_have_their_data),
    )
}


def get_task(name: str) -> TaskSpec:
    """Return the task called ``name``, or raise with the allowed names."""
    if name not in TASKS:
        raise ValueError(f"unknown dataset '{name}'; allowed: {', '.join(TASKS)}")
    return TASKS[name]


@functools.lru_cache(maxsize=2)
def load_pool(dataset: str, data_dir: str, seed: int,
              num_clients: int = 0) -> tuple[_data.Split, _data.Split]:
    """Load the whole (train, test) pool of a pool task (cached per process); a generated
    pool is made for ``num_clients`` clients."""
    spec = get_task(dataset)
    if spec.hub is None:  # generated
        return spec.load_pool(Path("."), seed, num_clients)
    if data_dir:
        folder = Path(data_dir).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"data-dir '{data_dir}' is not a folder")
        return spec.load_pool(folder, seed, num_clients)
    return _data.load_from_hub(*spec.hub)


@functools.lru_cache(maxsize=2)
def load_federated(dc: DataConfig) -> FederatedData:
    """The clients' data of ``dc`` (cached per process; deterministic by seed)."""
    spec = get_task(dc.dataset)
    if spec.needs_data_dir and not dc.data_dir:
        raise FileNotFoundError(f"dataset '{dc.dataset}' needs data-dir")
    if spec.federated:
        return spec.load_federated(dc)
    train, test = load_pool(dc.dataset, dc.data_dir, dc.seed,
                            dc.num_clients if spec.hub is None else 0)
    if dc.num_clients > len(train.y):
        raise ValueError(
            f"{dc.num_clients} clients but dataset '{dc.dataset}' has only {len(train.y)} "
            "training samples"
        )
    recipe = spec.practical.for_pool(
        _data.coarse_of_fine(train) if spec.practical.superclass_groups else None)
    from .partitioner_classes import build_partitioner, partition_pool  # seconds to import

    partitioner = build_partitioner(dc.partitioning, dc.num_clients, dc.seed,
                                    dc.dirichlet_alpha, recipe)
    train_idx, test_idx = partition_pool(train.y, test.y, partitioner, dc.test_samples, dc.seed)
    parts = [(train.subset(a), test.subset(b)) for a, b in zip(train_idx, test_idx)]
    if spec.client_view is not None:
        parts = [tuple(spec.client_view(p, i, dc.num_clients, dc.seed) for p in pair)
                 for i, pair in enumerate(parts)]
    return FederatedData([p[0] for p in parts], [p[1] for p in parts])


def client_groups(dataset: str, partitioning: str, num_clients: int) -> list[int] | None:
    """The group of every client in a data setting where clients of a group share one
    distribution (the FedAMP paper's "same distribution clients"), or None where the setting
    has no such groups.

    Practical: the setting's groups; IID: one group of all; label blocks: each client
    alone; pathological, Dirichlet and the federated tasks (fl60, tpt48, npz): None.
    """
    spec = get_task(dataset)
    if spec.federated:
        return None
    if partitioning == "practical":
        return spec.practical.groups(num_clients)
    if partitioning == "iid":
        return [0] * num_clients
    if partitioning == "blocks":
        return list(range(num_clients))
    return None


def data_info(dc: DataConfig) -> DataInfo:
    """Input shape, number of model outputs and kind of the data of ``dc``.

    Known without the data for every task but npz, whose file is read; for members,
    from the run's schema.
    """
    if dc.schema is not None:
        return DataInfo(dc.schema.input_shape, dc.schema.num_outputs, dc.schema.kind)
    if get_task(dc.dataset).info is not None:
        return get_task(dc.dataset).info
    fed = load_federated(dc)
    x, y = fed.train[0].x, fed.train[0].y
    if np.issubdtype(y.dtype, np.integer):
        classes = max(int(max(s.y.max(initial=0) for s in fed.train + fed.test)) + 1, 2)
        return DataInfo(tuple(x.shape[1:]), classes, CLASSIFICATION)
    return DataInfo(tuple(x.shape[1:]), int(np.prod(y.shape[1:])) or 1, REGRESSION)


def model_name(dc: DataConfig, model: str = "auto") -> str:
    """The model of a run: ``model`` (the run config's), or for "auto" the task's own, or
    the one its input shape calls for (:func:`tasks.models.auto_model`)."""
    if model != "auto":
        return model
    return get_task(dc.dataset).model or auto_model(data_info(dc).input_shape)


def build_model(dc: DataConfig, model: str = "auto") -> nn.Module:
    """A freshly initialised target model for the data of ``dc`` (see :func:`model_name`)."""
    info = data_info(dc)
    return MODELS[model_name(dc, model)](info.input_shape, info.num_outputs)


@dataclass(frozen=True)
class ClientData:
    """One client's tensors: training and test inputs and targets (on the CPU)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


class ClientCountError(ValueError):
    """A federated task defines another number of clients than the run has."""


def load_client_data(dc: DataConfig, client_id: int) -> ClientData:
    """Return the training and test data of client ``client_id`` (cached per process, and on
    the node's disk: :mod:`tasks.cache`).

    A simulation worker serves many clients and every round; a SuperNode starts
    a process per message: the tensors are made once per client. They are never
    modified in place. Raises FileNotFoundError (data folder), ClientCountError
    (a federated task with another number of clients) or ValueError (a setting
    the data cannot give).
    """
    return _client_data(dc, client_id)


@functools.lru_cache(maxsize=128)
def _client_data(dc: DataConfig, client_id: int) -> ClientData:
    def make() -> dict[str, torch.Tensor]:
        if dc.schema is not None:  # a member: its own file, checked against the run's schema
            train, test = load_member_data(dc.data_dir, dc.schema, dc.seed, dc.member)
            (xtr, ytr), (xte, yte) = _data.to_tensors(train), _data.to_tensors(test)
            return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}
        fed = load_federated(dc)
        if fed.num_clients != dc.num_clients:
            raise ClientCountError(
                f"dataset {dc.dataset!r} defines {fed.num_clients} clients but num-partitions = "
                f"{dc.num_clients}; allowed: run {fed.num_clients} SuperNodes")
        if not 0 <= client_id < fed.num_clients:
            raise ValueError(f"client {client_id} is outside the task's {fed.num_clients} clients")
        (xtr, ytr), (xte, yte) = (_data.to_tensors(s) for s in (fed.train[client_id],
                                                                fed.test[client_id]))
        return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}

    return ClientData(**cache.cached(dc, client_id, make))
