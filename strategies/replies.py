"""Checks of what clients send back, and the mean of their metrics.

* :func:`arrays_problem`, :func:`reply_problem`: what is wrong with a
  reply's arrays or a whole training reply, if anything (None: usable).
* :func:`mean_metrics`: the unweighted mean over clients of their metrics
  (Flower's ``*_metrics_aggr_fn``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from .protocol import CLIENT_ID, NUM_EXAMPLES, SERVER_ROUND

# Largest squared norm of a model taken from a client. Models of norm <= 1e9
# have centred norms <= 2e9, so every float32 Gram entry of FedAMP stays
# <= 4e18, far below float32's maximum (3.4e38).
MAX_SQ_NORM = 1e18
_ID_KEYS = (CLIENT_ID, SERVER_ROUND)


def arrays_problem(record: ArrayRecord, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Return what is wrong with an ``ArrayRecord`` from a client, or None.

    It must have exactly the keys and shapes of ``shapes``, values that are
    finite as float32 (the server's dtype) and a squared norm below
    ``MAX_SQ_NORM`` (so that the float32 Gram products of FedAMP cannot overflow).
    """
    if set(record.keys()) != set(shapes):
        return f"array keys differ from the model's ({sorted(set(record.keys()) ^ set(shapes))[:5]})"
    sq_norm = 0.0
    for key, arr in record.items():
        a = arr.numpy()
        if tuple(a.shape) != shapes[key]:
            return f"array '{key}' has shape {tuple(a.shape)}, expected {shapes[key]}"
        if np.issubdtype(a.dtype, np.floating):
            with np.errstate(over="ignore"):
                a32 = a.astype(np.float32)
            if not np.isfinite(a32).all():
                return f"array '{key}' has non-finite values (as float32)"
            sq_norm += float(np.square(a32, dtype=np.float64).sum())
    if sq_norm > MAX_SQ_NORM:
        return f"squared norm {sq_norm:.3g} exceeds {MAX_SQ_NORM:.0e}"
    return None


def reply_problem(msg: Message, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Return why a training reply cannot be used, or None if it can.

    A usable reply has no error, exactly one ``ArrayRecord`` that passes
    :func:`arrays_problem` and a ``MetricRecord`` with a non-negative ``num-examples``.
    """
    if msg.has_error():
        return f"error reply: {msg.error.reason}"
    arrays = list(msg.content.array_records.values())
    if len(arrays) != 1:
        return f"expected one ArrayRecord, got {len(arrays)}"
    problem = arrays_problem(arrays[0], shapes)
    if problem is not None:
        return problem
    if not msg.content.metric_records:
        return "no MetricRecord"
    count = metrics_of(msg).get(NUM_EXAMPLES)
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not 0 <= count < math.inf:
        return f"metric '{NUM_EXAMPLES}' = {count!r} is not a count"
    return None


def metrics_of(msg: Message) -> dict[str, Any]:
    record = next(iter(msg.content.metric_records.values()), MetricRecord())
    return dict(record)


def mean_metrics(contents: list[RecordDict], _weight_key: str = NUM_EXAMPLES) -> MetricRecord:
    """Unweighted mean over clients of every metric (ids and counts left out).

    Used as Flower's ``*_metrics_aggr_fn``: the papers report the mean test
    accuracy over clients, each client counting once.
    """
    sums: dict[str, float] = {}
    for content in contents:
        for record in content.metric_records.values():
            for k, v in record.items():
                if k in _ID_KEYS or k == NUM_EXAMPLES or not isinstance(v, (int, float)):
                    continue
                sums[k] = sums.get(k, 0.0) + float(v)
    n = max(len(contents), 1)
    return MetricRecord({k: v / n for k, v in sums.items()})

