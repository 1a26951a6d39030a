"""The partitioners that run on flwr-datasets (imported only when a pool is partitioned),
each applying a recipe of :mod:`tasks.recipes`.

``flwr_datasets`` and ``datasets`` take seconds to import; a ClientApp that finds
its data in the node's cache (:mod:`tasks.cache`) never needs them.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    Partitioner,
    PathologicalPartitioner,
)

from .recipes import (
    PARTITIONINGS,
    PRACTICAL_GROUP_CLASSES,
    PRACTICAL_SIZES_DEFAULT,
    PracticalRecipe,
    draw_by_counts,
    matching_test_indices,
    practical_class_counts,
    split_evenly,
)


class PracticalPartitioner(Partitioner):
    """The FedAMP paper's practical non-IID partitioning (Huang et al. 2021, Sec. 5.1).

    Clients are split into ``len(group_classes)`` groups of consecutive
    partition ids (partition ``i`` of ``n`` is in group ``i * G // n``). A
    client of group ``g`` gets ``group_sizes[g]`` samples: a share
    ``dominant_fraction`` (paper: 80%) spread evenly over the group's dominant
    classes and the rest spread evenly over all other classes. Partitions are
    disjoint and depend only on ``seed``. With fewer clients than groups only
    the first ``num_partitions`` groups are used.

    Parameters
    ----------
    num_partitions : int
        Number of clients.
    group_classes : Sequence[Sequence[int]]
        Dominant classes of each group, e.g. ``((0, 1), (2, 3), ...)``.
    group_sizes : Sequence[int]
        Training samples per client of each group (same length as ``group_classes``).
    dominant_fraction : float (default: 0.8)
        Share of a client's samples drawn from its group's dominant classes.
    partition_by : str (default: "label")
        Column holding the class labels.
    seed : int (default: 42)
        Seed of the draw.
    """

    def __init__(
        self,
        num_partitions: int,
        group_classes: Sequence[Sequence[int]] = PRACTICAL_GROUP_CLASSES,
        group_sizes: Sequence[int] = PRACTICAL_SIZES_DEFAULT,
        dominant_fraction: float = 0.8,
        partition_by: str = "label",
        seed: int = 42,
        recipe: PracticalRecipe | None = None,
    ) -> None:
        super().__init__()
        if num_partitions <= 0:
            raise ValueError(f"num_partitions must be > 0, got {num_partitions}")
        if recipe is None:
            if len(group_classes) != len(group_sizes) or not group_classes:
                raise ValueError("group_classes and group_sizes must be non-empty and of equal length")
            recipe = PracticalRecipe(tuple(tuple(int(c) for c in g) for g in group_classes),
                                     tuple(int(s) for s in group_sizes))
        if not 0.0 <= dominant_fraction <= 1.0:
            raise ValueError(f"dominant_fraction must be in [0, 1], got {dominant_fraction}")
        self._num_partitions = num_partitions
        self._recipe = recipe
        self._groups = recipe.groups(num_partitions)
        self._sizes = recipe.sizes(num_partitions)
        self._dominant_fraction = dominant_fraction
        self._partition_by = partition_by
        self._seed = seed
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        """Number of partitions."""
        return self._num_partitions

    def group_of(self, partition_id: int) -> int:
        """Return the group of ``partition_id``."""
        return self._groups[partition_id]

    def class_counts(self, num_classes: int) -> np.ndarray:
        """Per-client per-class training counts, shape (num_partitions, num_classes)."""
        return np.stack([
            practical_class_counts(self._sizes[i], self._recipe.group_classes[self._groups[i]],
                                   num_classes, self._dominant_fraction)
            for i in range(self._num_partitions)
        ])

    def _compute(self) -> list[np.ndarray]:
        labels = np.asarray(self.dataset[self._partition_by], dtype=np.int64)
        num_classes = int(labels.max()) + 1
        counts = self.class_counts(num_classes)
        return draw_by_counts(labels, counts, np.random.default_rng(self._seed), reuse=False)

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Return the rows of partition ``partition_id``."""
        if not 0 <= partition_id < self._num_partitions:
            raise ValueError(
                f"partition_id {partition_id} is outside [0, {self._num_partitions})"
            )
        if self._indices is None:
            self._indices = self._compute()
        return self.dataset.select(self._indices[partition_id])


class LabelBlocksPartitioner(Partitioner):
    """Each client gets every sample of its own block of classes: the classes split into
    ``num_partitions`` contiguous blocks (sizes differing by at most one), client i the i-th.

    The two-host setting of Ioste and Finger's combination (MNIST digits 0-4 on one
    host, 5-9 on the other) is ``num_partitions = 2``. Needs no more clients than classes.
    """

    def __init__(self, num_partitions: int, partition_by: str = "label") -> None:
        super().__init__()
        self._num_partitions = num_partitions
        self._partition_by = partition_by

    @property
    def num_partitions(self) -> int:
        """Number of partitions."""
        return self._num_partitions

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Return the rows of the classes of block ``partition_id``."""
        labels = np.asarray(self.dataset[self._partition_by], dtype=np.int64)
        num_classes = int(labels.max()) + 1
        if self._num_partitions > num_classes:
            raise ValueError(f"{self._num_partitions} clients but only {num_classes} classes "
                             "to split into blocks")
        ends = np.cumsum(split_evenly(num_classes, self._num_partitions))
        lo, hi = (0 if partition_id == 0 else ends[partition_id - 1]), ends[partition_id]
        return self.dataset.select(np.flatnonzero((labels >= lo) & (labels < hi)))


def build_partitioner(
    name: str,
    num_partitions: int,
    seed: int,
    dirichlet_alpha: float = 0.5,
    recipe: PracticalRecipe | None = None,
) -> Partitioner:
    """Return the partitioner called ``name`` (one of :data:`PARTITIONINGS`).

    ``recipe``: the dataset's practical setting (default: MNIST's).
    """
    if name == "practical":
        return PracticalPartitioner(num_partitions, seed=seed, recipe=recipe or PracticalRecipe())
    if name == "iid":
        return IidPartitioner(num_partitions)
    if name == "pathological":
        return PathologicalPartitioner(
            num_partitions, "label", num_classes_per_partition=2,
            class_assignment_mode="first-deterministic", seed=seed,
        )
    if name == "blocks":
        return LabelBlocksPartitioner(num_partitions)
    if name == "dirichlet":
        return DirichletPartitioner(
            num_partitions, "label", alpha=dirichlet_alpha, min_partition_size=10,
            self_balancing=True, seed=seed,
        )
    raise ValueError(f"unknown partitioning '{name}'; allowed: {', '.join(PARTITIONINGS)}")


def partition_pool(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    partitioner: Partitioner,
    n_test: int,
    seed: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Partition a pool: training indices and test indices of every client.

    The training labels are wrapped in a ``datasets.Dataset`` (labels and row
    ids only, shuffled with ``seed``), handed to ``partitioner``, and each
    partition's row ids are read back; test indices follow each client's mixture.
    """
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    ds = datasets.Dataset.from_dict(
        {"label": train_labels.astype(np.int64), "row": np.arange(len(train_labels))}
    ).shuffle(seed=seed)
    partitioner.dataset = ds
    train_idx = []
    for pid in range(partitioner.num_partitions):
        part = partitioner.load_partition(pid)
        # the whole column at once (Arrow to NumPy), not row by row through Python objects
        train_idx.append(np.asarray(part.with_format("numpy")["row"], dtype=np.int64))
    counts = np.stack([np.bincount(train_labels[i], minlength=num_classes) for i in train_idx])
    return train_idx, matching_test_indices(test_labels, counts, n_test, seed)

