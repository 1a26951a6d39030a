"""A method's own settings: each run-config key declared once, with its default, its check,
its doc and the messages that carry it.

Flower's run config is one flat table (``[tool.flwr.app.config]`` of
``pyproject.toml``). Its generic keys (task, rounds, local training, run
management, scenarios) belong to the app (``fedamp_flwr.config.RunConfig``);
every other key belongs to a method, which declares it once, as a field of its
:class:`Settings` dataclass made by :func:`setting` (``damped_keep`` is the key
``damped-keep``), and registers that class with its strategy
(``register_strategy(name, settings=...)``). From that one declaration:

* the app checks every key of every registered method before any work starts
  (a bad value gets a :class:`ConfigError` naming the key, the value and what
  is allowed) and gives "auto" values their value for the run's task;
* the server half adds the keys declared ``sent`` to its train or evaluate
  messages (:meth:`Settings.message_values`), and the client half that names
  the class (``ClientUpdate.settings``) owns those keys and reads them back,
  typed and checked, as ``job.settings``;
* ``tests/test_structure.py`` checks ``pyproject.toml`` and
  docs/configuration.md against the declarations.

.. code:: python

    @dataclass(frozen=True)
    class DampedSettings(Settings):
        damped_keep: float = setting(0.5, "the share of its update a client sends back",
                                     ok=lambda v: 0 <= v <= 1, allowed="a number in [0, 1]",
                                     sent=TRAIN)

    @register_strategy("damped-fedavg", settings=DampedSettings)
    def _damped(settings: DampedSettings, run: RunSetup) -> DampedFedAvg:
        return DampedFedAvg(settings, **flower_kwargs(run))

A check that needs more than the key's own value (another key, the task)
goes in :meth:`Settings.check`. Several strategies may share one settings class
(FedAMP and HeurFedAMP), and a class may extend another (FedProx-FT's settings
are FedProx's and FedAvg-FT's): a key is one field, whoever declares it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from tasks.export import MAX_INPUTS, MAX_OUTPUTS

from .protocol import short_repr

S = TypeVar("S", bound="Settings")

# The upper bounds of the run config's sizes, one place for the app's keys and the methods'
# (docs/configuration.md, "Bounds"): every integer key but ``seed`` has one, and so do the
# timeouts; a value above is refused before any work, and what passes is checked once more
# against the machine's memory (fedamp_flwr/sizes.py).
#: num-server-rounds, checkpoint-every, xi-every, max-failed-rounds, graph-warmup-rounds,
#: fedamp-alpha-decay-every
MOST_ROUNDS = 10**6
#: min-nodes, min-clients-evaluated, graph-k
MOST_CLIENTS = 10**5
#: local-epochs, finetune-epochs
MOST_EPOCHS = 10**4
#: local-steps, panacea-server-steps, pfedme-inner-steps
MOST_STEPS = 10**7
#: batch-size
MOST_BATCH = 10**6
#: test-samples (per client)
MOST_SAMPLES = 10**6
#: checkpoint-keep
MOST_CHECKPOINTS = 10**3
#: panacea-hidden, panacea-embed-dim
MOST_WIDTH = 10**5
#: panacea-gnn-layers, panacea-mlp-layers
MOST_LAYERS = 100
#: round-timeout, node-wait-timeout: 7 days, in seconds
MOST_TIMEOUT = 7 * 24 * 3600.0
#: the product of member-input-shape's dimensions, member-outputs: what a model card may
#: state (tasks.export, which cannot import this module)
MOST_INPUTS, MOST_OUTPUTS = MAX_INPUTS, MAX_OUTPUTS


_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    """A settings class's field types, whether its module's annotations are strings (read once
    per class: every ClientApp message parses the run config)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints

TRAIN, EVALUATE = "train", "evaluate"  # the messages a key may be sent in


class ConfigError(ValueError):
    """An invalid run-config value (the message names the key, the value and what is allowed).

    ``str(err)`` is the message, the one line a person reads; the reason is in fields that
    code and tests read: ``key`` (the key at fault, or None where no one key is), ``value``
    (its value, where at hand), ``allowed`` (what the key allows, where said) and ``kind``:

    * ``"invalid"``: a value the key does not allow (:func:`bad`, the default);
    * ``"unknown"``: a key no one declares (the first of them, in sorted order, where there
      are several);
    * ``"conflict"``: a value another key's value rules out (``key`` is the one refused);
    * ``"missing"``: a key or a file the run needs, left empty or absent.

    It survives pickling with its fields (it crosses process boundaries)."""

    KINDS: ClassVar[tuple[str, ...]] = ("invalid", "unknown", "conflict", "missing")

    def __init__(self, message: str, *, key: str | None = None, value: Any = None,
                 allowed: str | None = None, kind: str = "invalid") -> None:
        super().__init__(message)
        self.key, self.value, self.allowed, self.kind = key, value, allowed, kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (_config_error, (type(self), str(self), self.key, self.value, self.allowed,
                                self.kind), self.__dict__ or None)


