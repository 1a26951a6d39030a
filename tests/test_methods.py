"""Each method's server half on hand-made replies, and the contract between the two halves."""

from __future__ import annotations

import copy

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

import strategies
from fedamp_flwr import client_app
from fedamp_flwr.config import RunConfig
from strategies.core.client import (
    GENERIC_BOUNDS,
    ClientUpdate,
    instruction_problem,
    register_client_update,
    unregister_client_update,
)
from strategies.core.protocol import REFUSED
from strategies.core.settings import coerce as _coerce
from strategies.fedamp_math import fedamp_weights
from strategies.hypernetwork import sample_pairs, server_step

from .helpers import LocalGrid, client_infos, reply, run_local, setup_strategy


def _filled(model, value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in model.state_dict().items()}


def _grid(n: int) -> LocalGrid:
    return LocalGrid(infos=client_infos(n))  # nodes 10.. as in setup_strategy


# ---------------------------------------------------------------------------
# aggregate_train on replies built by hand
# ---------------------------------------------------------------------------
def test_scaffold_averages_models_and_updates_the_control_variate():
    strategy, model = setup_strategy("scaffold", n=2)
    messages = strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(), _grid(2))
    assert all(torch.count_nonzero(torch.from_numpy(a.numpy())) == 0
               for m in messages for a in m.content["control"].values())  # c starts at 0
    params = dict(model.named_parameters())
    delta0 = ArrayRecord({k: torch.full_like(v, 0.4) for k, v in params.items()})
    delta1 = ArrayRecord({k: torch.full_like(v, 0.8) for k, v in params.items()})
    replies = [reply(10, _filled(model, 1.0), {"num-examples": 1}, control_delta=delta0),
               reply(11, _filled(model, 3.0), {"num-examples": 3}, control_delta=delta1)]
    arrays, _ = strategy.aggregate_train(1, replies)
    # x = (1 * 1 + 3 * 3) / 4 (FedAvg, weighted by samples); c = 0 + (0.4 + 0.8) / N, N = 2
    assert all(torch.allclose(torch.from_numpy(a.numpy()), torch.tensor(2.5)) for a in arrays.values())
    assert torch.allclose(strategy.control, torch.full_like(strategy.control, 0.6))


def test_scaffold_leaves_out_a_reply_without_its_control_delta(caplog):
    strategy, model = setup_strategy("scaffold", n=2)
    strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(), _grid(2))
    delta = ArrayRecord({k: torch.ones_like(v) for k, v in model.named_parameters()})
    replies = [reply(10, _filled(model, 1.0), {"num-examples": 1}),
               reply(11, _filled(model, 3.0), {"num-examples": 1}, control_delta=delta)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert "no 'control-delta'" in caplog.text and "client 0" in caplog.text
    assert all(float(a.numpy().max()) == 3.0 for a in arrays.values())
    assert torch.allclose(strategy.control, torch.full_like(strategy.control, 0.5))


def test_pfedme_mixes_the_average_with_the_previous_global_model():
    strategy, model = setup_strategy("pfedme", n=2, **{"pfedme-beta": 2.0})
    strategy.configure_train(1, ArrayRecord(_filled(model, 1.0)), ConfigRecord(), _grid(2))
    replies = [reply(10, _filled(model, 2.0), {"num-examples": 5}),
               reply(11, _filled(model, 4.0), {"num-examples": 5})]
    arrays, _ = strategy.aggregate_train(1, replies)
    # (1 - beta) * 1 + beta * mean(2, 4) = -1 + 2 * 3 = 5
    assert all(torch.allclose(torch.from_numpy(a.numpy()), torch.tensor(5.0)) for a in arrays.values())


def test_panacea_aggregation_is_its_server_steps_on_the_valid_replies():
    strategy, model = setup_strategy("panacea", n=4, **{"panacea-server-steps": 2})
    messages = list(strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(),
                                             _grid(4)))
    assert {m.content["config"]["client-update"] for m in messages} == {"hypernetwork"}
    assert {m.content["config"]["panacea-client-lr"] for m in messages} == {0.1}
    main, s = strategy.main, strategy.settings
    hnet = copy.deepcopy(main.net)
    opt = torch.optim.SGD(hnet.parameters(), lr=float(s.panacea_server_lr),
                          momentum=s.panacea_server_momentum)
    pairs = torch.Generator().set_state(strategy.pair_gen.get_state())
    by_node = {m.metadata.dst_node_id: m for m in messages}
    sent = torch.stack([strategy.layout.flatten(by_node[10 + i].content["arrays"]) for i in range(4)])
    trained = sent + 0.1
    bad = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    replies = [reply(10 + i, strategy.layout.unflatten(trained[i]), {"num-examples": 5})
               for i in (0, 2, 3)] + [reply(11, bad, {"num-examples": 5})]
    strategy.aggregate_train(1, replies)
    rows, p = torch.tensor([0, 2, 3]), strategy.layout.num_params
    for _ in range(2):  # the same two steps by hand, client 1's NaN reply left out
        server_step(hnet, opt, main.prop, rows, trained[rows, :p], main.adj,
                    s.panacea_lambda_d, sample_pairs(main.adj, pairs))
    for (name, a), b in zip(main.net.named_parameters(), hnet.parameters()):
        assert torch.equal(a, b), name


