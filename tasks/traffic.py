"""Traffic forecasting over road sensors: the Panacea paper's METR-LA (207 sensors) and
PEMS-BAY (325) tasks, in the setup of Meng et al. 2021 (CNFGNN), its cited source.

One client per sensor: forecast its next 12 speed readings (5-minute steps: one hour) from its
previous 12. The client graph is the road graph: an edge where DCRNN's adjacency (a
thresholded Gaussian kernel of road distance, Li et al. 2018) is positive in either
direction, unweighted and without self loops, like every client graph of this project.

* :func:`load_traffic`: the user's files, from ``data-dir``: DCRNN's speed table
  (``metr-la.h5`` / ``pems-bay.h5``, a pandas HDF5 store: read with h5py, numbers and labels
  only, never through pickle) and the road graph: ``metr_la_adjacency.npz`` /
  ``pems_bay_adjacency.npz`` (``sensor_ids`` and ``adjacency``, the copy in
  ``shared/data/sensor_graphs``), DCRNN's ``adj_mx.pkl`` / ``adj_mx_bay.pkl`` (through
  :func:`read_adj_mx`, which rebuilds numpy arrays and lists and nothing else), or an edge
  list ``<name>-edges.csv`` of sensor ids (``from,to``).
* :func:`make_traffic_standin`: a **generated** stand-in on the real road graphs, for
  measurement where the speed tables are absent (these machines): never METR-LA's numbers.

Both scale the speeds to [0, 1] by their minimum and maximum over all sensors and steps (as
TPT-48; the MSE is reported on that scale, the paper's x1e-3 units), cut each sensor's series
into windows of 12 readings in and 12 out, one window starting every ``stride`` steps, and
split each sensor's windows 80/20 in time (train first). A real table's zero readings are
missing values (DCRNN masks them): a window holding one is left out.
"""

from __future__ import annotations

import csv
import io
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np

from .data import Split, missing_in
from .federated import FederatedData, split_80_20

STEPS_IN = STEPS_OUT = 12
STEPS_PER_DAY = 288  # 5-minute readings
#: the real datasets and their files: speed table, graph files (first found is used)
FILES = {
    "metr-la": ("metr-la.h5", ("metr_la_adjacency.npz", "adj_mx.pkl", "metr-la-edges.csv")),
    "pems-bay": ("pems-bay.h5", ("pems_bay_adjacency.npz", "adj_mx_bay.pkl",
                                 "pems-bay-edges.csv")),
}


class TrafficDataError(ValueError):
    """A traffic file that cannot be used, with the file and why."""


# ---------------------------------------------------------------------------
# The road graph
# ---------------------------------------------------------------------------
def client_graph(adjacency: np.ndarray) -> np.ndarray:
    """The unweighted symmetric client graph of a (directed, weighted) road adjacency:
    an edge where either direction is positive; no self loops."""
    a = np.asarray(adjacency, dtype=np.float64)
    graph = ((a > 0) | (a.T > 0)).astype(np.float32)
    np.fill_diagonal(graph, 0.0)
    return graph


#: the most sensors a graph file or speed table may name (the dense adjacency of this many is
#: 800 MB; LargeST's California, the largest public sensor set, has 8,600), and the most
#: readings a speed table may hold (METR-LA: 207 sensors, 7.1 million readings; PEMS-BAY:
#: 325, 16.9 million)
MOST_SENSORS = 10_000
#: the most rows an edge-list graph file may hold (every pair of MOST_SENSORS sensors is 5e7)
MOST_EDGES = 50_000_000
MOST_READINGS = 200_000_000
_DTYPE_NAME = re.compile(r"[fiub][1248]|f16|c8|c16")


class _DType:
    """A numeric dtype, as a pickle names it (``numpy.dtype('f4', 0, 1)`` then its byte order):
    built by this module, never by numpy's unpickling."""

    def __init__(self, name: str, align: int = 0, copy: int = 1) -> None:
        if not isinstance(name, str) or not _DTYPE_NAME.fullmatch(name):
            raise TrafficDataError(f"the pickle holds a {name!r} array: only numbers are read")
        self.dtype = np.dtype(name)

    def __setstate__(self, state) -> None:
        order = state[1] if isinstance(state, tuple) and len(state) > 1 else "="
        if order not in ("<", ">", "=", "|"):
            raise TrafficDataError(f"the pickle gives byte order {order!r}")
        if order in ("<", ">"):
            self.dtype = self.dtype.newbyteorder("<" if order == "<" else ">")


