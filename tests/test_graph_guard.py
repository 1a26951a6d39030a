"""The guard of an inferred graph (``strategies/graph_guard.py``): it goes on only if it beats
no graph on the clients' held-out training rows.

Unit: the arms, each round's means and the choice worked by hand; a client's reply record and
the share it holds out checked as an attacker would send them; the centered similarity. Client
half: the losses it replies are those of the two models on the rows it holds out, and it trains
on the rest only. App: a task whose inferred graph is wrong by construction ends on the
no-graph path, chosen on held-out rows, recorded in the log, metrics.json and the checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from strategies.core.client import ClientJob, Optim
from strategies.core.protocol import GRAPH_USED
from strategies.graph_guard import (
    GRAPH,
    HOLD_OUT,
    HOLD_OUT_RUN,
    NONE,
    OTHER,
    SIDE,
    SIDE_CONFIG,
    VALIDATION,
    choose,
    falls_behind,
    guard_arms,
    held_out_error,
    hold_out_share,
    read_validation,
    round_means,
    validation_record,
)
from strategies.panacea import HypernetworkClient, PanaceaSettings
from tasks import ClientData
from tasks.graphs import cosine_knn_graph
from tasks.loading import held_rows
from tasks.train import evaluate
from tasks.train import train as train_loop

from .helpers import member_sites, needs_data, run_local, run_named


def test_the_arms_swap_each_round_worked_by_hand():
    rows = torch.tensor([0, 1, 2, 5])
    assert guard_arms(rows, 3).tolist() == [1, 0, 1, 0]
    assert guard_arms(rows, 4).tolist() == [0, 1, 0, 1]  # each client trains both in turn


def test_a_rounds_means_worked_by_hand():
    arms = torch.tensor([0, 1, 0])
    losses = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64)
    # [loss of the model trained, of the other]: arm 0 trains the graph's, arm 1 no graph's
    two = round_means(arms[:2], losses[:2])  # two clients: nothing left out
    assert two["clients"] == 2
    assert two[GRAPH] == pytest.approx((1 + 4) / 2) and two[NONE] == pytest.approx((2 + 3) / 2)
    # three: the lowest and the highest left out (one at each end, at least, from three)
    means = round_means(arms, losses)
    assert means["clients"] == 3 and means[GRAPH] == 4.0 and means[NONE] == 3.0
    assert math.isnan(round_means(arms[:0], losses[:0])[GRAPH])
    # five clients, one liar (0 for the graph, 1e300 for no graph): it moves neither mean
    # past an honest client's; two replies of 1e308 never make a mean infinite
    five = torch.tensor([[0.3, 0.2], [0.2, 0.3], [0.4, 0.1], [0.0, 1e300], [0.3, 0.3]],
                        dtype=torch.float64)
    lied5 = round_means(torch.zeros(5, dtype=torch.long), five)
    assert lied5[GRAPH] == pytest.approx(0.8 / 3) and lied5[NONE] == pytest.approx(0.8 / 3)
    huge = torch.full((2, 2), 1e308, dtype=torch.float64)
    assert math.isfinite(round_means(torch.zeros(2, dtype=torch.long), huge)[GRAPH])
    # ten clients: the lowest and the highest of each are left out; one that lies about
    # its errors (0 for the graph, 1e9 for no graph) moves neither mean
    errors = torch.tensor([[0.1 * i, 0.2] for i in range(10)], dtype=torch.float64)
    honest = round_means(torch.zeros(10, dtype=torch.long), errors)
    assert honest[GRAPH] == pytest.approx(sum(0.1 * i for i in range(1, 9)) / 8)
    assert honest[NONE] == pytest.approx(0.2)
    lying = errors.clone()
    lying[3] = torch.tensor([0.0, 1e9])
    lied = round_means(torch.zeros(10, dtype=torch.long), lying)
    assert lied[NONE] == pytest.approx(0.2)
    # sorted: 0, 0 (the lie), 0.1, 0.2, 0.4 ... 0.9; kept: 0 ... 0.8 less 0.3: 3.3 / 8
    assert lied[GRAPH] == pytest.approx(3.3 / 8)


def _round(graph: float, none: float, clients: int = 4) -> dict:
    return {"round": 1, "clients": clients, GRAPH: graph, NONE: none}


def test_the_graph_goes_on_only_if_it_wins_by_the_margin():
    assert choose([_round(0.79, 1.0)]) == GRAPH
    assert choose([_round(0.81, 1.0)]) == NONE  # a win too small for Panacea's settings
    assert choose([_round(0.94, 1.0)], margin=0.05) == GRAPH
    assert choose([_round(1.0, 1.0)]) == NONE
    assert choose([_round(2.0, 1.0)]) == NONE
    # the last two rounds with replies decide; a round nobody answered is skipped
    # ratios: (0.5 + 1.0) / 2 = 0.75
    assert choose([_round(9.0, 1.0), _round(0.5, 1.0), _round(1.0, 1.0),
                   _round(math.nan, math.nan, 0)]) == GRAPH
    assert choose([_round(0.5, 1.0), _round(1.5, 1.0)]) == NONE  # 1.0: a zig-zag, no win
    # both errors fall tenfold from one round to the next: the ratios count alike,
    # (0.6 + 1.0) / 2 = 0.8, where the means would say (0.6 + 0.1) / (1 + 0.1) = 0.64
    assert choose([_round(0.6, 1.0), _round(0.1, 0.1)]) == NONE
    assert choose([_round(0.0, 0.0)]) == NONE  # both perfect: a tie
    assert choose([_round(0.1, 0.0)]) == NONE and choose([_round(0.0, 0.1)]) == GRAPH
    assert choose([]) == NONE and choose([_round(math.nan, math.nan, 0)]) == NONE


def test_the_graph_falls_behind_when_it_is_worse_over_the_last_two_watch_rounds():
    assert not falls_behind([])
    # one watch round never decides (the no-graph path was the run until then)
    assert not falls_behind([_round(1.1, 1.0)]) and not falls_behind([_round(0.1, 0.0)])
    assert falls_behind([_round(1.1, 1.0), _round(1.0, 1.0)])  # 2.1 against 2.0
    assert not falls_behind([_round(0.9, 1.0), _round(1.1, 1.0)])  # 2.0 against 2.0: a tie
    assert not falls_behind([_round(0.0, 0.0), _round(0.0, 0.0)])  # both perfect: a tie
    assert falls_behind([_round(0.1, 0.0), _round(0.0, 0.0)])
    # the means are summed, not their ratios: 0.01 / 0.005 is no reason to go back where the
    # other round is 0.4 against 0.5 (0.41 against 0.505); an older round does not count
    assert not falls_behind([_round(0.01, 0.005), _round(0.4, 0.5)])
    assert falls_behind([_round(0.1, 1.0), _round(0.8, 1.0), _round(1.3, 1.0)])  # 2.1 > 2
    assert not falls_behind([_round(2.0, 1.0), _round(0.8, 1.0), _round(1.1, 1.0)])
    # a round nobody answered is skipped
    assert falls_behind([_round(1.5, 1.0), _round(math.nan, math.nan, 0), _round(0.8, 1.0)])


@pytest.mark.parametrize("record, words", [
    (None, "no ArrayRecord 'panacea-validation'"),
    (ArrayRecord({"x": torch.zeros(2)}), "expected \\['error'\\]"),
    (ArrayRecord({"error": torch.zeros(3)}), "two finite errors"),
    (ArrayRecord({"error": torch.tensor([1.0, float("nan")])}), "two finite errors"),
    (ArrayRecord({"error": torch.tensor([1.0, float("inf")])}), "two finite errors"),
    (ArrayRecord({"error": torch.tensor([-1.0, 1.0])}), "two finite errors"),
    (ArrayRecord({"error": torch.zeros(2), "more": torch.zeros(1)}), "expected \\['error'\\]"),
])
def test_a_hostile_validation_record_is_refused(record, words):
    losses, problem = read_validation(record)
    assert losses is None and problem is not None
    assert __import__("re").search(words, problem)


def test_a_validation_record_reads_back():
    errors, problem = read_validation(validation_record(0.5, 0.25))
    assert problem is None and errors is not None and errors.tolist() == [0.5, 0.25]
    assert held_out_error(0.7, 0.75) == 0.25 and held_out_error(0.02, None) == 0.02


@pytest.mark.parametrize("value", [True, "0.2", 0.6, -0.1, float("nan"), None])
def test_a_client_refuses_to_hold_out_what_a_server_should_not_ask(value):
    with pytest.raises(ValueError, match="'panacea-hold-out' = .* is invalid; allowed: a "
                                         "number in \\[0, 0.5\\]"):
        hold_out_share(value)


def test_the_shares_a_client_accepts():
    assert hold_out_share(0) == 0.0 and hold_out_share(0.2) == 0.2 and hold_out_share(0.5) == 0.5


def test_centered_similarity_takes_out_the_direction_every_client_shares():
    # every update points mostly along the first axis; they differ in the second: 0 and 2
    # point down, 1 and 3 up
    updates = np.array([[3.0, -1.0], [3.0, 1.0], [3.0, -2.0], [2.0, 3.0]])
    # raw cosines of client 1: with 0 (9 - 1) / 10 = 0.800, with 3 9 / sqrt(130) = 0.789: the
    # shared first axis makes 1 choose 0
    raw = cosine_knn_graph(updates, 1)
    assert {tuple(e) for e in np.argwhere(np.triu(raw, 1))} == {(0, 1), (0, 2), (1, 3)}
    # less the mean [2.75, 0.25]: 1 -> [0.25, 0.75], 0 -> [0.25, -1.25], 3 -> [-0.75, 2.75];
    # cosines of 1: with 0 -0.868, with 3 0.832: the ups and the downs
    centered = cosine_knn_graph(updates, 1, similarity="centered")
    assert {tuple(e) for e in np.argwhere(np.triu(centered, 1))} == {(0, 2), (1, 3)}
    # the centered graph does not change when every client's update moves by one vector
    assert np.array_equal(cosine_knn_graph(updates + [40.0, -7.0], 1, similarity="centered"),
                          centered)
    # a client that never trained stays out, and is left out of the mean
    with_idle = np.vstack([updates, np.zeros(2)])
    assert np.array_equal(cosine_knn_graph(with_idle, 1, similarity="centered")[:4, :4],
                          centered)
    assert cosine_knn_graph(with_idle, 1, similarity="centered")[4].sum() == 0
    with pytest.raises(ValueError, match="similarity 'dot' is unknown; allowed: cosine, centered"):
        cosine_knn_graph(updates, 1, similarity="dot")


def _settings() -> PanaceaSettings:
    return dataclasses.replace(
        PanaceaSettings(), panacea_client_lr=0.1, panacea_client_momentum=0.0,
        panacea_client_weight_decay=0.0, panacea_client_clip=0.0)


def _job(model: nn.Module, data: ClientData, config: dict, content: RecordDict) -> ClientJob:
    return ClientJob(model=model, data=data, targets=data.y_train, content=content,
                     config=ConfigRecord(config), state=RecordDict(), server_round=3, seed=11,
                     epochs=0, steps=6, optim=Optim(4, 0.1, "sgd", torch.device("cpu")),
                     settings=_settings(), run_seed=7, client_id=2)


SIDE_KEYS = {"panacea-client-lr": 0.05, "panacea-client-momentum": 0.0,
             "panacea-client-weight-decay": 0.0, "panacea-client-clip": 0.0, "local-steps": 4,
             "local-epochs": 1, "batch-size": 5}


def _trained(model: nn.Module, x, y, **kwargs) -> nn.Module:
    out = copy.deepcopy(model)
    train_loop(out, x, y, optimizer="sgd", seed=11, epochs=kwargs.pop("epochs", 0), **kwargs)
    return out


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(),
                                                 b.state_dict().values(), strict=True))


def test_the_client_tests_both_side_models_on_its_held_rows_and_trains_each_as_told(caplog):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=gen), torch.randint(0, 2, (40,), generator=gen)
    data = ClientData(x, y, torch.randn(9, 3, generator=gen), torch.randint(0, 2, (9,)))
    model, side, other = nn.Linear(3, 2), nn.Linear(3, 2), nn.Linear(3, 2)
    received = copy.deepcopy(model)
    content = RecordDict({SIDE: ArrayRecord(side.state_dict()), SIDE_CONFIG: ConfigRecord(
        SIDE_KEYS), OTHER: ArrayRecord(other.state_dict())})
    with caplog.at_level(logging.INFO):
        _, records = HypernetworkClient().train(_job(model, data, {HOLD_OUT: 0.25}, content))
    held, rest = held_rows(40, 0.25, 7, 2, HOLD_OUT)
    # the member's own log says what it did for the guard and what it sent
    errors = records[VALIDATION].to_torch_state_dict()["error"].tolist()
    assert any("this node also trained a side model on 30 of its 40 training rows (10 held "
               f"out, the same every round); on the held-out rows the side model it trained "
               f"errs {errors[0]:.4g}, the other {errors[1]:.4g} (sent)" in r.getMessage()
               for r in caplog.records)
    assert len(held) == 10 and len(rest) == 30 and not set(held.tolist()) & set(rest.tolist())
    # before training, both side models' errors (1 - accuracy) on the held-out rows
    got = records[VALIDATION].to_torch_state_dict()["error"].tolist()
    assert got == pytest.approx([1 - evaluate(m, x[held], y[held]).accuracy for m in (side, other)])
    # the side model trained as its config says, on the rows less the held-out ones
    trained_side = nn.Linear(3, 2)
    trained_side.load_state_dict(records[SIDE].to_torch_state_dict())
    assert _same(trained_side, _trained(side, x[rest], y[rest], steps=4, batch_size=5,
                                        learning_rate=0.05))
    # the run's model trained as without a guard: every row, the message's own keys
    assert _same(model, _trained(received, x, y, steps=6, batch_size=4, learning_rate=0.1))
    # the same rows every round: the split depends on the run's seed and the client only
    assert torch.equal(held_rows(40, 0.25, 7, 2, HOLD_OUT)[0], held)


def test_in_the_watch_the_runs_model_too_trains_without_the_held_out_rows():
    """A watch round (the graph took over): the run's model trains on the rows less the
    held-out ones too, so that the two models compared there have never seen them."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 3, generator=gen), torch.randint(0, 2, (40,), generator=gen)
    data = ClientData(x, y, x[:4], y[:4])
    model, side = nn.Linear(3, 2), nn.Linear(3, 2)
    received = copy.deepcopy(model)
    content = RecordDict({SIDE: ArrayRecord(side.state_dict()),
                          SIDE_CONFIG: ConfigRecord(SIDE_KEYS),
                          OTHER: ArrayRecord(model.state_dict())})
    HypernetworkClient().train(_job(model, data, {HOLD_OUT: 0.25, HOLD_OUT_RUN: True}, content))
    _, rest = held_rows(40, 0.25, 7, 2, HOLD_OUT)
    assert _same(model, _trained(received, x[rest], y[rest], steps=6, batch_size=4, learning_rate=0.1))
    assert not _same(model, _trained(received, x, y, steps=6, batch_size=4, learning_rate=0.1))


