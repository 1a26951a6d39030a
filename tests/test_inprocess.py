"""The in-process engine calls the apps as Flower does: mods and lifespan run."""

from __future__ import annotations

from collections import Counter

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from fedamp_flwr import client_app, server_app
from fedamp_flwr.tools.inprocess import run_inprocess


def test_the_inprocess_engine_runs_mods_and_lifespans(tmp_path):
    calls: Counter[str] = Counter()

    def counting_mod(msg: Message, context: Context, call_next) -> Message:
        calls[f"mod:{msg.metadata.message_type}"] += 1
        return call_next(msg, context)

    clients = ClientApp(mods=[counting_mod])
    clients.query()(client_app.query)
    clients.train()(client_app.train)
    clients.evaluate()(client_app.evaluate)

    @clients.lifespan()
    def client_lifespan(context: Context):
        calls["client lifespan"] += 1
        yield

    server = ServerApp()
    server.main()(server_app.main)

    @server.lifespan()
    def server_lifespan(context: Context):
        calls["server enter"] += 1
        yield
        calls["server exit"] += 1

    n, rounds = 3, 2
    run_inprocess({"num-server-rounds": rounds, "local-epochs": 1, "min-nodes": n,
                   "results-dir": str(tmp_path), "run-name": "mods", "server-device": "cpu"},
                  n, server_app=server, client_app=clients)
    assert calls == Counter({"mod:query": n, "mod:train": n * rounds, "mod:evaluate": n * rounds,
                             "client lifespan": n * (1 + 2 * rounds),
                             "server enter": 1, "server exit": 1})
    assert (tmp_path / "mods" / "metrics.json").is_file()


def test_each_round_line_says_the_rounds_left_and_when_they_end(tmp_path, caplog):
    import logging
    import re

    from fedamp_flwr.server.rounds import eta

    # 4 rounds in 100 s: 8 more at that pace take 200 s
    assert re.fullmatch(r"; 8 rounds left, about 0:03:20 \(ETA \d\d:\d\d, at this run's mean "
                        r"pace\)", eta([20.0, 30.0, 25.0, 25.0], 8))
    assert eta([7300.0], 1).startswith("; 1 round left, about 2:01:40 ")
    assert eta([2.0, 2.0, 1.0], 0) == ""
    # a round the machine slept in (over 10 x the median, 25 s) is left out: 3 rounds of 25 s,
    # said on its own line only
    said = "this round left out: over 10 times the others, the machine paused?)"
    paused = eta([20.0, 30.0, 25.0, 7500.0], 8)
    assert paused.startswith("; 8 rounds left, about 0:03:20 ") and paused.endswith(said)
    later = eta([20.0, 7500.0, 30.0, 25.0], 8)
    assert later.startswith("; 8 rounds left, about 0:03:20 ") and said not in later
    assert eta([20.0, 240.0, 30.0], 1).startswith("; 1 round left, about 0:01:36 ")  # kept
    # of two rounds, the longer is left out where it is over 10 x the other
    assert eta([10.5, 7522.7], 98).startswith("; 98 rounds left, about 0:17:09 ")
    assert eta([10.0, 90.0], 2).startswith("; 2 rounds left, about 0:01:40 ")
    with caplog.at_level(logging.INFO):
        run_inprocess({"strategy": "fedavg", "num-server-rounds": 3, "local-epochs": 1,
                       "results-dir": str(tmp_path), "run-name": "r", "server-device": "cpu"}, 2)
    lines = [r.getMessage() for r in caplog.records if " done in " in r.getMessage()]
    assert "2 rounds left, about" in lines[0] and "1 round left" in lines[1]
    assert lines[2].startswith("Round 3 done in ") and "left" not in lines[2]
