"""A model's arrays: read from Flower's records (:func:`read`, :func:`state_dict`), flattened
into one vector and back (:class:`FlatLayout`), and kept in the dtypes they were sent with
(:func:`with_dtypes`)."""

from __future__ import annotations

import functools
import io
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord


@functools.lru_cache(maxsize=512)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes | None:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``
    (format 1.0), or None for a dtype that is not a plain number or bool."""
    try:
        dt = np.dtype(dtype)
        if dt.kind not in "biuf" or dt.hasobject or dt.names is not None:
            return None
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {
            "descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": shape})
    except (TypeError, ValueError):
        return None
    return buf.getvalue()


def read(array: Array) -> np.ndarray:
    """``array.numpy()``: the same array, without ``np.load``'s parse of the ``.npy`` header
    (``ast.literal_eval``: about 100 us against 4 us for a 192 x 64 float32 array, timed once
    with ``timeit`` here, docs/performance.md), which the in-process engine paid for every
    array of hundreds of messages a round, on both sides.

    Taken only where the buffer starts with exactly the header ``np.save`` writes for the
    array's own dtype and shape and holds exactly their bytes after it; anything else (another
    format version, Fortran order, an object dtype, a malformed or hostile buffer) is read by
    Flower's ``Array.numpy()``, as before, with its errors. What the header cache keeps is
    bounded: 512 pairs of a dtype of at most 16 characters and at most 64 sizes."""
    data, shape = array.data, array.shape
    if array.stype == "numpy.ndarray" and isinstance(array.dtype, str) and \
            len(array.dtype) <= 16 and isinstance(data, bytes) and \
            isinstance(shape, (list, tuple)) and len(shape) <= 64 and \
            all(type(n) is int and n >= 0 for n in shape):
        header = _npy_header(array.dtype, tuple(shape))
        if header is not None and data.startswith(header):
            dt, count = np.dtype(array.dtype), math.prod(shape)
            if len(data) == len(header) + count * dt.itemsize:
                return np.frombuffer(data, dt, count, len(header)).reshape(shape).copy()
    return array.numpy()


def write(array: np.ndarray | torch.Tensor) -> Array:
    """``Array(array)``: the same bytes (``np.save``'s, format 1.0), with the header of an
    array's dtype and shape written once (:func:`_npy_header`) rather than for every array
    (``np.save`` formats and pads it each time). A GRU's 10 arrays as a record (:func:`record`):
    253 us against Flower's 517 us (``timeit``, 200 x 3, docs/performance.md). Anything whose
    header is not cached here (an object, complex or structured dtype, a Fortran-ordered
    array, a header too long for format 1.0) goes through Flower's ``Array``, as before."""
    arr = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else array
    fortran = isinstance(arr, np.ndarray) and arr.flags.f_contiguous and \
        not arr.flags.c_contiguous  # np.save writes those in Fortran order
    if isinstance(arr, np.ndarray) and not fortran and len(arr.shape) <= 64:
        dtype = _dtype_name(arr.dtype)
        header = _npy_header(dtype, tuple(arr.shape))
        if header is not None:
            return Array(dtype=dtype, shape=tuple(arr.shape), stype="numpy.ndarray",
                         data=header + np.ascontiguousarray(arr).tobytes())
    return Array(arr)


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, which numpy formats anew each time (about 10 us, twice an array)."""
    return str(dtype)


def record(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """``ArrayRecord(arrays)`` (a state dict, in its order), each array written by
    :func:`write`, and put in the record as it is (``ArrayRecord(dict)`` would copy every
    ``Array`` once more)."""
    out = ArrayRecord()
    for k, v in arrays.items():
        out[k] = write(v)
    return out


def state_dict(arrays: ArrayRecord) -> OrderedDict[str, torch.Tensor]:
    """``arrays.to_torch_state_dict()``, each array read by :func:`read`."""
    return OrderedDict((k, torch.from_numpy(read(v))) for k, v in arrays.items())



@dataclass(frozen=True)
class FlatLayout:
    """How a model's state dict maps to one flat float vector.

    Floating-point tensors are concatenated, the trainable parameters
    (``param_keys``) first: ``vec[:num_params]`` are the parameters and the
    rest are floating-point buffers (such as batch-norm running statistics).
    Other tensors (integer counters) are not part of the vector and are
    restored from ``constants``, taken from the initial model.
    """

    keys: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    float_keys: tuple[str, ...]
    num_params: int
    constants: dict[str, np.ndarray]
    num_param_keys: int = 0

    @classmethod
    def from_arrays(cls, arrays: ArrayRecord, param_keys: Sequence[str] | None = None) -> FlatLayout:
        """Build the layout of ``arrays``; ``param_keys`` default to all float tensors."""
        nd = {k: read(v) for k, v in arrays.items()}
        floats = [k for k, v in nd.items() if np.issubdtype(v.dtype, np.floating)]
        params = [k for k in floats if param_keys is None or k in set(param_keys)]
        ordered = params + [k for k in floats if k not in set(params)]
        return cls(
            keys=tuple(nd),
            shapes={k: tuple(v.shape) for k, v in nd.items()},
            float_keys=tuple(ordered),
            num_params=int(sum(nd[k].size for k in params)),
            constants={k: v.copy() for k, v in nd.items() if k not in set(floats)},
            num_param_keys=len(params),
        )

    @functools.cached_property
    def size(self) -> int:
        """Length of the flat vector."""
        return int(sum(int(np.prod(self.shapes[k])) for k in self.float_keys))

    def flatten(self, arrays: ArrayRecord) -> torch.Tensor:
        """Return the float32 vector of ``arrays`` (which must match the layout)."""
        parts = [torch.from_numpy(np.asarray(read(arrays[k]), dtype=np.float32)).reshape(-1)
                 for k in self.float_keys]
        return torch.cat(parts)

    @functools.cached_property
    def _pieces(self) -> tuple[tuple[str, int, int, tuple[int, ...], bytes | None], ...]:
        """Per key, in the model's order: its bytes' span in the float32 vector and its
        ``.npy`` header as :func:`write` gives it (spans and header None: a constant)."""
        starts, at = {}, 0
        for k in self.float_keys:
            starts[k], at = at, at + 4 * math.prod(self.shapes[k])
        return tuple(
            (k, starts[k], starts[k] + 4 * math.prod(self.shapes[k]), self.shapes[k],
             _npy_header("float32", self.shapes[k])) if k in starts else (k, 0, 0, (), None)
            for k in self.keys)

    def unflatten(self, vec: torch.Tensor) -> ArrayRecord:
        """Return the ``ArrayRecord`` of the vector ``vec``, in the model's key order: float
        arrays as float32, constants as they were. The same arrays and bytes as
        :func:`record` of the vector's pieces, from one copy of the vector's bytes rather than
        one numpy array and header lookup a piece (a GRU's: about a third of the time, for each
        of a personalized strategy's hundreds of messages a round)."""
        if vec.dim() != 1 or vec.numel() != self.size:  # checked before the copy
            raise ValueError(f"a flat model of shape {tuple(vec.shape)}, the layout's is "
                             f"({self.size},)")
        raw = vec.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        out = ArrayRecord()
        for key, start, stop, shape, header in self._pieces:
            if key in self.constants:
                out[key] = write(self.constants[key])
            elif header is None:  # a header too long for format 1.0: as write does
                out[key] = write(np.frombuffer(raw, np.float32, (stop - start) // 4, start
                                               ).reshape(shape))
            else:
                out[key] = Array(dtype="float32", shape=shape, stype="numpy.ndarray",
                                 data=header + raw[start:stop])
        return out



def dtypes_of(arrays: ArrayRecord) -> dict[str, np.dtype]:
    """The numpy dtype of every array of ``arrays``."""
    return {k: read(v).dtype for k, v in arrays.items()}


def with_dtypes(arrays: ArrayRecord, dtypes: Mapping[str, np.dtype]) -> ArrayRecord:
    """``arrays`` with every array in its dtype of ``dtypes`` (the dtypes the model was sent with).

    Flower's aggregation helpers (``aggregate_arrayrecords``, the medians of
    FedMedian and FedTrimmedAvg, FedAvgM's momentum) multiply every array by a
    float weight, so an integer buffer such as BatchNorm's ``num_batches_tracked``
    comes back as float64; sent on like that, every honest reply (which holds
    the integer) would differ from the model sent. Integer arrays are rounded
    back to the nearest integer (for ``num_batches_tracked``: the clients'
    weighted mean count of batches, or the median under FedMedian), booleans
    are true where the aggregate is at least 0.5, floating-point arrays are
    cast to their dtype. Arrays already in their dtype are passed on as they are.
    """
    out: dict[str, np.ndarray] = {}
    changed = False
    for key, arr in arrays.items():
        a = read(arr)
        want = dtypes.get(key, a.dtype)
        if a.dtype != want:
            changed = True
            if want.kind in "iu":
                info = np.iinfo(want)
                a = np.clip(np.rint(a), info.min, info.max).astype(want)
            elif want.kind == "b":
                a = a >= 0.5
            else:
                a = a.astype(want)
        out[key] = np.require(a, requirements="C")  # keeps 0-d arrays 0-d
    if not changed:
        return arrays
    return ArrayRecord(OrderedDict((k, torch.from_numpy(v)) for k, v in out.items()))