def test_fedamp_stores_each_valid_reply_as_its_clients_model():
    strategy, model = setup_strategy("fedamp", n=3)
    strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(), _grid(3))
    before = strategy.models.clone()
    replies = [reply(12, _filled(model, 2.0), {"num-examples": 5}),
               reply(10, _filled(model, -1.0), {"num-examples": 5}),
               reply(99, _filled(model, 7.0), {"num-examples": 5})]  # an unknown node
    _, metrics = strategy.aggregate_train(1, replies)
    assert torch.equal(strategy.models[0], torch.full_like(before[0], -1.0))
    assert torch.equal(strategy.models[2], torch.full_like(before[2], 2.0))
    assert torch.equal(strategy.models[1], before[1])
    assert strategy.history.rounds[1]["trained_clients"] == [0, 2]


# ---------------------------------------------------------------------------
# The contract between the halves
# ---------------------------------------------------------------------------
def test_keys_of_two_methods_unknown_keys_or_an_unknown_update_are_refused():
    def problem(train=True, **config):
        return instruction_problem(ConfigRecord({k.replace("_", "-"): v for k, v in config.items()}),
                                   train)

    assert problem(client_update="apfl", apfl_alpha=0.5) is None
    assert problem(False, client_update="apfl", apfl_alpha=0.5) is None
    assert problem(local_epochs=1, learning_rate=0.1) is None  # plain local training
    mixed = problem(client_update="apfl", apfl_alpha=0.5, proximal_mu=0.1)
    assert "'apfl'" in mixed and "'proximal-mu' (of 'proximal')" in mixed
    assert "'finetune-epochs' (of 'finetune')" in problem(finetune_epochs=2)
    # a key of the update, but of the other phase; a key nobody owns; a key the update needs
    assert "'finetune-epochs' (of 'finetune')" in problem(client_update="finetune",
                                                             finetune_epochs=2)
    assert problem(False, client_update="finetune", finetune_epochs=2) is None
    assert "'apfl-alfa' (of no method)" in problem(client_update="local", apfl_alfa=1)
    assert "lacks the key(s) ['apfl-alpha']" in problem(client_update="apfl")
    unknown = problem(client_update="fedsgd")
    assert "'client-update' = 'fedsgd'" in unknown and "apfl, fedamp, finetune, hypernetwork" in unknown


