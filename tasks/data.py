"""Dataset loading: the embedded synthetic default, local files, and the hub.

Every loader returns two :class:`Split` objects (train and test) holding plain
NumPy arrays. Images stay ``uint8`` (N, C, H, W) until a client turns its own
partition into float tensors (:func:`to_tensors`), so the full pool is cheap to
hold and to partition.

Local formats (``data-dir`` set), read without pickle:

* MNIST, Fashion-MNIST, EMNIST: the four original IDX files, ``.gz`` or not
  (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-...``).
  For EMNIST any ``*train-images-idx3-ubyte*`` / ``*test-...`` pair is taken
  (for example ``emnist-byclass-train-images-idx3-ubyte.gz``) and the images
  are transposed back to upright, as EMNIST stores them transposed.
* CIFAR-10 / CIFAR-100: the "binary version" (``data_batch_1.bin`` ...
  ``test_batch.bin``; CIFAR-100 ``train.bin`` / ``test.bin``, fine labels).

With ``data-dir`` empty, the dataset is downloaded through flwr-datasets'
``FederatedDataset`` from the Hugging Face hub.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .graphs import same_group_graph
from .recipes import client_group


class DataDirError(FileNotFoundError):
    """What a reader of the user's data folder (run config ``data-dir``) needs and did not
    find there; the message names the key and the folder already (:func:`missing_in`), so
    that the app says it once (``RunConfig.data_dir_problem``)."""


def missing_in(folder: Path | str, need: str) -> DataDirError:
    """A :class:`DataDirError`: ``need`` (what the reader needs there) after the key and the
    folder."""
    return DataDirError(f"run config 'data-dir' = '{folder}': {need}")


@dataclass(frozen=True)
class Split:
    """One split of a dataset: inputs ``x`` (N, ...), integer labels ``y`` (N,) and, for
    CIFAR-100, the coarse (superclass) labels ``coarse`` (N,)."""

    x: np.ndarray
    y: np.ndarray
    coarse: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")
        if self.coarse is not None and len(self.coarse) != len(self.y):
            raise ValueError(f"coarse has {len(self.coarse)} rows but y has {len(self.y)}")

    def subset(self, idx: np.ndarray) -> Split:
        """Return the rows ``idx`` as a new split."""
        return Split(self.x[idx], self.y[idx], None if self.coarse is None else self.coarse[idx])


def coarse_of_fine(split: Split) -> np.ndarray:
    """The superclass of every fine class, from a split's coarse labels (each fine class
    must have exactly one)."""
    if split.coarse is None:
        raise ValueError("the data has no coarse (superclass) labels")
    pairs = np.unique(np.stack([split.y, split.coarse], axis=1), axis=0)
    fine, coarse = pairs[:, 0], pairs[:, 1]
    if len(np.unique(fine)) != len(fine):
        raise ValueError("a fine class has more than one coarse label")
    out = np.full(int(fine.max()) + 1, -1, dtype=np.int64)
    out[fine] = coarse
    return out


# ---------------------------------------------------------------------------
# Embedded default: a synthetic classification task that needs no download.
# ---------------------------------------------------------------------------
SYNTHETIC_FEATURES = 32
SYNTHETIC_CLASSES = 10


SYNTHETIC_GROUPS = 5
SYNTHETIC_POOL = 30_000


def synthetic_pool_size(num_clients: int) -> int:
    """Training samples of the synthetic pool for ``num_clients`` clients: 30,000, or 500 per
    client beyond 60 clients, enough for the practical partitioning's largest class demand
    (about 45 samples per client, in a pool of about 10% per class)."""
    return max(SYNTHETIC_POOL, 500 * num_clients)


def make_synthetic(
    seed: int = 0, n_train: int = SYNTHETIC_POOL, n_test: int = 10_000
) -> tuple[Split, Split]:
    """Return the pool of a seeded 10-class Gaussian-mixture task in 32 dimensions.

    Each class is a mixture of two Gaussians with unit covariance around
    centres drawn from N(0, 0.7^2 I). Clients then see these features through
    their group's rotation (:func:`synthetic_group_view`), so groups of
    clients have different tasks: one global model cannot fit them all, while
    clients of one group gain from each other's data. The data depend only on
    ``seed``.
    """
    rng = np.random.default_rng(10_007 + seed)
    centres = rng.normal(0.0, 0.7, size=(SYNTHETIC_CLASSES, 2, SYNTHETIC_FEATURES))

    def draw(n: int) -> Split:
        y = rng.integers(0, SYNTHETIC_CLASSES, size=n)
        mode = rng.integers(0, 2, size=n)
        x = centres[y, mode] + rng.normal(size=(n, SYNTHETIC_FEATURES))
        return Split(x.astype(np.float32), y.astype(np.int64))

    return draw(n_train), draw(n_test)


def synthetic_graph(num_clients: int) -> np.ndarray:
    """The synthetic task's client graph: an edge between two clients that see the features
    through the same rotation (:func:`synthetic_group_view`: the same group, which under the
    practical partitioning also shares its dominant classes). With 5 clients or fewer every
    client is its own group, and the graph has no edges."""
    return same_group_graph([client_group(i, num_clients, SYNTHETIC_GROUPS)
                             for i in range(num_clients)])


def synthetic_group_view(split: Split, partition_id: int, num_partitions: int, seed: int) -> Split:
    """Rotate a synthetic client's features by its group's orthogonal matrix.

    Client ``i`` of ``n`` is in group ``i * G // n`` with ``G = min(5, n)``,
    the same groups as the practical partitioning; each group has its own
    seeded random rotation of the feature space.
    """

    group = client_group(partition_id, num_partitions, SYNTHETIC_GROUPS)
    rng = np.random.default_rng([20_011 + seed, group])
    q, _ = np.linalg.qr(rng.normal(size=(SYNTHETIC_FEATURES, SYNTHETIC_FEATURES)))
    return Split((split.x @ q).astype(np.float32), split.y)


# ---------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------
def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (images: magic 2051, labels: magic 2049)."""
    with _open(path) as f:
        magic = struct.unpack(">I", f.read(4))[0]
        if magic == 2051:
            n, rows, cols = struct.unpack(">III", f.read(12))
            data = np.frombuffer(f.read(), dtype=np.uint8)
            return data.reshape(n, rows, cols)
        if magic == 2049:
            (n,) = struct.unpack(">I", f.read(4))
            return np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)[:n]
    raise ValueError(f"{path}: not an IDX image/label file (magic number {magic})")


