"""Federated partitioning of a dataset pool, its recipes: which classes and how many rows
each client gets (plain numpy, no flwr-datasets; the partitioners that apply a recipe to a
pool are :mod:`tasks.partitioners`).

``iid``, ``pathological`` and ``dirichlet`` use flwr-datasets' own partitioners
(``IidPartitioner``, ``PathologicalPartitioner``, ``DirichletPartitioner``);
``practical``, the FedAMP paper's setting, is ``tasks.partitioners.PracticalPartitioner``,
a ``flwr_datasets.partitioner.Partitioner`` subclass, from the recipe here.

Every client also gets a test split drawn from the test pool with the same
label mixture as its training partition (:func:`matching_test_indices`), so
that each client is evaluated on its own distribution, as in the paper.
Everything is deterministic for a given seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PARTITIONINGS = ("practical", "iid", "pathological", "dirichlet", "blocks")

# The paper's practical presets: 5 groups, dominant classes {0,1}..{8,9}, a
# training-set size per client of each group (Huang et al. 2021, Sec. 5.1).
PRACTICAL_GROUP_CLASSES: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
PRACTICAL_SIZES = {
    "mnist": (500, 400, 300, 200, 100),
    "fmnist": (600, 500, 400, 300, 200),
}
PRACTICAL_SIZES_DEFAULT = (500, 400, 300, 200, 100)


def client_group(client_id: int, num_clients: int, num_groups: int = 5) -> int:
    """Group of a client: consecutive ids, ``client_id * G // n`` with ``G = min(num_groups, n)``.

    The groups of the practical partitioning, of the synthetic task's
    rotations and of ``graph = "groups"``.
    """
    return client_id * min(num_groups, num_clients) // num_clients


@dataclass(frozen=True)
class PracticalRecipe:
    """The practical setting of one dataset: each client's group, the groups' dominant
    classes and each client's training size.

    Parameters
    ----------
    group_classes : tuple[tuple[int, ...], ...]
        Dominant classes of each group.
    group_sizes : tuple[int, ...] | None
        Training samples per client of each group (MNIST: 500, 400, ...).
    group_shares : tuple[float, ...] | None
        Share of the clients in each group, in order of consecutive ids (EMNIST:
        10/62, 26/62, 26/62); None: equal groups, ``client_group``.
    size_blocks : tuple[int, ...] | None
        Training samples per client of equal blocks of consecutive clients, set
        apart from the groups (CIFAR-100: 500, 400, 300, 200, 100 for blocks of
        20 of its 100 clients); used instead of ``group_sizes``.
    """

    group_classes: tuple[tuple[int, ...], ...] = PRACTICAL_GROUP_CLASSES
    group_sizes: tuple[int, ...] | None = PRACTICAL_SIZES_DEFAULT
    group_shares: tuple[float, ...] | None = None
    size_blocks: tuple[int, ...] | None = None
    superclass_groups: int = 0

    @property
    def num_groups(self) -> int:
        """Number of groups."""
        return self.superclass_groups or len(self.group_classes)

    def for_pool(self, coarse_of_fine: Sequence[int] | None) -> PracticalRecipe:
        """The recipe with its dominant classes filled in from the data: with
        ``superclass_groups`` = G, group g is dominated by the fine classes of superclass g."""
        if not self.superclass_groups:
            return self
        if coarse_of_fine is None:
            raise ValueError("this practical setting groups clients by superclass, but the data "
                             "has no coarse labels")
        coarse = np.asarray(coarse_of_fine)
        groups = tuple(tuple(int(c) for c in np.flatnonzero(coarse == g))
                       for g in range(self.superclass_groups))
        if any(len(g) == 0 for g in groups):
            raise ValueError(f"the coarse labels must cover the {self.superclass_groups} superclasses")
        return dataclasses.replace(self, group_classes=groups, superclass_groups=0)

    def groups(self, n: int) -> list[int]:
        """The group of each of ``n`` clients (consecutive ids form a group)."""
        if self.group_shares is None:
            return [client_group(i, n, self.num_groups) for i in range(n)]
        starts = np.round(np.cumsum((0.0,) + tuple(self.group_shares[:-1])) * n).astype(int)
        return [int(np.searchsorted(starts, i, side="right")) - 1 for i in range(n)]

    def sizes(self, n: int) -> list[int]:
        """The training size of each of ``n`` clients."""
        if self.size_blocks is not None:
            blocks = self.size_blocks
            return [blocks[client_group(i, n, len(blocks))] for i in range(n)]
        if self.group_sizes is None:
            raise ValueError("a practical recipe needs group_sizes or size_blocks")
        sizes = self.group_sizes
        return [sizes[g] for g in self.groups(n)]


def emnist_recipe() -> PracticalRecipe:
    """FedAMP paper's EMNIST practical setting: 62 clients in three groups of consecutive ids,
    0-9 dominated by the digits (classes 0-9) with 1000 training samples each, 10-35 by the
    upper-case letters (10-35) with 700, 36-61 by the lower-case letters (36-61) with 400."""
    return PracticalRecipe(
        group_classes=(tuple(range(10)), tuple(range(10, 36)), tuple(range(36, 62))),
        group_sizes=(1000, 700, 400), group_shares=(10 / 62, 26 / 62, 26 / 62))


def cifar100_recipe() -> PracticalRecipe:
    """FedAMP paper's CIFAR-100 practical setting: 100 clients in 20 groups of 5 consecutive
    ids, group g dominated by the 5 classes of superclass g (from the dataset's coarse
    labels, :meth:`PracticalRecipe.for_pool`), with 500, 400, 300, 200 and 100 training
    samples for consecutive blocks of 20 clients."""
    return PracticalRecipe(group_classes=(), group_sizes=None, superclass_groups=20,
                           size_blocks=(500, 400, 300, 200, 100))


def split_evenly(total: int, parts: int) -> np.ndarray:
    """Split ``total`` into ``parts`` integers that differ by at most one."""
    base = np.full(parts, total // parts, dtype=np.int64)
    base[: total % parts] += 1
    return base


def practical_class_counts(
    n: int, dominant: Sequence[int], num_classes: int, dominant_fraction: float = 0.8
) -> np.ndarray:
    """Per-class sample counts of one client of the practical setting.

    ``round(dominant_fraction * n)`` samples are spread evenly over the
    ``dominant`` classes and the rest evenly over all other classes.
    """
    counts = np.zeros(num_classes, dtype=np.int64)
    others = [c for c in range(num_classes) if c not in set(dominant)]
    n_dom = int(round(dominant_fraction * n)) if others else n
    counts[list(dominant)] = split_evenly(n_dom, len(dominant))
    if others:
        counts[others] = split_evenly(n - n_dom, len(others))
    return counts


def draw_by_counts(
    labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator, reuse: bool
) -> list[np.ndarray]:
    """Draw, for every row of ``counts`` (clients x classes), that many indices per class.

    Indices of each class are taken in a seeded random order. With ``reuse``
    False the clients' indices are disjoint and running out of a class is an
    error; with ``reuse`` True a class pool is reshuffled and taken again when
    it runs out (used for test sets, which may share samples across clients).
    """
    num_classes = counts.shape[1]
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    needed = counts.sum(axis=0)
    if not reuse:
        for c in range(num_classes):
            if needed[c] > len(pools[c]):
                raise ValueError(
                    f"the partitioning needs {needed[c]} samples of class {c} but the "
                    f"dataset has {len(pools[c])}; use fewer clients or smaller partitions"
                )
    elif np.any((needed > 0) & (np.array([len(p) for p in pools]) == 0)):
        missing = [c for c in range(num_classes) if needed[c] and not len(pools[c])]
        raise ValueError(f"the test split has no samples of class(es) {missing}")
    cursor = np.zeros(num_classes, dtype=np.int64)
    out = []
    for row in counts:
        parts = []
        for c in (int(i) for i in np.flatnonzero(row)):
            k = int(row[c])
            pool = pools[c]
            if reuse:
                take = pool[(cursor[c] + np.arange(k)) % len(pool)]
            else:
                take = pool[cursor[c] : cursor[c] + k]
            cursor[c] += k
            parts.append(take)
        out.append(rng.permutation(np.concatenate(parts)) if parts else np.zeros(0, np.int64))
    return out


def matching_test_indices(
    test_labels: np.ndarray,
    train_counts: np.ndarray,
    n_test: int,
    seed: int,
) -> list[np.ndarray]:
    """Draw ``n_test`` test indices per client with its training label mixture.

    ``train_counts`` is (clients x classes). A client's per-class test counts
    are ``n_test * p`` rounded by largest remainder, ``p`` its training label
    proportions; under the practical partitioning this is the paper's "100
    test samples drawn from the same mixture". Test samples may repeat across
    clients (not within one client while the class pool lasts).
    """
    counts = np.zeros_like(train_counts)
    for i, row in enumerate(train_counts):
        total = row.sum()
        if total == 0:
            continue
        exact = n_test * row / total
        base = np.floor(exact).astype(np.int64)
        order = np.argsort(-(exact - base), kind="stable")
        base[order[: n_test - base.sum()]] += 1
        counts[i] = base
    return draw_by_counts(test_labels, counts, np.random.default_rng(seed + 1), reuse=True)