@pytest.mark.parametrize("message_type", [MessageType.TRAIN, MessageType.EVALUATE])
def test_the_client_refuses_a_message_it_cannot_carry_out(message_type):
    _, model = setup_strategy("fedavg")
    ctx = LocalGrid({}, 3).contexts[100]
    config = ConfigRecord({"client-update": "per-fedavg", "per-fedavg-alpha": 0.1, "apfl-alpha": 0.5})
    msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
                  message_type=message_type, dst_node_id=100)
    handler = client_app.train if message_type == MessageType.TRAIN else client_app.evaluate
    answer = handler(msg, ctx)
    assert answer.has_error() and answer.error.code == REFUSED
    assert "'apfl-alpha' (of 'apfl')" in answer.error.reason and len(ctx.state.array_records) == 0


_HOSTILE = (10**18, -(10**18), 2**31, -1, 0, 1.5, float("nan"), float("inf"), True, "10", b"\x00")


@pytest.mark.parametrize("key", sorted(GENERIC_BOUNDS) + ["learning-rate", "optimizer"])
def test_each_generic_message_value_out_of_bounds_is_one_refusal_before_any_work(key,
                                                                                 monkeypatch):
    """A hostile server's message: each generic key (local steps and epochs, batch size,
    round, client index, trained rounds, learning rate, optimizer) at values outside what the
    run config allows gets one refusal naming the key, from both handlers, before the node
    reads its data or builds a model (``_job`` is never reached)."""
    _, model = setup_strategy("fedavg")
    low, high = GENERIC_BOUNDS.get(key, (1, 1))

    def no_work(*args, **kwargs):
        raise AssertionError("the node started work on a message it should refuse")

    monkeypatch.setattr(client_app, "_job", no_work)
    refused = 0
    for value in (*_HOSTILE, low - 1, high + 1, "adamw"):
        if key in GENERIC_BOUNDS and not isinstance(value, (bool, str, bytes)) and \
                value == value and abs(value) != float("inf") and float(value).is_integer() \
                and low <= value <= high:
            continue  # allowed
        if key == "learning-rate" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and 0 < value < float("inf"):
            continue
        for message_type, handler in ((MessageType.TRAIN, client_app.train),
                                      (MessageType.EVALUATE, client_app.evaluate)):
            ctx = LocalGrid({}, 3).contexts[100]
            msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                      "config": ConfigRecord({key: value})}),
                          message_type=message_type, dst_node_id=100)
            answer = handler(msg, ctx)
            assert answer.has_error() and answer.error.code == REFUSED, (key, value)
            assert f"message key '{key}' = " in answer.error.reason, answer.error.reason
            assert len(answer.error.reason) < 400 and not ctx.state.array_records
            refused += 1
    assert refused >= 16


def test_a_batch_size_above_the_run_configs_is_checked_against_the_nodes_memory(monkeypatch):
    """The memory a node checked at its start is for the run config's batch size; a message
    asking a larger one (within bounds) is checked again with the rows it will use, and
    refused, naming the key, where they would not fit."""
    from fedamp_flwr import sizes
    from fedamp_flwr.config import ConfigError

    _, model = setup_strategy("fedavg")
    ctx = LocalGrid({}, 3).contexts[100]
    cfg = RunConfig.from_run_config(ctx.run_config)
    size = sizes.model_size(cfg)
    assert size is not None
    monkeypatch.setattr(sizes, "machine_memory", lambda: sizes.client_bytes(cfg, size) + 1)

    def message(batch: int) -> Message:
        config = ConfigRecord({"batch-size": batch, "local-epochs": 1, "client-index": 0})
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
                       message_type=MessageType.TRAIN, dst_node_id=100)

    assert not client_app.train(message(int(cfg.batch_size)), ctx).has_error()
    with pytest.raises(ConfigError, match="'batch-size' = .*this machine has"):
        client_app.train(message(100_000), ctx)