class _Array:
    """An array as a pickle gives it (``_reconstruct`` then its state: version, shape, dtype,
    order, bytes), rebuilt from its bytes by this module."""

    array: np.ndarray | None = None

    def __setstate__(self, state) -> None:
        try:
            _, shape, dtype, fortran, raw = state
        except (TypeError, ValueError):
            raise TrafficDataError("the pickle's array state is not numpy's") from None
        if not isinstance(dtype, _DType) or not isinstance(shape, tuple) or not all(
                isinstance(d, int) and d >= 0 for d in shape):
            raise TrafficDataError("the pickle's array has no numeric dtype or shape")
        size = int(np.prod(shape, dtype=np.float64))
        raw = raw.encode("latin1") if isinstance(raw, str) else raw
        if size > MOST_READINGS or not isinstance(raw, bytes) or \
                len(raw) != size * dtype.dtype.itemsize:
            raise TrafficDataError(f"the pickle's array of shape {shape} does not hold its "
                                   f"{size} values (at most {MOST_READINGS})")
        self.array = np.frombuffer(raw, dtype.dtype).reshape(
            shape, order="F" if fortran else "C").copy()


def _reconstruct(cls, shape, typecode) -> _Array:
    if cls is not _ndarray:
        raise TrafficDataError("the pickle rebuilds something other than an array")
    return _Array()


def _ndarray(*args, **kwargs):
    raise TrafficDataError("the pickle builds an array from raw memory, not from its state")


def _scalar(dtype, raw=b""):
    raw = raw.encode("latin1") if isinstance(raw, str) else raw
    if not isinstance(dtype, _DType) or not isinstance(raw, bytes) or \
            len(raw) != dtype.dtype.itemsize:
        raise TrafficDataError("the pickle's number is not a numeric scalar")
    return np.frombuffer(raw, dtype.dtype)[0].item()


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    if encoding != "latin1" or not isinstance(text, str):
        raise TrafficDataError(f"the pickle encodes bytes as {encoding!r}, not latin1")
    return text.encode("latin1")


class _ArraysOnly(pickle.Unpickler):
    """An unpickler of numbers, strings, lists, dicts and numeric arrays: every name a pickle
    may give is one of this module's stand-ins above (numpy's own unpickling never runs, and
    no other name is found), so no code from the file runs and no array is built from memory
    it does not hold."""

    STANDINS = {"_reconstruct": _reconstruct, "ndarray": _ndarray, "dtype": _DType,
                "scalar": _scalar}

    def find_class(self, module: str, name: str):
        if (module, name) == ("_codecs", "encode"):  # how protocol 2 writes bytes
            return _latin1
        if module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray") and \
                name in self.STANDINS:
            return self.STANDINS[name]
        raise TrafficDataError(f"the pickle names {module}.{name}: only numpy arrays, lists, "
                               "dicts and strings are read from a graph file")


def read_adj_mx(path: Path) -> tuple[list[str], np.ndarray]:
    """DCRNN's ``adj_mx.pkl``: (sensor ids, id -> index, adjacency), pickled by Python 2;
    read by :class:`_ArraysOnly`."""
    most = 8 * MOST_SENSORS ** 2 + (1 << 20)  # the dense matrix and the ids, before reading
    if path.stat().st_size > most:
        raise TrafficDataError(f"{path}: {path.stat().st_size} bytes, more than the "
                               f"{MOST_SENSORS} sensors' adj_mx.pkl can hold ({most})")
    try:
        with open(path, "rb") as f:
            data = _ArraysOnly(io.BytesIO(f.read()), encoding="latin1").load()
    except TrafficDataError as err:
        raise TrafficDataError(f"{path}: {err}") from None
    except Exception as err:  # a truncated or foreign file
        raise TrafficDataError(f"{path}: not DCRNN's adj_mx.pkl ({err})") from None
    if not (isinstance(data, (tuple, list)) and len(data) == 3 and isinstance(data[0], list)
            and isinstance(data[2], _Array) and data[2].array is not None):
        raise TrafficDataError(f"{path}: expected (sensor_ids, sensor_id_to_ind, adj_mx)")
    if len(data[0]) > MOST_SENSORS or not all(isinstance(s, (str, bytes)) for s in data[0]):
        raise TrafficDataError(f"{path}: sensor ids must be at most {MOST_SENSORS} strings")
    ids = [s.decode("latin1") if isinstance(s, bytes) else s for s in data[0]]
    return ids, data[2].array