def _config_error(cls: type[ConfigError], message: str, key: str | None, value: Any,
                  allowed: str | None, kind: str) -> ConfigError:
    """A ConfigError again from its pickle (:meth:`ConfigError.__reduce__`)."""
    return cls(message, key=key, value=value, allowed=allowed, kind=kind)


class RunCannotGoOn(RuntimeError):
    """The run cannot go on, for a reason its message says in full (e.g. a hypernetwork whose
    parameters are no longer finite): the ServerApp stops it with that one line."""


def bad(key: str, value: Any, allowed: str, kind: str = "invalid") -> ConfigError:
    """The ConfigError of run-config ``key`` = ``value``: ``allowed`` says what is; ``kind``
    is "invalid" unless another key rules the value out ("conflict") or the key must be set
    ("missing"): the message is the same."""
    return ConfigError(f"run config '{key}' = {value!r} is invalid; allowed: {allowed}",
                       key=key, value=value, allowed=allowed, kind=kind)


def integer_in(low: int, high: int, why: str = "") -> dict[str, Any]:
    """The ``ok`` and ``allowed`` of a :func:`setting` that takes an integer in [low, high]:
    ``setting(30, doc, **integer_in(1, MOST_ROUNDS))``; ``why`` is added to the words."""
    return {"ok": lambda v: low <= v <= high, "allowed": integer_words(low, high, why)}


def one_of(*choices: str) -> dict[str, Any]:
    """The ``ok`` and ``allowed`` of a :func:`setting` that takes one of ``choices``."""
    return {"ok": lambda v: v in choices, "allowed": ", ".join(choices)}


def integer_words(low: int, high: int, why: str = "") -> str:
    """What an integer key in [low, high] allows, in words: ``an integer >= 1, at most 100``."""
    return f"an integer >= {low}, at most {high}" + (f" ({why})" if why else "")


def key_of(field_name: str) -> str:
    """The run-config key of a field: ``fedamp_alpha_k`` -> ``fedamp-alpha-k``."""
    return field_name.replace("_", "-")


_KEYS: dict[type, dict[str, dataclasses.Field]] = {}