def test_every_methods_own_message_keys_are_held_to_the_run_configs_bounds():
    """Each registered client update's own train keys at a hostile server's extremes: never
    an exception, one problem naming the key wherever the run config would refuse the value
    under that key (the same declaration on both halves), and a key no settings declare
    (Panacea's share to hold out) refuses every value outside its own bounds."""
    from strategies.core.settings import ConfigError

    checked = 0
    for name, update in strategies.CLIENT_UPDATES.items():
        by_message = {update.settings.message_key(k): k for k in update.settings.keys()}
        for key in update.train_keys:
            for value in (10**18, -(10**18), -1, 0.75, float("nan"), float("inf"), "x" * 10_000):
                config = dict(update.settings().message_values("train"))
                config.update({k: False if k.endswith("-run") else 0.0  # hold-out, the watch's
                               for k in update.train_keys if k not in config})
                config.update({"client-update": name, key: value})
                problem = instruction_problem(ConfigRecord(config), train=True)
                if key in by_message:  # what the run config says of the same value
                    try:
                        update.settings.from_values({by_message[key]: value}).check_declared()
                        allowed = True
                    except ConfigError:
                        allowed = False
                elif key.endswith("-run"):  # the watch's flag: true or false only
                    allowed = isinstance(value, bool)
                elif key == "fedamp-pull":  # lambda / alpha_k: any the run config can make
                    allowed = not isinstance(value, str) and 0 <= value < float("inf")
                else:
                    allowed = not isinstance(value, str) and 0 <= value <= 0.5
                assert (problem is None) == allowed, (name, key, value, problem)
                assert problem is None or f"'{key}' = " in problem, problem
                assert problem is None or len(problem) < 600
                checked += 1
    assert checked > 60


def test_the_server_stops_the_run_when_a_client_refuses(tmp_path, monkeypatch):
    # a fleet whose clients run older code that knows no 'fedamp' update
    def old_code(config, train):
        return "unknown client update 'fedamp'" if config.get("client-update") == "fedamp" else None

    monkeypatch.setattr(client_app, "instruction_problem", old_code)
    with pytest.raises(RuntimeError, match=r"round 1: clients refused the message:\n  client 0: "
                                           r"unknown client update 'fedamp'"):
        run_local(tmp_path, "fedamp")


def test_the_server_never_sends_a_message_with_keys_of_two_methods(tmp_path, monkeypatch):
    monkeypatch.setattr(strategies.APFL, "train_keys", lambda self: {"apfl-alpha": 0.5,
                                                                     "proximal-mu": 0.1})
    with pytest.raises(ValueError, match=r"not its own: 'proximal-mu' \(of 'proximal'\)"):
        run_local(tmp_path, "apfl")


def test_registration_refuses_taken_names_and_keys():
    class Other(ClientUpdate):
        name = "apfl"

    with pytest.raises(ValueError, match="already registered"):
        register_client_update(Other)

    class Thief(ClientUpdate):
        name = "thief"
        train_keys = ("pfedme-lambda",)

    with pytest.raises(ValueError, match="owned by client update 'pfedme'"):
        register_client_update(Thief)

    class Generic(ClientUpdate):
        name = "generic"
        train_keys = ("learning-rate",)

    with pytest.raises(ValueError, match="generic key"):
        register_client_update(Generic)
    unregister_client_update("thief")
    unregister_client_update("generic")
    assert "thief" not in strategies.CLIENT_UPDATES
    with pytest.raises(ValueError, match="already registered"):
        strategies.register_strategy("fedavg")(lambda cfg, run: None)


def test_factories_get_the_typed_run_config():
    strategy, _ = setup_strategy("fedprox", **{"fedprox-mu": 0.25})
    assert strategy.flower.proximal_mu == 0.25 and strategy.client_update == "proximal"
    strategy, _ = setup_strategy("heurfedamp", **{"heurfedamp-sigma": 3})
    assert strategy.sigma == 3.0 and strategy.self_weight == 0.1


def test_coercion_raises_on_a_type_it_does_not_know():
    with pytest.raises(TypeError, match="no coercion for the field type 'list'"):
        _coerce("k", [1], "list")
    assert RunConfig.from_run_config({"fedamp-sigma": "2.5"}).settings.fedamp_sigma == 2.5


