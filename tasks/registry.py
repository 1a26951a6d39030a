"""The task table: every dataset name with its model, its data and its settings.

Three kinds of task:

* pool tasks (synthetic, MNIST, FMNIST, EMNIST, CIFAR): one dataset pool,
  split among the clients by a partitioner (``partitioning``);
* federated tasks (fl60, tpt48, npz): the data defines the clients (and
  usually their graph); ``partitioning`` does not apply;
* ``members``: every SuperNode reads its own data, named by its node config
  (:mod:`tasks.members`); the run config gives only its schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import data as _data
from . import traffic as _traffic
from .compcars import load_compcars
from .federated import FederatedData, load_npz, load_tpt48, make_fl60, make_fl60_grda
from .members import CLASSIFICATION, REGRESSION, MemberSchema
from .models import MODEL_OF_TASK
from .recipes import PRACTICAL_SIZES, PracticalRecipe, cifar100_recipe, emnist_recipe


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
    validation_fraction: float = 0.0  # > 0: evaluate on this share of the training data instead
    fl60_noise_std: float = 1.0
    fl60_variant: str = "text"
    tpt48_split: str = "time"
    traffic_graph: str = "metr-la"
    traffic_days: int = 35
    traffic_stride: int = 12
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


#: The traffic tasks (tasks.traffic): the real ones by their graph's name, and the stand-in.
TRAFFIC_GRAPHS = tuple(_traffic.FILES)
TRAFFIC_GENERATED = "traffic-generated"
TRAFFIC_INFO = DataInfo((_traffic.STEPS_IN,), _traffic.STEPS_OUT, REGRESSION)
#: about 270 training windows a sensor: an epoch of batch 32 a round (9 steps)
TRAFFIC_AUTO = {"local-epochs": 1, "batch-size": 32}


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
    auto : dict[str, Any]
        The task's values of run-config settings left at "auto", for every strategy
        (a strategy's own values for a task are registered with the strategy,
        ``register_strategy(task_auto=...)``); see ``fedamp_flwr.config.auto_values``.
    has_graph : bool | None
        Whether the task defines a client graph (``graph = "task"``): True, False, or
        None where its file says (npz: an optional ``adjacency``).
    pool_graph : Callable[[int], np.ndarray] | None
        Pool tasks with a graph: the graph of ``n`` clients (the synthetic task's
        generator knows which clients see the same rotation).
    load_graph : Callable[[DataConfig], np.ndarray] | None
        A federated task's graph without its data, where that is cheaper (the traffic
        stand-in's: its road graph file alone, not the generated series: 0.5 s on 207
        sensors); the same graph as the data's ``adjacency``.
    """

    name: str
    model: str
    load_pool: Callable[[Path, int, int], tuple[_data.Split, _data.Split]] | None = None
    hub: tuple[str, ...] | None = None
    load_federated: Callable[[DataConfig], FederatedData] | None = None
    practical: PracticalRecipe = PracticalRecipe()
    client_view: Callable[[_data.Split, int, int, int], _data.Split] | None = None
    needs_data_dir: bool = False
    info: DataInfo | None = None
    auto: dict[str, Any] = field(default_factory=dict)
    has_graph: bool | None = False
    pool_graph: Callable[[int], np.ndarray] | None = None
    load_graph: Callable[[DataConfig], np.ndarray] | None = None

    @property
    def federated(self) -> bool:
        """True when the data defines the clients (partitioning does not apply)."""
        return self.load_federated is not None


def _real_traffic(name: str) -> Callable[[DataConfig], FederatedData]:
    """The loader of a real traffic task, from ``data-dir`` (:func:`tasks.traffic.load_traffic`)."""
    def load(dc: DataConfig) -> FederatedData:
        return _traffic.load_traffic(Path(dc.data_dir).expanduser(), name, dc.traffic_stride)
    return load


