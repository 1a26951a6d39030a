"""A member's own data: the file or folder its SuperNode names, checked against the run's schema.

In a run with ``dataset = "members"`` every SuperNode reads its own data, named
by its node config (``data-path``), never by the run config; the run config
says only what shape the data must have (:class:`MemberSchema`). Formats a
member can write without this project's code, all read without pickle:

* ``.npz``: ``x`` (N, *input shape) and ``y`` (N,) or (N, outputs), and
  optionally ``x_test`` / ``y_test``; without them the rows are split 80/20
  at random (seeded by the run's seed and the member's name).
* ``.csv`` or ``.parquet``: one row per sample, the label in the run's
  ``member-label-column``, the features in ``member-feature-columns`` (default:
  every other column, in file order). An optional column ``split`` with
  ``train`` / ``test`` in each row says which rows are for testing; without it,
  the seeded 80/20 split. Labels are integers in ``[0, classes)`` or, where the
  run names its classes (``member-class-names``), those names.
* a folder of images, one subfolder per class as torchvision's ``ImageFolder``
  reads it (``<folder>/<class name>/*.png``), or ``train/`` and ``test/``
  folders laid out so; the class list is the run's ``member-class-names``, so
  that a label means the same at every site (a site may lack some classes).
  Images are converted to the run's channels (1: grey, 3: RGB) and resized to
  its height and width.

Every problem raises :class:`MemberDataError` naming the file and what is
wrong; the ClientApp reports it, with the member's name, to the server, which
leaves that member out.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import Split

CLASSIFICATION, REGRESSION = "classification", "regression"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
TABLE_SUFFIXES = (".csv", ".parquet")
SPLIT_COLUMN = "split"


class MemberDataError(ValueError):
    """A member's data cannot be used by the run (the message names the file and the problem)."""


@dataclass(frozen=True)
class MemberSchema:
    """What the run expects of every member's data (run-config keys ``member-*``).

    Attributes
    ----------
    input_shape : tuple[int, ...]
        Shape of one sample's input: ``(features,)`` or ``(channels, height, width)``.
    kind : str
        ``classification`` or ``regression``.
    num_outputs : int
        Classes (classification) or target values per sample (regression).
    class_names : tuple[str, ...]
        The classes by name, in label order (image folders need them; tables may use them).
    label_column : str
        Tables: the label's column.
    feature_columns : tuple[str, ...]
        Tables: the features' columns (empty: every column but the label and ``split``).
    """

    input_shape: tuple[int, ...]
    kind: str
    num_outputs: int
    class_names: tuple[str, ...] = ()
    label_column: str = "label"
    feature_columns: tuple[str, ...] = ()

    def describe(self) -> str:
        """The schema in words (for error messages)."""
        what = (f"{self.num_outputs} classes" if self.kind == CLASSIFICATION
                else f"{self.num_outputs} regression output(s)")
        return f"inputs of shape {self.input_shape}, {what}"


def _fail(path: Path, problem: str) -> MemberDataError:
    return MemberDataError(f"{path}: {problem}")


def _seeded_split(x: np.ndarray, y: np.ndarray, seed: int, name: str) -> tuple[Split, Split]:
    """80/20 at random, seeded by the run's seed and the member's name; one row each at least."""
    n = len(y)
    rng = np.random.default_rng([40_013, seed, zlib.crc32(name.encode())])
    order = rng.permutation(n)
    cut = min(max(int(round(0.8 * n)), 1), n - 1)
    return Split(x[order[:cut]], y[order[:cut]]), Split(x[order[cut:]], y[order[cut:]])