def read_graph(path: Path) -> tuple[list[str], np.ndarray]:
    """Sensor ids and the (n, n) road adjacency of a graph file: our ``.npz``
    (``sensor_ids``, ``adjacency``; no pickle), DCRNN's ``adj_mx*.pkl``, or an edge list
    ``.csv`` (``from,to`` sensor ids, any further column ignored); at most
    :data:`MOST_SENSORS` sensors, checked before the matrix is read or built."""
    if path.suffix == ".npz":
        ids, adjacency = _read_npz(path)
    elif path.suffix == ".pkl":
        ids, adjacency = read_adj_mx(path)
    else:
        ids, adjacency = _read_edge_list(path)
    if adjacency.dtype.kind not in "fiub" or adjacency.shape != (len(ids), len(ids)):
        raise TrafficDataError(f"{path}: the adjacency must be a numeric {len(ids)} x "
                               f"{len(ids)} matrix, got {adjacency.dtype} {adjacency.shape}")
    adjacency = adjacency.astype(np.float64)
    if not np.isfinite(adjacency).all() or (adjacency < 0).any():
        raise TrafficDataError(f"{path}: the adjacency must be finite and non-negative")
    if len(set(ids)) != len(ids):
        raise TrafficDataError(f"{path}: sensor ids repeat")
    return ids, adjacency


def _read_npz(path: Path) -> tuple[list[str], np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            sensors = data["sensor_ids"]
            if sensors.ndim != 1 or len(sensors) > MOST_SENSORS:
                raise TrafficDataError(f"{path}: sensor_ids must be a list of at most "
                                       f"{MOST_SENSORS}, got shape {sensors.shape}")
            with zipfile.ZipFile(path) as z:  # its size before it is read (a zip bomb)
                size = z.getinfo("adjacency.npy").file_size
            if size > 8 * len(sensors) ** 2 + 4096:
                raise TrafficDataError(f"{path}: adjacency holds {size} bytes, more than "
                                       f"{len(sensors)} x {len(sensors)} numbers")
            return [str(s) for s in sensors], data["adjacency"]
    except TrafficDataError:
        raise
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
        raise TrafficDataError(f"{path}: needs arrays sensor_ids and adjacency ({err})") \
            from None


def _read_edge_list(path: Path) -> tuple[list[str], np.ndarray]:
    """Rows read one at a time: more than :data:`MOST_SENSORS` sensors or :data:`MOST_EDGES`
    rows stop the reading before the matrix is built."""
    index: dict[str, int] = {}
    edges: list[tuple[int, int]] = []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not {"from", "to"} <= set(reader.fieldnames or ()):
                raise TrafficDataError(f"{path}: an edge list needs the columns from,to")
            for line, row in enumerate(reader, start=2):
                ends = (row.get("from"), row.get("to"))
                if not all(ends):
                    raise TrafficDataError(f"{path}:{line}: an edge list needs from,to filled "
                                           "in every row")
                u, v = (index.setdefault(str(e), len(index)) for e in ends)
                edges.append((u, v))
                if len(index) > MOST_SENSORS or len(edges) > MOST_EDGES:
                    raise TrafficDataError(f"{path}: more than {MOST_SENSORS} sensors or "
                                           f"{MOST_EDGES} edges")
    except (csv.Error, UnicodeDecodeError) as err:
        raise TrafficDataError(f"{path}: not a CSV edge list ({err})") from None
    if not edges:
        raise TrafficDataError(f"{path}: an edge list needs at least one from,to row")
    ids = sorted(index)
    order = np.array([index[s] for s in ids])  # first-seen position -> sorted position
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids))
    pairs = rank[np.array(edges)]
    adjacency = np.zeros((len(ids), len(ids)))
    adjacency[pairs[:, 0], pairs[:, 1]] = 1.0
    return ids, adjacency


