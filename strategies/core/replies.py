"""Checks of everything a client sends back, and the mean of the metrics that passed them.

Every reply is untrusted. A reply is used only if these functions find
nothing wrong with it (they return a reason, or None):

* :func:`arrays_problem`: an ``ArrayRecord`` must have exactly the keys,
  shapes and dtype kinds of the model that was sent, floating-point values
  only where the model has them, finite in float32 (the server's dtype), and
  a squared norm below :data:`MAX_SQ_NORM`;
* :func:`train_reply_problem`: the ArrayRecord ``arrays`` passing
  :func:`arrays_problem` (and no other but the method's own) and one
  MetricRecord with ``num-examples`` an integer in [1, the client's
  training size], a finite ``train-loss`` when present, and ``client-id`` /
  ``server-round`` that match the sender and the round when present;
* :func:`evaluate_reply_problem`: one MetricRecord with the task's metric
  (``accuracy`` in [0, 1], or ``mse`` >= 0), ``loss`` >= 0, all finite, and
  ``num-examples`` an integer in [1, the client's test size].

:func:`mean_metrics` averages only finite numbers (Flower's ``*_metrics_aggr_fn``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from .layout import read
from .protocol import (
    ACCURACY,
    ALONE_LINEAR,
    ALONE_MODEL,
    ARRAYS,
    CLIENT_ID,
    DP_EPSILON,
    HELD_OUT_GAIN,
    KEPT_MODEL,
    LOSS,
    METRICS,
    MSE,
    NUM_EXAMPLES,
    SERVER_ROUND,
    TRAIN_LOSS,
)

# Largest squared norm of a model taken from a client. Models of norm <= 1e9
# have centred norms <= 2e9, so every float32 Gram entry of FedAMP stays
# <= 4e18, far below float32's maximum (3.4e38).
MAX_SQ_NORM = 1e18
_ID_KEYS = (CLIENT_ID, SERVER_ROUND)

#: what a reply's arrays must look like: key -> (shape, numpy dtype kind: "f", "i", "u", "b")
ArraySpec = dict[str, tuple[tuple[int, ...], str]]


def array_spec(arrays: ArrayRecord) -> ArraySpec:
    """The keys, shapes and dtype kinds of the arrays sent (what a reply must match)."""
    spec = {}
    for key, arr in arrays.items():
        a = read(arr)
        spec[key] = (tuple(int(n) for n in a.shape), str(a.dtype.kind))
    return spec


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (not a bool, a list or a string)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value))


def arrays_problem(record: ArrayRecord, spec: ArraySpec) -> str | None:
    """Return what is wrong with an ``ArrayRecord`` from a client, or None."""
    if set(record.keys()) != set(spec):
        return f"array keys differ from the model's ({sorted(set(record.keys()) ^ set(spec))[:5]})"
    sq_norm = 0.0
    for key, arr in record.items():
        try:
            a = read(arr)
        except Exception as err:  # a malformed buffer or dtype string
            return f"array '{key}' cannot be read ({type(err).__name__}: {err})"
        shape, kind = spec[key]
        if tuple(a.shape) != shape:
            return f"array '{key}' has shape {tuple(a.shape)}, expected {shape}"
        if a.dtype.kind != kind or (kind == "f" and a.dtype.itemsize not in (2, 4, 8)):
            return f"array '{key}' has dtype {a.dtype}, expected a {_KINDS.get(kind, kind)} array"
        if kind == "f":
            with np.errstate(over="ignore"):
                a32 = a.astype(np.float32)
            if not np.isfinite(a32).all():
                return f"array '{key}' has non-finite values (as float32)"
            sq_norm += float(np.square(a32, dtype=np.float64).sum())
    if sq_norm > MAX_SQ_NORM:
        return f"squared norm {sq_norm:.3g} exceeds {MAX_SQ_NORM:.0e}"
    return None


_KINDS = {"f": "floating-point", "i": "signed integer", "u": "unsigned integer", "b": "boolean"}


def _count_problem(metrics: dict[str, Any], most: int | None) -> str | None:
    count = metrics.get(NUM_EXAMPLES)
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return f"metric '{NUM_EXAMPLES}' = {count!r} is not an integer >= 1"
    if most is not None and count > most:
        return f"metric '{NUM_EXAMPLES}' = {count} exceeds the client's {most} samples"
    return None


def _ids_problem(metrics: dict[str, Any], client_id: int | None, server_round: int | None) -> str | None:
    for key, expected in ((CLIENT_ID, client_id), (SERVER_ROUND, server_round)):
        if key in metrics and expected is not None and metrics[key] != expected:
            return f"metric '{key}' = {metrics[key]!r}, but the reply is for {expected}"
    return None


def _single_metrics(msg: Message) -> tuple[dict[str, Any] | None, str | None]:
    names = sorted(msg.content.metric_records)
    if names != [METRICS]:
        return None, f"expected the one MetricRecord '{METRICS}', got {names[:5]}"
    return dict(msg.content[METRICS]), None


def train_reply_problem(msg: Message, spec: ArraySpec, most_examples: int | None = None,
                        client_id: int | None = None, server_round: int | None = None,
                        extra_records: tuple[str, ...] = ()) -> str | None:
    """Return why a training reply cannot be used, or None if it can.

    ``extra_records``: the method's own ArrayRecords that may come beside
    ``arrays`` (the method checks them).
    """
    if msg.has_error():
        return f"error reply: {msg.error.reason}"
    names = set(msg.content.array_records)
    if ARRAYS not in names:
        return f"no ArrayRecord '{ARRAYS}' (got {sorted(names)[:5]})"
    if names - {ARRAYS} - set(extra_records):
        return f"unexpected ArrayRecords {sorted(names - {ARRAYS} - set(extra_records))[:5]}"
    problem = arrays_problem(msg.content.array_records[ARRAYS], spec)
    if problem is not None:
        return problem
    metrics, problem = _single_metrics(msg)
    if metrics is None:
        return problem
    if TRAIN_LOSS in metrics and not finite_number(metrics[TRAIN_LOSS]):
        return f"metric '{TRAIN_LOSS}' = {metrics[TRAIN_LOSS]!r} is not a finite number"
    if DP_EPSILON in metrics and not (finite_number(metrics[DP_EPSILON])
                                      and metrics[DP_EPSILON] >= 0):
        return f"metric '{DP_EPSILON}' = {metrics[DP_EPSILON]!r} is not a finite number >= 0"
    return _count_problem(metrics, most_examples) or _ids_problem(metrics, client_id, server_round)


def evaluate_reply_problem(msg: Message, most_examples: int | None = None,
                           client_id: int | None = None, server_round: int | None = None) -> str | None:
    """Return why an evaluation reply cannot be used, or None if it can."""
    if msg.has_error():
        return f"error reply: {msg.error.reason}"
    metrics, problem = _single_metrics(msg)
    if metrics is None:
        return problem
    if (ACCURACY in metrics) == (MSE in metrics):
        return f"expected exactly one of the metrics '{ACCURACY}' and '{MSE}'"
    # what a member scores alone is on its main metric's scale
    main_high = 1.0 if ACCURACY in metrics else math.inf
    for key, low, high in ((ACCURACY, 0.0, 1.0), (MSE, 0.0, math.inf), (LOSS, 0.0, math.inf),
                           (ALONE_LINEAR, 0.0, main_high), (ALONE_MODEL, 0.0, main_high),
                           (HELD_OUT_GAIN, -math.inf, math.inf)):
        if key in metrics and not (finite_number(metrics[key]) and low <= metrics[key] <= high):
            allowed = (f"in [{low:g}, {high:g}]" if high < math.inf else
                       f">= {low:g}" if low > -math.inf else "")
            return f"metric '{key}' = {metrics[key]!r} is not a finite number {allowed}".rstrip()
    kept = metrics.get(KEPT_MODEL, 0)
    if isinstance(kept, bool) or not isinstance(kept, int) or kept not in (0, 1, 2):
        return f"metric '{KEPT_MODEL}' = {metrics[KEPT_MODEL]!r} is not 0, 1 or 2"
    return _count_problem(metrics, most_examples) or _ids_problem(metrics, client_id, server_round)


def metrics_of(msg: Message) -> dict[str, Any]:
    """The (first) MetricRecord of a reply as a dict (empty if none)."""
    record = next(iter(msg.content.metric_records.values()), MetricRecord())
    return dict(record)


def mean_metrics(contents: list[RecordDict], _weight_key: str = NUM_EXAMPLES) -> MetricRecord:
    """Unweighted mean over clients of every finite numeric metric (ids and counts left out).

    Used as Flower's ``*_metrics_aggr_fn``: the papers report the mean test
    accuracy over clients, each client counting once.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for content in contents:
        for record in content.metric_records.values():
            for k, v in record.items():
                if k in _ID_KEYS or k == NUM_EXAMPLES or not isinstance(v, (int, float)) \
                        or not finite_number(v):
                    continue
                sums[k] = sums.get(k, 0.0) + float(v)
                counts[k] = counts.get(k, 0) + 1
    return MetricRecord({k: v / counts[k] for k, v in sums.items()})
