"""Hostile and malformed replies: property-based fuzzing of what a client may send back.

Every generated reply has at least one defect. Fed to FedAMP, Panacea, SCAFFOLD
and Flower's FedAvg, they must never raise and never change what the server
stores (the per-client models, the hypernetwork and its optimizer, the
control variate, the global model), nor reach the records as a result.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import LocalGrid, client_infos, reply, setup_strategy

N = 3  # clients 0..2 on nodes 10..12, 5 training and 5 test samples each (client_infos)

ARRAY_DEFECTS = ["missing key", "extra key", "wrong shape", "int dtype", "float16 nan", "nan",
                 "inf", "huge", "poison 1e7"]
METRIC_DEFECTS = ["num-examples 0", "num-examples -3", "num-examples 1.5", "num-examples 1e300",
                  "num-examples list", "num-examples too many",
                  "no num-examples", "train-loss nan", "train-loss list", "train-loss inf",
                  "wrong client-id", "wrong round", "two metric records", "no metric record"]
ENVELOPE_DEFECTS = ["unknown node", "error reply", "no arrays", "two array records"]
EVAL_DEFECTS = ["accuracy 1e9", "accuracy nan", "accuracy -0.1", "accuracy list", "no metric",
                "accuracy and mse", "loss inf", "loss -1", "num-examples 0", "num-examples 99",
                "num-examples 1.5", "unknown node", "error reply", "wrong client-id"]


def _trained(sent: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v + 0.01 if v.is_floating_point() else v.clone() for k, v in sent.items()}


def bad_train_reply(node: int, sent: dict[str, torch.Tensor], defects: list[str], extra=None) -> Message:
    arrays = _trained(sent)
    metrics = {"num-examples": 5, "train-loss": 0.5, "client-id": node - 10, "server-round": 1}
    records: dict = {}
    keys = list(arrays)
    for i, d in enumerate(defects):
        key = keys[i]  # each defect on a tensor of its own
        if d == "missing key":
            arrays.pop(key)
        elif d == "extra key":
            arrays["evil"] = torch.zeros(3)
        elif d == "wrong shape":
            arrays[key] = torch.zeros(7, 7)
        elif d == "int dtype":
            arrays[key] = arrays[key].to(torch.int32)
        elif d == "float16 nan":
            arrays[key] = torch.full_like(arrays[key], float("nan")).half()
        elif d in ("nan", "inf"):
            arrays[key] = arrays[key].clone()
            arrays[key].view(-1)[0] = float(d)
        elif d == "huge":
            arrays[key] = torch.full_like(arrays[key], 1e12)
        elif d == "poison 1e7":  # finite, below the absolute bound: the update-norm bound catches it
            arrays[key] = torch.full_like(arrays[key], 1e7)
        elif d.startswith("num-examples"):
            metrics["num-examples"] = {"num-examples 0": 0, "num-examples -3": -3,
                                       "num-examples 1.5": 1.5, "num-examples 1e300": 1e300,
                                       "num-examples list": [5],
                                       "num-examples too many": 6}[d]
        elif d == "no num-examples":
            metrics.pop("num-examples")
        elif d.startswith("train-loss"):
            metrics["train-loss"] = {"train-loss nan": float("nan"), "train-loss list": [0.1, 0.2],
                                     "train-loss inf": float("inf")}[d]
        elif d == "wrong client-id":
            metrics["client-id"] = (node - 10 + 1) % N
        elif d == "wrong round":
            metrics["server-round"] = 7
        elif d == "two metric records":
            records["metrics-2"] = MetricRecord({"num-examples": 5})
        elif d == "no metric record":
            pass  # below
        elif d == "unknown node":
            node = 99
        elif d == "two array records":
            records["shadow"] = ArrayRecord(_trained(sent))
    content = RecordDict()
    if "no arrays" not in defects:
        content["arrays"] = ArrayRecord(arrays)
    if "no metric record" not in defects:
        content["metrics"] = MetricRecord(metrics)
    for name, record in {**(extra or {}), **records}.items():
        content[name] = record
    sent_msg = Message(RecordDict({"config": ConfigRecord()}), message_type=MessageType.TRAIN,
                       dst_node_id=node)
    if "error reply" in defects:
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="boom"),
                       reply_to=sent_msg)
    return Message(content, reply_to=sent_msg)


def snapshot(strategy) -> dict:
    state = {}
    if getattr(strategy, "models", None) is not None:
        state["models"] = strategy.models.clone()
    if getattr(strategy, "main", None) is not None:  # Panacea's hypernetwork and its SGD
        state["hnet"] = copy.deepcopy(strategy.main.net.state_dict())
        state["optimizer"] = copy.deepcopy(strategy.main.optimizer.state_dict())
    if getattr(strategy, "control", None) is not None:
        state["control"] = strategy.control.clone()
    return state


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


STRATEGIES = [("fedamp", {}), ("panacea", {"graph": "groups"}), ("scaffold", {}), ("fedavg", {})]
defects = st.lists(st.sampled_from(ARRAY_DEFECTS + METRIC_DEFECTS + ENVELOPE_DEFECTS),
                   min_size=1, max_size=3, unique=True)


@pytest.mark.parametrize("name, overrides", STRATEGIES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replies=st.lists(st.tuples(st.integers(0, N - 1), defects, st.booleans()),
                        min_size=1, max_size=6))
def test_malformed_train_replies_never_crash_the_server_or_touch_its_state(name, overrides, replies):
    strategy, model = setup_strategy(name, n=N, **overrides)
    initial = ArrayRecord(model.state_dict())
    grid = LocalGrid(infos=client_infos(N))
    messages = list(strategy.configure_train(1, initial, ConfigRecord(), grid))
    sent = {m.metadata.dst_node_id: m.content["arrays"].to_torch_state_dict() for m in messages}
    before = snapshot(strategy)
    built = []
    for client, ds, twice in replies:
        extra = None
        if name == "scaffold" and "two array records" not in ds:  # a valid control delta
            extra = {"control-delta": ArrayRecord({k: torch.zeros_like(v)
                                                   for k, v in model.named_parameters()})}
        msg = bad_train_reply(10 + client, sent[10 + client], ds, extra)
        built += [msg, msg] if twice else [msg]
    arrays, _ = strategy.aggregate_train(1, built)
    assert arrays is None  # Flower strategies: nothing to aggregate
    assert same(snapshot(strategy), before)
    assert strategy.history.rounds.get(1, {}).get("trained_clients", []) == []


@pytest.mark.parametrize("name, overrides", STRATEGIES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replies=st.lists(st.tuples(st.integers(0, N - 1), st.sampled_from(EVAL_DEFECTS)),
                        min_size=1, max_size=6))
def test_malformed_evaluation_replies_are_never_recorded(name, overrides, replies):
    strategy, model = setup_strategy(name, n=N, **overrides)
    list(strategy.configure_evaluate(1, ArrayRecord(model.state_dict()), ConfigRecord(),
                                     LocalGrid(infos=client_infos(N))))
    built = []
    for client, d in replies:
        node = 99 if d == "unknown node" else 10 + client
        metrics = {"num-examples": 5, "accuracy": 0.5, "loss": 1.0, "client-id": client,
                   "server-round": 1}
        bad = {"accuracy 1e9": {"accuracy": 1e9}, "accuracy nan": {"accuracy": float("nan")},
               "accuracy -0.1": {"accuracy": -0.1}, "accuracy list": {"accuracy": [0.5]},
               "accuracy and mse": {"mse": 0.1}, "loss inf": {"loss": float("inf")},
               "loss -1": {"loss": -1.0}, "num-examples 0": {"num-examples": 0},
               "num-examples 99": {"num-examples": 99}, "num-examples 1.5": {"num-examples": 1.5},
               "wrong client-id": {"client-id": (client + 1) % N}}.get(d, {})
        metrics.update(bad)
        if d == "no metric":
            metrics.pop("accuracy")
        out = Message(RecordDict({"config": ConfigRecord()}), message_type=MessageType.EVALUATE,
                      dst_node_id=node)
        built.append(Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="gone"), reply_to=out)
                     if d == "error reply" else Message(RecordDict({"metrics": MetricRecord(metrics)}),
                                                        reply_to=out))
    strategy.aggregate_evaluate(1, built)
    record = strategy.history.rounds.get(1, {})
    assert "client_accuracy" not in record and "mean_accuracy" not in record
    assert np.isfinite(strategy.history.run_file().headlines.get("bmta", 0.0))


def test_one_good_reply_among_bad_ones_is_the_only_one_used():
    strategy, model = setup_strategy("fedamp", n=N)
    initial = ArrayRecord(model.state_dict())
    grid = LocalGrid(infos=client_infos(N))
    messages = list(strategy.configure_train(1, initial, ConfigRecord(), grid))
    sent = {m.metadata.dst_node_id: m.content["arrays"].to_torch_state_dict() for m in messages}
    before = strategy.models.clone()
    good = bad_train_reply(11, sent[11], [])
    replies = [bad_train_reply(10, sent[10], ["poison 1e7"]), good, good,  # a duplicate
               bad_train_reply(12, sent[12], ["int dtype"])]
    strategy.aggregate_train(1, replies)
    assert torch.equal(strategy.models[[0, 2]], before[[0, 2]])
    assert not torch.equal(strategy.models[1], before[1])
    record = strategy.history.rounds[1]
    assert record["trained_clients"] == [1]
    assert "update norm" in record["rejected"][0] and "dtype int32" in record["rejected"][2]


def _train_reply(node, state, cid):
    return reply(node, state, {"num-examples": 5, "client-id": cid})


def test_fedamp_leaves_bad_replies_out_and_keeps_their_models(caplog):
    strategy, model = setup_strategy("fedamp")
    init = ArrayRecord(model.state_dict())
    list(strategy.configure_train(1, init, ConfigRecord(), LocalGrid()))
    before = strategy.models.clone()
    nan_state = {k: v.clone() for k, v in model.state_dict().items()}
    nan_state["net.0.weight"][0, 0] = float("nan")
    shape_state = {k: v.clone() for k, v in model.state_dict().items()}
    shape_state["net.0.bias"] = torch.zeros(3)
    good_state = {k: v + 1.0 for k, v in model.state_dict().items()}
    no_arrays = reply(10, metrics={"num-examples": 5})
    replies = [no_arrays, _train_reply(11, nan_state, 1), _train_reply(12, shape_state, 2)]
    strategy.aggregate_train(1, replies)
    assert torch.equal(strategy.models, before)  # nothing changed
    assert "client 1" in caplog.text and "non-finite" in caplog.text
    assert "client 2" in caplog.text and "shape" in caplog.text
    assert "client 0" in caplog.text and "ArrayRecord" in caplog.text
    strategy.aggregate_train(2, [_train_reply(12, good_state, 2), _train_reply(11, nan_state, 1)])
    assert torch.allclose(strategy.models[2], before[2] + 1.0)
    assert torch.equal(strategy.models[:2], before[:2])


def test_fedavg_aggregates_only_valid_replies():
    strategy, model = setup_strategy("fedavg")
    init = ArrayRecord(model.state_dict())
    strategy.configure_train(1, init, ConfigRecord(), LocalGrid(infos=client_infos(3)))
    nan_state = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    ones = {k: torch.ones_like(v) for k, v in model.state_dict().items()}
    arrays, _ = strategy.aggregate_train(1, [_train_reply(10, ones, 0), _train_reply(11, nan_state, 1)])
    assert all(np.all(a.numpy() == 1.0) for a in arrays.values())


def test_huge_and_float32_overflowing_replies_are_left_out(caplog):
    strategy, model = setup_strategy("fedamp")
    init = ArrayRecord(model.state_dict())
    list(strategy.configure_train(1, init, ConfigRecord(), LocalGrid()))
    before = strategy.models.clone()
    overflow = {k: v.double() for k, v in model.state_dict().items()}
    overflow["net.0.bias"][0] = 1e300  # finite in float64, inf in float32
    huge = {k: torch.full_like(v, 1e12) for k, v in model.state_dict().items()}
    strategy.aggregate_train(1, [_train_reply(10, overflow, 0), _train_reply(11, huge, 1)])
    assert torch.equal(strategy.models, before)
    assert "as float32" in caplog.text and "squared norm" in caplog.text
    list(strategy.configure_train(2, init, ConfigRecord(), LocalGrid()))
    assert all(torch.isfinite(torch.tensor(row)).all() for row in strategy.history.xi[2])


def test_fedamp_leaves_novel_clients_out_of_the_cloud_models():
    from tasks.scenarios import Roles

    strategy, model = setup_strategy("fedamp", roles=Roles(frozenset({1}), frozenset()))
    strategy.alpha_k, strategy.sigma = 0.01, 1.0
    messages = list(strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(),
                                             LocalGrid()))
    assert len(messages) == 2  # the novel client does not train
    xi = torch.tensor(strategy.history.xi[1])
    assert xi[1].tolist() == [0.0, 1.0, 0.0] and xi[0, 1] == 0 and xi[2, 1] == 0
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=xi.dtype))


_DTYPES = ["float32", "float64", "float16", "int64", "int8", "uint8", "bool", ">f4", "<i2"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(_DTYPES),
       shape=st.lists(st.integers(0, 4), max_size=4).map(tuple),
       fortran=st.booleans(),
       defect=st.sampled_from(["none", "truncate", "extend", "flip a header byte", "other dtype",
                               "other shape", "object dtype", "negative shape", "not npy"]),
       at=st.integers(0, 10_000))
def test_an_array_read_fast_is_flowers_reading_of_any_buffer(dtype, shape, fortran, defect, at):
    """``strategies.core.layout.read`` (the in-process engine's fast reading of a reply's
    arrays) gives exactly what Flower's ``Array.numpy()`` gives, or the same error, for
    honest arrays and for every defect of the buffer or of the fields beside it."""
    from strategies.core.layout import read

    values = (np.arange(int(np.prod(shape))) * 7 % 5).reshape(shape).astype(dtype)
    if fortran:
        values = np.asfortranarray(values)
    honest = Array(values)  # np.save's bytes, as Flower writes them
    data, dt, sh = honest.data, honest.dtype, tuple(honest.shape)
    if defect == "truncate":
        data = data[:at % (len(data) + 1)]
    elif defect == "extend":
        data = data + b"\0" * (1 + at % 9)
    elif defect == "flip a header byte":
        i = at % min(len(data), 128)
        data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]
    elif defect == "other dtype":
        dt = "float64" if dt != "float64" else "int32"
    elif defect == "other shape":
        sh = (*sh, 1)
    elif defect == "object dtype":
        dt = "O"
    elif defect == "negative shape":
        sh = (-1, *sh)
    elif defect == "not npy":
        data = bytes(at % 251 for _ in range(at % 64))
    array = Array(dtype=dt, shape=sh, stype=honest.stype, data=data)
    try:
        expected = array.numpy()
    except Exception as err:  # the same error either way
        with pytest.raises(type(err)):
            read(array)
        return
    got = read(array)
    if defect == "none" and not fortran:  # the fast way was taken, not Flower's
        from strategies.core.layout import _npy_header

        header = _npy_header(dt, sh)
        assert header is not None and data.startswith(header)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert got.flags.writeable and got.flags.c_contiguous == expected.flags.c_contiguous


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([*_DTYPES, "complex64", "float128"]),
       shape=st.lists(st.integers(0, 4), max_size=4).map(tuple),
       layout=st.sampled_from(["c", "fortran", "strided", "torch"]))
def test_an_array_written_fast_is_flowers_writing_byte_for_byte(dtype, shape, layout):
    """``strategies.core.layout.write`` (the fast writing of a model's arrays into a message)
    gives the Array Flower's own ``Array(...)`` gives, to the byte, for C-ordered, Fortran-ordered
    and strided arrays and torch tensors; and :func:`record` keeps a state dict's order."""
    from strategies.core.layout import read, record, write

    values = (np.arange(int(np.prod(shape))) * 7 % 5).reshape(shape).astype(dtype)
    if layout == "fortran":
        values = np.asfortranarray(values)
    elif layout == "strided":
        values = np.concatenate([values, values], axis=-1)[..., ::2] if shape else values
    if layout == "torch" and values.dtype.isnative and values.dtype.kind in "fiub" \
            and dtype != "float128":
        values = torch.from_numpy(np.ascontiguousarray(values))
    expected, got = Array(values), write(values)
    assert (got.dtype, tuple(got.shape), got.stype, got.data) == \
        (expected.dtype, tuple(expected.shape), expected.stype, expected.data)
    np.testing.assert_array_equal(read(got), expected.numpy())
    rec = record({"b": values, "a": values})
    assert list(rec.keys()) == ["b", "a"] and rec["a"].data == expected.data


@settings(max_examples=100, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(0, 4), max_size=3).map(tuple), min_size=1,
                       max_size=4),
       dtypes=st.lists(st.sampled_from(["float32", "float64", "float16", "int64"]),
                       min_size=4, max_size=4),
       seed=st.integers(0, 2**16))
