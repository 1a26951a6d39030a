"""Partitioners: the practical 80/20 mix, sizes, determinism; real MNIST files."""

from __future__ import annotations

import numpy as np
import pytest

import tasks
from tasks.partitioners import PracticalPartitioner, build_partitioner, partition_pool
from tasks.recipes import matching_test_indices, practical_class_counts

from .helpers import needs_data


def _labels(n_per_class=1000, classes=10, seed=0):
    y = np.repeat(np.arange(classes), n_per_class)
    return np.random.default_rng(seed).permutation(y)


def test_practical_class_counts_are_80_20():
    counts = practical_class_counts(500, (2, 3), 10)
    assert counts.sum() == 500
    assert counts[[2, 3]].tolist() == [200, 200]
    assert counts[[0, 1, 4, 5, 6, 7, 8, 9]].sum() == 100
    assert counts.max() - counts[[0, 1, 4, 5, 6, 7, 8, 9]].min() == 200 - 12


@pytest.mark.slow
def test_practical_partitions_sizes_mix_disjoint_and_deterministic():
    train, test = _labels(), _labels(300, seed=1)
    parts = [partition_pool(train, test, PracticalPartitioner(20, seed=3), 100, 3) for _ in range(2)]
    (tr, te), (tr2, te2) = parts
    assert all(np.array_equal(a, b) for a, b in zip(tr + te, tr2 + te2))  # deterministic
    sizes = [len(i) for i in tr]
    assert sizes == [500] * 4 + [400] * 4 + [300] * 4 + [200] * 4 + [100] * 4
    all_idx = np.concatenate(tr)
    assert len(np.unique(all_idx)) == len(all_idx)  # disjoint
    for pid, (idx, tidx) in enumerate(zip(tr, te)):
        g = pid // 4
        dominant = np.isin(train[idx], (2 * g, 2 * g + 1)).mean()
        assert dominant == pytest.approx(0.8, abs=1e-9)
        assert len(tidx) == 100
        assert np.isin(test[tidx], (2 * g, 2 * g + 1)).mean() == pytest.approx(0.8, abs=1e-9)
    other = partition_pool(train, test, PracticalPartitioner(20, seed=4), 100, 4)[0]
    assert not np.array_equal(other[0], tr[0])  # the seed matters


def test_practical_scales_to_fewer_clients_and_refuses_too_many():
    p = PracticalPartitioner(7)
    assert [p.group_of(i) for i in range(7)] == [0, 0, 1, 2, 2, 3, 4]
    assert [PracticalPartitioner(2).group_of(i) for i in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="needs .* samples of class"):
        partition_pool(_labels(50), _labels(50), PracticalPartitioner(20), 100, 0)


def test_test_split_follows_the_training_mixture():
    counts = np.array([[30, 10, 0], [0, 0, 7]])
    idx = matching_test_indices(np.array([0, 1, 2] * 50), counts, 20, seed=0)
    labels = np.array([0, 1, 2] * 50)
    assert np.bincount(labels[idx[0]], minlength=3).tolist() == [15, 5, 0]
    assert np.bincount(labels[idx[1]], minlength=3).tolist() == [0, 0, 20]


@pytest.mark.parametrize("name", ["iid", "pathological", "dirichlet"])
def test_flower_partitioners_cover_the_data(name):
    train = _labels(200)
    tr, te = partition_pool(train, _labels(50, seed=2), build_partitioner(name, 10, 0), 40, 0)
    assert len(tr) == 10 and all(len(i) > 0 for i in tr)
    allidx = np.concatenate(tr)
    assert len(np.unique(allidx)) == len(allidx)
    if name == "pathological":
        assert all(len(np.unique(train[i])) <= 2 for i in tr)
    assert all(len(i) == 40 for i in te)


def test_unknown_partitioning_names_the_allowed():
    with pytest.raises(ValueError, match="allowed: practical, iid, pathological, dirichlet"):
        build_partitioner("bogus", 2, 0)


@pytest.mark.slow
def test_real_fmnist_practical_preset():
    folder = needs_data("fashion_mnist")
    dc = tasks.DataConfig("fmnist", str(folder), 20, 42, "practical")
    data = tasks.load_client_data(dc, 0)
    assert tuple(data.x_train.shape) == (600, 1, 28, 28)
    assert np.isin(data.y_train.numpy(), (0, 1)).mean() == pytest.approx(0.8)
    assert float(data.x_train.min()) == -1.0 and float(data.x_train.max()) == 1.0
    last = tasks.load_client_data(dc, 19)
    assert len(last.y_train) == 200 and len(last.y_test) == 100


def test_real_mnist_idx_files():
    train, test = tasks.load_pool("mnist", str(needs_data("mnist")), 0)
    assert train.x.shape == (60_000, 1, 28, 28) and test.x.shape == (10_000, 1, 28, 28)
    assert np.bincount(train.y).tolist()[:2] == [5923, 6742]