def _members_have_their_data(dc: DataConfig) -> FederatedData:
    raise ValueError("dataset 'members': each member's data lives on its own node (node config "
                     "data-path); there is no pooled data to load")


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "synthetic", MODEL_OF_TASK["synthetic"],
            lambda _folder, seed, n: _data.make_synthetic(seed, _data.synthetic_pool_size(n)),
            client_view=_data.synthetic_group_view,
            info=DataInfo((_data.SYNTHETIC_FEATURES,), _data.SYNTHETIC_CLASSES, CLASSIFICATION),
            has_graph=True, pool_graph=_data.synthetic_graph,
            # the default task: each client also scores its model trained alone (seconds)
            auto={"alone": True},
        ),
        TaskSpec(
            "mnist", MODEL_OF_TASK["mnist"], lambda folder, _seed, _n: _data.load_idx_folder(folder),
            ("ylecun/mnist", "image", "label"),
            practical=PracticalRecipe(group_sizes=PRACTICAL_SIZES["mnist"]),
            info=DataInfo((1, 28, 28), 10, CLASSIFICATION),
        ),
        TaskSpec(
            "fmnist", MODEL_OF_TASK["fmnist"], lambda folder, _seed, _n: _data.load_idx_folder(folder),
            ("zalando-datasets/fashion_mnist", "image", "label"),
            practical=PracticalRecipe(group_sizes=PRACTICAL_SIZES["fmnist"]),
            info=DataInfo((1, 28, 28), 10, CLASSIFICATION),
        ),
        TaskSpec(
            "emnist", MODEL_OF_TASK["emnist"],
            lambda folder, _seed, _n: _data.load_idx_folder(folder, transpose=True),
            ("flwrlabs/femnist", "image", "character"),
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
            practical=cifar100_recipe(),
            info=DataInfo((3, 32, 32), 100, CLASSIFICATION),
        ),
        TaskSpec(
            "fl60", MODEL_OF_TASK["fl60"], info=DataInfo((2,), 2, CLASSIFICATION), has_graph=True,
            # 80 training points per client: short rounds of small batches (see the README)
            auto={"local-steps": 20, "batch-size": 16},
            load_federated=lambda dc: (
                make_fl60_grda(dc.num_clients, dc.seed) if dc.fl60_variant == "grda"
                else make_fl60(dc.num_clients, dc.seed, noise_std=dc.fl60_noise_std)),
        ),
        TaskSpec(
            "tpt48", MODEL_OF_TASK["tpt48"],
            load_federated=lambda dc: load_tpt48(Path(dc.data_dir).expanduser(), dc.tpt48_split,
                                                 dc.seed),
            needs_data_dir=True, info=DataInfo((6,), 6, REGRESSION), has_graph=True,
            # measured (docs/reproducing.md): one epoch of batch 16 per round keeps FedAvg's
            # drift lowest (Panacea's own values on TPT-48: strategies/panacea.py)
            auto={"local-epochs": 1, "batch-size": 16},
        ),
        *(TaskSpec(name, MODEL_OF_TASK[name], load_federated=_real_traffic(name),
                   needs_data_dir=True, info=TRAFFIC_INFO, auto=TRAFFIC_AUTO, has_graph=True)
          for name in TRAFFIC_GRAPHS),
        TaskSpec(
            TRAFFIC_GENERATED, MODEL_OF_TASK[TRAFFIC_GENERATED],
            load_federated=lambda dc: _traffic.make_traffic_standin(
                _traffic.graph_file(Path(dc.data_dir).expanduser(), dc.traffic_graph),
                dc.traffic_days, dc.seed, dc.traffic_stride),
            needs_data_dir=True, info=TRAFFIC_INFO, auto=TRAFFIC_AUTO, has_graph=True,
            load_graph=lambda dc: _traffic.client_graph(_traffic.read_graph(
                _traffic.graph_file(Path(dc.data_dir).expanduser(), dc.traffic_graph))[1])),
        TaskSpec(
            "compcars", MODEL_OF_TASK["compcars"],
            load_federated=lambda dc: load_compcars(Path(dc.data_dir).expanduser(), dc.seed),
            needs_data_dir=True, info=DataInfo((3, 32, 32), 4, CLASSIFICATION), has_graph=True),
        TaskSpec(
            "npz", MODEL_OF_TASK["npz"],
            load_federated=lambda dc: load_npz(Path(dc.data_dir).expanduser(), dc.seed),
            needs_data_dir=True, has_graph=None,
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