def _labels(path: Path, y: np.ndarray, schema: MemberSchema, what: str) -> np.ndarray:
    """Targets checked against the schema: int64 classes in range, or float32 (N,) / (N, k)."""
    if schema.kind == CLASSIFICATION:
        if y.dtype.kind in "OSU" and schema.class_names:  # class names
            index = {c: i for i, c in enumerate(schema.class_names)}
            unknown = sorted({str(v) for v in y.tolist()} - set(index))
            if unknown:
                raise _fail(path, f"{what} has labels {unknown[:5]} that are not among the run's "
                                  f"classes {list(schema.class_names)}")
            return np.array([index[str(v)] for v in y.tolist()], dtype=np.int64)
        if y.ndim != 1:
            raise _fail(path, f"{what} has shape {y.shape}; class labels need one value per row")
        if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
            y = y.astype(np.int64)
        if y.dtype.kind not in "iu":
            raise _fail(path, f"{what} holds {y.dtype} values; class labels must be integers in "
                              f"[0, {schema.num_outputs})"
                              + (" or the run's class names" if schema.class_names else ""))
        bad = (y < 0) | (y >= schema.num_outputs)
        if bad.any():
            raise _fail(path, f"{what} has labels {sorted(set(y[bad].tolist()))[:5]} outside "
                              f"[0, {schema.num_outputs}) (the run has {schema.num_outputs} classes)")
        return y.astype(np.int64)
    if y.dtype.kind not in "fiu":
        raise _fail(path, f"{what} holds {y.dtype} values; regression targets must be numbers")
    per_row = int(np.prod(y.shape[1:])) if y.ndim > 1 else 1
    if per_row != schema.num_outputs:
        raise _fail(path, f"{what} has {per_row} target value(s) per row; the run expects "
                          f"{schema.num_outputs}")
    y = y.astype(np.float32)
    if not np.isfinite(y).all():
        raise _fail(path, f"{what} has non-finite values")
    return y if schema.num_outputs > 1 else y.reshape(-1)


def _inputs(path: Path, x: np.ndarray, schema: MemberSchema, what: str) -> np.ndarray:
    """Inputs checked against the schema: (N, *input_shape), numbers, finite."""
    if x.ndim >= 1 and tuple(x.shape[1:]) != schema.input_shape:
        features = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
        if len(schema.input_shape) == 1 and x.ndim == 2:
            raise _fail(path, f"{what} has {features} features per row; the run expects "
                              f"{schema.input_shape[0]}")
        raise _fail(path, f"{what} has shape {x.shape}; the run expects (N, "
                          f"{', '.join(map(str, schema.input_shape))})")
    if x.dtype.kind not in "fiub":
        raise _fail(path, f"{what} holds {x.dtype} values; inputs must be numbers")
    if x.dtype == np.uint8:
        return x  # images: scaled to [-1, 1] like the partitioned image tasks (tasks.data.to_tensors)
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise _fail(path, f"{what} has non-finite values")
    return x


def _pair(path: Path, x: np.ndarray, y: np.ndarray, schema: MemberSchema, what: str) -> Split:
    if x.ndim == 0 or y.ndim == 0:
        raise _fail(path, f"{what}: x and y must hold one row per sample, not a single value")
    if len(x) != len(y):
        raise _fail(path, f"{what}: x has {len(x)} rows but y has {len(y)}")
    if len(y) == 0:
        raise _fail(path, f"{what} has no rows")
    return Split(_inputs(path, x, schema, f"{what} x"), _labels(path, y, schema, f"{what} y"))


def load_npz(path: Path, schema: MemberSchema, seed: int, name: str) -> tuple[Split, Split]:
    """A member's ``.npz``: ``x``, ``y`` and optional ``x_test``, ``y_test``."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except ValueError as err:  # object arrays need pickle: refused
        raise _fail(path, f"cannot be read without pickle ({err})") from None
    except (OSError, EOFError, Exception) as err:
        raise _fail(path, f"is not a readable .npz file ({type(err).__name__}: {err})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise _fail(path, f"has no array(s) {missing}; a member's .npz holds x and y (and "
                          f"optionally x_test and y_test); it has {sorted(arrays)}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise _fail(path, "has only one of x_test and y_test; give both or neither")
    train = _pair(path, arrays["x"], arrays["y"], schema, "x/y")
    if "x_test" in arrays:
        return train, _pair(path, arrays["x_test"], arrays["y_test"], schema, "x_test/y_test")
    if len(train.y) < 2:
        raise _fail(path, "has 1 row; needs at least 2 (one to train, one to test)")
    return _seeded_split(train.x, train.y, seed, name)


def load_table(path: Path, schema: MemberSchema, seed: int, name: str) -> tuple[Split, Split]:
    """A member's CSV or Parquet table (see the module docstring)."""
    import pandas as pd

    try:
        frame = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except Exception as err:
        raise _fail(path, f"cannot be read as a {path.suffix} table ({type(err).__name__}: "
                          f"{err})") from None
    columns = list(frame.columns)
    if schema.label_column not in columns:
        raise _fail(path, f"has no label column '{schema.label_column}' (member-label-column); "
                          f"its columns are {columns[:20]}")
    features = list(schema.feature_columns) or [
        c for c in columns if c not in (schema.label_column, SPLIT_COLUMN)]
    missing = [c for c in features if c not in columns]
    if missing:
        raise _fail(path, f"lacks the feature column(s) {missing} (member-feature-columns)")
    if len(schema.input_shape) != 1:
        raise _fail(path, f"a table gives one feature vector per row; the run expects inputs of "
                          f"shape {schema.input_shape}")
    try:
        x = frame[features].to_numpy(dtype=np.float32)
    except (ValueError, TypeError) as err:
        raise _fail(path, f"has non-numeric feature values ({err})") from None
    y = frame[schema.label_column].to_numpy()
    if y.dtype == object and schema.kind == CLASSIFICATION and not schema.class_names:
        raise _fail(path, f"label column '{schema.label_column}' holds text; name the classes "
                          "in member-class-names, or use integer labels")
    if SPLIT_COLUMN not in columns:
        whole = _pair(path, x, y, schema, "the table")
        if len(whole.y) < 2:
            raise _fail(path, "has 1 row; needs at least 2 (one to train, one to test)")
        return _seeded_split(whole.x, whole.y, seed, name)
    split = frame[SPLIT_COLUMN].astype(str).str.strip().str.lower().to_numpy()
    other = sorted(set(split.tolist()) - {"train", "test"})
    if other:
        raise _fail(path, f"column '{SPLIT_COLUMN}' holds {other[:5]}; allowed: train, test")
    tr, te = split == "train", split == "test"
    return (_pair(path, x[tr], y[tr], schema, "the train rows"),
            _pair(path, x[te], y[te], schema, "the test rows"))


