"""Tasks: datasets with their models, partitioners and clients' data.

The task table (:mod:`tasks.registry`: every dataset name with its model,
data and settings) and the loaders (:mod:`tasks.loading`: a task's pool, its
clients' data, its model); the rest of the package is what they are made of
(:mod:`tasks.data` readers and generators, :mod:`tasks.recipes` and
:mod:`tasks.partitioners`,
:mod:`tasks.federated` tasks, :mod:`tasks.members` (members' own files),
:mod:`tasks.models`, :mod:`tasks.train` (the generic loops), :mod:`tasks.cache`,
:mod:`tasks.graphs`, :mod:`tasks.scenarios`). Everything the app uses is
importable from ``tasks`` itself.
"""

from __future__ import annotations

from .data import DataDirError
from .loading import (
    ClientCountError,
    ClientData,
    build_model,
    data_info,
    load_client_data,
    load_federated,
    load_pool,
    model_for,
    model_name,
    task_graph,
)
from .members import MemberDataError, MemberSchema
from .models import MODELS
from .registry import (
    CLASSIFICATION,
    MEMBERS,
    REGRESSION,
    TASKS,
    TRAFFIC_GENERATED,
    TRAFFIC_GRAPHS,
    DataConfig,
    DataInfo,
    TaskSpec,
    client_groups,
    get_task,
)

__all__ = [
    "CLASSIFICATION", "MEMBERS", "MODELS", "REGRESSION", "TASKS", "TRAFFIC_GENERATED",
    "TRAFFIC_GRAPHS", "ClientCountError", "DataDirError",
    "ClientData", "DataConfig", "DataInfo", "MemberDataError", "MemberSchema", "TaskSpec",
    "build_model", "client_groups", "data_info", "get_task", "load_client_data",
    "load_federated", "load_pool", "model_for", "model_name", "task_graph",
]
