"""The two kinds of strategy of this project, and what the rest of the code imports from here.

* :class:`TrackedStrategy`: put in front of one of Flower's own strategies
  (FedAvg, FedProx, Krum, ...): novel clients and drop-outs are left out,
  invalid replies never reach the aggregation, every evaluation is recorded,
  and every message names its client half.
* :class:`PersonalizedStrategy`: a Message-API ``Strategy`` that keeps one
  model per client on the server and sends each client its own model; FedAMP,
  HeurFedAMP, Panacea and Separate subclass it.

Both hold a :class:`strategies.tracking.Tracker` (``self.tracker``) and say
which client half runs on the clients (:class:`ClientInstructions`). The
pieces they are built from live in modules of their own and are re-exported
here: :mod:`strategies.discovery` (the query round), :mod:`strategies.layout`
(flat model vectors), :mod:`strategies.replies` (reply checks),
:mod:`strategies.history` (the run's records), :mod:`strategies.tracking`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO
from typing import ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from tasks.scenarios import Roles

from .client import LOCAL, instruction_problem
from .discovery import ClientInfo, discover_clients
from .history import RunHistory
from .layout import FlatLayout
from .protocol import ARRAYS, CLIENT_ID, CLIENT_UPDATE, CONFIG, NUM_EXAMPLES, SERVER_ROUND
from .replies import MAX_SQ_NORM, arrays_problem, mean_metrics, reply_problem
from .tracking import Tracker

ROUND = SERVER_ROUND  # the name this module has always exported


class ClientInstructions:
    """What a strategy asks of the clients: which client half runs, with which keys.

    ``client_update`` names the :class:`strategies.client.ClientUpdate` that
    runs on train messages, ``evaluate_update`` the one on evaluate messages
    (None: the same). :meth:`train_keys` and :meth:`evaluate_keys` are the
    method's own config entries, added to every message of that kind.
    """

    client_update: ClassVar[str] = LOCAL
    evaluate_update: ClassVar[str | None] = None

    def train_keys(self) -> dict:
        """The method's own entries of every train config (none by default)."""
        return {}

    def evaluate_keys(self) -> dict:
        """The method's own entries of every evaluate config (none by default)."""
        return {}

    def instruct(self, config: ConfigRecord, train: bool) -> ConfigRecord:
        """Add the client update's name and the method's keys to ``config`` (in place)."""
        if train:
            config.update({CLIENT_UPDATE: self.client_update, **self.train_keys()})
        else:
            config.update({CLIENT_UPDATE: self.evaluate_update or self.client_update,
                           **self.evaluate_keys()})
        return config


def check_instructions(messages: Iterable[Message]) -> None:
    """Raise ValueError if a message's config cannot be carried out by a client.

    The server checks what it sends (see :func:`strategies.client.instruction_problem`),
    so that a wrong message stops the run before any client sees it.
    """
    seen: set[int] = set()
    for m in messages:
        config = m.content.config_records.get(CONFIG)
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        problem = instruction_problem(config)
        if problem is not None:
            raise ValueError(f"{type(m).__name__} to node {m.metadata.dst_node_id}: {problem}")


# ---------------------------------------------------------------------------
# Flower's own strategies, with validation and records
# ---------------------------------------------------------------------------
class Tracked(ClientInstructions):
    """What both kinds of strategy share: a :class:`Tracker` and the client instructions."""

    tracker: Tracker

    def setup_tracking(self, clients: dict[int, ClientInfo], roles: Roles | None = None) -> None:
        """Start tracking a run: the node-to-client map and the scenario roles."""
        self.tracker = Tracker(clients, roles)

    @property
    def history(self) -> RunHistory:
        """The run's records (``self.tracker.history``)."""
        return self.tracker.history