# ---------------------------------------------------------------------------
# Speed tables
# ---------------------------------------------------------------------------
def read_speed_table(path: Path) -> tuple[list[str], np.ndarray]:
    """Sensor ids and the (steps, sensors) speeds of DCRNN's ``metr-la.h5`` / ``pems-bay.h5``:
    a pandas HDF5 store (fixed format) of one frame, read with h5py: the column labels
    (``axis0``) and the numeric blocks, never an object block (pandas would unpickle it),
    nothing stored outside the file (external or virtual data, soft or external links), and
    at most :data:`MOST_READINGS` readings, checked before any is read."""
    import h5py  # only the real traffic tasks need it

    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise TrafficDataError(f"{path}: not an HDF5 file ({err})") from None
    try:
        with f:
            return _read_frame(f, h5py)
    except TrafficDataError as err:
        raise TrafficDataError(f"{path}: {err}") from None
    except (KeyError, IndexError, ValueError, TypeError, OSError) as err:
        raise TrafficDataError(f"{path}: not a pandas frame in fixed format ({err})") from None


def _inside(group, h5py) -> dict:
    """The members of ``group``, each a hard link to data in this file."""
    members = {}
    for name in group:
        if not isinstance(group.get(name, getlink=True), h5py.HardLink):
            raise TrafficDataError(f"{name} links outside the file")
        member = group[name]
        if isinstance(member, h5py.Dataset) and (member.external or member.is_virtual):
            raise TrafficDataError(f"{name} is stored outside the file")
        members[name] = member
    return members


def _read_frame(f, h5py) -> tuple[list[str], np.ndarray]:
    groups = {k: g for k, g in _inside(f, h5py).items() if isinstance(g, h5py.Group)}
    if len(groups) != 1:
        raise TrafficDataError(f"expected one frame (pandas' to_hdf), found {list(groups)}")
    g = _inside(next(iter(groups.values())), h5py)
    blocks = sorted(k for k in g if k.startswith("block") and k.endswith("_values"))
    if not isinstance(g.get("axis0"), h5py.Dataset) or not blocks:
        raise TrafficDataError("not a pandas frame in fixed format (axis0, block*_values)")
    if sum(g[k].size for k in blocks) > MOST_READINGS or g["axis0"].size > MOST_SENSORS:
        raise TrafficDataError(f"more than {MOST_READINGS} readings or {MOST_SENSORS} sensors")
    for key in ["axis0", *(k.replace("_values", "_items") for k in blocks)]:
        _labels_bounded(g.get(key), key, h5py)  # every size counted before anything is read
    if any(g[k].dtype.itemsize > 8 for k in blocks):
        raise TrafficDataError("a block's values are wider than 8 bytes each")
    ids = [_label(v) for v in g["axis0"][()]]
    if len(set(ids)) != len(ids):
        raise TrafficDataError("sensor ids repeat")
    columns: dict[str, np.ndarray] = {}
    steps = {g[k].shape[0] for k in blocks if g[k].ndim == 2}
    for key in blocks:
        values = g[key]
        if values.dtype.kind not in "fiu":
            raise TrafficDataError(f"block {key} is not numeric ({values.dtype}); object data "
                                   "is not read")
        items = [_label(v) for v in g[key.replace("_values", "_items")][()]]
        if values.ndim != 2 or values.shape[1] != len(items) or len(steps) != 1:
            raise TrafficDataError(f"block {key} of shape {values.shape} does not hold its "
                                   f"{len(items)} columns of one length")
        block = np.asarray(values[()], dtype=np.float64)
        columns.update((item, block[:, j]) for j, item in enumerate(items))
    missing = [s for s in ids if s not in columns]
    if missing:
        raise TrafficDataError(f"columns {missing[:5]} have no numeric values")
    return ids, np.stack([columns[s] for s in ids], axis=1)


#: the most bytes one column label (a sensor id) may take
LABEL_BYTES = 256


