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

import math
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
    categories : tuple[tuple[str, tuple[str, ...]], ...]
        Tables: the categorical feature columns and each one's categories, in the order
        their one-hot inputs take (run config ``member-categories``); every other feature
        column holds numbers.
    """

    input_shape: tuple[int, ...]
    kind: str
    num_outputs: int
    class_names: tuple[str, ...] = ()
    label_column: str = "label"
    feature_columns: tuple[str, ...] = ()
    categories: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def width(self, features: list[str] | tuple[str, ...]) -> int:
        """The model inputs that table columns ``features`` give: one per numeric column,
        one per category of a categorical column (one-hot)."""
        sizes = {c: len(v) for c, v in self.categories}
        return sum(sizes.get(c, 1) for c in features)

    def input_names(self, features: list[str] | tuple[str, ...]) -> list[str]:
        """The model's inputs by name, in order: a numeric column's name, a categorical
        column's ``column=category`` for each of its categories."""
        cats = dict(self.categories)
        return [n for c in features for n in ([f"{c}={v}" for v in cats[c]] if c in cats
                                               else [c])]

    def describe(self) -> str:
        """The schema in words (for error messages)."""
        what = (f"{self.num_outputs} classes" if self.kind == CLASSIFICATION
                else f"{self.num_outputs} regression output(s)")
        return f"inputs of shape {self.input_shape}, {what}"


def _fail(path: Path, problem: str) -> MemberDataError:
    return MemberDataError(f"{path}: {problem}")


def _rows(index: np.ndarray, where: str) -> str:
    """Rows by position, as a member finds them: ``where`` is "line" (a CSV: the header is
    line 1), "row" (a Parquet table, counted from 1) or "index" (an array, from 0)."""
    first = {"line": 2, "row": 1, "index": 0}[where]
    shown = ", ".join(str(int(i) + first) for i in index[:5])
    more = f" and {len(index) - 5} more" if len(index) > 5 else ""
    plural = {"line": "lines", "row": "rows", "index": "indices"}[where]
    return f"{plural if len(index) > 1 else where} {shown}{more}"


class Problems:
    """Every problem found in one member's data: the checks go on after the first, so
    that a member fixes its file in one go; :meth:`raise_any` ends with all of them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        self.found.append(problem)

    def raise_any(self) -> None:
        """Raise :class:`MemberDataError` with every problem in one line, if there is one."""
        if len(self.found) == 1:
            raise _fail(self.path, self.found[0])
        if self.found:
            raise _fail(self.path, f"{len(self.found)} problems: " + "; ".join(self.found))


@dataclass(frozen=True)
class Rows:
    """Every row of a member's data, in file order: inputs, targets (None where the file has
    no labels: a file to predict on), and which rows the file marks for testing (None where
    it marks none: the seeded split applies)."""

    x: np.ndarray
    y: np.ndarray | None
    test: np.ndarray | None


def _seeded_split(x: np.ndarray, y: np.ndarray, seed: int, name: str) -> tuple[Split, Split]:
    """80/20 at random, seeded by the run's seed and the member's name; one row each at least."""
    n = len(y)
    rng = np.random.default_rng([40_013, seed, zlib.crc32(name.encode())])
    order = rng.permutation(n)
    cut = min(max(int(round(0.8 * n)), 1), n - 1)
    return Split(x[order[:cut]], y[order[:cut]]), Split(x[order[cut:]], y[order[cut:]])


def check_labels(found: Problems, y: np.ndarray, schema: MemberSchema, what: str,
                 where: str) -> np.ndarray | None:
    """Targets checked against the schema: int64 classes in range, or float32 (N,) / (N, k);
    None (and the problems added) if they do not fit."""
    if schema.kind != CLASSIFICATION:
        return _check_targets(found, y, schema, what, where)
    if y.dtype.kind in "OSU":
        return _class_names(found, y, schema, what, where)
    if y.ndim != 1:
        found.add(f"{what} has shape {y.shape}; class labels need one value per row")
        return None
    if y.dtype.kind == "f":
        missing = np.flatnonzero(~np.isfinite(y))
        if len(missing):
            found.add(f"{what} is missing (empty, n/a or not finite) at {_rows(missing, where)}")
            return None
        if (y == np.round(y)).all():
            y = y.astype(np.int64)
    if y.dtype.kind not in "iu":
        found.add(f"{what} holds {y.dtype} values; class labels must be integers in "
                  f"[0, {schema.num_outputs})"
                  + (" or the run's class names" if schema.class_names else ""))
        return None
    bad = np.flatnonzero((y < 0) | (y >= schema.num_outputs))
    if len(bad):
        found.add(f"{what} has labels {sorted(set(y[bad].tolist()))[:5]} outside "
                  f"[0, {schema.num_outputs}) (the run has {schema.num_outputs} classes) at "
                  f"{_rows(bad, where)}")
        return None
    return y.astype(np.int64)


def _class_names(found: Problems, y: np.ndarray, schema: MemberSchema, what: str,
                 where: str) -> np.ndarray | None:
    """Text labels as the indices of the run's class names."""
    text = np.array([str(v) for v in y.tolist()], dtype=object)
    classes = set(schema.class_names)
    missing = np.flatnonzero([v not in classes and v.strip().lower() in (
        "", "nan", "n/a", "na", "none", "<na>") for v in text])
    if len(missing):
        found.add(f"{what} is missing (empty or n/a) at {_rows(missing, where)}")
        return None
    if not schema.class_names:
        found.add(f"{what} holds text; name the classes in member-class-names, or use "
                  "integer labels")
        return None
    index = {c: i for i, c in enumerate(schema.class_names)}
    unknown = np.flatnonzero([v not in index for v in text])
    if len(unknown):
        names = sorted({str(text[i]) for i in unknown})
        found.add(f"{what} has labels {names[:5]} that are not among the run's classes "
                  f"{list(schema.class_names)} at {_rows(unknown, where)}")
        return None
    return np.array([index[v] for v in text], dtype=np.int64)