def test_a_client_refuses_a_side_model_it_cannot_train_as_told():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 3, generator=gen), torch.randint(0, 2, (20,), generator=gen)
    data = ClientData(x, y, x[:3], y[:3])
    model = nn.Linear(3, 2)
    expected = _trained(model, x, y, steps=6, batch_size=4, learning_rate=0.1)
    _, records = HypernetworkClient().train(_job(model, data, {HOLD_OUT: 0.0}, RecordDict()))
    assert records == {} and _same(model, expected)
    side = ArrayRecord(model.state_dict())
    for share, content, words in (
            (0.0, {SIDE: side, SIDE_CONFIG: ConfigRecord(SIDE_KEYS)}, "a share > 0"),
            (0.2, {SIDE: side}, "comes with its config"),
            (0.2, {}, "a share > 0"),
            (0.2, {OTHER: side, SIDE_CONFIG: ConfigRecord(SIDE_KEYS)}, "only with a side"),
            (0.2, {SIDE: side, SIDE_CONFIG: ConfigRecord({**SIDE_KEYS, "apfl-alpha": 0.5})},
             "not its own: 'apfl-alpha'"),
            (0.2, {SIDE: side, SIDE_CONFIG: ConfigRecord({**SIDE_KEYS,
                                                          "panacea-client-lr": -1.0})},
             "bad value")):
        with pytest.raises(ValueError, match=words):
            HypernetworkClient().train(_job(model, data, {HOLD_OUT: share}, RecordDict(content)))


