"""A member's node under CPU-bound neighbours keeps one ClientApp process per message.

The drill of ``experiments/node_load.py`` at a small scale: a loopback fleet of three
members' SuperNodes beside CPU-bound neighbours (as many busy processes as the machine has
cores: every core taken; the drill's own default is twice that), a FedAMP run, then the run
resumed while a fourth member joins. Every SuperNode must have started exactly one
``flwr-clientapp`` process per message it received (none relaunched for a task whose
claim ran out: Flower's pile-up, docs/federation.md "A node under load"), kept at most
two at once, and logged no token failure.
"""

from __future__ import annotations

import os
import re

import pytest

from experiments import node_load

from .helpers import FLWR

pytestmark = [pytest.mark.flower,
              pytest.mark.skipif(FLWR is None, reason="flwr CLI not on PATH (activate the venv)")]


def test_a_member_node_under_load_through_a_resumed_run_with_a_joining_member(tmp_path,
                                                                              capsys):
    load = os.cpu_count() or 1
    assert node_load.main(["--load", str(load), "--rounds", "1", "--repeats", "1",
                           "--most", "2", "--run-timeout", "600", "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert "first run: finished" in said and "resumed run: finished" in said, said
    lines = re.findall(r"^(site-\w): (\d+) messages received, (\d+) ClientApp processes "
                       r"started, at most (\d+) at once; (\d+) token failure", said, re.M)
    assert [name for name, *_ in lines] == ["site-a", "site-b", "site-c", "site-d"], said
    for name, received, started, most, failed in lines:
        # one query and one train and one evaluate message per round; site-d joins the
        # resumed run (a query, then round 2)
        assert int(received) == (6 if name != "site-d" else 3), said
        assert int(started) == int(received) and int(most) <= 2 and failed == "0", said
