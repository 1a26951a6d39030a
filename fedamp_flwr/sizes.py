"""About how much memory a run needs, checked against the machine's before any work.

Every size key of the run config has a static upper bound
(``strategies.core.settings``: ``MOST_ROUNDS``, ``MOST_WIDTH``, ...), but sizes
within their bounds can still multiply beyond any machine (a hypernetwork of
width 100,000 has 10^10 weights). Two estimates, from a validated
:class:`fedamp_flwr.config.RunConfig` and the run's model built on torch's meta
device (nothing allocated, a millisecond, once per process and architecture):

* a client's training (:func:`client_bytes`): the model's P parameters, about
  :data:`MODEL_COPIES` times (weights, gradients, Adam's two moments, the model
  received), a batch's inputs and their activations (:data:`ACTIVATIONS` times
  the inputs), its test rows, and with ``dp = "dp-sgd"`` a gradient per example
  of the batch; checked by ``RunConfig.from_run_config`` in every process;
* what the server holds for its method with n clients (:func:`server_bytes`,
  the method's ``Settings.server_floats``: by default the replies and a model
  per client; FedAMP 3 n P; Panacea its hypernetwork three times); checked by
  the ServerApp with n = max(min-nodes, 2) before it waits for clients, and
  again with the clients found.

Numbers are float32 (4 bytes). An estimate above the machine's memory
(``psutil.virtual_memory().total``) is one :class:`ConfigError` line naming the
size key that, back at its default, lowers the estimate most (the members' schema,
``member-input-shape`` and ``member-outputs``, only where no other key would fit). Where the model
cannot be built without the data (the npz task before its file is read) or here
at all (ResNet-18 where torchvision does not load), nothing is estimated: the
run stops where it builds the model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import psutil
import torch

import tasks
from strategies.core.settings import ConfigError, bad

FLOAT = 4  # bytes of a float32
#: copies of the model a training client holds: weights, gradients, Adam's two moments,
#: the model received
MODEL_COPIES = 5
#: a batch's activations, as a multiple of its inputs (rough: the CNN's first layer has 32
#: channels of the image's size)
ACTIVATIONS = 32
#: the keys the memory check may name, in the order ties are named: first the run's choices,
#: then the members' data's schema (named only where no choice, at its default, would fit)
SIZE_KEYS = ("batch-size", "test-samples", "min-nodes", "panacea-hidden", "panacea-embed-dim",
             "panacea-mlp-layers", "panacea-gnn-layers")
SCHEMA_KEYS = ("member-input-shape", "member-outputs")
#: where a key's declared default is no size ("auto", "", 0): the value it is reset to
#: (batch-size: the generic "auto" value, fedamp_flwr.config.GENERIC_AUTO)
RESET = {"batch-size": 100, "member-outputs": 2}


def machine_memory() -> int:
    """This machine's memory in bytes."""
    return int(psutil.virtual_memory().total)


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """The run's model: its trainable parameters and the values of one input."""

    params: int
    inputs: int


def model_size(cfg: Any, read_data: bool = False, num_clients: int = 2) -> ModelSize | None:
    """The size of ``cfg``'s model (built on the meta device) with ``num_clients`` clients;
    None where its input shape needs the data read (the npz task) and ``read_data`` is False,
    or it cannot be built here."""
    dc = cfg.data_config(num_clients)
    if tasks.get_task(cfg.dataset).info is None and dc.schema is None and not read_data:
        return None
    try:
        info = tasks.data_info(dc)  # outside the meta device: it may read (and cache) data
        params = _parameters(tasks.model_name(dc, cfg.model), info.input_shape, info.num_outputs)
    except (ImportError, RuntimeError, OSError, ValueError):  # e.g. torchvision does not load
        return None
    return ModelSize(params, math.prod(info.input_shape))


@functools.lru_cache(maxsize=64)
def _parameters(name: str, shape: tuple[int, ...], outputs: int) -> int:
    """The trainable parameters of model ``name``, built on the meta device once per process
    and architecture (every ClientApp message reads the run config)."""
    with torch.device("meta"):
        model = tasks.MODELS[name](shape, outputs)
    return sum(p.numel() for p in model.parameters())