@pytest.mark.slow
def test_a_wrong_inferred_graph_ends_on_the_no_graph_path_as_pfedhn_ran(tmp_path, caplog):
    # TPT-48 with graph-k = 47: every state chooses every other, and the GCN pools all 48
    # climates: the inferred graph is wrong by construction (as good as a random one)
    common = {"dataset": "tpt48", "data-dir": str(needs_data("tpt48")), "tpt48-split": "time",
              "num-server-rounds": 5, "seed": 3}
    guarded = run_named(tmp_path, "guarded", {
        **common, "strategy": "panacea", "graph": "inferred", "graph-k": 47,
        "graph-warmup-rounds": 1, "graph-guard-rounds": 3}, 48)
    note, graph = guarded["graph_guard"], guarded["inferred_graph"]
    assert graph["against_truth"]["precision"] < 0.1 and len(graph["edges"]) == 47 * 48 // 2
    assert note["chosen"] == NONE and note["round"] == 4 and note["held_out_share"] == 0.2
    assert [r["round"] for r in note["rounds"]] == [2, 3, 4]
    assert all(r["clients"] == 48 for r in note["rounds"])
    last = note["rounds"][-1]
    ratios = [r[GRAPH] / r[NONE] for r in note["rounds"][-2:]]
    assert not sum(ratios) / 2 < 0.8  # the rule, on the numbers recorded
    assert last[NONE] < 0.05 < note["rounds"][0][NONE]  # on held-out rows both learned
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("did not beat no graph by more than 20% on the clients' held-out rows: the run "
               "goes on as pFedHN" in m for m in said)
    # the run trained as pFedHN from round 1: its numbers are a pFedHN run's, to the last digit
    plain = run_named(tmp_path, "plain", {**common, "strategy": "pfedhn"}, 48)
    assert [r["mean_mse"] for r in guarded["rounds"]] == [r["mean_mse"] for r in plain["rounds"]]


