"""The two kinds of strategy of this project, and what the rest of the code imports from here.

* :class:`FlowerStrategy`: holds one of Flower's own strategies (FedAvg, FedProx,
  Krum, ...), whose aggregation is Flower's: novel clients and drop-outs are left out,
  invalid replies never reach the aggregation, every evaluation is recorded,
  and every message names its client half.
* :class:`PersonalizedStrategy`: a Message-API ``Strategy`` that keeps one
  model per client on the server and sends each client its own model; FedAMP,
  HeurFedAMP, Panacea and Separate subclass it.

Both hold a :class:`strategies.core.tracking.Tracker` (``self.tracker``) and
say which client half runs on the clients (:class:`ClientInstructions`). The
pieces they are built from live in modules of their own:
:mod:`strategies.core.roster` (who the clients are),
:mod:`strategies.core.layout` (flat model vectors),
:mod:`strategies.core.replies` (reply checks), :mod:`strategies.core.history`
(the run's records), :mod:`strategies.core.tracking`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO, WARNING
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp import strategy as flwr_strategy
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from tasks.scenarios import Roles

from .client import LOCAL, instruction_problem
from .client_state import CLIENT_STATE, declaration
from .history import RunHistory, client_order
from .layout import FlatLayout, dtypes_of, with_dtypes
from .policy import ApartPolicy
from .protocol import ARRAYS, CLIENT_UPDATE, CONFIG, SERVER_ROUND
from .replies import array_spec, mean_metrics
from .roster import ClientInfo
from .settings import EVALUATE as EVALUATE_MESSAGE
from .settings import TRAIN as TRAIN_MESSAGE
from .settings import NoSettings, Settings
from .tracking import EVALUATE, TRAIN, RunTracking, Tracker


class RoundStrategy(Protocol):
    """What the app's round loop (``fedamp_flwr.server.rounds``) asks of a strategy: Flower's
    Message-API steps, its summary, the tracker of its clients and its records. Every
    strategy of this module is one (:class:`FlowerStrategy`, :class:`PersonalRounds`)."""

    @property
    def tracker(self) -> Tracker: ...
    @property
    def history(self) -> RunHistory: ...
    def summary(self) -> None: ...
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]: ...
    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]: ...
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]: ...
    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None: ...


class ClientInstructions:
    """What a strategy asks of the clients: which client half runs, with which keys.

    ``client_update`` names the :class:`strategies.core.client.ClientUpdate` that
    runs on train messages, ``evaluate_update`` the one on evaluate messages
    (None: the same). :meth:`train_keys` and :meth:`evaluate_keys` are the
    method's own config entries, added to every message of that kind.
    """

    client_update: ClassVar[str] = LOCAL
    evaluate_update: ClassVar[str | None] = None
    #: names of records a train reply carries beside ``arrays`` and ``metrics``
    #: (SCAFFOLD's ``control-delta``), checked by :meth:`method_reply_problem`
    reply_records: ClassVar[tuple[str, ...]] = ()

    #: the method's settings (set by a strategy that has keys of its own): the keys they
    #: declare ``sent`` go into the messages
    settings: Settings = NoSettings()

    #: the method's own entries of every train config beside its settings' (Panacea's: the
    #: share of its rows a client holds out, 0 but in its graph guard's rounds)
    train_defaults: ClassVar[dict[str, Any]] = {}

    def train_keys(self) -> dict:
        """The method's own entries of every train config: its settings' keys sent in train
        messages, and its :attr:`train_defaults`."""
        return {**self.settings.message_values(TRAIN_MESSAGE), **self.train_defaults}

    def evaluate_keys(self) -> dict:
        """The method's own entries of every evaluate config."""
        return self.settings.message_values(EVALUATE_MESSAGE)

    def method_reply_problem(self, msg: Message) -> str | None:
        """What is wrong with the method's own records of a train reply (``reply_records``)."""
        return None

    def instruct(self, config: ConfigRecord, train: bool) -> ConfigRecord:
        """A copy of ``config`` with the client update's name and the method's keys.

        A copy: Flower hands the same config record to every round, and no key
        of one round may linger in the next.
        """
        if train:
            extra = {CLIENT_UPDATE: self.client_update, **self.train_keys()}
        else:
            extra = {CLIENT_UPDATE: self.evaluate_update or self.client_update,
                     **self.evaluate_keys()}
        return ConfigRecord({**dict(config), **extra})