def _find_one(folder: Path, *patterns: str) -> Path:
    """Return the first file in ``folder`` that matches one of ``patterns``."""
    for pattern in patterns:
        hits = sorted(p for p in folder.glob(pattern) if p.is_file())
        if hits:
            return hits[0]
    raise FileNotFoundError(
        f"no file matching {' or '.join(patterns)} in data folder {folder}"
    )


def load_idx_folder(folder: Path, transpose: bool = False) -> tuple[Split, Split]:
    """Load MNIST-style IDX files from ``folder`` (images as (N, 1, 28, 28) uint8)."""
    out = []
    for names in (("train",), ("t10k", "test")):
        images = read_idx(_find_one(folder, *(f"*{n}-images-idx3-ubyte*" for n in names)))
        labels = read_idx(_find_one(folder, *(f"*{n}-labels-idx1-ubyte*" for n in names)))
        if transpose:
            images = images.transpose(0, 2, 1)
        out.append(Split(np.ascontiguousarray(images[:, None]), labels))
    return out[0], out[1]


def load_cifar_binary(folder: Path, num_classes: int) -> tuple[Split, Split]:
    """Load the CIFAR "binary version" files (images as (N, 3, 32, 32) uint8)."""
    if num_classes == 10:
        train_files = [f"data_batch_{i}.bin" for i in range(1, 6)]
        test_files, label_bytes, label_pos = ["test_batch.bin"], 1, 0
    else:
        train_files, test_files, label_bytes, label_pos = ["train.bin"], ["test.bin"], 2, 1
    record = label_bytes + 3072

    def read(names: list[str]) -> Split:
        raw = []
        for name in names:
            path = _find_one(folder, name)
            data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
            if data.size % record:
                raise ValueError(f"{path}: size {data.size} is not a multiple of {record}")
            raw.append(data.reshape(-1, record))
        rows = np.concatenate(raw)
        y = rows[:, label_pos].astype(np.int64)
        x = rows[:, label_bytes:].reshape(-1, 3, 32, 32)
        coarse = rows[:, 0].astype(np.int64) if label_bytes == 2 else None  # CIFAR-100
        return Split(np.ascontiguousarray(x), y, coarse)

    return read(train_files), read(test_files)


# ---------------------------------------------------------------------------
# Hugging Face hub, through flwr-datasets
# ---------------------------------------------------------------------------
def load_from_hub(hub_name: str, image_key: str, label_key: str,
                  coarse_key: str | None = None) -> tuple[Split, Split]:
    """Download ``hub_name`` with flwr-datasets and return it as NumPy splits
    (with the coarse labels of ``coarse_key`` when given)."""
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import IidPartitioner

    # The partitioner here only satisfies FederatedDataset's interface; the
    # federated split is made by this project's partitioners on the whole pool.
    fds = FederatedDataset(dataset=hub_name, partitioners={"train": IidPartitioner(1)})

    def convert(split: str) -> Split:
        ds = fds.load_split(split).with_format("numpy")
        x = np.asarray(ds[image_key], dtype=np.uint8)
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
        coarse = None if coarse_key is None else np.asarray(ds[coarse_key], dtype=np.int64)
        return Split(np.ascontiguousarray(x), np.asarray(ds[label_key], dtype=np.int64), coarse)

    return convert("train"), convert("test")


def _writable(values: np.ndarray) -> np.ndarray:
    """``values`` as an array torch may share: a read-only one (pandas', a memory map) is
    copied, where torch would warn that it cannot write it."""
    array = np.asarray(values)
    return array if array.flags.writeable else array.copy()


def to_tensors(split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    """Convert a split to float inputs and long (classes) or float (regression) targets.

    ``uint8`` images are scaled to [-1, 1] ((x / 255 - 0.5) / 0.5); float
    features are kept as they are.
    """
    x = torch.from_numpy(_writable(split.x))
    if x.dtype == torch.uint8:
        x = (x.float() / 255.0 - 0.5) / 0.5
    y = torch.from_numpy(_writable(split.y))
    return x.float(), (y.long() if not torch.is_floating_point(y) else y.float())
