"""A method's settings class works whether its module's annotations are strings or types.

This module has no ``from __future__ import annotations``: its fields' types are the type
objects themselves, which the settings read with ``typing.get_type_hints``.
"""

from dataclasses import dataclass

import pytest

from strategies.core.settings import ConfigError, Settings, bad


@dataclass(frozen=True)
class PlainSettings(Settings):
    """Settings declared without postponed annotations."""

    AUTO = {"plain-steps": 3}

    plain_rate: float = 0.5
    plain_steps: int | str = "auto"
    plain_on: bool = False

    def check(self, run) -> None:
        if not self.plain_rate > 0:
            raise bad("plain-rate", self.plain_rate, "a number > 0")


def test_settings_with_type_objects_coerce_check_and_resolve():
    s = PlainSettings.from_values({"plain-rate": 2, "plain-steps": 4.0, "plain-on": True})
    assert s == PlainSettings(2.0, 4, True) and isinstance(s.plain_rate, float)
    assert PlainSettings.from_values({}).resolved({}).plain_steps == 3
    with pytest.raises(ConfigError, match="'plain-steps' = 'x' is invalid"):
        PlainSettings.from_values({"plain-steps": "x"})
    with pytest.raises(ConfigError, match="'plain-rate' = -1.0 is invalid; allowed: a number > 0"):
        PlainSettings.from_values({"plain-rate": -1}).check(None)