class TrackedStrategy(Tracked):
    """Put in front of a Flower strategy: ``class FedAvg(TrackedStrategy, flwr...FedAvg)``.

    It remembers the model's keys and shapes sent in ``configure_train``,
    leaves novel and dropped-out clients out of the round, names the client
    half in every message, leaves replies that fail
    :func:`strategies.replies.reply_problem` out of the aggregation (with a
    warning naming the client) and records every client's evaluation, all
    through ``self.tracker``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.setup_tracking({})

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Hook: the valid replies, just before the Flower strategy aggregates them."""
        return replies

    def configure_train(self, server_round, arrays, config, grid):  # noqa: D102
        t = self.tracker
        t.shapes = {k: tuple(v.numpy().shape) for k, v in arrays.items()}
        self.instruct(config, train=True)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        check_instructions(messages)
        cid = {m.metadata.dst_node_id: t.client_of_node(m.metadata.dst_node_id) for m in messages}
        kept = set(t.participants(server_round, [c for c in cid.values() if isinstance(c, int)]))
        out = []
        for m in messages:
            c = cid[m.metadata.dst_node_id]
            if c not in kept:
                continue
            content = m.content
            if t.roles.heterogeneous_epochs:  # Flower shares one RecordDict among all messages
                content = RecordDict(dict(content.items()))
                name = next(k for k, v in content.items() if isinstance(v, ConfigRecord))
                content[name] = t.client_config(server_round, c, content[name])
            out.append(Message(content, message_type=m.metadata.message_type,
                               dst_node_id=m.metadata.dst_node_id))
        return out

    def aggregate_train(self, server_round, replies):  # noqa: D102
        good = self.tracker.valid_train_replies(server_round, replies)
        self.tracker.record_train(server_round, good)
        return super().aggregate_train(server_round, self.before_aggregation(server_round, good))

    def configure_evaluate(self, server_round, arrays, config, grid):  # noqa: D102
        self.instruct(config, train=False)
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        check_instructions(messages)
        return messages

    def aggregate_evaluate(self, server_round, replies):  # noqa: D102
        replies = list(replies)
        self.tracker.record_evaluation(server_round, replies)
        return super().aggregate_evaluate(server_round, replies)