def test_a_flat_model_unflattened_is_flowers_writing_of_each_piece(shapes, dtypes, seed):
    """``FlatLayout.unflatten`` (every personalized strategy's messages) gives, key by key in
    the model's order, the Array Flower's ``Array(...)`` gives of the vector's piece as float32
    (an integer constant as it was), to the byte; a vector of another length is refused."""
    from strategies.core.layout import FlatLayout, record

    rng = np.random.default_rng(seed)
    model = {f"k{i}": np.asarray(rng.normal(size=shape) * 100).astype(dtypes[i])
             for i, shape in enumerate(shapes)}
    layout = FlatLayout.from_arrays(record(model))
    vec = torch.from_numpy(rng.normal(size=layout.size)).to(torch.float64)
    got, at = layout.unflatten(vec), 0
    assert list(got.keys()) == list(model)
    pieces = {}
    for k in layout.float_keys:
        n = int(np.prod(layout.shapes[k]))
        pieces[k] = vec[at:at + n].float().numpy().reshape(layout.shapes[k])
        at += n
    for k, v in model.items():
        expected = Array(pieces[k]) if k in pieces else Array(v)
        assert (got[k].dtype, tuple(got[k].shape), got[k].stype, got[k].data) == \
            (expected.dtype, tuple(expected.shape), expected.stype, expected.data), k
    with pytest.raises(ValueError, match="flat model of shape"):
        layout.unflatten(torch.zeros(layout.size + 1))
