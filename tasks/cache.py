"""A client's prepared data, cached on the node's disk.

On a SuperNode every message runs in a fresh ClientApp process; without a
cache each one would load and partition the whole dataset again. The first
process that prepares a client's tensors writes them here; the next ones read
them (a few milliseconds, where loading and partitioning MNIST takes seconds).

The file name is a hash of everything that determines the tensors: the data
config (dataset, partitioning, seed, number of partitions, partition id, test
samples, the task's own options), the data folder's files (path, size and
modification time of each), and the code that prepares them (a hash of the
``tasks`` package's source), so a changed key never reads a stale cache.
Files are written to a temporary name and renamed (atomic), so ClientApp
processes that start at once never read a part-written file; the loser of a
race writes the same bytes. Files are uncompressed ``.npz`` (plain arrays:
written at disk speed, read without pickle, ``allow_pickle=False``).

Where: ``$FEDAMP_CACHE_DIR``, default ``~/.cache/fedamp-flwr``;
``FEDAMP_CACHE_DIR=off`` turns the cache off. The files are copies of the
clients' data (a member's own records): each is readable by its owner only
(``0600``, a new folder ``0700``: :mod:`tasks.files`). Removing the folder
removes them all; nothing else refers to it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .files import atomic_write

CACHE_ENV = "FEDAMP_CACHE_DIR"
FORMAT = 2  # 2: .npz of plain arrays (1: torch.save)


def cache_dir() -> Path | None:
    """The cache folder, or None when the cache is off."""
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() == "off":
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "fedamp-flwr"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the source of the ``tasks`` package (what prepares a client's data)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def data_fingerprint(data_dir: str) -> list:
    """Path, size and modification time of every file of a data folder (or of one file)."""
    if not data_dir:
        return []
    root = Path(data_dir).expanduser().resolve()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) \
        if root.is_dir() else []
    out = []
    for p in files:
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def cache_key(data_config, client_id: int) -> str:
    """The hash naming a client's cached tensors (see the module docstring)."""
    record = {"format": FORMAT, "config": dataclasses.asdict(data_config), "client": client_id,
              "code": code_version(), "data": data_fingerprint(data_config.data_dir),
              "torch": torch.__version__}
    return hashlib.sha256(json.dumps(record, sort_keys=True, allow_nan=False).encode()).hexdigest()


def cached(data_config, client_id: int, make: Callable[[], dict[str, torch.Tensor]]
           ) -> dict[str, torch.Tensor]:
    """The tensors of a client: read from the cache, or ``make()`` and written there."""
    folder = cache_dir()
    if folder is None:
        return make()
    path = folder / f"client-{cache_key(data_config, client_id)}.npz"
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {k: torch.from_numpy(stored[k]) for k in stored.files}
    except FileNotFoundError:
        pass
    except Exception:  # a damaged file: make it again
        path.unlink(missing_ok=True)
    tensors = make()
    try:
        arrays: dict[str, Any] = {k: v.numpy() for k, v in tensors.items()}
        atomic_write(path, lambda f: np.savez(f, **arrays), private=True)  # the member's data
    except OSError:  # a read-only or full disk: go on without the cache
        pass
    return tensors
