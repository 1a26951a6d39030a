"""The node-side cache of a client's prepared data (tasks.cache): a hit reads what was
written, any change of what determines the tensors misses, writes are atomic and safe
when several ClientApp processes start at once."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os

import numpy as np
import pytest
import torch

import tasks
from tasks import cache


def _tensors(value: float = 1.0) -> dict[str, torch.Tensor]:
    return {"x_train": torch.full((3, 2), value), "y_train": torch.arange(3),
            "x_test": torch.zeros(1, 2), "y_test": torch.zeros(1, dtype=torch.long)}


class Counter:
    def __init__(self, value: float = 1.0):
        self.calls, self.value = 0, value

    def __call__(self) -> dict[str, torch.Tensor]:
        self.calls += 1
        return _tensors(self.value)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _dc(data_dir: str = "", **kw) -> tasks.DataConfig:
    return tasks.DataConfig(**{"dataset": "synthetic", "data_dir": data_dir, "num_clients": 4,
                               "seed": 0, **kw})


def test_a_hit_reads_the_written_tensors_without_making_them(folder):
    make = Counter()
    first = cache.cached(_dc(), 1, make)
    second = cache.cached(_dc(), 1, Counter(value=9.0))  # would make other values
    assert make.calls == 1 and torch.equal(first["x_train"], second["x_train"])
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temp files


@pytest.mark.parametrize("change", [
    {"seed": 1}, {"num_clients": 5}, {"partitioning": "iid"}, {"test_samples": 50},
    {"dirichlet_alpha": 0.1}, {"dataset": "fl60"}, {"tpt48_split": "random"},
])
def test_any_change_of_the_data_config_misses(folder, change):
    cache.cached(_dc(), 1, Counter())
    make = Counter()
    cache.cached(dataclasses.replace(_dc(), **change), 1, make)
    assert make.calls == 1


def test_another_client_misses(folder):
    cache.cached(_dc(), 1, Counter())
    make = Counter()
    cache.cached(_dc(), 2, make)
    assert make.calls == 1


def test_a_changed_data_file_or_code_misses(folder, tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.bin").write_bytes(b"1234")
    cache.cached(_dc(str(data)), 0, Counter())
    make = Counter()
    cache.cached(_dc(str(data)), 0, make)
    assert make.calls == 0
    (data / "train.bin").write_bytes(b"12345")  # another size
    cache.cached(_dc(str(data)), 0, make)
    assert make.calls == 1
    monkeypatch.setattr(cache, "code_version", lambda: "another version of tasks/")
    cache.cached(_dc(str(data)), 0, make)
    assert make.calls == 2


def test_a_damaged_file_is_made_again(folder):
    cache.cached(_dc(), 0, Counter())
    (path,) = folder.glob("client-*.npz")
    path.write_bytes(b"not an npz file")
    make = Counter(value=2.0)
    out = cache.cached(_dc(), 0, make)
    assert make.calls == 1 and float(out["x_train"][0, 0]) == 2.0
    with np.load(path, allow_pickle=False) as stored:  # plain arrays, no pickle
        assert stored["x_train"][0, 0] == 2.0


def test_off_makes_every_time_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    monkeypatch.setattr(cache.Path, "home", lambda: tmp_path)
    make = Counter()
    cache.cached(_dc(), 0, make)
    cache.cached(_dc(), 0, make)
    assert make.calls == 2 and not any(tmp_path.rglob("*.npz"))


def _prepare(client_id: int) -> list[float]:
    # what a ClientApp process does: the real data of a client, through the cache
    data = tasks.load_client_data(_dc(num_clients=3), client_id)
    return [float(data.x_train.sum()), float(data.x_test.sum()), len(data.y_train)]


@pytest.mark.slow
def test_processes_that_start_at_once_agree(folder):
    """Six processes prepare the same three clients at once: each gets the tensors that a
    process without a cache makes, and no part-written or temporary file is left."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        got = pool.map(_prepare, [0, 1, 2, 0, 1, 2])
    os.environ[cache.CACHE_ENV] = "off"
    try:
        tasks.loading._client_data.cache_clear()
        want = [_prepare(c) for c in (0, 1, 2)]
    finally:
        os.environ[cache.CACHE_ENV] = str(folder)
    assert got == want * 2
    assert sorted(p.name.startswith("client-") for p in folder.iterdir()) == [True] * 3
