"""The client half of a method: what a client does with a train or evaluate message.

The ClientApp (``fedamp_flwr/client_app.py``) is a generic worker. It loads
the client's data, builds the received model and hands both, as a
:class:`ClientJob`, to the :class:`ClientUpdate` that the message names under
``client-update``; it never names a method. A method that needs client-side
behaviour defines its ``ClientUpdate`` subclass in its own module, beside its
strategy, and registers it with :func:`register_client_update`:

.. code:: python

    @register_client_update
    class ScaffoldClient(ClientUpdate):
        name = "scaffold"
        train_keys = ()              # config keys it reads (none: it reads a record)

        def train(self, job):        # -> (training loss, extra records of the reply)
            ...

        def evaluate(self, job):     # -> the model to test (default: the received one)
            ...

Each update declares the config keys it owns and needs (``train_keys``,
``evaluate_keys``); :func:`instruction_problem` refuses a message naming an
unknown update, lacking one of its keys, or carrying a key that is neither
generic nor its own (another method's, or nobody's), so that two methods'
instructions are never mixed and a mistyped key is never ignored. The
records a message carries (SCAFFOLD's ``control``) are the method's own
business and are not checked here. A message without ``client-update``
runs :class:`LocalTraining`, plain local training (what Flower's own
strategies expect of a client).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, ClassVar, Generic

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.supercore import log
from torch import nn

from tasks import ClientData
from tasks.dp import DPSGD
from tasks.train import train as train_loop

from .protocol import (
    BATCH_SIZE,
    CLIENT_INDEX,
    CLIENT_UPDATE,
    GENERIC_KEYS,
    LEARNING_RATE,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    OPTIMIZER,
    SERVER_ROUND,
    TRAINED_ROUNDS,
    as_float,
    as_int,
    short_repr,
)
from .settings import (
    EVALUATE,
    MOST_BATCH,
    MOST_CLIENTS,
    MOST_EPOCHS,
    MOST_ROUNDS,
    MOST_STEPS,
    TRAIN,
    ConfigError,
    NoSettings,
    S,
    Settings,
)

LOCAL = "local"
#: the records a client update adds to its train reply (SCAFFOLD's ``control-delta``)
Records = Mapping[str, ArrayRecord | ConfigRecord | MetricRecord]


@dataclass(frozen=True)
class Optim:
    """The optimizer settings of a message (the run config's where the message has none)."""

    batch_size: int
    learning_rate: float
    optimizer: str
    device: torch.device

    @classmethod
    def from_message(cls, config: Mapping[str, Any], run: Mapping[str, Any],
                     device: torch.device) -> Optim:
        """The message's batch size, learning rate and optimizer (checked before:
        :func:`instruction_problem`); ``run``'s (the member's run config,
        ``RunConfig.training``) where the message has none."""
        def value(key: str) -> Any:
            return config.get(key, run[key])
        return cls(batch_size=as_int(value(BATCH_SIZE), BATCH_SIZE),
                   learning_rate=as_float(value(LEARNING_RATE), LEARNING_RATE),
                   optimizer=str(value(OPTIMIZER)), device=device)

    def loop_kwargs(self) -> dict[str, Any]:
        """The generic loops' optimizer arguments (:func:`tasks.train.train`)."""
        return dict(batch_size=self.batch_size, learning_rate=self.learning_rate,
                    optimizer=self.optimizer, device=self.device)


@dataclass
class ClientJob(Generic[S]):
    """Everything a client update gets for one message.

    Attributes
    ----------
    model : nn.Module
        The received model; train updates train it in place and it is sent back.
    data : ClientData
        The client's training and test tensors (never modified).
    targets : torch.Tensor
        The training targets to use: the true labels, or random ones for a
        client that the ``attack-ratio`` scenario makes an attacker.
    content : RecordDict
        The whole message content (a method's own records, e.g. SCAFFOLD's ``control``).
    config : ConfigRecord
        The message's config record.
    state : RecordDict
        The client's ``context.state``, kept across rounds; each method owns its keys.
    server_round, seed, epochs, steps : int
        The round, its seed (mini-batch order), and the local epochs or
        steps (> 0: steps instead of epochs) that the message asks for.
    optim : Optim
        Batch size, learning rate, optimizer and device of local training.
    settings : Settings
        The method's own keys the message carries, typed and checked (the update's
        :attr:`ClientUpdate.settings` class; the keys it does not carry keep their defaults).
    dp_sgd : DPSGD or None
        Per-example DP-SGD, which :meth:`fit` (the generic loop) applies: a method whose
        training is its own loop is refused with ``dp = "dp-sgd"`` (``not_private``).
    """

    model: nn.Module
    data: ClientData
    targets: torch.Tensor
    content: RecordDict
    config: ConfigRecord
    state: RecordDict
    server_round: int
    seed: int
    epochs: int
    steps: int
    optim: Optim
    settings: S = field(default_factory=NoSettings)  # type: ignore[assignment]
    #: per-example DP-SGD for the generic loop (run config dp = "dp-sgd"; train messages)
    dp_sgd: DPSGD | None = None
    #: the run's seed and the client's id in the run (a split of its rows that stays the
    #: same in every round is seeded by them)
    run_seed: int = 0
    client_id: int = 0

    @property
    def trained_before(self) -> int:
        """In how many earlier rounds this client's training was used (train messages)."""
        return as_int(self.config.get(TRAINED_ROUNDS, 0), TRAINED_ROUNDS)

    def saved_state(self, key: str) -> ArrayRecord | None:
        """The client's own state ``key`` from ``context.state``, or None if it has none.

        A client that trained before but has no state has lost it: a restarted
        SuperNode starts with an empty ``context.state``. That is said in a
        warning; the method then starts the state afresh, as in its first round.
        """
        record = self.state.array_records.get(key)
        if record is None and self.trained_before > 0:
            log(WARNING, "Client state '%s' is missing although this client trained in %d "
                "earlier round(s) (a restarted SuperNode starts with an empty context.state): "
                "it starts afresh", key, self.trained_before)
        return record

    def loop_kwargs(self) -> dict:
        """The keyword arguments of the generic loops for this job (epochs or steps,
        batch size, learning rate, optimizer, device, seed)."""
        return dict(epochs=self.epochs, steps=self.steps, **self.optim.loop_kwargs(),
                    seed=self.seed)

    def fit(self, model: nn.Module | None = None, *, seed: int | None = None,
            epochs: int | None = None, steps: int | None = None,
            learning_rate: float | None = None,
            optimizer: str | None = None, proximal_mu: float = 0.0,
            grad_correction: list[torch.Tensor] | None = None,
            targets: torch.Tensor | None = None, **extra) -> float:
        """Train ``model`` (default: the received one) on the local training data.

        The generic loop :func:`tasks.train.train` with this job's settings;
        each argument given replaces the job's (``extra``: the loop's other
        options: momentum, weight_decay, clip_norm). Returns the mean training loss.
        """
        given = dict(seed=seed, epochs=epochs, steps=steps, learning_rate=learning_rate,
                     optimizer=optimizer)
        kwargs = {**self.loop_kwargs(), **{k: v for k, v in given.items() if v is not None}}
        return train_loop(self.model if model is None else model, self.data.x_train,
                          self.targets if targets is None else targets,
                          proximal_mu=proximal_mu, grad_correction=grad_correction,
                          dp_sgd=self.dp_sgd, stackable=True, **kwargs, **extra)


class ClientUpdate(Generic[S]):
    """A method's client half; subclass, set :attr:`name`, override what differs.

    The defaults are plain local training (``train``) and testing the
    received model as it is (``evaluate``).
    """

    name: ClassVar[str] = ""
    #: the method's settings class: the keys it declares ``sent`` are this update's own
    #: (:attr:`train_keys`, :attr:`evaluate_keys`), read back as ``job.settings``
    settings: ClassVar[type[Settings]] = NoSettings
    #: config keys this update reads in train messages (owned: no other update may use them)
    train_keys: ClassVar[tuple[str, ...]] = ()
    #: config keys this update reads in evaluate messages
    evaluate_keys: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "settings" in cls.__dict__:  # the keys come from the declarations
            cls.train_keys = cls.settings.sent_keys(TRAIN)
            cls.evaluate_keys = cls.settings.sent_keys(EVALUATE)

    def message_problem(self, config: ConfigRecord, train: bool) -> str | None:
        """Why a value of a key this update owns but its settings do not declare (one added
        to :attr:`train_keys` by hand) cannot be used, or None; checked with the others by
        :func:`instruction_problem`, before any work."""
        return None

    def train(self, job: ClientJob[S]) -> tuple[float, Records]:
        """Train ``job.model`` in place; return the training loss and extra reply records."""
        return job.fit(), {}

    def evaluate(self, job: ClientJob[S]) -> nn.Module:
        """Return the model the client tests on its test split (default: the received one)."""
        return job.model


@dataclass
class _Registry:
    updates: dict[str, ClientUpdate] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # config key -> update name


_REGISTRY = _Registry()
CLIENT_UPDATES = _REGISTRY.updates


def register_client_update(cls: type[ClientUpdate]) -> type[ClientUpdate]:
    """Class decorator: make ``cls`` the client update called ``cls.name``.

    Raises ValueError (and registers nothing) if the name is taken by another
    class, or a key it owns is a generic key or owned by another update.
    """
    name = cls.name
    if not name:
        raise ValueError(f"{cls.__name__} has no name")
    current = _REGISTRY.updates.get(name)
    if current is not None and type(current) is not cls:
        raise ValueError(f"client update {name!r} is already registered by "
                         f"{type(current).__name__}")
    keys = sorted(set(cls.train_keys) | set(cls.evaluate_keys))
    for key in keys:
        if key in GENERIC_KEYS:
            raise ValueError(f"{cls.__name__}: {key!r} is a generic key and cannot be owned")
        if _REGISTRY.owner.get(key, name) != name:
            raise ValueError(f"{cls.__name__}: key {key!r} is owned by client update "
                             f"{_REGISTRY.owner[key]!r}")
    _REGISTRY.owner.update({key: name for key in keys})
    _REGISTRY.updates[name] = cls()
    return cls


def unregister_client_update(name: str) -> None:
    """Remove the client update ``name`` and its keys (tests and plugins)."""
    _REGISTRY.updates.pop(name, None)
    for key in [k for k, v in _REGISTRY.owner.items() if v == name]:
        del _REGISTRY.owner[key]


def update_name(config: ConfigRecord) -> str:
    """The client update a message names (``local`` when it names none)."""
    return str(config.get(CLIENT_UPDATE, LOCAL))


#: The bounds of the generic keys' integer values in a message, on both halves: the run
#: config's (fedamp_flwr/config.py), local epochs and steps doubled (``heterogeneous-epochs``
#: gives a client up to 2E - 1 of the run's E).
GENERIC_BOUNDS: dict[str, tuple[int, int]] = {
    LOCAL_EPOCHS: (1, 2 * MOST_EPOCHS), LOCAL_STEPS: (0, 2 * MOST_STEPS),
    BATCH_SIZE: (1, MOST_BATCH), SERVER_ROUND: (0, MOST_ROUNDS),
    CLIENT_INDEX: (0, MOST_CLIENTS - 1), TRAINED_ROUNDS: (0, MOST_ROUNDS)}


def generic_problem(config: ConfigRecord) -> str | None:
    """Why a message's generic values cannot be used (None: they can): each count in
    :data:`GENERIC_BOUNDS`, the learning rate a finite number > 0, the optimizer one of the
    run config's. Checked before anything is read or built: a hostile server's local steps
    or batch size are refused with one error reply, not trained on."""
    for key, (low, high) in GENERIC_BOUNDS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return (f"message key '{key}' = {short_repr(value)} is invalid; allowed: an integer in "
                    f"[{low}, {high}]")
    rate = config.get(LEARNING_RATE)
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not math.isfinite(rate) or rate <= 0):
        return (f"message key '{LEARNING_RATE}' = {short_repr(rate)} is invalid; allowed: a "
                "finite number > 0")
    optimizer = config.get(OPTIMIZER)
    if optimizer is not None and optimizer not in ("adam", "sgd"):
        return f"message key '{OPTIMIZER}' = {short_repr(optimizer)} is invalid; allowed: adam, sgd"
    return None