@pytest.mark.slow
def test_each_member_sees_its_own_edges_by_name_in_its_log_and_card(tmp_path, caplog):
    n = 4
    members_config, nodes = member_sites(tmp_path / "sites", "synthetic", n)
    for node in nodes:
        node["model-dir"] = str(tmp_path / "cards" / node["client-id"])
    with caplog.at_level(logging.INFO):
        metrics = run_named(tmp_path, "members", {
            **members_config, "strategy": "panacea", "graph": "inferred", "graph-k": 1,
            "graph-warmup-rounds": 1, "graph-guard-rounds": 1, "num-server-rounds": 3,
            "local-epochs": 1}, n, nodes)
    names = metrics["client_names"]
    edges = {(names[u], names[v]) for u, v in metrics["inferred_graph"]["edges"]}
    used = ("used by the run" if metrics["graph_guard"]["chosen"] == GRAPH
            else "not used: it did not beat no graph on the clients' held-out rows")
    said = [r.getMessage() for r in caplog.records]
    for name in names:
        mine = sorted({v for u, v in edges if u == name} | {u for u, v in edges if v == name})
        card = json.loads((tmp_path / "cards" / name / "members" / f"{name}.json").read_text())
        assert card["inferred_graph"] == {"edges": mine, "used": used}, name
        assert mine and all(other in names for other in mine)  # names, never client ids
    assert sum("This node's edges in the run's inferred client graph:" in m for m in said) == n


