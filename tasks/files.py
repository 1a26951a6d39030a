"""Files this app writes on a machine: atomically, and readable by their owner only.

A member's node holds copies of the member's data (the node cache) and models
trained on it (``model-dir``): nobody but the account that runs the SuperNode
should read them. Folders are made ``0700`` and files ``0600``, whatever the
machine's umask; a folder that exists already keeps its mode (it is the
member's), the files written into it do not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

FOLDER_MODE, FILE_MODE = 0o700, 0o600


def private_folder(path: Path) -> Path:
    """``path`` made (with its missing parents) readable by its owner only; returned."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for p in missing:
        os.chmod(p, FOLDER_MODE)
    return path


def owner_only_tree(folder: Path) -> None:
    """Every file under ``folder`` made ``0600`` and every folder ``0700`` (links are not
    followed): for what a library writes with its own modes (MLflow's file store,
    TensorBoard's event files), into a folder made ``0700`` before it wrote, so that no other
    account could reach them meanwhile. The process's umask is never changed (other threads,
    and libraries that read it by setting it, share it)."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, FOLDER_MODE)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, FILE_MODE)


def write_private_text(path: Path, text: str) -> None:
    """``path.write_text(text)`` (UTF-8), atomically and readable by its owner only."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data), private=True)


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the file system lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], object], private: bool = False) -> None:
    """Write ``path`` through ``write(file)`` into a temporary file, sync it, then rename it
    over ``path``: a reader sees the old file or the new one, never a part. ``private``:
    the file is ``0600`` and new folders ``0700``."""
    if private:
        private_folder(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a stale one (or a link planted in its place): never followed
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     FILE_MODE if private else 0o666)
        with os.fdopen(fd, "wb") as f:
            if private:
                os.fchmod(f.fileno(), FILE_MODE)  # O_CREAT's mode passes through the umask
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_folder(path.parent)