def instruction_problem(config: ConfigRecord, train: bool) -> str | None:
    """Why a train (``train``) or evaluate config cannot be carried out, or None.

    The config must name a registered update (or none: ``local``), carry
    every key that update declares for the phase, with values its settings'
    declarations allow, and no key but those and the generic ones
    (:data:`strategies.core.protocol.GENERIC_KEYS`). A key of another method
    (e.g. ``apfl-alpha`` beside ``proximal-mu``) is named with its owner.
    Used by both halves: the server checks every message it sends, the
    client every message it receives.
    """
    name = update_name(config)
    update = _REGISTRY.updates.get(name)
    if update is None:
        return (f"unknown client update '{CLIENT_UPDATE}' = {name!r}; allowed: "
                f"{', '.join(sorted(_REGISTRY.updates))}")
    phase = "train" if train else "evaluate"
    own = set(update.train_keys if train else update.evaluate_keys)
    missing = sorted(own - set(config.keys()))
    if missing:
        return f"{phase} message for client update {name!r} lacks the key(s) {missing}"
    extra = sorted(set(config.keys()) - own - GENERIC_KEYS)
    if extra:
        owned = ", ".join(f"'{k}' (of {_REGISTRY.owner[k]!r})" if k in _REGISTRY.owner
                          else f"'{k}' (of no method)" for k in extra)
        return (f"the {phase} message names client update {name!r} but carries keys that "
                f"are not its own: {owned}")
    problem = generic_problem(config)
    if problem is not None:
        return f"the {phase} message for client update {name!r} carries a bad value: {problem}"
    try:  # its keys' values, checked as their declarations say (a hostile server's too)
        update.settings.from_message(config)
    except ConfigError as err:
        return f"the {phase} message for client update {name!r} carries a bad value: {err}"
    problem = update.message_problem(config, train)
    if problem is not None:
        return f"the {phase} message for client update {name!r} carries a bad value: {problem}"
    return None


@register_client_update
class LocalTraining(ClientUpdate):
    """Plain local training of the received model; tests it as received.

    FedAvg, Separate, FedMedian, FedTrimmedAvg, Krum and the non-convex
    combination need nothing else of a client.
    """

    name = LOCAL