@pytest.mark.parametrize("edges, used", [
    (["../x"], "used by the run"), (["a"] * 2, "used by the run"),
    ([f"m{i}" for i in range(201)], "used by the run"), (["a"], 3), (["a"], "x" * 121),
    (["a"], "line\nbreak")])
def test_a_hostile_servers_edges_are_left_off_the_card(tmp_path, caplog, edges, used):
    from flwr.app import Context

    import tasks
    from fedamp_flwr.config import RunConfig
    from fedamp_flwr.member.keeping import keep_tested_model
    from strategies.core.protocol import (
        GRAPH_EDGES,
        MODEL_KEPT,
        SAVE_MODEL,
        SAVE_TOKEN,
        SERVER_ROUND,
    )

    cfg = RunConfig.from_run_config({})
    dc = cfg.data_config(2)
    context = Context(run_id=1, node_id=5, node_config={"model-dir": str(tmp_path / "mine")},
                      state=RecordDict(), run_config={})
    config = ConfigRecord({SAVE_MODEL: "run", SAVE_TOKEN: "t", SERVER_ROUND: 2,
                           GRAPH_EDGES: edges, GRAPH_USED: used})
    with caplog.at_level(logging.ERROR):
        _, said = keep_tested_model(context, cfg, dc, config, tasks.build_model(dc), 0, "site-a",
                                    {"accuracy": 0.5, "loss": 1.0})
    assert said == {MODEL_KEPT: 1}  # the model is kept all the same
    card = json.loads((tmp_path / "mine" / "run" / "site-a.json").read_text())
    assert "inferred_graph" not in card and "left off the model's card" in caplog.text