def _labels_bounded(labels, key: str, h5py) -> None:
    """A dataset of column labels (``axis0``, a block's ``_items``) that is there, one
    dimension, at most :data:`MOST_SENSORS` labels of at most :data:`LABEL_BYTES` bytes each
    (its declared size: a file of a few kB can declare gigabytes it never wrote)."""
    if not isinstance(labels, h5py.Dataset):
        raise TrafficDataError(f"{key} is missing (a pandas frame in fixed format has it)")
    if labels.ndim != 1 or labels.size > MOST_SENSORS or labels.dtype.itemsize > LABEL_BYTES:
        raise TrafficDataError(
            f"{key} declares {labels.shape} labels of {labels.dtype.itemsize} bytes; allowed: "
            f"one row of at most {MOST_SENSORS} sensor ids of at most {LABEL_BYTES} bytes")


def _label(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------------
# Windows and clients
# ---------------------------------------------------------------------------
def windows(series: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of one sensor's scaled series: 12 in, 12 out, one window starting
    every ``stride`` steps; a window with a missing reading (NaN) is left out."""
    span = STEPS_IN + STEPS_OUT
    starts = np.arange(0, len(series) - span + 1, stride)
    cut = series[starts[:, None] + np.arange(span)[None, :]]
    cut = cut[np.isfinite(cut).all(axis=1)]
    return cut[:, :STEPS_IN].astype(np.float32), cut[:, STEPS_IN:].astype(np.float32)


def to_clients(speeds: np.ndarray, adjacency: np.ndarray, names: list[str], stride: int,
               extras: dict | None = None) -> FederatedData:
    """Per-sensor clients of a (steps, sensors) speed table (NaN: missing), scaled to [0, 1]
    over every reading, 80/20 in time."""
    lo, hi = np.nanmin(speeds), np.nanmax(speeds)
    if not hi > lo:
        raise TrafficDataError("every speed reading is the same: nothing to forecast")
    scaled = (speeds - lo) / (hi - lo)
    train, test = [], []
    for s in range(speeds.shape[1]):
        x, y = windows(scaled[:, s], stride)
        if len(x) < 2:
            raise TrafficDataError(f"sensor {names[s]}: {len(x)} complete window(s) of "
                                   f"{STEPS_IN + STEPS_OUT} readings; needs at least 2")
        tr, te = split_80_20(Split(x, y), None)
        train.append(tr)
        test.append(te)
    return FederatedData(train, test, client_graph(adjacency), names,
                         {"speed_min": float(lo), "speed_max": float(hi), **(extras or {})})


def graph_file(folder: Path, name: str) -> Path:
    """The road graph of ``name`` (metr-la, pems-bay) in ``folder``: the first of its
    :data:`FILES` there."""
    for g in FILES[name][1]:
        if (folder / g).is_file():
            return folder / g
    raise missing_in(folder, f"the {name} road graph needs one of {', '.join(FILES[name][1])} "
                             "there (shared/data/sensor_graphs holds the .npz)")


def load_traffic(folder: Path, name: str, stride: int = 12) -> FederatedData:
    """METR-LA or PEMS-BAY from the user's ``folder`` (:data:`FILES`); clients in the order of
    the speed table's columns, each matched to the graph by sensor id."""
    table_name, graph_names = FILES[name]
    table = folder / table_name
    if not table.is_file():
        raise missing_in(folder, f"dataset {name!r} needs {table_name} (DCRNN's speed table) "
                                 f"and one of {', '.join(graph_names)} (the road graph) there")
    graph = graph_file(folder, name)
    ids, speeds = read_speed_table(table)
    graph_ids, adjacency = read_graph(graph)
    index = {s: i for i, s in enumerate(graph_ids)}
    absent = [s for s in ids if s not in index]
    if absent:
        raise TrafficDataError(f"{graph}: sensors {absent[:5]} of {table} are not in the "
                               "graph")
    order = [index[s] for s in ids]
    # DCRNN's missing readings are zeros; a reading that is not a finite number is missing too
    speeds = np.where(np.isfinite(speeds) & (speeds > 0), speeds, np.nan)
    return to_clients(speeds, adjacency[np.ix_(order, order)], ids, stride)


# ---------------------------------------------------------------------------
# The generated stand-in
# ---------------------------------------------------------------------------
def _smooth_field(graph: np.ndarray, rng: np.random.Generator, hops: int = 10) -> np.ndarray:
    """A standardised random field over the sensors, smooth over the graph: white noise
    averaged ``hops`` times over each sensor and its neighbours."""
    a = graph + np.eye(len(graph))
    walk = a / a.sum(axis=1, keepdims=True)
    z = rng.standard_normal(len(graph))
    for _ in range(hops):
        z = walk @ z
    return (z - z.mean()) / (z.std() + 1e-12)


def standin_speeds(graph: np.ndarray, days: int, seed: int) -> np.ndarray:
    """The stand-in's (steps, sensors) speeds in mph; the process is in
    :func:`make_traffic_standin`."""
    rng = np.random.default_rng([31_337, seed])
    n = len(graph)
    free = 62.0 + 4.0 * _smooth_field(graph, rng)
    depth_am = np.clip(0.35 + 0.12 * _smooth_field(graph, rng), 0.05, 0.7)
    depth_pm = np.clip(0.40 + 0.12 * _smooth_field(graph, rng), 0.05, 0.7)
    shift = 20.0 * _smooth_field(graph, rng)  # minutes
    rho = np.clip(0.90 + 0.04 * _smooth_field(graph, rng), 0.7, 0.98)
    steps = days * STEPS_PER_DAY
    minute = (np.arange(steps) % STEPS_PER_DAY) * 5.0
    weekday = ((np.arange(steps) // STEPS_PER_DAY) % 7 < 5)[:, None]
    scale = np.where(weekday, 1.0, 0.3)

    def rush(centre: float, width: float) -> np.ndarray:
        return np.exp(-0.5 * ((minute[:, None] - centre - shift[None, :]) / width) ** 2)

    mean = free[None, :] * (1.0 - scale * (depth_am * rush(8 * 60, 60)
                                           + depth_pm * rush(17.5 * 60, 90)))
    a = graph + np.eye(n)
    walk = a / a.sum(axis=1, keepdims=True)
    shocks = rng.standard_normal((steps, n)) @ walk.T * (0.05 * free)
    noise = np.zeros((steps, n))
    for t in range(1, steps):  # AR(1) in time: a loop over steps, not over sensors
        noise[t] = rho * noise[t - 1] + shocks[t]
    return np.clip(mean + noise, 3.0, 80.0)


def make_traffic_standin(graph_file: Path, days: int = 35, seed: int = 0,
                         stride: int = 12) -> FederatedData:
    """A generated traffic stand-in on a real road graph (``graph_file``: any graph
    :func:`read_graph` reads), labelled as generated wherever it is reported.

    The process, with G the client graph and W the random walk on G plus self loops
    (each sensor and its neighbours, equally weighted):

    1. Each sensor's parameters are random fields smooth over G (white noise averaged 10
       times by W, standardised): free-flow speed 62 + 4 z mph; morning and evening rush
       depths 0.35 + 0.12 z and 0.40 + 0.12 z of it (clipped to [0.05, 0.7]); a rush-hour
       shift of 20 z minutes; a persistence 0.90 + 0.04 z (clipped to [0.7, 0.98]). Road
       neighbours have similar parameters: the graph carries information about each
       sensor's model.
    2. The mean speed: free-flow speed times 1 - depth x a Gaussian rush at 8:00 (width 60
       min) and 17:30 (90 min), shifted per sensor, at 0.3 of their depth on weekends.
    3. Fluctuations: e_t = rho e_(t-1) + W eps_t x 0.05 x free-flow speed, eps_t standard
       normal per sensor: shocks spread to road neighbours, and fade at each sensor's rate.
    4. Speed = mean + e, clipped to [3, 80] mph; ``days`` days of 5-minute readings, from a
       Monday. The default, 35 days, makes the test (the last 20% in time) one whole week,
       as each of the training's four: with 7 or 14 days the test is mostly a weekend, whose
       shallow rush hours are easier to forecast than the training's weekdays (measured:
       forecasting the last reading scores 0.0039 on the training windows of 7 days and
       0.0014 on their test windows; 0.0033 and 0.0032 with 35 days).

    Then windows, scaling and the split as the real tasks (the module's docstring).
    """
    ids, adjacency = read_graph(graph_file)
    graph = client_graph(adjacency)
    speeds = standin_speeds(graph.astype(np.float64), days, seed)
    return to_clients(speeds, adjacency, ids, stride,
                      {"generated": True, "graph_file": graph_file.name, "days": days})