# ---------------------------------------------------------------------------
# Personalized strategies
# ---------------------------------------------------------------------------
class PersonalizedStrategy(Tracked, Strategy):
    """A Message-API strategy that keeps one model per client on the server.

    The models are rows of one tensor ``self.models`` (clients x parameters,
    float32, on ``device``), in the order of ``self.client_ids``; all rows
    start as the initial model. In a round, the sampled clients each receive
    the model and config that :meth:`personalize` makes for them, and their
    valid replies replace their rows. In evaluation every client receives its
    own row and tests it on its own test split.

    Parameters
    ----------
    fraction_train : float
        Share of clients sampled for training each round (at least one).
    param_keys : Sequence[str] | None
        State-dict keys of the trainable parameters (the rest are buffers).
    device : str
        Where the server keeps and mixes the models ("cpu", "cuda", ...).
    seed : int
        Seed of the client sampling.
    """

    def __init__(
        self,
        fraction_train: float = 1.0,
        param_keys: Sequence[str] | None = None,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        self.fraction_train = fraction_train
        self.param_keys = list(param_keys) if param_keys is not None else None
        self.device = torch.device(device)
        self.seed = seed
        self.layout: FlatLayout | None = None
        self.models: torch.Tensor | None = None
        self.setup_tracking({})

    def setup_tracking(self, clients: dict[int, ClientInfo], roles: Roles | None = None) -> None:
        """Start tracking a run: the clients (rows of the store, by client id) and the scenario."""
        super().setup_tracking(clients, roles)
        self.client_ids = sorted(i.client_id for i in clients.values())
        self._row = {cid: r for r, cid in enumerate(self.client_ids)}
        self._node_of_row = {self._row[i.client_id]: n for n, i in clients.items()}
        # rows of the clients that train (all but the novel ones)
        self.training_rows = torch.tensor(
            [r for r, c in enumerate(self.client_ids) if c not in self.tracker.roles.novel],
            dtype=torch.long)
        self.layout, self.models = None, None

    # -- hooks for subclasses ------------------------------------------------
    def personalize(
        self, server_round: int, rows: torch.Tensor, config: ConfigRecord
    ) -> tuple[torch.Tensor, ConfigRecord]:
        """Return the models (len(rows) x d) and the config to send to clients ``rows``.

        The default sends each client its own stored model.
        """
        return self.models[rows], config

    def update(self, server_round: int, rows: torch.Tensor, trained: torch.Tensor) -> None:
        """Take the valid trained models (len(rows) x d) of clients ``rows``.

        The default stores them as the clients' personalized models.
        """
        self.models[rows] = trained

    def evaluation_models(self) -> torch.Tensor:
        """The (clients x d) models the clients test, row i for ``client_ids[i]``."""
        return self.models

    def initial_models(self, initial: torch.Tensor) -> torch.Tensor | None:
        """The per-client store at the start: every client holds the initial model."""
        return initial.unsqueeze(0).repeat(len(self.client_ids), 1)

    # -- Strategy API --------------------------------------------------------
    def summary(self) -> None:
        """Log the strategy's settings."""
        log(INFO, "\t├── %s: fraction-train %.2f, server device %s",
            type(self).__name__, self.fraction_train, self.device)

    def _ensure_models(self, arrays: ArrayRecord) -> None:
        """On first use: the flat layout of the model and :meth:`initial_models`."""
        if self.layout is None:
            if not self.client_ids:
                raise RuntimeError("no clients: call setup_tracking(discover_clients(...)) first")
            self.layout = FlatLayout.from_arrays(arrays, self.param_keys)
            self.tracker.shapes = dict(self.layout.shapes)
            self.models = self.initial_models(self.layout.flatten(arrays).to(self.device))

    def _messages(self, rows: Iterable[int], vectors: torch.Tensor,
                  configs: Sequence[ConfigRecord], message_type: str) -> list[Message]:
        messages = [
            Message(RecordDict({ARRAYS: self.layout.unflatten(vec), CONFIG: cfg}),
                    message_type=message_type, dst_node_id=self._node_of_row[int(row)])
            for row, vec, cfg in zip(rows, vectors, configs)
        ]
        check_instructions(messages)
        return messages

    def sample_rows(self, server_round: int) -> torch.Tensor:
        """Rows (clients) that train in ``server_round``: a seeded sample of ``fraction-train``
        of the training clients, less those that drop out (``drop-rate``)."""
        pool = self.training_rows.numpy()
        k = max(1, int(round(self.fraction_train * len(pool))))
        rng = np.random.default_rng([self.seed, server_round])
        sampled = np.sort(rng.choice(pool, size=k, replace=False))
        kept = set(self.tracker.participants(server_round, [self.client_ids[r] for r in sampled]))
        return torch.as_tensor([r for r in sampled if self.client_ids[r] in kept], dtype=torch.long)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send each sampled client the model :meth:`personalize` makes for it."""
        self._ensure_models(arrays)
        rows = self.sample_rows(server_round)
        config[SERVER_ROUND] = server_round
        self.instruct(config, train=True)
        vectors, cfg = self.personalize(server_round, rows, config)
        log(INFO, "configure_train: %d of %d clients", len(rows), len(self.client_ids))
        configs = [self.tracker.client_config(server_round, self.client_ids[int(r)], cfg)
                   for r in rows]
        return self._messages(rows, vectors, configs, MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Store each valid reply's model as its client's model; invalid ones change nothing."""
        t = self.tracker
        good = t.valid_train_replies(server_round, replies)
        t.record_train(server_round, good)
        if good:
            rows = torch.as_tensor([self._row[t.client_of(m)] for m in good])
            vectors = torch.stack(
                [self.layout.flatten(next(iter(m.content.array_records.values()))) for m in good]
            )
            self.update(server_round, rows, vectors.to(self.device))
        return None, mean_metrics([m.content for m in good]) if good else None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Send every client its own personalized model for testing."""
        self._ensure_models(arrays)
        config[SERVER_ROUND] = server_round
        self.instruct(config, train=False)
        n = len(self.client_ids)
        return self._messages(range(n), self.evaluation_models(), [config] * n, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Record every client's test metrics; return their means over clients."""
        means = self.tracker.record_evaluation(server_round, replies)
        return MetricRecord(means) if means else None


__all__ = [
    "CLIENT_ID", "MAX_SQ_NORM", "NUM_EXAMPLES", "ROUND", "ClientInfo", "ClientInstructions",
    "FlatLayout", "PersonalizedStrategy", "RunHistory", "TrackedStrategy", "Tracker",
    "arrays_problem", "check_instructions", "discover_clients", "mean_metrics", "reply_problem",
]