@pytest.mark.parametrize("behind", [False, True], ids=["kept", "switched-back"])
def test_a_graph_that_wins_takes_over_the_run_at_the_runs_own_settings(tmp_path, monkeypatch,
                                                                       behind):
    """The graph wins the guard (round 2) and takes over at the run's own settings, watched:
    in rounds 3 and 4 every client also trains pFedHN's model on the side (at pFedHN's keys)
    and both train on the rows less the held-out ones. Where the graph falls behind after
    round 3, the run is pFedHN again from round 4: its keys, no side."""
    import strategies.panacea_guard as panacea_guard
    from fedamp_flwr.config import RunConfig
    from fedamp_flwr.server.results import checkpoint_files

    monkeypatch.setattr(panacea_guard, "choose", lambda rounds: GRAPH)  # the rule: tested above
    monkeypatch.setattr(panacea_guard, "falls_behind", lambda rounds: behind)
    overrides = {"graph": "inferred", "graph-k": 2, "graph-warmup-rounds": 1,
                 "graph-guard-rounds": 1, "num-server-rounds": 4, "local-steps": 3,
                 "panacea-server-lr": 0.01}
    metrics, grid = run_local(tmp_path, "panacea", 6, **overrides)
    assert metrics["graph_guard"]["chosen"] == GRAPH and metrics["graph_guard"]["round"] == 2
    watched = [r for r in metrics["graph_guard"]["rounds"] if r.get("stage") == "watch"]
    assert [r["round"] for r in watched] == ([3] if behind else [3, 4])
    assert all(r["clients"] == 6 for r in watched)
    assert (metrics["graph_guard"].get("switched_back", {}).get("round") == 3) == behind
    graph_until = 3 if behind else 4
    cfg = RunConfig.from_run_config({"strategy": "panacea", **overrides})
    assert cfg.no_graph is not None
    run_lr, path_lr = (float(c.settings.panacea_client_lr) for c in (cfg, cfg.no_graph))
    assert run_lr != path_lr
    for msg in grid.sent:
        if msg.metadata.message_type != "train":
            continue
        c, rnd = msg.content.config_records["config"], msg.content.config_records["config"][
            "server-round"]
        # pFedHN's keys while the guard runs, the side model with the run's own; then the
        # graph's, with pFedHN's on the side (the watch); pFedHN's again once switched back
        graph = 3 <= rnd <= graph_until
        assert c["panacea-client-lr"] == (run_lr if graph else path_lr)
        assert (SIDE in msg.content.array_records) == (rnd <= graph_until)
        assert (OTHER in msg.content.array_records) == (2 <= rnd <= graph_until)
        assert c[HOLD_OUT] == (0.2 if rnd <= graph_until else 0.0)
        assert c[HOLD_OUT_RUN] is graph
        if rnd <= graph_until:
            assert msg.content.config_records[SIDE_CONFIG]["panacea-client-lr"] == (
                path_lr if graph else run_lr)
    # each member is told with its final model (its card, its log) whether the graph was used
    told = {m.content.config_records["config"].get(GRAPH_USED) for m in grid.sent
            if m.metadata.message_type == "evaluate" and GRAPH_USED in
            m.content.config_records["config"]}
    assert told == {"used until round 3, then dropped: pFedHN did better on the clients' "
                    "held-out rows" if behind else "used by the run, watched against pFedHN "
                    "on the clients' held-out rows"}
    state = torch.load(checkpoint_files(tmp_path / "panacea")[0], weights_only=True)["strategy"]
    if behind:  # GH is pFedHN's again: no graph
        assert "inferred_adjacency" not in state and state["graph_guard"]["decided"] == NONE
        assert state["graph_guard"]["arms"] == {} and state["graph_guard"]["stage"] == ""
        return
    # from round 3 GH is the graph's: the checkpoint holds the inferred graph it is built on
    used = state["inferred_adjacency"].numpy()
    assert {(int(u), int(v)) for u, v in np.argwhere(np.triu(used, 1))} == {
        tuple(e) for e in metrics["inferred_graph"]["edges"]}
    assert state["graph_guard"]["decided"] == GRAPH and state["graph_guard"]["stage"] == "watch"
    assert list(state["graph_guard"]["arms"]) == [NONE]  # pFedHN's, watched


