"""Loading a task's data and model: the pool, the clients' data (cached), the model.

:func:`load_federated` builds a task's :class:`tasks.federated.FederatedData`
once per process; :func:`load_client_data` returns one client's tensors (a
member's, from its own file), cached per process and on the node's disk
(:mod:`tasks.cache`); :func:`build_model` makes the run's model.

torchvision is imported only by :func:`tasks.models.resnet18` (CIFAR tasks): its
compiled ops load only beside the torch build they were made for (README, Install;
``tests/test_install.py``), and nothing else needs it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import cache
from . import data as _data
from .federated import FederatedData
from .members import load_member_data
from .models import MODELS, auto_model
from .registry import CLASSIFICATION, REGRESSION, DataConfig, DataInfo, get_task
from .train import stacking_worker


@functools.lru_cache(maxsize=2)
def load_pool(dataset: str, data_dir: str, seed: int,
              num_clients: int = 0) -> tuple[_data.Split, _data.Split]:
    """Load the whole (train, test) pool of a pool task (cached per process); a generated
    pool is made for ``num_clients`` clients."""
    spec = get_task(dataset)
    if spec.load_pool is None:
        raise ValueError(f"dataset '{dataset}' has no pool: its data defines its clients")
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
    if spec.load_federated is not None:
        return spec.load_federated(dc)
    train, test = load_pool(dc.dataset, dc.data_dir, dc.seed,
                            dc.num_clients if spec.hub is None else 0)
    if dc.num_clients > len(train.y):
        raise ValueError(
            f"{dc.num_clients} clients but dataset '{dc.dataset}' has only {len(train.y)} "
            "training samples"
        )
    coarse = _data.coarse_of_fine(train) if spec.practical.superclass_groups else None
    recipe = spec.practical.for_pool(None if coarse is None else coarse.tolist())
    from .partitioners import build_partitioner, partition_pool  # seconds to import

    partitioner = build_partitioner(dc.partitioning, dc.num_clients, dc.seed,
                                    dc.dirichlet_alpha, recipe)
    train_idx, test_idx = partition_pool(train.y, test.y, partitioner, dc.test_samples, dc.seed)
    parts = [(train.subset(a), test.subset(b)) for a, b in zip(train_idx, test_idx)]
    view = spec.client_view
    if view is not None:
        parts = [(view(tr, i, dc.num_clients, dc.seed), view(te, i, dc.num_clients, dc.seed))
                 for i, (tr, te) in enumerate(parts)]
    return FederatedData([p[0] for p in parts], [p[1] for p in parts], task_graph(dc))


def task_graph(dc: DataConfig) -> np.ndarray | None:
    """The client graph the task of ``dc`` defines (``graph = "task"``), None where it has
    none: a pool task's from its generator (no data loaded), a federated task's from its own
    graph loader where it has one (the traffic stand-in's road graph), else from its data (an
    npz file's optional ``adjacency``)."""
    spec = get_task(dc.dataset)
    if spec.pool_graph is not None:
        return spec.pool_graph(dc.num_clients)
    if spec.load_graph is not None:  # the same graph, its data not made
        return spec.load_graph(dc)
    if spec.load_federated is None or spec.has_graph is False:
        return None
    return load_federated(dc).adjacency


def data_info(dc: DataConfig) -> DataInfo:
    """Input shape, number of model outputs and kind of the data of ``dc``.

    Known without the data for every task but npz, whose file is read; for members,
    from the run's schema.
    """
    if dc.schema is not None:
        return DataInfo(dc.schema.input_shape, dc.schema.num_outputs, dc.schema.kind)
    info = get_task(dc.dataset).info
    if info is not None:
        return info
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


_REUSED: dict[tuple, nn.Module] = {}
_THREADS = threading.local()  # a stacking engine's client threads' own models
_SPARE: dict[tuple, list[nn.Module]] = {}  # and those its finished threads gave back


def model_for(dc: DataConfig, model: str = "auto") -> nn.Module:
    """A model of the run's architecture for a client to load received weights into.

    Built (and initialised) once per process and architecture (the model's builder,
    input shape and outputs), then reused, on whatever device it was left: a
    simulation worker or an in-process run serves many messages, and building and
    initialising the CNN costs more than loading weights into it. The caller
    overwrites every parameter and buffer (``load_state_dict``), so nothing of
    one message reaches the next.
    """
    info = data_info(dc)
    builder = MODELS[model_name(dc, model)]
    key = (builder, info.input_shape, info.num_outputs)
    if key not in _REUSED:
        _REUSED[key] = builder(info.input_shape, info.num_outputs)
    if not stacking_worker():
        return _REUSED[key]
    # a client's thread of an engine that trains clients together (tasks.stacked) keeps its
    # model while the others load theirs: one of its own (a copy: no draw of torch's random
    # numbers), given back for the next thread when it is done (release_thread_models)
    own = _THREADS.__dict__.setdefault("models", {})
    if key not in own:
        spare = _SPARE.get(key)
        own[key] = spare.pop() if spare else copy.deepcopy(_REUSED[key])
    return own[key]


def release_thread_models() -> None:
    """This thread is done with its models (:func:`model_for` in an engine's client thread):
    the next threads take them."""
    for key, model in _THREADS.__dict__.pop("models", {}).items():
        _SPARE.setdefault(key, []).append(model)


def drop_spare_models() -> None:
    """Forget the models finished client threads gave back (:func:`release_thread_models`):
    a run that stacked its clients is over, and the next one in this process (a grid's) may
    have another architecture; what it kept (a copy per client of a round, 325 CNNs or
    GRUs) would otherwise stay for the process's life."""
    _SPARE.clear()


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


def held_rows(n: int, fraction: float, seed: int, client_id: int, key: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random ``fraction`` of ``n`` training rows held out (at least one, and at
    least one left to train on): the held-out rows and the rest. ``key`` names the setting
    in the error."""
    held = max(1, round(fraction * n))
    if n < 2 or held >= n:
        raise ValueError(f"client {client_id} has {n} training rows: {key} = {fraction} "
                         "leaves none to train on; allowed: a smaller fraction")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + client_id)
    order = torch.randperm(n, generator=gen)
    return order[:held], order[held:]


def hold_out(data: ClientData, fraction: float, seed: int, client_id: int) -> ClientData:
    """``data`` with a validation split in place of its test split: a seeded random
    ``fraction`` of the training rows (at least one, and at least one left to train on),
    never trained on; the test rows are dropped (a tuning run never sees them)."""
    val, train = held_rows(len(data.y_train), fraction, seed, client_id, "validation-fraction")
    return ClientData(data.x_train[train], data.y_train[train],
                      data.x_train[val], data.y_train[val])


# every client of a paper-scale run (207-325 sensors, 1,000 clients): with fewer places, a
# round that goes through more clients than it holds finds none and reads every one from disk
@functools.lru_cache(maxsize=1024)
def _client_data(dc: DataConfig, client_id: int) -> ClientData:
    if dc.validation_fraction > 0:  # the cache holds the whole split; held out here
        whole = _client_data(dataclasses.replace(dc, validation_fraction=0.0), client_id)
        return hold_out(whole, dc.validation_fraction, dc.seed, client_id)

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