def _read_images(folder: Path, schema: MemberSchema) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    channels, height, width = schema.input_shape
    mode = {1: "L", 3: "RGB"}[channels]
    classes = {c: i for i, c in enumerate(schema.class_names)}
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
    unknown = [p.name for p in subfolders if p.name not in classes]
    if unknown:
        raise _fail(folder, f"has class folder(s) {unknown[:5]} that are not among the run's "
                            f"classes {list(schema.class_names)} (member-class-names)")
    xs, ys = [], []
    for sub in subfolders:
        for f in sorted(sub.iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(f) as opened:
                    img = opened.convert(mode)
                    if img.size != (width, height):
                        img = img.resize((width, height), Image.Resampling.BILINEAR)
                    a = np.asarray(img, dtype=np.uint8)
            except Exception as err:
                raise _fail(f, f"cannot be read as an image ({type(err).__name__}: {err})") from None
            xs.append(a[None] if channels == 1 else a.transpose(2, 0, 1))
            ys.append(classes[sub.name])
    if not xs:
        raise _fail(folder, f"holds no images ({', '.join(IMAGE_SUFFIXES)}) in class folders")
    return np.stack(xs), np.array(ys, dtype=np.int64)


def load_image_folder(path: Path, schema: MemberSchema, seed: int,
                      name: str) -> tuple[Split, Split]:
    """A member's image folder: ``<class>/*`` (seeded 80/20 split), or ``train/`` and ``test/``."""
    if len(schema.input_shape) != 3 or schema.input_shape[0] not in (1, 3):
        raise _fail(path, f"is a folder of images; the run expects inputs of shape "
                          f"{schema.input_shape}, not (1 or 3 channels, height, width)")
    if schema.kind != CLASSIFICATION or len(schema.class_names) != schema.num_outputs:
        raise _fail(path, f"is a folder of images: the run must be a classification with its "
                          f"{schema.num_outputs} classes named in member-class-names")
    if (path / "train").is_dir() and (path / "test").is_dir():
        return (Split(*_read_images(path / "train", schema)),
                Split(*_read_images(path / "test", schema)))
    x, y = _read_images(path, schema)
    if len(y) < 2:
        raise _fail(path, "holds 1 image; needs at least 2 (one to train, one to test)")
    return _seeded_split(x, y, seed, name)


def load_member_data(path: str | Path, schema: MemberSchema, seed: int,
                     name: str) -> tuple[Split, Split]:
    """The member ``name``'s (train, test) data from ``path``, checked against ``schema``."""
    p = Path(path).expanduser()
    if not p.exists():
        raise _fail(p, "does not exist")
    if p.is_dir():
        return load_image_folder(p, schema, seed, name)
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return load_npz(p, schema, seed, name)
    if suffix in TABLE_SUFFIXES:
        return load_table(p, schema, seed, name)
    raise _fail(p, f"has the suffix '{p.suffix}'; allowed: .npz, .csv, .parquet, or a folder "
                   "of images")