def client_bytes(cfg: Any, size: ModelSize) -> int:
    """About the bytes of one client's training (see the module's doc)."""
    batch = int(cfg.batch_size)
    floats = (MODEL_COPIES * size.params + batch * size.inputs * (1 + ACTIVATIONS)
              + cfg.test_samples * size.inputs)
    if cfg.dp == "dp-sgd":  # a gradient per example of the batch
        floats += batch * size.params
    return FLOAT * floats


def server_bytes(cfg: Any, size: ModelSize, num_clients: int) -> int:
    """About the bytes the server holds for ``cfg``'s method with ``num_clients`` clients."""
    return FLOAT * int(cfg.settings.server_floats(size.params, num_clients))


def _estimate(cfg: Any, part: str, num_clients: int, read_data: bool) -> tuple[int, ModelSize] | None:
    size = model_size(cfg, read_data, num_clients)
    if size is None:
        return None
    if part == "client":
        return client_bytes(cfg, size), size
    return server_bytes(cfg, size, num_clients), size


def _reset(cfg: Any, key: str, num_clients: int) -> tuple[Any, int] | None:
    """``cfg`` (and the number of clients) with size ``key`` at its default; None where it is
    there already."""
    if key == "min-nodes":
        return (cfg, 2) if num_clients > 2 else None
    generic = type(cfg).generic_fields()
    if key in generic:
        f = generic[key]
        default: Any = RESET.get(key, f.default)
        if key == "member-input-shape":  # "" is no shape: one value, or a small image
            dims = cfg.member_input_shape.split(",")
            default = "1" if len(dims) == 1 else f"{dims[0].strip()},32,32"
        if getattr(cfg, f.name) == default:
            return None
        return dataclasses.replace(cfg, **{f.name: default}), num_clients
    own = cfg.settings.keys()
    if key not in own or getattr(cfg.settings, own[key].name) == own[key].default:
        return None
    settings = dataclasses.replace(cfg.settings, **{own[key].name: own[key].default})
    return dataclasses.replace(cfg, settings=settings), num_clients


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}" if n < 1e11 else f"{n / 1e9:,.0f}"


def check_memory(cfg: Any, part: str, num_clients: int = 2, read_data: bool = False) -> None:
    """Raise the ConfigError of the size key most responsible when ``part`` ("client": one
    client's training; "server": the server's with ``num_clients`` clients) would need more
    than this machine's memory. ``read_data``: the npz task's file may be read for its
    input shape."""
    found = _estimate(cfg, part, num_clients, read_data)
    memory = machine_memory()
    if found is None or found[0] <= memory:
        return
    need, size = found
    best: tuple[int, str] | None = None
    for key in (*SIZE_KEYS, *SCHEMA_KEYS):
        if key in SCHEMA_KEYS and best is not None and best[0] <= memory:
            break  # a choice of the run, at its default, fits: that choice is named
        reset = _reset(cfg, key, num_clients)
        smaller = None if reset is None else _estimate(reset[0], part, reset[1], read_data)
        if smaller is not None and smaller[0] < need and (best is None or smaller[0] < best[0]):
            best = (smaller[0], key)
    key = best[1] if best else ("model" if cfg.model != "auto" else "dataset")
    value = cfg.to_dict().get(key)
    if part == "client":
        what = (f"a client would need about {_gb(need)} GB to train (a model of "
                f"{size.params:,} parameters, inputs of {size.inputs:,} values)")
    else:
        what = (f"the server would hold about {_gb(need)} GB ({cfg.settings.SERVER_HOLDS}; "
                f"{num_clients} clients, a model of {size.params:,} parameters)")
    raise bad(key, value, f"a size whose models fit this machine's memory: {what}, this "
              f"machine has {_gb(memory)} GB")


def check_client_memory(cfg: Any) -> None:
    """:func:`check_memory` of one client's training (every process builds the model)."""
    check_memory(cfg, "client")


def check_server_memory(cfg: Any, num_clients: int, read_data: bool = False) -> None:
    """:func:`check_memory` of the server's method with ``num_clients`` clients."""
    check_memory(cfg, "server", num_clients, read_data)


__all__ = ["ConfigError", "check_client_memory", "check_memory", "check_server_memory",
           "client_bytes", "model_size", "server_bytes"]