def check_instructions(messages: Iterable[Message]) -> None:
    """Raise ValueError if a message's config cannot be carried out by a client.

    The server checks what it sends (see :func:`strategies.core.client.instruction_problem`),
    so that a wrong message stops the run before any client sees it.
    """
    seen: set[int] = set()
    for m in messages:
        config = m.content.config_records.get(CONFIG)
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        problem = instruction_problem(config, train=m.metadata.message_type == MessageType.TRAIN)
        if problem is not None:
            raise ValueError(f"{m.metadata.message_type} message to node "
                             f"{m.metadata.dst_node_id}: {problem}")


# ---------------------------------------------------------------------------
# Flower's own strategies, with validation and records
# ---------------------------------------------------------------------------
class StrategyBase(ClientInstructions):
    """What both kinds of strategy share: a :class:`Tracker`, the client instructions,
    the update-norm check and the checkpoint state.

    The update-norm bound (``max_update_ratio``, ``update_noise``) and the rest of what
    the run gives it to track come in a :class:`RunTracking` (:meth:`track`).
    """

    tracker: Tracker
    max_update_ratio: float = 100.0
    update_noise: float = 0.0
    apart: ApartPolicy | None = None  # the run's collaboration policy (RunTracking.apart)
    #: the kind of state the method keeps, which a warm start carries from run to run
    #: (:meth:`warm_start`); ``STATE_KIND_OWN``: only a run of the same method has it
    STATE_KIND: ClassVar[str] = "one global model"
    STATE_KIND_OWN: ClassVar[bool] = False

    def track(self, tracking: RunTracking) -> None:
        """Track the run ``tracking`` describes (what the constructors do with theirs)."""
        self.max_update_ratio, self.update_noise = (tracking.max_update_ratio,
                                                    tracking.update_noise)
        self.setup_tracking(tracking.clients, tracking.roles)
        self.tracker.replies.refusals_are_absences = tracking.refusals_are_absences
        self.history.xi_sink = tracking.xi_sink
        self.history.names = lambda: self.tracker.roster.names()
        self.apart = tracking.apart
        #: client id -> how its model started, where not from the initial model (a warm
        #: start's, a late joiner's): its card says so
        self.started_from: dict[int, str] = {}

    def setup_tracking(self, clients: dict[int, ClientInfo], roles: Roles | None = None) -> None:
        """Start tracking a run: the node-to-client map and the scenario roles."""
        self.tracker = Tracker(clients, roles)

    def add_client(self, info: ClientInfo, adjacency: torch.Tensor | None = None) -> None:
        """Take a client that joins after the run started (a new member, ``info.client_id``
        the next id). The tracker maps it; strategies that keep per-client state on the
        server make room for it (``adjacency``: the client graph with it, for strategies
        that use one)."""
        self.tracker.roster.add(info)

    def learned_from(self, most: int = 5) -> dict[int, tuple[list[int], list[float], float]]:
        """Client id -> whom its model learned from (:meth:`PersonalizedStrategy.learned_from`);
        empty: a method that does not mix models by weights."""
        return {}

    def graph_edges(self) -> tuple[dict[int, list[int]], str] | None:
        """Where the run inferred its client graph: client id -> its neighbours' client ids,
        and whether the run uses the graph (a short line); None: no inferred graph."""
        return None

    def warm_start(self, state: dict[str, Any], old_rows: Sequence[int | None],
                   initial: ArrayRecord) -> None:
        """Start from another run's strategy state (``state``, its :meth:`state_dict`);
        ``old_rows[i]``: the row there of this run's ``i``-th client (by client id), None for
        a client new to this run. A method with one global model keeps nothing per client:
        the run starts from that run's global model (the ServerApp's ``arrays``)."""

    def warm_row(self, state: dict[str, Any], old_row: int, client_id: int) -> None:
        """A returning client that joins the run under way (after :meth:`add_client`) takes
        its row ``old_row`` of the other run's ``state`` (:meth:`warm_start`)."""

    @property
    def history(self) -> RunHistory:
        """The run's records (``self.tracker.history``)."""
        return self.tracker.history

    def state_dict(self) -> dict[str, Any]:
        """The strategy's state between rounds, for a checkpoint (tensors and plain values),
        with where it holds something of each client (:meth:`client_state`)."""
        return {"history": self.history.to_state(),
                "started_from": {str(c): w for c, w in self.started_from.items()},
                CLIENT_STATE: self.client_state()}

    def client_state(self) -> dict[str, list[list[Any]]]:
        """The paths into :meth:`state_dict` of what it holds per client
        (:mod:`strategies.core.client_state`): ``fedamp-flwr forget`` zeroes a client's part of
        each. A method that keeps per-client state extends it (its own keys, named here
        only by the method); the round records (``history``) are erased by their own
        rules."""
        return declaration(maps=[["started_from"]])

    def load_state_dict(self, state: dict[str, Any], initial_arrays: ArrayRecord) -> None:
        """Continue from :meth:`state_dict` (after ``setup_tracking`` of the resumed run)."""
        self.history.load_state(state["history"])
        self.started_from = {int(c): str(w) for c, w in state.get("started_from", {}).items()}

    def _screen_train(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """The training replies that pass every check, the method's own included."""
        t = self.tracker
        good = []
        for msg in t.replies.screen(server_round, replies, TRAIN, extra_records=self.reply_records):
            problem = self.method_reply_problem(msg)
            if problem is None:
                good.append(msg)
            else:
                t.replies.reject(server_round, TRAIN, t.roster.client_of(msg), problem)
        return good

    def update_bound(self, sent_norms: torch.Tensor) -> torch.Tensor:
        """The largest update ||w - w_sent|| taken from a client: ``max_update_ratio`` x
        max(||w_sent||, 1), plus the dp noise's expected norm."""
        return self.max_update_ratio * sent_norms.clamp_min(1.0) + self.update_noise

    def _within_bound(self, server_round: int, replies: list[Message], distances: torch.Tensor,
                      sent_norms: torch.Tensor) -> list[bool]:
        """Whether each reply's update ||w - w_sent|| is within ``max_update_ratio``; record
        the others."""
        bound = self.update_bound(sent_norms)
        ok = (distances <= bound).tolist()
        for msg, fine, dist, b in zip(replies, ok, distances.tolist(), bound.tolist()):
            if not fine:
                self.tracker.replies.reject(server_round, TRAIN, self.tracker.roster.client_of(msg),
                                    f"update norm {dist:.4g} exceeds {b:.4g} (max-update-ratio "
                                    f"{self.max_update_ratio:g} x max(||w_sent||, 1)"
                                    + (f" + {self.update_noise:.4g} of dp noise"
                                       if self.update_noise else "") + ")")
        return ok


class FlowerStrategy(StrategyBase, Strategy):
    """A Flower strategy (``self.flower``, a :attr:`flower_class` made from the keyword
    arguments), held the way Flower's own DP wrappers hold one: its sampling of the nodes
    it is given and its aggregation are Flower's; around them, this class samples the
    clients by the run's rule, leaves novel and dropped-out clients out of the round,
    names the client half in every message, screens every reply
    (:meth:`ReplyScreen.screen`, the update-norm bound) so that only valid replies reach
    the aggregation, and records every client's evaluation, all through ``self.tracker``.
    A method built on a Flower strategy subclasses this one and names its
    :attr:`flower_class` (``class FedProx(FlowerStrategy): flower_class = flwr.FedProx``).

    The global model keeps the dtypes of the first model it is given (the
    initial one): what Flower's aggregation returns is cast back to them
    (:func:`strategies.core.layout.with_dtypes`; integer buffers such as
    BatchNorm's ``num_batches_tracked`` come back from Flower's helpers as
    float64), and replies must match them.
    """

    #: the Flower strategy held (its keyword arguments are the constructor's others)
    flower_class: ClassVar[type[Strategy]] = flwr_strategy.FedAvg

    def __init__(self, *, settings: Settings | None = None, sample_fraction: float = 1.0,
                 sample_seed: int = 0, tracking: RunTracking | None = None, **kwargs) -> None:
        self.flower = self.flower_class(**kwargs)
        if settings is not None:  # the method's keys, sent as they declare
            self.settings = settings
        self.sample_fraction, self.sample_seed = sample_fraction, sample_seed
        self.track(tracking or RunTracking())
        self._sent: tuple[FlatLayout, torch.Tensor] | None = None
        self._dtypes: dict[str, np.dtype] | None = None

    def _as_sent(self, arrays: ArrayRecord) -> ArrayRecord:
        """``arrays`` in the dtypes of the model (fixed by the first model this strategy sends)."""
        if self._dtypes is None:
            self._dtypes = dtypes_of(arrays)
        return with_dtypes(arrays, self._dtypes)

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Hook: the valid replies, just before the Flower strategy aggregates them."""
        return replies

    def configure_train(self, server_round, arrays, config, grid):
        t = self.tracker
        arrays = self._as_sent(arrays)
        t.replies.spec = array_spec(arrays)
        layout = FlatLayout.from_arrays(arrays)
        self._sent = (layout, layout.flatten(arrays))
        config = self.instruct(config, train=True)
        # the run's sampling rule (Scenario.sample_training), the same as the personalized
        # strategies'; Flower's own sampler (fraction 1) then takes every chosen client
        online = [c for c in map(t.roster.client_of_node, grid.get_node_ids()) if isinstance(c, int)]
        chosen = t.scenario.sample_training(server_round, online, self.sample_fraction, self.sample_seed)
        view = GridView(grid, [t.roster.node_of(c) for c in chosen])
        # no client chosen: Flower's sampler would wait for one for ever
        messages = list(self.flower.configure_train(server_round, arrays, config, view)) \
            if chosen else []
        check_instructions(messages)
        out = []
        of = t.roster.client_of_node
        for m in sorted(messages, key=lambda m: client_order(of(m.metadata.dst_node_id))):
            c = t.roster.client_of_node(m.metadata.dst_node_id)
            content = RecordDict(dict(m.content.items()))  # Flower shares one among all messages
            content[CONFIG] = t.scenario.client_config(server_round, c, content[CONFIG])
            out.append(Message(content, message_type=m.metadata.message_type,
                               dst_node_id=m.metadata.dst_node_id))
        t.replies.record_offline(server_round)
        t.replies.expect(TRAIN, out)
        return out

    def aggregate_train(self, server_round, replies):
        good = self._screen_train(server_round, replies)
        if good and self._sent is not None:
            layout, sent = self._sent
            vectors = torch.stack([layout.flatten(m.content.array_records[ARRAYS]) for m in good])
            ok = self._within_bound(server_round, good, (vectors - sent).norm(dim=1),
                                    sent.norm().expand(len(good)))
            good = [m for m, fine in zip(good, ok) if fine]
        self.tracker.history.record_train(server_round, good, self.tracker.roster.client_of)
        arrays, metrics = self.flower.aggregate_train(server_round,
                                                      self.before_aggregation(server_round, good))
        return (None if arrays is None else self._as_sent(arrays)), metrics

    def configure_evaluate(self, server_round, arrays, config, grid):
        config = self.instruct(config, train=False)
        arrays = self._as_sent(arrays)
        self.tracker.replies.record_offline(server_round, EVALUATE)
        messages = (list(self.flower.configure_evaluate(server_round, arrays, config, grid))
                    if grid.get_node_ids() else [])
        check_instructions(messages)
        t, out = self.tracker, []
        for m in messages:  # each its own config: its client's index
            c = t.roster.client_of_node(m.metadata.dst_node_id)
            content = RecordDict(dict(m.content.items()))
            if isinstance(c, int):
                content[CONFIG] = t.scenario.evaluate_config(c, content[CONFIG])
            out.append(Message(content, message_type=m.metadata.message_type,
                               dst_node_id=m.metadata.dst_node_id))
        t.replies.expect(EVALUATE, out)
        return out

    def aggregate_evaluate(self, server_round, replies):
        good = self.tracker.replies.screen(server_round, replies, EVALUATE)
        self.tracker.history.record_evaluation(server_round, good, self.tracker.roster.client_of)
        return self.flower.aggregate_evaluate(server_round, good)

    def summary(self) -> None:
        self.flower.summary()


class GridView:
    """A view of a Flower ``Grid`` whose nodes are ``node_ids``, in that order: the clients
    chosen to train, or the connected ones (``fedamp_flwr.server.rounds.online_view``)."""

    def __init__(self, grid: Grid, node_ids: list[int]) -> None:
        self._grid, self._nodes = grid, list(node_ids)

    def get_node_ids(self) -> list[int]:
        return list(self._nodes)

    def __getattr__(self, name: str):
        return getattr(self._grid, name)


# ---------------------------------------------------------------------------
# Personalized strategies
# ---------------------------------------------------------------------------
class PersonalRounds(StrategyBase, Strategy):
    """The Message-API rounds of a strategy that keeps one model per client on the server
    (:class:`PersonalizedStrategy` holds the models and sets the attributes below).

    In a round, the sampled clients that are connected each receive the model and config
    that :meth:`personalize` makes for them, and their valid replies (screened, and within
    the update bound from what was sent, :meth:`sent_distances`) go to :meth:`update`. In
    evaluation every connected client receives its row of :meth:`evaluation_models` and tests
    it on its own test split. By default a client is sent, and tests, the model the server
    holds for it (:meth:`held_models`).
    """

    client_ids: list[int]  # by store row
    _row: dict[int, int]  # client id -> store row
    training_rows: torch.Tensor  # the rows of the clients that train (all but novel ones)
    fraction_train: float
    seed: int  # of the client sampling
    device: torch.device
    layout: FlatLayout | None
    _sent_norms: torch.Tensor  # by row: the norm of the model last sent

    @property
    def flat(self) -> FlatLayout:
        """The flat layout of the model, once the first round has set it up."""
        if self.layout is None:
            raise RuntimeError(f"{type(self).__name__} has no model layout before round 1")
        return self.layout

    def held_models(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The models the server holds for the clients of store rows ``rows`` (None: every
        client, row i for ``client_ids[i]``): what the default :meth:`personalize` sends,
        what :meth:`sent_distances` measures a reply from and what the clients test
        (:meth:`evaluation_models`). :class:`PersonalizedStrategy`: the stored models
        (Panacea: the models its hypernetwork generates)."""
        raise NotImplementedError

    def update(self, server_round: int, rows: torch.Tensor, trained: torch.Tensor) -> None:
        """Take the valid trained models (len(rows) x d) of clients ``rows``."""
        raise NotImplementedError

    def _ensure_models(self, arrays: ArrayRecord) -> None:
        """On first use: the flat layout of the model and the models held."""
        raise NotImplementedError

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(INFO, "\t├── %s: fraction-train %.2f, server device %s",
            type(self).__name__, self.fraction_train, self.device)

    def _messages(self, rows: Iterable[int], vectors: torch.Tensor,
                  configs: Sequence[ConfigRecord], message_type: str) -> list[Message]:
        messages = [
            Message(RecordDict({ARRAYS: self.flat.unflatten(vec), CONFIG: cfg}),
                    message_type=message_type,
                    dst_node_id=self.tracker.roster.node_of(self.client_ids[int(row)]))
            for row, vec, cfg in zip(rows, vectors, configs)
        ]
        check_instructions(messages)
        self.tracker.replies.expect(message_type, messages)
        return messages

    def online_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows of ``rows`` whose clients are connected now."""
        keep = [r for r in rows.tolist() if self.tracker.roster.is_online(self.client_ids[r])]
        return rows if len(keep) == len(rows) else torch.as_tensor(keep, dtype=torch.long)

    def sample_rows(self, server_round: int) -> torch.Tensor:
        """Rows (clients) that train in ``server_round``: the run's sampling rule
        (:meth:`Scenario.sample_training`) over the connected training clients."""
        online = self.online_rows(self.training_rows).tolist()
        chosen = set(self.tracker.scenario.sample_training(
            server_round, [self.client_ids[r] for r in online], self.fraction_train, self.seed))
        return torch.as_tensor([r for r in online if self.client_ids[r] in chosen],
                               dtype=torch.long)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send each sampled client the model :meth:`personalize` makes for it."""
        self._ensure_models(arrays)
        rows = self.sample_rows(server_round)
        config = self.instruct(config, train=True)
        config[SERVER_ROUND] = server_round
        self.tracker.replies.record_offline(server_round)
        if len(rows) == 0:
            log(WARNING, "Round %d: no client to train", server_round)
            self.tracker.replies.expect(TRAIN, [])
            return []
        vectors, cfg = self.personalize(server_round, rows, config)
        self._sent_norms[rows] = vectors.norm(dim=1).float().cpu()
        log(INFO, "configure_train: %d of %d clients", len(rows), len(self.client_ids))
        configs = [self.tracker.scenario.client_config(server_round, self.client_ids[int(r)], cfg)
                   for r in rows]
        return self._messages(rows, vectors, configs, MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Store each valid reply's model as its client's model; invalid ones change nothing."""
        t = self.tracker
        good = self._screen_train(server_round, replies)
        if good:
            rows = torch.as_tensor([self._row[t.roster.known_client_of(m)] for m in good])
            vectors = torch.stack([self.flat.flatten(m.content.array_records[ARRAYS]) for m in good]
                                  ).to(self.device)
            ok = self._within_bound(server_round, good, self.sent_distances(rows, vectors).cpu(),
                                    self._sent_norms[rows])
            if not all(ok):
                keep = torch.as_tensor(ok)
                good = [m for m, fine in zip(good, ok) if fine]
                rows, vectors = rows[keep], vectors[keep.to(vectors.device)]
        t.history.record_train(server_round, good, t.roster.client_of)
        if good:
            self.update(server_round, rows, vectors)
        return None, mean_metrics([m.content for m in good]) if good else None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Send every connected client its own personalized model for testing."""
        self._ensure_models(arrays)
        config = self.instruct(config, train=False)
        config[SERVER_ROUND] = server_round
        rows = self.online_rows(torch.arange(len(self.client_ids)))
        self.tracker.replies.record_offline(server_round, EVALUATE)
        models = self.evaluation_models()
        configs = [self.tracker.scenario.evaluate_config(self.client_ids[int(r)], config) for r in rows]
        return self._messages(rows, models if len(rows) == len(models) else models[rows],
                              configs, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Record every valid client's test metrics; return their means over clients."""
        good = self.tracker.replies.screen(server_round, replies, EVALUATE)
        means = self.tracker.history.record_evaluation(server_round, good,
                                                      self.tracker.roster.client_of)
        return MetricRecord(dict(means)) if means else None

    def personalize(
        self, server_round: int, rows: torch.Tensor, config: ConfigRecord
    ) -> tuple[torch.Tensor, ConfigRecord]:
        """Return the models (len(rows) x d) and the config to send to clients ``rows``.

        The default sends each client the model the server holds for it
        (:meth:`held_models`).
        """
        return self.held_models(rows), config

    def sent_distances(self, rows: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """``||vectors[i] - the model sent to rows[i]||``, before :meth:`update` (the default:
        the models held, which the default :meth:`personalize` sends)."""
        return (vectors - self.held_models(rows)).norm(dim=1)

    def evaluation_models(self) -> torch.Tensor:
        """The (clients x d) models the clients test, row i for ``client_ids[i]``."""
        return self.held_models()


class PersonalizedStrategy(PersonalRounds):
    """A Message-API strategy that keeps one model per client on the server.

    The models are rows of one tensor ``self.models`` (clients x parameters,
    float32, on ``device``), in the order of ``self.client_ids``; all rows
    start as the initial model. In a round, the sampled clients that are
    connected each receive the model and config that :meth:`personalize`
    makes for them, and their valid replies replace their rows. In evaluation
    every connected client receives its own row and tests it on its own test
    split.

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
    tracking : RunTracking | None
        The run's clients, scenario and reply checks (:meth:`track`; none: tracking starts
        empty, a test's ``setup_tracking`` gives the clients).
    """

    STATE_KIND = "a model per client"

    def __init__(
        self,
        fraction_train: float = 1.0,
        param_keys: Sequence[str] | None = None,
        device: str = "cpu",
        seed: int = 0,
        tracking: RunTracking | None = None,
    ) -> None:
        self.fraction_train = fraction_train
        self.param_keys = list(param_keys) if param_keys is not None else None
        self.device = torch.device(device)
        self.seed = seed
        self.layout: FlatLayout | None = None
        self.models: torch.Tensor | None = None
        self.track(tracking or RunTracking())

    def setup_tracking(self, clients: dict[int, ClientInfo], roles: Roles | None = None) -> None:
        """Start tracking a run: the clients (rows of the store, by client id) and the scenario."""
        super().setup_tracking(clients, roles)
        self.client_ids = sorted(i.client_id for i in clients.values())
        self._row = {cid: r for r, cid in enumerate(self.client_ids)}
        # rows of the clients that train (all but the novel ones)
        self.training_rows = torch.tensor(
            [r for r, c in enumerate(self.client_ids) if c not in self.tracker.roles.novel],
            dtype=torch.long)
        self.layout, self.models = None, None
        self._sent_norms = torch.zeros(len(self.client_ids))

    def apart_mask(self, rows: torch.Tensor, joining: str | None = None) -> torch.Tensor | None:
        """The pairs kept apart among the clients of store rows ``rows`` and, last, a client
        ``joining`` under that name (boolean; :mod:`strategies.core.policy`), named as a
        collaboration policy names them (a member's name, a partitioned run's client id as
        text: "3"); None without a collaboration policy."""
        if self.apart is None:
            return None
        names = self.tracker.roster.names()
        known = [names.get(c) or str(c) for c in (self.client_ids[r] for r in rows.tolist())]
        return self.apart.mask(known + ([joining] if joining is not None else []))

    @property
    def store(self) -> torch.Tensor:
        """The per-client models (clients x d), once the first round has set them up."""
        if self.models is None:
            raise RuntimeError(f"{type(self).__name__} keeps no per-client store before round 1")
        return self.models

    # -- hooks for subclasses ------------------------------------------------
    def held_models(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The stored models of store rows ``rows`` (None: every client's)."""
        return self.store if rows is None else self.store[rows]

    def update(self, server_round: int, rows: torch.Tensor, trained: torch.Tensor) -> None:
        """Take the valid trained models (len(rows) x d) of clients ``rows``.

        The default stores them as the clients' personalized models (and, where the method
        mixed this round's models by :attr:`mixing_weights`, their rows of it as whom each
        stored model learned from, :attr:`learned_weights`).
        """
        self.store[rows] = trained
        if self.mixing_weights is not None:
            n = len(self.client_ids)
            if self.learned_weights is None or len(self.learned_weights) != n:
                grown = torch.eye(n, dtype=torch.float64)  # a client new to it: its own
                if self.learned_weights is not None:
                    old = len(self.learned_weights)
                    grown[:old, :old] = self.learned_weights
                self.learned_weights = grown
            self.learned_weights[rows.cpu()] = self.mixing_weights[rows.to(
                self.mixing_weights.device)].detach().double().cpu()

    def initial_models(self, initial: torch.Tensor) -> torch.Tensor | None:
        """The per-client store at the start: every client holds the initial model."""
        return initial.unsqueeze(0).repeat(len(self.client_ids), 1)

    #: a client that joins after the start starts from the mean of the training clients'
    #: stored models (FedAMP, SFL), not from the initial model
    JOINER_FROM_MEAN = False
    #: (n, n), rows and columns the store's: this round's weights with which the clients'
    #: models were mixed before training (FedAMP's xi); None: none this round
    mixing_weights: torch.Tensor | None = None
    #: (n, n) float64 on the CPU: whom each stored model learned from, the weights of the
    #: round it was stored in (:meth:`update` from :attr:`mixing_weights`; SFL's smoothing
    #: and Panacea's graph propagation set it whole); None: a method that does not mix by
    #: weights
    learned_weights: torch.Tensor | None = None

    def learned_from(self, most: int = 5) -> dict[int, tuple[list[int], list[float], float]]:
        """Client id -> the ``most`` other clients whose models weighed most in its model
        (their ids and weights, most first, weights > 0 only) and its own model's weight,
        from :attr:`learned_weights` (non-finite weights as 0, all clamped to [0, 1]); empty
        without them."""
        w, n = self.learned_weights, len(self.client_ids)
        if w is None or tuple(w.shape) != (n, n) or n < 2:
            return {}
        w = torch.nan_to_num(w.detach().double().cpu(), nan=0.0).clamp(0.0, 1.0)
        values, index = w.clone().fill_diagonal_(0.0).topk(min(most, n - 1), dim=1)
        ids = torch.as_tensor(self.client_ids)
        return {cid: (ids[index[r][values[r] > 0]].tolist(), values[r][values[r] > 0].tolist(),
                      float(w[r, r])) for r, cid in enumerate(self.client_ids)}

    def warm_start(self, state: dict[str, Any], old_rows: Sequence[int | None],
                   initial: ArrayRecord) -> None:
        """Each returning client's row from the other run's store (``state["models"]``); a
        client new to this run, with :attr:`JOINER_FROM_MEAN`, the mean of the returning
        clients' models but those the collaboration policy keeps apart from it (else, or with
        none left, the initial model). :attr:`started_from` says which, by client id."""
        old = state.get("models")
        self._ensure_models(initial)
        if not isinstance(old, torch.Tensor) or old.ndim != 2 or \
                old.shape[1] != self.store.shape[1]:
            raise ValueError("it keeps no per-client models of this model's size "
                             f"({self.store.shape[1]} values)")
        back = torch.tensor([r for r, o in enumerate(old_rows) if o is not None], dtype=torch.long)
        new = torch.tensor([r for r, o in enumerate(old_rows) if o is None], dtype=torch.long)
        if len(back):
            source = torch.tensor([o for o in old_rows if o is not None], dtype=torch.long)
            self.store[back] = old[source].to(self.store)
        for r in back.tolist():
            self.started_from[self.client_ids[r]] = "its own model"
        for r in new.tolist():
            self.started_from[self.client_ids[r]] = "the initial model (new to the run)"
        if not (len(new) and len(back) and self.JOINER_FROM_MEAN):
            return
        apart = self.apart_mask(torch.cat([new, back]))  # newcomers x returning: not apart
        allowed = (torch.ones(len(new), len(back), dtype=torch.bool) if apart is None
                   else ~apart[: len(new), len(new):])
        weights = allowed.to(self.store.dtype)
        counts = weights.sum(dim=1)
        has = counts > 0
        mean = (weights[has] / counts[has, None]).to(self.store.device) @ self.store[back]
        self.store[new[has]] = mean
        for r, k in zip(new[has].tolist(), counts[has].tolist(), strict=True):
            self.started_from[self.client_ids[r]] = (f"the mean of the models of {int(k)} "
                                                     "returning member(s)")

    def warm_row(self, state: dict[str, Any], old_row: int, client_id: int) -> None:
        old = state.get("models")
        if self.models is not None and isinstance(old, torch.Tensor) and old.ndim == 2 \
                and old.shape[1] == self.store.shape[1] and 0 <= old_row < len(old):
            self.store[self._row[client_id]] = old[old_row].to(self.store)
            self.started_from[client_id] = "its own model"

    def add_client(self, info: ClientInfo, adjacency: torch.Tensor | None = None) -> None:
        """A client that joins after the start gets a row of its own, computed from the store
        as it is, before the client is in it: the initial model, or with
        :attr:`JOINER_FROM_MEAN` the mean of the training clients' stored models but those
        the collaboration policy keeps apart from it (none left: the initial model)."""
        cid = info.client_id
        if cid in self._row:
            super().add_client(info, adjacency)
            return
        row = None
        if self.models is not None:
            rows = self.training_rows
            apart = self.apart_mask(rows, info.name or str(cid)) if len(rows) else None
            if apart is not None:
                rows = rows[~apart[-1, :-1]]
            row = self._initial
            if self.JOINER_FROM_MEAN and len(rows):
                self.started_from[cid] = f"the mean of the models of {len(rows)} member(s)"
                row = self.store[rows.to(self.store.device)].mean(dim=0)
            row = row[None].to(self.models)
        super().add_client(info, adjacency)
        self.client_ids.append(cid)
        self._row[cid] = len(self.client_ids) - 1
        if cid not in self.tracker.roles.novel:
            self.training_rows = torch.cat([self.training_rows,
                                            torch.tensor([self._row[cid]], dtype=torch.long)])
        self._sent_norms = torch.cat([self._sent_norms, torch.zeros(1)])
        if self.models is not None and row is not None:
            self.models = torch.cat([self.models, row])

    # -- checkpoints ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.models is not None:
            state["models"] = self.models.detach().cpu()
        return state

    def client_state(self) -> dict[str, list[list[Any]]]:
        declared = super().client_state()
        declared["rows"].append(["models"])  # each client's stored model
        return declared

    def load_state_dict(self, state: dict[str, Any], initial_arrays: ArrayRecord) -> None:
        super().load_state_dict(state, initial_arrays)
        self._ensure_models(initial_arrays)
        if "models" in state:
            models = state["models"]
            if tuple(models.shape) != tuple(self.store.shape):
                raise ValueError(f"checkpoint store is {tuple(models.shape)}, the run's "
                                 f"{tuple(self.store.shape)}")
            self.models = models.to(self.device, self.store.dtype)

    def _ensure_models(self, arrays: ArrayRecord) -> None:
        """On first use: the flat layout of the model and :meth:`initial_models`."""
        if self.layout is None:
            if not self.client_ids:
                raise RuntimeError("no clients: call setup_tracking(clients) first")
            self.layout = FlatLayout.from_arrays(arrays, self.param_keys)
            self.tracker.replies.spec = array_spec(arrays)
            self._initial = self.layout.flatten(arrays).to(self.device)
            self.models = self.initial_models(self._initial)