def _check_targets(found: Problems, y: np.ndarray, schema: MemberSchema, what: str,
                   where: str) -> np.ndarray | None:
    """Regression targets: numbers, the run's count per row, finite; float32."""
    if y.dtype.kind not in "fiu":
        found.add(f"{what} holds {y.dtype} values; regression targets must be numbers")
        return None
    per_row = int(np.prod(y.shape[1:])) if y.ndim > 1 else 1
    if per_row != schema.num_outputs:
        found.add(f"{what} has {per_row} target value(s) per row; the run expects "
                  f"{schema.num_outputs}")
        return None
    y = y.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(y.reshape(len(y), -1)).all(axis=1))
    if len(bad):
        found.add(f"{what} is missing or not finite at {_rows(bad, where)}")
        return None
    return y if schema.num_outputs > 1 else y.reshape(-1)


def check_inputs(found: Problems, x: np.ndarray, schema: MemberSchema, what: str,
            where: str) -> np.ndarray | None:
    """Inputs checked against the schema: (N, *input_shape), numbers, finite; None (and the
    problems added) if they do not fit."""
    if x.ndim == 0:
        found.add(f"{what} must hold one row per sample, not a single value")
        return None
    if tuple(x.shape[1:]) != schema.input_shape:
        features = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
        if len(schema.input_shape) == 1 and x.ndim <= 2:
            found.add(f"{what} has {features} feature(s) per row; the run expects "
                      f"{schema.input_shape[0]}")
        else:
            found.add(f"{what} has shape {x.shape}; the run expects (N, "
                      f"{', '.join(map(str, schema.input_shape))})")
        return None
    if x.dtype.kind not in "fiub":
        found.add(f"{what} holds {x.dtype} values; inputs must be numbers")
        return None
    if x.dtype == np.uint8:
        return x  # images: scaled to [-1, 1] like the partitioned image tasks (tasks.data.to_tensors)
    x = x.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
    if len(bad):
        found.add(f"{what} has non-finite values at {_rows(bad, where)}")
        return None
    return x