def field_keys(cls: type) -> dict[str, dataclasses.Field]:
    """A dataclass's run-config keys and fields, read once per class (a ClientApp's every
    message asks: :meth:`Settings.keys`, ``RunConfig.generic_fields``); shared: not to be
    changed by the caller."""
    keys = _KEYS.get(cls)
    if keys is None:
        keys = _KEYS[cls] = {key_of(f.name): f for f in dataclasses.fields(cls)}
    return keys


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
    """``value`` as the field's type (``bool``, ``str``, ``int``, ``float``, ``bool | str``,
    ``int | str``, ``float | str``), or a ConfigError naming ``key``.

    ``bool | str``, ``int | str`` and ``float | str`` fields take a bool or a number, or one
    of their ``words`` (e.g. ``"auto"``).
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
    if ann == "bool | str":
        if isinstance(value, bool) or (isinstance(value, str) and value in words):
            return value
        raise bad(key, value, " or ".join(f'"{w}"' for w in words) + " or true or false")
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


def check_value(key: str, f: dataclasses.Field, value: Any, words: tuple[str, ...] = ()
                ) -> None:
    """Raise the ConfigError of ``key`` = ``value`` unless its declaration (``f``, made by
    :func:`setting`) allows it; a word the key takes besides numbers (``words``) is allowed."""
    ok = f.metadata.get("ok")
    if ok is not None and not (isinstance(value, str) and value in words) and not ok(value):
        raise bad(key, value, f.metadata["allowed"])


def setting(default: Any, doc: str, *, ok: Callable[[Any], bool] | None = None,
            allowed: str = "", sent: str | Iterable[str] = (),
            message_key: str | None = None) -> Any:
    """Declare a method's run-config key (a field of a :class:`Settings` class).

    ``default``: its value when the run config does not set it (also the value
    of ``pyproject.toml``'s table); ``doc``: one line for the configuration
    reference; ``ok``: whether a value is allowed (never asked of the words
    the key takes besides numbers, such as "auto"), ``allowed`` saying what is
    in the error; ``sent``: ``TRAIN`` and/or ``EVALUATE``, the messages that
    carry the key to the client half, under ``message_key`` (default: the
    run-config key; FedProx's ``proximal-mu`` is the key Flower's FedProx sends).
    """
    if ok is not None and not allowed:
        raise ValueError(f"setting {doc!r}: a check needs the words that say what is allowed")
    phases = (sent,) if isinstance(sent, str) else tuple(sent)
    if not set(phases) <= {TRAIN, EVALUATE}:
        raise ValueError(f"setting {doc!r}: sent = {phases}; allowed: {TRAIN!r}, {EVALUATE!r}")
    return dataclasses.field(default=default, metadata={
        "doc": doc, "ok": ok, "allowed": allowed, "sent": phases, "message_key": message_key})


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
    data_setting : str
        The data setting: the ``partitioning`` of a pool dataset, ``federated``
        for a task whose data defines its clients (fl60, tpt48, npz, members).
    data_label : str
        The setting in words, for messages: ``mnist/practical``, ``fl60``.
    has_groups : bool
        Whether the setting has groups of same-distribution clients.
    graph : str
        The ``graph`` key: where the client graph comes from.
    policy : bool
        Whether the run has a collaboration policy (``collaboration-policy``).
    """

    strategy: str
    dataset: str
    data_setting: str
    data_label: str
    has_groups: bool
    graph: str = "task"
    policy: bool = False


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
    #: what :meth:`server_floats` counts, in words (the memory check's message)
    SERVER_HOLDS: ClassVar[str] = "the round's replies and a model per client"

    @classmethod
    def keys(cls) -> dict[str, dataclasses.Field]:
        """The run-config keys of this class and their fields (a copy: a class's are read
        once, since every message's settings ask for them, a key at a time)."""
        return dict(field_keys(cls))

    @classmethod
    def words(cls, key: str) -> tuple[str, ...]:
        """The words ``key`` takes besides numbers (``"auto"`` for :attr:`AUTO` keys)."""
        return tuple(cls.WORDS.get(key, ())) + (("auto",) if key in cls.AUTO else ())

    @classmethod
    def from_values(cls: type[S], values: Mapping[str, Any]) -> S:
        """The settings from run-config values (every key of this class that ``values`` has,
        coerced to its field's type; the others keep their defaults)."""
        hints = _type_hints(cls)
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

    @classmethod
    def message_key(cls, key: str) -> str:
        """The key under which run-config ``key`` travels in messages."""
        return field_keys(cls)[key].metadata.get("message_key") or key

    @classmethod
    def sent_keys(cls, phase: str) -> tuple[str, ...]:
        """The message keys of the ``phase`` (``TRAIN`` or ``EVALUATE``) messages."""
        return tuple(cls.message_key(key) for key, f in cls.keys().items()
                     if phase in f.metadata.get("sent", ()))

    def message_values(self, phase: str) -> dict[str, Any]:
        """The entries these settings add to every ``phase`` message (by message key)."""
        return {self.message_key(key): getattr(self, f.name) for key, f in self.keys().items()
                if phase in f.metadata.get("sent", ())}

    @classmethod
    def from_message(cls: type[S], config: Mapping[str, Any]) -> S:
        """The settings a client half reads from a message's config (its sent keys, coerced
        and checked as the run config's are; the others keep their defaults)."""
        by_message = {cls.message_key(key): key for key in cls.keys()}
        try:
            own = cls.from_values({by_message[k]: v for k, v in config.items() if k in by_message})
            own.check_declared()
        except ConfigError as err:  # said of the message's key (a node has no run config key)
            sent = next((m for m, k in by_message.items() if k == err.key), err.key)
            if err.key is None or err.key not in by_message.values():
                raise
            raise ConfigError(
                f"message key '{sent}' = {short_repr(err.value)} is invalid"
                + (f" (run config '{err.key}')" if sent != err.key else "")
                + (f"; allowed: {err.allowed}" if err.allowed else ""),
                key=sent, value=err.value, allowed=err.allowed, kind=err.kind) from None
        return own

    def check_declared(self) -> None:
        """Raise the ConfigError of the first key whose value its declaration does not allow."""
        for key, f in self.keys().items():
            check_value(key, f, getattr(self, f.name), self.words(key))

    def validate(self, run: SettingsContext) -> None:
        """Every check: each key's declared one, then :meth:`check`'s of the keys together."""
        self.check_declared()
        self.check(run)

    def check(self, run: SettingsContext) -> None:
        """Raise :class:`ConfigError` on a value that only the keys together, or the run, rule
        out (none by default; each key's own range is its declaration's ``ok``)."""

    def server_floats(self, num_params: int, num_clients: int) -> int:
        """About how many numbers the server of this method holds at once, with
        ``num_clients`` clients of a model of ``num_params`` parameters (the memory check
        of ``fedamp_flwr/sizes.py``). By default the round's replies and a model per client
        (a personalized method's store; Flower's strategies hold the replies), and a few
        models; a method that holds more says so."""
        return (2 * num_clients + 3) * num_params

    def record(self, run: SettingsContext) -> dict[str, Any]:
        """What ``metrics.json`` records of these settings beside the config (none by default)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The settings by run-config key."""
        return {key: getattr(self, f.name) for key, f in self.keys().items()}


@dataclass(frozen=True)
class NoSettings(Settings):
    """The settings of a method that has no keys of its own."""