def test_synthetic_default_sizes():
    dc = tasks.DataConfig("synthetic", "", 10, 42)
    a, b = tasks.load_client_data(dc, 0), tasks.load_client_data(dc, 9)
    assert a.x_train.shape[1] == b.x_train.shape[1] == 32
    assert len(a.y_train) == 500 and len(b.y_train) == 100


@pytest.mark.slow
def test_emnist_practical_recipe_62_clients_in_three_groups():
    from tasks.recipes import emnist_recipe

    recipe = emnist_recipe()
    groups, sizes = recipe.groups(62), recipe.sizes(62)
    assert groups == [0] * 10 + [1] * 26 + [2] * 26
    assert sizes == [1000] * 10 + [700] * 26 + [400] * 26
    train, test = _labels(1200, classes=62), _labels(200, classes=62, seed=1)
    tr, te = partition_pool(train, test, PracticalPartitioner(62, recipe=recipe, seed=0), 100, 0)
    assert [len(i) for i in tr] == sizes and all(len(i) == 100 for i in te)
    dominant = (range(10), range(10, 36), range(36, 62))
    for pid, (idx, tidx) in enumerate(zip(tr, te)):
        classes = list(dominant[groups[pid]])
        assert np.isin(train[idx], classes).mean() == pytest.approx(0.8, abs=1e-9)
        # 100 test samples in the same mixture, to the rounding of 100 x 26 classes
        assert np.isin(test[tidx], classes).mean() == pytest.approx(0.8, abs=0.03)
    all_idx = np.concatenate(tr)
    assert len(np.unique(all_idx)) == len(all_idx)


@pytest.mark.slow
def test_cifar100_practical_recipe_groups_by_superclass_sizes_by_block():
    from tasks.data import Split, coarse_of_fine
    from tasks.recipes import cifar100_recipe

    rng = np.random.default_rng(0)
    superclass = rng.permutation(np.repeat(np.arange(20), 5))  # fine class -> coarse class
    fine = _labels(600, classes=100)
    pool = Split(np.zeros((len(fine), 1)), fine, superclass[fine])
    coarse = coarse_of_fine(pool)
    assert np.array_equal(coarse, superclass)
    recipe = cifar100_recipe().for_pool(coarse)
    groups, sizes = recipe.groups(100), recipe.sizes(100)
    assert groups == [i // 5 for i in range(100)]
    assert sizes == [500] * 20 + [400] * 20 + [300] * 20 + [200] * 20 + [100] * 20
    tr, te = partition_pool(fine, _labels(60, classes=100, seed=2),
                            PracticalPartitioner(100, recipe=recipe, seed=0), 100, 0)
    for pid, idx in enumerate(tr):
        dominant = np.flatnonzero(superclass == pid // 5)
        assert len(dominant) == 5 and len(idx) == sizes[pid]
        assert np.isin(fine[idx], dominant).mean() == pytest.approx(0.8, abs=1e-9)
    with pytest.raises(ValueError, match="no coarse"):
        cifar100_recipe().for_pool(None)


def test_label_blocks_give_each_client_its_own_classes():
    train, test = _labels(100), _labels(30, seed=1)
    tr, te = partition_pool(train, test, build_partitioner("blocks", 2, 0), 50, 0)
    assert set(train[tr[0]]) == {0, 1, 2, 3, 4} and set(train[tr[1]]) == {5, 6, 7, 8, 9}
    assert len(tr[0]) == 500 and set(test[te[1]]) <= {5, 6, 7, 8, 9}
    with pytest.raises(ValueError, match="11 clients but only 10 classes"):
        partition_pool(train, test, build_partitioner("blocks", 11, 0), 50, 0)


@pytest.mark.parametrize("dataset, partitioning, sigma", [
    ("mnist", "practical", (100.0, 25.0)), ("fmnist", "practical", (10.0, 100.0)),
    ("emnist", "practical", (10.0, 50.0)), ("cifar100", "practical", (1e6, 10.0)),
])
def test_sigma_auto_takes_the_papers_cell_of_the_dataset_and_setting(dataset, partitioning, sigma):
    from fedamp_flwr.config import RunConfig

    cfgs = [RunConfig.from_run_config({"dataset": dataset, "partitioning": partitioning,
                                       "data-dir": "x", "strategy": m})
            for m in ("fedamp", "heurfedamp")]
    assert tuple(c.settings.sigma(c.dataset, c.data_setting) for c in cfgs) == sigma


@pytest.mark.parametrize("partitioning", ["iid", "pathological"])
def test_auto_sigma_where_the_paper_has_no_cell_comes_from_the_data(partitioning):
    """FedAMP's and HeurFedAMP's "auto" sigma where the paper's cell is not held here: taken
    from the data (fedamp-sigma-rule, docs/methods.md), never the practical cell's."""
    from fedamp_flwr.config import RunConfig

    for method in ("fedamp", "heurfedamp"):
        cfg = RunConfig.from_run_config({"dataset": "mnist", "partitioning": partitioning,
                                         "data-dir": "x", "strategy": method})
        assert cfg.settings.sigma("mnist", partitioning) is None
