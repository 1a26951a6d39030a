"""Flattening a model's state dict into one vector and back (:class:`FlatLayout`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord


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
    def from_arrays(cls, arrays: ArrayRecord, param_keys: Sequence[str] | None = None) -> "FlatLayout":
        """Build the layout of ``arrays``; ``param_keys`` default to all float tensors."""
        nd = {k: v.numpy() for k, v in arrays.items()}
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

    @property
    def size(self) -> int:
        """Length of the flat vector."""
        return int(sum(int(np.prod(self.shapes[k])) for k in self.float_keys))

    def flatten(self, arrays: ArrayRecord) -> torch.Tensor:
        """Return the float32 vector of ``arrays`` (which must match the layout)."""
        parts = [torch.from_numpy(np.asarray(arrays[k].numpy(), dtype=np.float32)).reshape(-1)
                 for k in self.float_keys]
        return torch.cat(parts)

    def unflatten(self, vec: torch.Tensor) -> ArrayRecord:
        """Return the ``ArrayRecord`` of the vector ``vec``, in the model's key order."""
        vec = vec.detach().to("cpu", torch.float32)
        sizes = [int(np.prod(self.shapes[k])) for k in self.float_keys]
        out = {k: t.reshape(self.shapes[k]) for k, t in zip(self.float_keys, vec.split(sizes))}
        out.update({k: torch.from_numpy(v) for k, v in self.constants.items()})
        return ArrayRecord(OrderedDict((k, out[k].contiguous()) for k in self.keys))