def _checked(found: Problems, x: np.ndarray, y: np.ndarray | None, schema: MemberSchema,
             what: tuple[str, str], where: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Inputs and targets of one block of rows (``what``: their names in messages)."""
    if y is not None and x.ndim >= 1 and y.ndim >= 1 and len(x) != len(y):
        found.add(f"{what[0]} has {len(x)} rows but {what[1]} has {len(y)}")
        return None, None
    if y is not None and y.ndim == 0:
        found.add(f"{what[1]} must hold one value per sample, not a single value")
        return None, None
    if x.ndim >= 1 and len(x) == 0:
        found.add(f"{what[0]} has no rows")
        return None, None
    checked_x = check_inputs(found, x, schema, what[0], where)
    return checked_x, None if y is None else check_labels(found, y, schema, what[1], where)


def open_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, read without pickle; MemberDataError naming the file
    if it is no ``.npz`` (a zip archive of ``.npy`` arrays) or holds pickled arrays."""
    import zipfile

    if not zipfile.is_zipfile(path):
        raise _fail(path, "is not an .npz file (numpy.savez writes a zip archive of .npy arrays)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ValueError:  # object arrays need pickle: refused, never loaded
        raise _fail(path, "holds object arrays, which only pickle can read; refused (save "
                          "numbers or strings: numpy.savez with numeric arrays)") from None
    except Exception as err:
        raise _fail(path, f"is not a readable .npz file ({type(err).__name__}: {err})") from None


def read_npz(path: Path, schema: MemberSchema, labels: bool = True) -> Rows:
    """A member's ``.npz``: ``x``, ``y`` and optional ``x_test``, ``y_test`` (test rows after
    the others); without ``labels``, ``y`` may be absent."""
    arrays = open_npz(path)
    if "x" not in arrays or (labels and "y" not in arrays):
        need = ["x", "y"] if labels else ["x"]
        missing = [k for k in need if k not in arrays]
        raise _fail(path, f"has no array(s) {missing}; a member's .npz holds x and y (and "
                          f"optionally x_test and y_test); it has {sorted(arrays)}")
    found = Problems(path)
    blocks = [("x", "y")] + ([("x_test", "y_test")] if "x_test" in arrays else [])
    if ("x_test" in arrays) != ("y_test" in arrays) and labels:
        found.add("it has only one of x_test and y_test; give both or neither")
    xs, ys = [], []
    for xk, yk in blocks:
        x, y = _checked(found, arrays[xk], arrays.get(yk) if yk in arrays else None, schema,
                        (xk, yk), "index")
        xs.append(x)
        ys.append(y)
    found.raise_any()
    inputs = [x for x in xs if x is not None]
    targets = [y for y in ys if y is not None]
    has_y = len(targets) == len(blocks)
    test = (np.r_[np.zeros(len(inputs[0]), dtype=np.bool_), np.ones(len(inputs[1]), dtype=np.bool_)]
            if len(inputs) == 2 else None)
    return Rows(np.concatenate(inputs), np.concatenate(targets) if has_y else None, test)


def read_table(path: Path, schema: MemberSchema, labels: bool = True) -> Rows:
    """A member's CSV or Parquet table (see the module docstring); without ``labels``, the
    label column may be absent. Every problem of the file is reported in one go."""
    import pandas as pd

    frame = _load_frame(path, schema)
    where = "line" if path.suffix.lower() == ".csv" else "row"
    found = Problems(path)
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    has_label = schema.label_column in columns
    if labels and not has_label:
        found.add(f"it has no label column '{schema.label_column}' (member-label-column); its "
                  f"columns are {columns[:20]}")
    features = list(schema.feature_columns) or [
        c for c in columns if c not in (schema.label_column, SPLIT_COLUMN)]
    cats = dict(schema.categories)
    _check_columns(found, schema, columns, features)
    if len(frame) == 0:
        found.add("it has no rows")
        found.raise_any()
    _check_cells(found, frame, [c for c in features if c in columns], cats, where)
    y = None
    if has_label:
        raw = frame[schema.label_column]
        y = raw.to_numpy(dtype=object) if raw.dtype == object or str(raw.dtype).startswith(
            ("string", "str")) else raw.to_numpy()
        if y.dtype == object and schema.kind == REGRESSION:
            y = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        y = check_labels(found, y, schema, f"label column '{schema.label_column}'", where)
    test = None
    if SPLIT_COLUMN in columns:
        split = frame[SPLIT_COLUMN].astype(str).str.strip().str.lower().to_numpy()
        other = np.flatnonzero(~np.isin(split, ["train", "test"]))
        if len(other):
            found.add(f"column '{SPLIT_COLUMN}' holds {sorted(set(split[other].tolist()))[:5]} at "
                      f"{_rows(other, where)}; allowed: train, test")
        test = split == "test"
    found.raise_any()
    parts = [one_hot(category_text(frame[c], cats[c]), cats[c]) if c in cats
             else pd.to_numeric(frame[c]).to_numpy(dtype=np.float32).reshape(-1, 1)
             for c in features]
    x = np.concatenate(parts, axis=1) if parts else np.zeros((len(frame), 0), np.float32)
    return Rows(x, y, test)


def _load_frame(path: Path, schema: MemberSchema):
    """The table as a data frame, its categorical CSV columns as written ("NA" a category)."""
    import pandas as pd

    try:
        csv = path.suffix.lower() == ".csv"
        frame = pd.read_csv(path) if csv else pd.read_parquet(path)
        if csv and schema.categories:
            named = {c for c, _ in schema.categories}
            raw = pd.read_csv(path, dtype=str, keep_default_na=False,
                              usecols=lambda c: str(c) in named)
            for c in raw.columns:
                frame[c] = raw[c]
    except Exception as err:
        raise _fail(path, f"cannot be read as a {path.suffix} table ({type(err).__name__}: "
                          f"{err})") from None
    return frame


def _check_columns(found: Problems, schema: MemberSchema, columns: list[str],
                   features: list[str]) -> None:
    """The feature columns the schema names are there, and give the inputs it expects."""
    cats = dict(schema.categories)
    missing = [c for c in features if c not in columns]
    if missing:
        close = {c: [o for o in columns if o.strip().lower() == c.strip().lower()]
                 for c in missing}
        hints = "; ".join(f"'{c}' differs from the file's '{close[c][0]}' in case or spaces"
                          for c in missing if close[c])
        found.add(f"it lacks the feature column(s) {missing} (member-feature-columns"
                  f"{', member-categories' if set(missing) & set(cats) else ''}); its "
                  f"columns are {columns[:20]}" + (f" ({hints})" if hints else ""))
    absent = [c for c in cats if c not in features]
    if absent and not missing:
        found.add(f"the categorical column(s) {absent} (member-categories) are not among its "
                  f"feature columns {features[:20]}")
    if len(schema.input_shape) != 1:
        found.add(f"a table gives one feature vector per row; the run expects inputs of shape "
                  f"{schema.input_shape}")
    elif schema.width(features) != schema.input_shape[0]:
        shown = ", ".join(features[:10]) + (f" and {len(features) - 10} more"
                                              if len(features) > 10 else "")
        onehot = [f"{c}: {len(cats[c])}" for c in features if c in cats]
        gives = (f", which give {schema.width(features)} inputs (one-hot categories "
                 f"{', '.join(onehot)})" if onehot else "")
        found.add(f"it has {len(features)} feature column(s) ({shown}){gives}; the run expects "
                  f"{schema.input_shape[0]} (member-input-shape)")


def _check_cells(found: Problems, frame, present: list[str],
                 cats: dict[str, tuple[str, ...]], where: str) -> None:
    """Every cell of the feature columns the table has: a declared category, or a number."""
    import pandas as pd

    for c in (c for c in present if c in cats):  # categories, as declared
        text = category_text(frame[c], cats[c])
        empty = np.flatnonzero(text == "")
        if len(empty):
            found.add(f"column '{c}' is missing (empty or n/a) at {_rows(empty, where)}")
        other = np.flatnonzero(~np.isin(text, list(cats[c])) & (text != ""))
        if len(other):
            found.add(f"column '{c}' holds {sorted(set(text[other].tolist()))[:5]} at "
                      f"{_rows(other, where)}; its categories are {list(cats[c])} "
                      "(member-categories)")
    for c in (c for c in present if c not in cats):  # cells not numbers
        values = frame[c]
        numbers = pd.to_numeric(values, errors="coerce")
        empty = np.flatnonzero(values.isna().to_numpy())
        if len(empty):
            found.add(f"column '{c}' is missing (empty or n/a) at {_rows(empty, where)}")
        text = np.flatnonzero((numbers.isna() & values.notna()).to_numpy())
        if len(text):
            found.add(f"column '{c}' holds non-numeric values such as "
                      f"{str(values.iloc[int(text[0])])!r} at {_rows(text, where)}")


def category_text(values: object, categories: tuple[str, ...]) -> np.ndarray:
    """A categorical column's cells as text, stripped, "" where empty or null; a number that
    is none of ``categories`` as written but a whole number that is (``2.0``, a float column
    with gaps, for the category ``2``) as that one."""
    import pandas as pd

    column = pd.Series(values)
    known = set(categories)
    shown = []
    for value, missing in zip(column.tolist(), column.isna().to_numpy()):
        text = "" if missing else str(value).strip()
        if text and text not in known:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number.is_integer() and str(int(number)) in known:
                text = str(int(number))
        shown.append(text)
    return np.array(shown, dtype=object)


def one_hot(text: np.ndarray, categories: tuple[str, ...]) -> np.ndarray:
    """Rows of ``text`` (each one of ``categories``) as one-hot float32 columns, in the
    order of ``categories``."""
    index = {c: i for i, c in enumerate(categories)}
    out = np.zeros((len(text), len(categories)), dtype=np.float32)
    out[np.arange(len(text)), [index[v] for v in text.tolist()]] = 1.0
    return out


def _read_images(folder: Path, schema: MemberSchema, labelled: bool = True
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    from PIL import Image

    channels, height, width = schema.input_shape
    mode = {1: "L", 3: "RGB"}[channels]
    classes = {c: i for i, c in enumerate(schema.class_names)}
    found = Problems(folder)
    if labelled:
        subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
        unknown = [p.name for p in subfolders if p.name not in classes]
        if unknown:
            found.add(f"it has class folder(s) {unknown[:5]} that are not among the run's "
                      f"classes {list(schema.class_names)} (member-class-names)")
        groups = [(sub, classes.get(sub.name, -1)) for sub in subfolders]
    else:
        groups = [(folder, -1)]
    xs, ys = [], []
    for sub, label in groups:
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
                found.add(f"{f.relative_to(folder)} cannot be read as an image "
                          f"({type(err).__name__}: {err})")
                continue
            xs.append(a[None] if channels == 1 else a.transpose(2, 0, 1))
            ys.append(label)
    if not xs and not found.found:
        found.add(f"it holds no images ({', '.join(IMAGE_SUFFIXES)})"
                  + (" in class folders" if labelled else ""))
    found.raise_any()
    return np.stack(xs), (np.array(ys, dtype=np.int64) if labelled else None)


def read_image_folder(path: Path, schema: MemberSchema, labels: bool = True) -> Rows:
    """A member's image folder: ``<class>/*``, or ``train/`` and ``test/`` laid out so; without
    ``labels``, a folder of images alone is read too (no classes)."""
    if len(schema.input_shape) != 3 or schema.input_shape[0] not in (1, 3):
        raise _fail(path, f"is a folder of images; the run expects inputs of shape "
                          f"{schema.input_shape}, not (1 or 3 channels, height, width)")
    if schema.kind != CLASSIFICATION or len(schema.class_names) != schema.num_outputs:
        raise _fail(path, f"is a folder of images: the run must be a classification with its "
                          f"{schema.num_outputs} classes named in member-class-names")
    if (path / "train").is_dir() and (path / "test").is_dir():
        (xa, ya), (xb, yb) = (_read_images(path / "train", schema),
                              _read_images(path / "test", schema))
        assert ya is not None and yb is not None
        return Rows(np.concatenate([xa, xb]), np.concatenate([ya, yb]),
                    np.r_[np.zeros(len(ya), bool), np.ones(len(yb), bool)])
    flat = any(f.suffix.lower() in IMAGE_SUFFIXES for f in path.iterdir() if f.is_file())
    x, y = _read_images(path, schema, labelled=labels or not flat)
    return Rows(x, y, None)


def read_member_rows(path: str | Path, schema: MemberSchema, labels: bool = True) -> Rows:
    """Every row of the member data at ``path``, checked against ``schema`` (every problem
    found in one :class:`MemberDataError`); ``labels = False`` for data to predict on."""
    p = Path(path).expanduser()
    if not p.exists():
        raise _fail(p, "does not exist")
    if p.is_dir():
        return read_image_folder(p, schema, labels)
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return read_npz(p, schema, labels)
    if suffix in TABLE_SUFFIXES:
        return read_table(p, schema, labels)
    raise _fail(p, f"has the suffix '{p.suffix}'; allowed: .npz, .csv, .parquet, or a folder "
                   "of images")


def load_member_data(path: str | Path, schema: MemberSchema, seed: int,
                     name: str) -> tuple[Split, Split]:
    """The member ``name``'s (train, test) data from ``path``, checked against ``schema``:
    the rows the file marks for testing, or else a seeded 80/20 split."""
    rows = read_member_rows(path, schema)
    assert rows.y is not None
    if rows.test is None:
        if len(rows.y) < 2:
            raise _fail(Path(path), "has 1 row; needs at least 2 (one to train, one to test)")
        return _seeded_split(rows.x, rows.y, seed, name)
    parts = []
    for keep, what in ((~rows.test, "train"), (rows.test, "test")):
        if not keep.any():
            raise _fail(Path(path), f"has no {what} rows (the {what} rows it marks are none)")
        parts.append(Split(rows.x[keep], rows.y[keep]))
    return parts[0], parts[1]