@pytest.mark.parametrize("override, words", [
    ({"graph-guard-rounds": 8}, "'graph-guard-rounds' = 8 is invalid; allowed: fewer than "
                                "num-server-rounds (10) less graph-warmup-rounds (2), or 0"),
    ({"graph-guard-rounds": -1}, "'graph-guard-rounds' = -1 is invalid"),
    ({"dp": "update", "dp-noise-multiplier": 1.0},
     "'graph-guard-rounds' = 4 is invalid; allowed: 0 with dp = 'update'"),
    ({"graph-similarity": "dot"}, "'graph-similarity' = 'dot' is invalid; allowed: cosine, "
                                  "centered"),
])
def test_the_guards_keys_get_one_clear_line_before_any_round(override, words):
    from fedamp_flwr.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_run_config({"strategy": "panacea", "graph": "inferred",
                                   "num-server-rounds": 10, **override})
    # the guard's checks are its own: no guard, no refusal
    if "graph-similarity" not in override:
        RunConfig.from_run_config({"strategy": "panacea", "graph": "inferred",
                                   "num-server-rounds": 10, **override,
                                   "graph-guard-rounds": 0})


def test_an_arm_whose_generated_models_overflow_is_not_finite():
    from strategies.graph_guard import Arm
    from strategies.hypernetwork import GraphHyperNetwork

    net = GraphHyperNetwork(4, [3, 2], embed_dim=4, gnn_layers=0, hidden=4, mlp_layers=1,
                            generator=False)
    arm = Arm(net, torch.optim.SGD(net.parameters(), lr=0.1), None, False)
    assert arm.finite()
    with torch.no_grad():  # every parameter finite, the models it generates not
        for p in net.parameters():
            p.fill_(1e30)
    assert all(bool(torch.isfinite(p).all()) for p in net.parameters()) and not arm.finite()


@pytest.mark.parametrize("where", ["guard", "watch", "both"])
def test_a_hypernetwork_that_diverges_never_stops_a_guarded_run(tmp_path, monkeypatch, where):
    """The graph's hypernetwork diverges: in the guard, the side is dropped and the run goes
    on as the pFedHN it has been; in the watch, the run goes back to the pFedHN path it
    watched. Either way the run ends, its rounds all evaluated."""
    import strategies.panacea_guard as panacea_guard
    from strategies.graph_guard import Arm

    monkeypatch.setattr(panacea_guard, "choose", lambda rounds: GRAPH)
    monkeypatch.setattr(panacea_guard, "falls_behind", lambda rounds: False)
    calls = {"graph": 0}
    # the graph's hypernetwork is checked after the warm-up's round 1, after the guard's
    # round 2, then (the run's, in the watch) after round 3: it diverges at the 1st or 3rd
    limit = 1 if where == "guard" else 3
    real = Arm.finite

    def finite(self):
        if self.adj is None:  # "both": the pFedHN path watched diverges in the same round
            return real(self) and not (where == "both" and calls["graph"] >= limit)
        calls["graph"] += 1
        return calls["graph"] < limit

    monkeypatch.setattr(Arm, "finite", finite)
    overrides = {"graph": "inferred", "graph-k": 2, "graph-warmup-rounds": 1,
                 "graph-guard-rounds": 1, "num-server-rounds": 4, "local-steps": 3,
                 "panacea-server-lr": 0.01}
    if where == "both":  # nothing intact to go on with: the run stops, round 2 its last
        from strategies.core.settings import RunCannotGoOn

        with pytest.raises(RunCannotGoOn, match="round 3: the inferred graph's hypernetwork "
                                                 "and the pFedHN path watched beside it both"):
            run_local(tmp_path, "panacea", 6, **overrides)
        metrics = json.loads((tmp_path / "panacea" / "metrics.json").read_text())
        assert not metrics["finished"] and metrics["completed_rounds"] == 2
        return
    metrics, _ = run_local(tmp_path, "panacea", 6, **overrides)
    guard = metrics["graph_guard"]
    assert metrics["finished"] and [r["round"] for r in metrics["rounds"]] == [1, 2, 3, 4]
    assert all(r.get("mean_accuracy") is not None for r in metrics["rounds"])
    if where == "guard":
        assert guard["chosen"] == NONE and guard["round"] == 1
        assert guard["diverged"] == [GRAPH] and "switched_back" not in guard
    else:
        assert guard["chosen"] == GRAPH and guard["switched_back"]["round"] == 3
        assert "diverged" in guard["switched_back"]["why"]
