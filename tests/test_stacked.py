"""A round's clients trained as one stacked model (run config ``client-batching``,
:mod:`tasks.stacked`) give each client the numbers of training it alone.

Tolerances, and why: a batched matrix product sums in another order than one client's, and the
stacked GRU computes its gates by hand where torch's cell is fused, so the two paths differ in
the last bits of a float32 (seen: losses 2e-7 relative; weights 4e-8 for SGD and up to 2.4e-5
for Adam, whose step m / sqrt(v) turns the rounding of a gradient near 0 into a step of about
the learning rate's size). Losses are compared to 1e-5 relative, weights to 1e-4 absolute, a
run's test numbers to 1e-4 relative (seen: up to 1.1e-5, Panacea's GRU after 2 rounds, whose
hypernetwork steps on the replies carry the rounding on) and its accuracies as counts of test
samples.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from fedamp_flwr.tools.inprocess import InProcessGrid, task_identity
from strategies.per_fedavg import MetaStep
from strategies.pfedme import MoreauStep
from tasks import loading, stacked
from tasks.models import MLP, GRUSeq2Seq, McMahanCNN
from tasks.train import Fit, Test, run_batches, train

from .helpers import SENSOR_CONFIG, SENSORS, run_local, run_named, sensor_sites

SIZES = [50, 37, 64, 5, 80, 33, 0]  # an empty client, a short one, uneven last batches


#: float64's tolerances of the step-by-step checks: the stacked arithmetic is the one-by-one
#: loop's in another summation order (seen: weights 5e-13 apart, losses 6e-16 relative)
WEIGHTS, LOSSES = 1e-10, 1e-10


@pytest.fixture
def float64():
    """The step-by-step checks in double precision, where the two paths differ only by their
    summation order. In float32 (the runs') Adam turns the rounding of a gradient near 0 into
    a step of about the learning rate, by as much as the CPU's kernels round differently:
    2.4e-5 on one machine, 3.2e-4 for the CNN on an AMD EPYC (2026-12-06). The whole runs
    below check float32, to 1e-4 relative."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _fits(kind: str, optimizer: str, **settings) -> list[Fit]:
    """Clients of different sizes, epochs (1-3), seeds and proximal weights (0 for every
    other one), each with its own model."""
    torch.manual_seed(0)
    fits = []
    for i, n in enumerate(SIZES):
        if kind == "gru":
            model, x, y = GRUSeq2Seq(12), torch.randn(n, 12), torch.randn(n, 12)
        elif kind == "cnn":  # 8 x 8 images, 4 classes: the McMahan CNN's layers, small
            model, x, y = McMahanCNN(1, 4, 8), torch.randn(n, 1, 8, 8), torch.randint(0, 4, (n,))
        else:
            model, x, y = MLP(10, 4, (16, 8)), torch.randn(n, 10), torch.randint(0, 4, (n,))
        correction = ([torch.randn_like(p) * 0.01 for p in model.parameters()]
                      if settings.get("correction") else None)
        fits.append(Fit(model, x, y, epochs=1 + i % 3, batch_size=16, learning_rate=0.01,
                        optimizer=optimizer, proximal_mu=settings.get("mu", 0.0) * (i % 2),
                        grad_correction=correction, steps=settings.get("steps", 0),
                        momentum=settings.get("momentum", 0.0),
                        weight_decay=settings.get("wd", 0.0), clip_norm=settings.get("clip", 0.0),
                        device="cpu", seed=100 + i))
    return fits


@pytest.mark.parametrize("kind", ["mlp", "gru", "cnn"])
@pytest.mark.parametrize("optimizer,settings", [
    ("adam", {}), ("adam", {"mu": 0.1, "wd": 0.01}), ("adam", {"clip": 0.1, "mu": 1.0, "steps": 20}),
    ("sgd", {"momentum": 0.9, "wd": 1e-3, "clip": 0.5}), ("sgd", {"correction": True, "steps": 7}),
], ids=["adam", "adam-proximal-decay", "adam-clip-steps", "sgd-momentum-clip", "sgd-correction"])
def test_stacked_training_gives_each_client_its_own_training(kind, optimizer, settings, float64):
    """Each client's weights and mean loss as :func:`tasks.train.train` gives them one by one:
    its own batches, number of steps, proximal weight, correction and clipping, in chunks of
    3 (the clients sorted by steps across chunks)."""
    one_by_one = _fits(kind, optimizer, **settings)
    together = [Fit(**{**vars(f), "model": copy.deepcopy(f.model)}) for f in one_by_one]
    before = [copy.deepcopy(f.model) for f in together]
    alone = [f.alone() for f in one_by_one]
    losses = stacked.train_stacked(together, chunk=3)
    assert losses == pytest.approx(alone, rel=LOSSES) and losses[-1] == 0.0  # the empty client
    for a, b in zip(one_by_one, together):
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert p.dtype == torch.float64
            torch.testing.assert_close(q, p, rtol=0, atol=WEIGHTS)
    for p, s in zip(together[-1].model.parameters(), before[-1].parameters()):
        assert torch.equal(p, s)  # no step for a client without data


def _with_rule(fits: list[Fit], rule: str) -> list[Fit]:
    """The fits with Per-FedAvg's ("meta") or pFedMe's ("moreau") own step, each its own
    personal model."""
    return [Fit(**{**vars(f), "rule": MetaStep(0.05) if rule == "meta" else
                   MoreauStep(_moved(f.model), 15.0, 3, 0.01)}) for f in fits]


def _moved(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` a little away from it (pFedMe's theta starts at its personal model,
    which need not be w)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(0.01)
    return out


@pytest.mark.parametrize("kind", ["mlp", "gru"])
@pytest.mark.parametrize("rule,optimizer,steps", [
    ("meta", "adam", 0), ("meta", "sgd", 8), ("moreau", "sgd", 0), ("moreau", "sgd", 7)])
def test_a_methods_own_step_stacked_gives_each_client_its_own_training(kind, rule, optimizer,
                                                                       steps, float64):
    """Per-FedAvg's meta-step and pFedMe's Moreau-envelope step, stacked (their
    :class:`tasks.train.LocalRule`), give each client the weights, personal model and loss of
    the method's own loop one by one: its own batches (pairs of them, an odd last one), steps
    and seed, in chunks of 3."""
    one_by_one = _with_rule(_fits(kind, optimizer, steps=steps), rule)
    together = [Fit(**{**vars(f), "model": copy.deepcopy(f.model),
                       "rule": copy.deepcopy(f.rule)}) for f in one_by_one]
    alone = [f.alone() for f in one_by_one]
    losses = stacked.train_stacked(together, chunk=3)
    assert losses == pytest.approx(alone, rel=LOSSES) and losses[-1] == 0.0
    for a, b in zip(one_by_one, together):
        models = [(a.model, b.model)]
        if rule == "moreau":
            models.append((a.rule.personal, b.rule.personal))  # type: ignore[union-attr]
        for m, n in models:
            for p, q in zip(m.parameters(), n.parameters()):
                torch.testing.assert_close(q, p, rtol=0, atol=WEIGHTS)
    assert stacked.group_key(together[0]) != stacked.group_key(
        Fit(**{**vars(together[0]), "rule": None}))  # never stacked with plain training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kind", ["mlp", "gru", "cnn"])
def test_stacked_training_on_a_gpu_gives_each_client_its_own_training(kind, monkeypatch):
    """The same on CUDA, TF32 off (with it, a grouped convolution rounds otherwise than one
    client's: docs/performance.md)."""
    one_by_one = [Fit(**{**vars(f), "device": "cuda"}) for f in _fits(kind, "adam", mu=0.1)]
    together = [Fit(**{**vars(f), "model": copy.deepcopy(f.model)}) for f in one_by_one]
    assert all(stacked.call_problem(f) is None for f in together)  # the CNN too, on a GPU
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        alone = [f.alone() for f in one_by_one]
        losses = stacked.train_stacked(together, chunk=3)
    assert losses == pytest.approx(alone, rel=1e-5)
    for a, b in zip(one_by_one, together):
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            torch.testing.assert_close(q, p, rtol=0, atol=1e-4)


def test_a_clients_batches_are_those_of_the_one_by_one_loop():
    fit = _fits("mlp", "adam")[2]  # 64 rows, 3 epochs of 16: 12 steps
    seen: list[torch.Tensor] = []

    def step(xb, yb):
        seen.append(xb)
        return torch.zeros(())

    run_batches(fit.x, fit.y, step, epochs=3, batch_size=16, steps=0, device="cpu", seed=fit.seed)
    idx, sizes = stacked.batch_plan(Fit(**{**vars(fit), "epochs": 3}), 16)
    assert len(seen) == len(idx) == 12 and sizes.tolist() == [16] * 12
    for xb, i in zip(seen, idx):
        assert torch.equal(xb, fit.x[i])
    short = stacked.batch_plan(Fit(**{**vars(fit), "x": fit.x[:37], "epochs": 2}), 20)
    assert short[1].tolist() == [16, 16, 5] * 2 and short[0][2, 5:].eq(0).all()
    # a batch size beyond the data: one batch of all its rows a pass, no wider
    whole = stacked.batch_plan(Fit(**{**vars(fit), "x": fit.x[:10], "batch_size": 10**6}), 10)
    assert whole[0].shape == (fit.epochs, 10) and whole[1].tolist() == [10] * fit.epochs


@pytest.mark.parametrize("kind", ["mlp", "gru", "cnn"])
def test_stacked_tests_give_each_clients_own_scores(kind):
    """:func:`tasks.train.evaluate`'s loss and accuracy or MSE, client by client: rows in
    several batches of ``batch_size``, of different counts (one client without any)."""
    fits = _fits(kind, "adam")
    tests = [Test(f.model, f.x, f.y, batch_size=16, device="cpu") for f in fits]
    alone = [t.alone() for t in tests]
    for got, want in zip(stacked.evaluate_stacked(tests, chunk=3), alone, strict=True):
        assert got.loss == pytest.approx(want.loss, rel=1e-5, abs=1e-12)
        assert got.accuracy == want.accuracy and (got.mse is None) == (want.mse is None)


def test_a_chunk_fits_the_memory_budget(monkeypatch):
    big = Fit(**{**vars(_fits("mlp", "adam")[0]), "model": MLP(4000, 10, (2000, 2000))})
    assert stacked.chunk_for(big, 50) < stacked.CHUNK  # 12M weights x 6 copies: 290 MB each
    assert stacked.chunk_for(_fits("gru", "adam")[0], 700) == stacked.CHUNK
    # the CNN's every layer's outputs count: 28 x 28 images, batches of 100, 600 rows a client
    cnn = Fit(**{**vars(_fits("cnn", "adam")[0]), "model": McMahanCNN(), "batch_size": 100,
                 "x": torch.zeros(600, 1, 28, 28), "y": torch.zeros(600, dtype=torch.long)})
    outputs = 2 * 32 * 28 * 28 + 32 * 14 * 14 + 2 * 64 * 14 * 14 + 2 * 64 * 7 * 7 + 2 * 512 + 10
    assert stacked._outputs_per_row(cnn.model, (1, 28, 28)) == outputs
    floats = 6 * 1_663_370 + 600 * (784 + 1) + 100 * 3 * outputs
    assert stacked.chunk_for(cnn, 600) == stacked.MEMORY_BUDGET // (4 * floats) == 3  # 148 MB
    # on a GPU the budget is an eighth of its memory (here, one of 141 GB): as many as CHUNK
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("P", (), {"total_memory": 141 * 10**9}))
    stacked.memory_budget.cache_clear()
    try:
        assert stacked.memory_budget("cuda") == 141 * 10**9 // 8
        assert stacked.chunk_for(Fit(**{**vars(cnn), "device": "cuda"}), 600) == stacked.CHUNK
    finally:
        stacked.memory_budget.cache_clear()
    # on a machine of 1 GB the budget is an eighth of it: the GRUs are stacked fewer at once
    gru = _fits("gru", "adam")[0]
    per = stacked.MEMORY_BUDGET // stacked.chunk_for(gru, 700, most=10**6)
    stacked.memory_budget.cache_clear()
    monkeypatch.setattr(stacked.psutil, "virtual_memory", lambda: type("M", (), {"total": 2**30}))
    try:
        assert stacked.memory_budget() == 2**27
        assert stacked.chunk_for(gru, 700, most=10**6) == pytest.approx(2**27 // per, rel=0.05)
    finally:
        stacked.memory_budget.cache_clear()


def test_two_chunks_run_side_by_side_on_a_cpu_each_on_half_of_the_threads(monkeypatch):
    """On a CPU of two threads or more, chunks of about one size, an even count of them, at most
    CHUNK clients in flight in all and each chunk within half of the memory budget; two run
    at once, each on one of torch's threads, which are restored after, and the results come
    back in order; a chunk's error is raised, the threads restored too."""
    gru = _fits("gru", "adam")[0]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for n, sizes in ((1, [1]), (3, [2, 1]), (9, [5, 4]), (207, [26] * 7 + [25])):
            parts, side = stacked.chunks([gru] * n, list(range(n)), 700)
            assert [len(p) for p in parts] == sizes and sum(parts, []) == list(range(n))
            assert side == (2 if n > 1 else 1)
        alone = stacked.chunk_for(gru, 700, most=10**6)
        assert stacked.chunk_for(gru, 700, most=10**6, share=2) == alone // 2
        seen = stacked.side_by_side(lambda part: (part, torch.get_num_threads()),
                                    [[0], [1], [2]], 2)
        assert seen == [([0], 1), ([1], 1), ([2], 1)] and torch.get_num_threads() == 2

        def broken(part):
            if part == [1]:
                raise ValueError("chunk 1 failed")
            return part
        with pytest.raises(ValueError, match="chunk 1 failed"):
            stacked.side_by_side(broken, [[0], [1], [2]], 2)
        assert torch.get_num_threads() == 2
        # on a GPU, or with torch on one thread, one chunk after another
        assert stacked.workers("cuda", 207) == 1
        torch.set_num_threads(1)
        assert stacked.chunks([gru] * 9, list(range(9)), 700)[1] == 1
    finally:
        torch.set_num_threads(before)


def test_a_huge_batch_size_or_plan_stays_within_the_data_or_runs_one_by_one():
    fits = _fits("gru", "adam")[:3]
    huge = [Fit(**{**vars(f), "model": copy.deepcopy(f.model), "batch_size": 10**6}) for f in fits]
    alone = [Fit(**{**vars(f), "model": copy.deepcopy(f.model)}) for f in huge]
    assert stacked.train_stacked(huge) == pytest.approx([f.alone() for f in alone], rel=1e-5)
    long = Fit(**{**vars(fits[0]), "steps": 10**7})
    assert "passes the stacked path's memory budget" in stacked.call_problem(long)
    assert stacked.call_problem(fits[0]) is None


def test_what_cannot_be_stacked_says_why():
    assert stacked.stack_problem(MLP(3, 2)) is None and stacked.stack_problem(GRUSeq2Seq(4)) is None
    assert stacked.stack_problem(McMahanCNN()) is None
    # ... but on a CPU the CNN trains faster one by one (docs/performance.md): not stacked there
    cnn = Fit(**{**vars(_fits("cnn", "adam")[0]), "model": McMahanCNN(1, 4, 8)})
    assert "McMahanCNN trains faster one by one on a CPU" in stacked.call_problem(cnn)
    assert stacked.call_problem(_fits("mlp", "adam")[0]) is None
    frozen = MLP(3, 2)
    next(frozen.parameters()).requires_grad_(False)
    assert stacked.stack_problem(frozen) == "some of the model's parameters are frozen"
    assert stacked.stack_problem(torch.nn.BatchNorm1d(3)).startswith("no stacked form")


def _strip(metrics: dict) -> list:
    return [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")}
            for r in metrics["rounds"]]


def _assert_same_runs(off: dict, auto: dict) -> None:
    """Round by round, client by client, the test numbers of two runs (the tolerances above)."""
    for a, b in zip(_strip(off), _strip(auto), strict=True):
        assert a["trained_clients"] == b["trained_clients"]
        for key in a:
            if key.startswith("client_") and isinstance(a[key], dict):
                got = {c: v for c, v in b[key].items()}
                if "accuracy" in key:  # counts of 100 test samples
                    assert {c: round(v * 100) for c, v in got.items()} == \
                        {c: round(v * 100) for c, v in a[key].items()}, key
                else:
                    assert got == pytest.approx(a[key], rel=1e-4), key
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)


@pytest.fixture
def stacked_fits(monkeypatch):
    """How many clients' trainings the run stacked."""
    count = [0]
    inner = stacked.train_stacked

    def counted(fits, chunk=stacked.CHUNK):
        count[0] += len(fits)
        return inner(fits, chunk)
    monkeypatch.setattr(stacked, "train_stacked", counted)
    return count


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fedamp", "scaffold", "sfl",
                                      "panacea", "pfedhn", "per-fedavg", "pfedme"])
def test_a_run_stacked_has_the_numbers_of_one_by_one(strategy, tmp_path, stacked_fits):
    """The real ServerApp and ClientApps on the default task (the MLP), 6 clients, 2 rounds,
    with a scenario's heterogeneous epochs: ``client-batching`` auto and off agree."""
    extra = {"heterogeneous-epochs": True, "local-epochs": 2}
    off, _ = run_local(tmp_path / "off", strategy, n=6, **extra, **{"client-batching": "off"})
    assert stacked_fits[0] == 0
    auto, grid = run_local(tmp_path / "auto", strategy, n=6, **extra)  # auto: the default
    # every client, both rounds (Per-FedAvg: and its one step before each test)
    assert stacked_fits[0] == (24 if strategy == "per-fedavg" else 12) and grid.batching
    _assert_same_runs(off, auto)
    assert not loading._SPARE  # the clients' threads' models are not kept past the run


@pytest.mark.parametrize("strategy", ["fedavg", "sfl", "panacea", "per-fedavg", "pfedme"])
def test_sensors_gru_forecasts_stacked_are_those_of_one_by_one(strategy, tmp_path, stacked_fits):
    """The traffic GRU, on sensors that are members (3 road sensors' windows, 2 rounds)."""
    graph, files = sensor_sites(tmp_path)
    runs = {}
    for mode in ("off", "auto"):
        nodes = [{"data-path": str(files[s]), "client-id": s} for s in SENSORS]
        runs[mode] = run_named(tmp_path / mode, strategy, {
            **SENSOR_CONFIG, "strategy": strategy, "graph-file": str(graph),
            "num-server-rounds": 2, "client-batching": mode}, 3, nodes)
    assert stacked_fits[0] == (12 if strategy == "per-fedavg" else 6)
    _assert_same_runs(runs["off"], runs["auto"])


def test_a_model_without_a_stacked_form_trains_one_by_one_said_once(tmp_path, monkeypatch,
                                                                     caplog, stacked_fits):
    monkeypatch.setattr(stacked, "_FORWARDS", {GRUSeq2Seq: stacked._FORWARDS[GRUSeq2Seq]})
    with caplog.at_level(logging.INFO, logger="flwr"):
        _, grid = run_local(tmp_path, "fedavg", n=4)
    said = [r.getMessage() for r in caplog.records if "client-batching" in r.getMessage()]
    assert said == ["client-batching: a client trains (or is tested) one by one: no stacked "
                    "form of MLP (stacked: GRUSeq2Seq)"]
    assert stacked_fits[0] == 0 and not grid.batching  # round 2 did not try again


def _trainer(fail_on: int | None = None) -> ClientApp:
    """A ClientApp that trains an MLP twice a message (as a guard's side model does), with
    :func:`tasks.train.train` as a method's generic loop calls it, and replies the losses and
    the order it ran in."""
    app, order = ClientApp(), []

    @app.train()
    def fit(msg: Message, context: Context) -> Message:
        node = context.node_id
        order.append(("start", node))
        torch.manual_seed(node)
        model, x, y = MLP(4, 3, (5,)), torch.randn(20 + node, 4), torch.randint(0, 3, (20 + node,))
        first = train(model, x, y, epochs=1, batch_size=8, learning_rate=0.1, seed=node, stackable=True)
        order.append(("between", node))
        second = train(model, x, y, epochs=1, batch_size=8, learning_rate=0.1, seed=node + 1,
                       stackable=True)
        if node == fail_on:
            raise ValueError("this node's own failure")
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "losses":
                                   ConfigRecord({"first": first, "second": second})}),
                       reply_to=msg)
    app.order = order  # type: ignore[attr-defined]
    return app


def _send(grid: InProcessGrid) -> list[Message]:
    with task_identity():
        messages = [Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
                    for node in grid.get_node_ids()]
        return grid.send_and_receive(messages)


def test_the_engine_runs_everything_but_training_in_the_order_of_one_by_one():
    """Threads that take turns: everything outside ``train`` runs client by client in the
    messages' order, a client that trains twice waits twice, the replies come in order, and
    each is the one-by-one reply; a client's own error is its own error reply."""
    apps, replies = {}, {}
    for mode in ("off", "auto"):
        apps[mode] = _trainer(fail_on=3)
        replies[mode] = _send(InProcessGrid({"client-batching": mode}, 4, first_node=1,
                                            client_app=apps[mode]))
    nodes = [1, 2, 3, 4]
    assert apps["auto"].order == [("start", n) for n in nodes] + [("between", n) for n in nodes]
    assert apps["off"].order == [e for n in nodes for e in (("start", n), ("between", n))]
    for off, auto in zip(replies["off"], replies["auto"], strict=True):
        assert off.metadata.reply_to_message_id == auto.metadata.reply_to_message_id
        assert off.has_error() == auto.has_error()
        if off.has_error():
            assert "this node's own failure" in auto.error.reason
            continue
        a, b = off.content.config_records["losses"], auto.content.config_records["losses"]
        assert b["first"] == pytest.approx(a["first"], rel=1e-5)
        assert b["second"] == pytest.approx(a["second"], rel=1e-5)
        for k, v in off.content.array_records["arrays"].to_torch_state_dict().items():
            w = auto.content.array_records["arrays"].to_torch_state_dict()[k]
            torch.testing.assert_close(w, v, rtol=0, atol=1e-4)
    assert [r.has_error() for r in replies["auto"]] == [False, False, True, False]


def test_a_stacked_failure_runs_its_group_one_by_one(monkeypatch, caplog):
    """An error of the stacked training (the models untouched) leaves each client its own
    outcome: the group trains one by one, said in the log."""
    def broken(fits, chunk=stacked.CHUNK):
        raise RuntimeError("out of memory, say")
    off = _send(InProcessGrid({"client-batching": "off"}, 3, first_node=1, client_app=_trainer()))
    monkeypatch.setattr(stacked, "train_stacked", broken)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        replies = _send(InProcessGrid({}, 3, first_node=1, client_app=_trainer()))
    assert not any(r.has_error() for r in replies)
    for a, b in zip(off, replies):
        assert dict(b.content.config_records["losses"]) == dict(a.content.config_records["losses"])
    assert "3 clients' stacked training failed (RuntimeError: out of memory, say); one by one" \
        in caplog.text


def test_a_bad_client_batching_value_is_refused_by_name():
    from fedamp_flwr.config import RunConfig

    with pytest.raises(ValueError, match="client-batching.*sometimes") as err:
        RunConfig.from_run_config({"client-batching": "sometimes"})
    assert '"auto", "off"' in str(err.value) or "auto, off" in str(err.value)