def test_panacea_stops_with_a_clear_error_when_its_hypernetwork_diverges():
    strategy, model = setup_strategy("panacea", n=4, **{"panacea-server-lr": 1e30})
    messages = list(strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(),
                                             _grid(4)))
    replies = [reply(m.metadata.dst_node_id,
                     {k: v + 0.5 for k, v in m.content["arrays"].to_torch_state_dict().items()},
                     {"num-examples": 5}) for m in messages]
    with pytest.raises(RuntimeError, match="no longer finite .* lower panacea-server-lr"):
        strategy.aggregate_train(1, replies)


def test_the_papers_self_weight_is_one_over_the_clients_of_the_group():
    # 10 clients of the practical setting: 5 groups of 2 consecutive ids -> xi_ii = 1/2;
    # with client 3 out of the round's mix, client 2 is alone in its group -> xi_22 = 1
    strategy, model = setup_strategy("fedamp", n=10, **{"fedamp-self-weight": "paper"})
    strategy._ensure_models(ArrayRecord(model.state_dict()))
    xi = strategy.collaboration(1, torch.arange(10))
    assert torch.allclose(xi.diagonal(), torch.full((10,), 0.5, dtype=torch.float64))
    assert torch.allclose(xi.sum(1), torch.ones(10, dtype=torch.float64))
    rows = torch.tensor([0, 1, 2, 4, 5, 6, 7, 8, 9])
    xi = strategy.collaboration(1, rows)
    assert xi[2, 2] == 1.0 and xi[2].sum() == 1.0 and xi[0, 0] == 0.5
    heur, _ = setup_strategy("heurfedamp", n=10, **{"heurfedamp-self-weight": "paper"})
    assert heur.self_weights(torch.arange(10), None).tolist() == [0.5] * 10


def test_the_papers_self_weight_needs_groups():
    from fedamp_flwr.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=r"'fedamp-self-weight' = 'paper' .* synthetic/dirichlet"):
        RunConfig.from_run_config({"fedamp-self-weight": "paper", "partitioning": "dirichlet"})
    with pytest.raises(ConfigError, match=r"'heurfedamp-self-weight' = 'paper' .* fl60"):
        RunConfig.from_run_config({"strategy": "heurfedamp", "heurfedamp-self-weight": "paper",
                                   "heurfedamp-sigma": 1.0, "dataset": "fl60"})
    assert RunConfig.from_run_config({"fedamp-self-weight": "paper",
                                      "partitioning": "iid"}).groups(4) == [0, 0, 0, 0]
    with pytest.raises(ConfigError, match='"eq6" or "paper" or a number'):
        RunConfig.from_run_config({"fedamp-self-weight": "half"})


def test_fedamp_sends_cloud_models_and_lambda_over_alpha():
    strategy, model = setup_strategy("fedamp")
    init = ArrayRecord(model.state_dict())
    strategy._ensure_models(init)
    gen = torch.Generator().manual_seed(1)
    strategy.models = strategy.models + 0.05 * torch.randn(strategy.models.shape, generator=gen)
    strategy.sigma = 1.0
    strategy.alpha_k = 0.01  # rows stay below 1: a real convex mix with xi_ii > 0
    messages = list(strategy.configure_train(31, init, ConfigRecord(), LocalGrid()))
    alpha = 0.01 * 0.1  # decayed once after 30 rounds
    params = strategy.models[:, : strategy.layout.num_params].double()
    xi, _ = fedamp_weights(params, alpha, 1.0)
    assert (xi.diagonal() > 0).all()
    expected = (xi.float() @ strategy.models)
    by_node = {m.metadata.dst_node_id: m for m in messages}
    for row, cid in enumerate(strategy.client_ids):
        node = next(n for n, i in strategy.tracker.roster.clients.items() if i.client_id == cid)
        msg = by_node[node]
        got = strategy.layout.flatten(msg.content["arrays"])
        assert torch.allclose(got, expected[row], atol=1e-6)
        assert msg.content["config"]["client-update"] == "fedamp"
        assert msg.content["config"]["fedamp-pull"] == pytest.approx(1.0 / alpha)
    assert strategy.history.xi[31][0] == pytest.approx(xi[0].tolist())
