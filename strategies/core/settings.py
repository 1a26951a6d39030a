"""A method's own settings: its run-config keys, their defaults and their checks, in one place.

Flower's run config is one flat table (``[tool.flwr.app.config]`` of
``pyproject.toml``). Its generic keys (task, rounds, local training, run
management, scenarios) belong to the app (``fedamp_flwr.config.RunConfig``);
every other key belongs to a method, which declares it as a field of its
:class:`Settings` dataclass (``fedamp_alpha_k`` is the key ``fedamp-alpha-k``)
and registers that class with its strategy
(``register_strategy(name, settings=...)``). The app checks every key of every
registered method before any work starts (a bad value gets a
:class:`ConfigError` naming the key, the value and what is allowed), gives
"auto" values their value for the run's task and strategy, and hands the
chosen strategy's factory its settings:

.. code:: python

    @dataclass(frozen=True)
    class DampedSettings(Settings):
        damped_keep: float = 0.5

        def check(self, run: SettingsContext) -> None:
            self.require("damped-keep", 0 <= self.damped_keep <= 1, "a number in [0, 1]")

    @register_strategy("damped-fedavg", settings=DampedSettings)
    def _damped(settings: DampedSettings, run: RunSetup) -> DampedFedAvg:
        return DampedFedAvg(settings.damped_keep, **flower_kwargs(run))

Several strategies may share one settings class (FedAMP and HeurFedAMP), and
a class may extend another (FedProx-FT's settings are FedProx's and
FedAvg-FT's): a key is one field, whoever declares it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

S = TypeVar("S", bound="Settings")


class ConfigError(ValueError):
    """An invalid run-config value (the message names the key, the value and what is allowed)."""


def bad(key: str, value: Any, allowed: str) -> ConfigError:
    """The ConfigError of run-config ``key`` = ``value``: ``allowed`` says what is."""
    return ConfigError(f"run config '{key}' = {value!r} is invalid; allowed: {allowed}")


def key_of(field_name: str) -> str:
    """The run-config key of a field: ``fedamp_alpha_k`` -> ``fedamp-alpha-k``."""
    return field_name.replace("_", "-")


def type_name(annotation: Any) -> str:
    """A field's type as it is written: ``"float | str"`` (from the type itself, or from the
    string a module with ``from __future__ import annotations`` keeps)."""
    if isinstance(annotation, str):
        return annotation
    args = typing.get_args(annotation)
    if args:
        return " | ".join(getattr(a, "__name__", str(a)) for a in args)
    return getattr(annotation, "__name__", str(annotation))


def coerce(key: str, value: Any, annotation: Any, words: tuple[str, ...] = ()) -> Any:
    """``value`` as the field's type (``bool``, ``str``, ``int``, ``float``, ``int | str``,
    ``float | str``), or a ConfigError naming ``key``.

    ``int | str`` and ``float | str`` fields take a number or one of their ``words``
    (e.g. ``"auto"``).
    """
    ann = type_name(annotation)
    if ann == "bool":
        if not isinstance(value, bool):
            raise bad(key, value, "true or false")
        return value
    if ann == "str":
        if not isinstance(value, str):
            raise bad(key, value, "a string")
        return value
    if ann == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad(key, value, "an integer")
        return value
    if ann == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(key, value, "a number")
        return _finite(key, value)
    if ann == "int | str":
        if isinstance(value, str) and value in words:
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(key, value, " or ".join(f'"{w}"' for w in words) + " or an integer")
        allowed = " or ".join(f'"{w}"' for w in words) + " or an integer"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()):
            raise bad(key, value, allowed)
        return int(value)
    if ann != "float | str":
        raise TypeError(f"run config '{key}': no coercion for the field type {ann!r}")
    allowed = " or ".join(f'"{w}"' for w in words) + " or a number"
    if isinstance(value, str):
        if value in words:
            return value
        try:
            return _finite(key, float(value), allowed)
        except ValueError as err:
            if isinstance(err, ConfigError):
                raise
            raise bad(key, value, allowed) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(key, value, allowed)
    return _finite(key, value, allowed)


def _finite(key: str, value: float, allowed: str = "a number") -> float:
    """``value`` as a float, or the ConfigError of ``key`` if it is not finite (no key of
    this app takes an infinity or a NaN: a bound that is not one is a number too large)."""
    try:
        if math.isfinite(value):
            return float(value)
    except OverflowError:  # an integer beyond any float
        pass
    raise bad(key, value, f"{allowed}, finite")


@dataclass(frozen=True)
class SettingsContext:
    """What a method's checks may need to know of the run besides its own keys.

    Attributes
    ----------
    strategy : str
        The strategy the run uses (a class shared by several strategies checks
        what only the chosen one needs).
    dataset : str
        The ``dataset`` key.
    setting : str
        The data setting: the ``partitioning`` of a pool dataset, ``federated``
        for a task whose data defines its clients (fl60, tpt48, npz, members).
    setting_name : str
        The setting in words, for messages: ``mnist/practical``, ``fl60``.
    has_groups : bool
        Whether the setting has groups of same-distribution clients.
    """

    strategy: str
    dataset: str
    setting: str
    setting_name: str
    has_groups: bool


@dataclass(frozen=True)
class Settings:
    """Base class of a method's settings: subclass it as a frozen dataclass with defaults.

    Field types: ``bool``, ``str``, ``int``, ``float``, or ``int | str`` /
    ``float | str`` for keys that take words besides numbers (:attr:`WORDS`;
    ``"auto"`` for the keys in :attr:`AUTO`).
    """

    #: run-config key -> the words it takes besides numbers
    WORDS: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: run-config key -> the value of "auto" where neither the task nor the strategy says
    #: otherwise (see ``fedamp_flwr.config.auto_values``)
    AUTO: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def keys(cls) -> dict[str, dataclasses.Field]:
        """The run-config keys of this class and their fields."""
        return {key_of(f.name): f for f in dataclasses.fields(cls)}

    @classmethod
    def words(cls, key: str) -> tuple[str, ...]:
        """The words ``key`` takes besides numbers (``"auto"`` for :attr:`AUTO` keys)."""
        return tuple(cls.WORDS.get(key, ())) + (("auto",) if key in cls.AUTO else ())

    @classmethod
    def from_values(cls: type[S], values: Mapping[str, Any]) -> S:
        """The settings from run-config values (every key of this class that ``values`` has,
        coerced to its field's type; the others keep their defaults)."""
        hints = typing.get_type_hints(cls)  # types, whether the module's annotations are strings
        out = {}
        for key, f in cls.keys().items():
            if key in values:
                out[f.name] = coerce(key, values[key], hints[f.name], cls.words(key))
        return cls(**out)

    def resolved(self: S, auto: Mapping[str, Any]) -> S:
        """These settings with every key left at "auto" given its value: ``auto``'s, else
        :attr:`AUTO`'s."""
        changes = {}
        for key, f in self.keys().items():
            if getattr(self, f.name) == "auto" and key in self.AUTO:
                changes[f.name] = auto.get(key, self.AUTO[key])
        return dataclasses.replace(self, **changes) if changes else self

    def require(self, key: str, ok: bool, allowed: str) -> None:
        """Raise the ConfigError of ``key`` (with its value) unless ``ok``."""
        if not ok:
            raise bad(key, getattr(self, key.replace("-", "_")), allowed)

    def check(self, run: SettingsContext) -> None:
        """Raise :class:`ConfigError` on the first value out of its range (none by default)."""

    def record(self, run: SettingsContext) -> dict[str, Any]:
        """What ``metrics.json`` records of these settings beside the config (none by default)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The settings by run-config key."""
        return {key: getattr(self, f.name) for key, f in self.keys().items()}


@dataclass(frozen=True)
class NoSettings(Settings):
    """The settings of a method that has no keys of its own."""
