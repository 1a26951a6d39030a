"""The fault drill's verdict (experiments/fleet_drill.py): what it calls untrue in a run's
records. The drill itself runs a 12-SuperNode fleet (docs/survival.md); the tests run the
same faults on 4 (tests/test_faults_e2e.py)."""

from __future__ import annotations

from dataclasses import replace

from experiments.fleet_drill import problems
from strategies.core.records import RunFile


def _run(**round3) -> RunFile:
    return RunFile.from_dict({"finished": True, "rounds": [
        {"round": 1, "trained_clients": [0, 1, 2, 3]},
        {"round": 2, "trained_clients": [0, 2], "absent_clients": {
            "1": "node unavailable: Error: Node Unavailable", "3": "node unavailable: the "
            "SuperLink took no message for node 9: the node has left the federation"},
         "absent_evaluation": {"1": "node not connected", "3": "node not connected"}},
        {"round": 3, "trained_clients": [0, 1, 2], **round3}]})


def test_true_reasons_pass_and_every_untruth_is_named():
    assert problems(_run(), {1, 3}, {1}, 600, "") == []
    said = problems(_run(absent_evaluation={"3": "no reply within the round timeout (600 s)",
                                            "2": "node unavailable"}),
                    {1, 3}, {1, 3}, 600, "Round 2: evaluate reply from node 1 dropped: that "
                    "node was not sent a evaluate message this round")
    assert said == [
        "round 3: client 3 in absent_evaluation: 'no reply within the round timeout (600 s)' "
        "(rounds are shorter than the timeout, 600 s)",
        "round 3: client 2 in absent_evaluation but never killed: node unavailable",
        "client 3 was restarted and did not train in the last round",
        "the log dropped a reply it could not match to a message"]
    assert problems(replace(_run(), finished=False), {1, 3}, set(), 600, "") == \
        ["the run did not finish"]
