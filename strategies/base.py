"""What every strategy of this project shares.

* :func:`discover_clients`: a query round that maps Flower node ids (random
  per run) to stable client ids (the ``partition-id`` of each node's
  ``node_config``) and checks that every client could load its data.
* :class:`FlatLayout`: flattens an ``ArrayRecord`` (a model's state dict)
  into one vector and back, with the trainable parameters first.
* :func:`reply_problem`: what is wrong with a training reply, if anything.
* :class:`RunHistory`: per-round, per-client evaluation records (the
  ``metrics.json`` of a run).
* :class:`TrackedStrategy`: a mixin for Flower's own strategies (FedAvg,
  FedProx, ...) that drops invalid replies before they are aggregated and
  records every client's evaluation.
* :class:`PersonalizedStrategy`: a Message-API ``Strategy`` that keeps one
  model per client on the server and sends each client its own model; FedAMP,
  HeurFedAMP and Panacea subclass it.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from tasks.scenarios import Roles

CLIENT_ID = "client-id"
ROUND = "server-round"
NUM_EXAMPLES = "num-examples"
# Largest squared norm of a model taken from a client. Models of norm <= 1e9
# have centred norms <= 2e9, so every float32 Gram entry of FedAMP stays
# <= 4e18, far below float32's maximum (3.4e38).
MAX_SQ_NORM = 1e18
_ID_KEYS = (CLIENT_ID, ROUND)


# ---------------------------------------------------------------------------
# Client discovery
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientInfo:
    """What a node said about itself in the query round."""

    node_id: int
    client_id: int
    num_partitions: int
    num_train: int
    num_test: int


def discover_clients(
    grid: Grid, min_nodes: int, timeout: float = 600.0, poll: float = 1.0
) -> dict[int, ClientInfo]:
    """Query every connected node for its client id; return ``{node_id: info}``.

    Waits until at least ``min_nodes`` nodes are connected, sends each a
    ``query`` message, and checks the answers: every node must have loaded its
    data (a node that could not says why, and that reason is raised here,
    before any training), client ids must be unique and all nodes must agree
    on the number of partitions.

    Raises
    ------
    RuntimeError
        If nodes do not connect within ``timeout`` or a node reports an error.
    """
    deadline = time.monotonic() + timeout
    while len(node_ids := sorted(grid.get_node_ids())) < min_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(node_ids)} node(s) connected after {timeout:.0f}s; "
                f"min-nodes is {min_nodes}"
            )
        log(INFO, "Waiting for nodes: %d connected, min-nodes %d", len(node_ids), min_nodes)
        time.sleep(poll)
    messages = [
        Message(RecordDict({"config": ConfigRecord({"query": "client-info"})}),
                message_type=MessageType.QUERY, dst_node_id=n)
        for n in node_ids
    ]
    infos: dict[int, ClientInfo] = {}
    errors: list[str] = []
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            errors.append(f"node {node}: {reply.error.reason}")
            continue
        cfg = reply.content["info"]
        if cfg.get("error"):
            errors.append(f"client {cfg.get(CLIENT_ID, '?')} (node {node}): {cfg['error']}")
            continue
        infos[node] = ClientInfo(
            node, int(cfg[CLIENT_ID]), int(cfg["num-partitions"]),
            int(cfg["num-train"]), int(cfg["num-test"]),
        )
    if errors:
        raise RuntimeError("clients could not start:\n  " + "\n  ".join(errors))
    if len(infos) < len(node_ids):
        raise RuntimeError(f"only {len(infos)} of {len(node_ids)} nodes answered the query")
    ids = [i.client_id for i in infos.values()]
    if len(set(ids)) != len(ids):
        raise RuntimeError(f"two nodes have the same partition-id: {sorted(ids)}")
    parts = {i.num_partitions for i in infos.values()}
    if len(parts) != 1:
        raise RuntimeError(f"nodes disagree on num-partitions: {sorted(parts)}")
    (num_partitions,) = parts
    if sorted(ids) != list(range(num_partitions)):
        raise RuntimeError(
            f"found clients {sorted(ids)} but num-partitions = {num_partitions}: every "
            f"partition id 0..{num_partitions - 1} must have one node; set min-nodes = "
            f"{num_partitions} so that the ServerApp waits for all of them"
        )
    sizes = [i.num_train for i in infos.values()]
    log(INFO, "Found %d clients (partition ids 0..%d), %d to %d training samples each",
        len(ids), num_partitions - 1, min(sizes), max(sizes))
    return infos


# ---------------------------------------------------------------------------
# Flattening models
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class FlatLayout:
    """How a model's state dict maps to one flat float vector.

    Floating-point tensors are concatenated, the trainable parameters
    (``param_keys``) first: ``vec[:num_params]`` are the parameters and the
    rest are floating-point buffers (such as batch-norm running statistics).
    Other tensors (integer counters) are not part of the vector and are
    restored from ``constants``, taken from the initial model.
    """

    keys: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    float_keys: tuple[str, ...]
    num_params: int
    constants: dict[str, np.ndarray]
    num_param_keys: int = 0

    @classmethod
    def from_arrays(cls, arrays: ArrayRecord, param_keys: Sequence[str] | None = None) -> "FlatLayout":
        """Build the layout of ``arrays``; ``param_keys`` default to all float tensors."""
        nd = {k: v.numpy() for k, v in arrays.items()}
        floats = [k for k, v in nd.items() if np.issubdtype(v.dtype, np.floating)]
        params = [k for k in floats if param_keys is None or k in set(param_keys)]
        ordered = params + [k for k in floats if k not in set(params)]
        return cls(
            keys=tuple(nd),
            shapes={k: tuple(v.shape) for k, v in nd.items()},
            float_keys=tuple(ordered),
            num_params=int(sum(nd[k].size for k in params)),
            constants={k: v.copy() for k, v in nd.items() if k not in set(floats)},
            num_param_keys=len(params),
        )

    @property
    def size(self) -> int:
        """Length of the flat vector."""
        return int(sum(int(np.prod(self.shapes[k])) for k in self.float_keys))

    def flatten(self, arrays: ArrayRecord) -> torch.Tensor:
        """Return the float32 vector of ``arrays`` (which must match the layout)."""
        parts = [torch.from_numpy(np.asarray(arrays[k].numpy(), dtype=np.float32)).reshape(-1)
                 for k in self.float_keys]
        return torch.cat(parts)

    def unflatten(self, vec: torch.Tensor) -> ArrayRecord:
        """Return the ``ArrayRecord`` of the vector ``vec``, in the model's key order."""
        vec = vec.detach().to("cpu", torch.float32)
        sizes = [int(np.prod(self.shapes[k])) for k in self.float_keys]
        out = {k: t.reshape(self.shapes[k]) for k, t in zip(self.float_keys, vec.split(sizes))}
        out.update({k: torch.from_numpy(v) for k, v in self.constants.items()})
        return ArrayRecord(OrderedDict((k, out[k].contiguous()) for k in self.keys))


def arrays_problem(record: ArrayRecord, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Return what is wrong with an ``ArrayRecord`` from a client, or None.

    It must have exactly the keys and shapes of ``shapes``, values that are
    finite as float32 (the server's dtype) and a squared norm below
    ``MAX_SQ_NORM`` (so that the float32 Gram products of FedAMP cannot overflow).
    """
    if set(record.keys()) != set(shapes):
        return f"array keys differ from the model's ({sorted(set(record.keys()) ^ set(shapes))[:5]})"
    sq_norm = 0.0
    for key, arr in record.items():
        a = arr.numpy()
        if tuple(a.shape) != shapes[key]:
            return f"array '{key}' has shape {tuple(a.shape)}, expected {shapes[key]}"
        if np.issubdtype(a.dtype, np.floating):
            with np.errstate(over="ignore"):
                a32 = a.astype(np.float32)
            if not np.isfinite(a32).all():
                return f"array '{key}' has non-finite values (as float32)"
            sq_norm += float(np.square(a32, dtype=np.float64).sum())
    if sq_norm > MAX_SQ_NORM:
        return f"squared norm {sq_norm:.3g} exceeds {MAX_SQ_NORM:.0e}"
    return None


def reply_problem(msg: Message, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Return why a training reply cannot be used, or None if it can.

    A usable reply has no error, exactly one ``ArrayRecord`` that passes
    :func:`arrays_problem` and a ``MetricRecord`` with a non-negative ``num-examples``.
    """
    if msg.has_error():
        return f"error reply: {msg.error.reason}"
    arrays = list(msg.content.array_records.values())
    if len(arrays) != 1:
        return f"expected one ArrayRecord, got {len(arrays)}"
    problem = arrays_problem(arrays[0], shapes)
    if problem is not None:
        return problem
    if not msg.content.metric_records:
        return "no MetricRecord"
    count = _metrics_of(msg).get(NUM_EXAMPLES)
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not 0 <= count < math.inf:
        return f"metric '{NUM_EXAMPLES}' = {count!r} is not a count"
    return None


def _metrics_of(msg: Message) -> dict[str, Any]:
    record = next(iter(msg.content.metric_records.values()), MetricRecord())
    return dict(record)


def mean_metrics(contents: list[RecordDict], _weight_key: str = NUM_EXAMPLES) -> MetricRecord:
    """Unweighted mean over clients of every metric (ids and counts left out).

    Used as Flower's ``*_metrics_aggr_fn``: the papers report the mean test
    accuracy over clients, each client counting once.
    """
    sums: dict[str, float] = {}
    for content in contents:
        for record in content.metric_records.values():
            for k, v in record.items():
                if k in _ID_KEYS or k == NUM_EXAMPLES or not isinstance(v, (int, float)):
                    continue
                sums[k] = sums.get(k, 0.0) + float(v)
    n = max(len(contents), 1)
    return MetricRecord({k: v / n for k, v in sums.items()})


# ---------------------------------------------------------------------------
# History
# ---------------------------------------------------------------------------
METRICS = ("accuracy", "mse", "loss")


def _client_order(client: int | str) -> tuple[int, int | str]:
    """Sort key: client ids in order, then anything else (unknown senders)."""
    return (0, client) if isinstance(client, int) else (1, str(client))


@dataclass
class RunHistory:
    """Per-round records of a run; serialised into ``metrics.json``.

    ``rounds[r]`` holds, for each metric the clients report (``accuracy``
    for classification, ``mse`` for regression, ``loss``), ``client_<m>``
    (client id to value) and ``mean_<m>``, the mean over the benign training
    clients (neither novel nor attackers); ``novel_mean_<m>`` over the novel
    clients when there are any; and ``train_loss``. ``xi[r]`` holds the
    collaboration weights of a FedAMP round.

    Parameters
    ----------
    novel : Collection[int]
        Client ids of the novel clients (recorded apart).
    attackers : Collection[int]
        Client ids of the attackers (left out of the means).
    """

    novel: frozenset[int] = frozenset()
    attackers: frozenset[int] = frozenset()
    rounds: dict[int, dict[str, Any]] = field(default_factory=dict)
    xi: dict[int, list[list[float]]] = field(default_factory=dict)
    xi_client_ids: list[int] = field(default_factory=list)

    def _round(self, server_round: int) -> dict[str, Any]:
        return self.rounds.setdefault(server_round, {"round": server_round})

    def record_train(self, server_round: int, replies: list[Message], client_of) -> None:
        """Record the mean training loss and the clients that trained."""
        rec = self._round(server_round)
        losses = [_metrics_of(m).get("train-loss") for m in replies]
        losses = [float(v) for v in losses if v is not None]
        rec["trained_clients"] = sorted(client_of(m) for m in replies)
        rec["train_loss"] = float(np.mean(losses)) if losses else None

    def record_evaluation(self, server_round: int, replies: list[Message],
                          client_of) -> dict[str, float]:
        """Record each client's test metrics; return the means over benign training clients.

        ``client_of`` maps a reply to its sender's client id (an int), or to
        something else for nodes that were not discovered, whose replies are skipped.
        """
        values: dict[str, dict[int, float]] = {m: {} for m in METRICS}
        for msg in sorted(replies, key=lambda m: _client_order(client_of(m))):
            cid = client_of(msg)
            if msg.has_error() or not isinstance(cid, int):
                continue
            metrics = _metrics_of(msg)
            for m in METRICS:
                if m in metrics:
                    values[m][cid] = float(metrics[m])
        rec = self._round(server_round)
        means: dict[str, float] = {}
        for m, by_client in values.items():
            if not by_client:
                continue
            rec[f"client_{m}"] = dict(sorted(by_client.items()))
            benign = [v for c, v in by_client.items() if c not in self.novel | self.attackers]
            novel = [v for c, v in by_client.items() if c in self.novel]
            if benign:
                means[f"mean_{m}"] = rec[f"mean_{m}"] = float(np.mean(benign))
            if novel:
                means[f"novel_mean_{m}"] = rec[f"novel_mean_{m}"] = float(np.mean(novel))
        main = "accuracy" if values["accuracy"] else "mse"
        if f"mean_{main}" in rec:
            vals = values[main]
            extra = (f", novel clients {rec[f'novel_mean_{main}']:.4g}"
                     if f"novel_mean_{main}" in rec else "")
            who = "benign training clients" if self.novel | self.attackers else "clients"
            log(INFO, "Round %d: mean test %s over %d %s %.4g (min %.4g, max %.4g)%s",
                server_round, main, len(set(vals) - (self.novel | self.attackers)), who,
                rec[f"mean_{main}"], min(vals.values()), max(vals.values()), extra)
        return means

    def record_xi(self, server_round: int, client_ids: list[int], xi: torch.Tensor) -> None:
        """Record the collaboration weights of one round (rows and columns: ``client_ids``)."""
        self.xi_client_ids = list(client_ids)
        self.xi[server_round] = xi.detach().cpu().double().tolist()

    def _series(self, key: str) -> list[float]:
        return [r[key] for r in self.rounds.values() if r.get(key) is not None]

    def bmta(self) -> float | None:
        """Best mean test accuracy over all rounds, in percent (the paper's metric)."""
        accs = self._series("mean_accuracy")
        return 100.0 * max(accs) if accs else None

    def best_mean_mse(self) -> float | None:
        """Lowest mean test MSE over all rounds (regression tasks)."""
        mses = self._series("mean_mse")
        return min(mses) if mses else None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready records."""
        out: dict[str, Any] = {"rounds": [self.rounds[r] for r in sorted(self.rounds)]}
        if self.bmta() is not None:
            out["bmta"] = self.bmta()
            novel = self._series("novel_mean_accuracy")
            if novel:
                out["novel_bmta"] = 100.0 * max(novel)
        if self.best_mean_mse() is not None:
            out["best_mean_mse"] = self.best_mean_mse()
            novel = self._series("novel_mean_mse")
            if novel:
                out["novel_best_mean_mse"] = min(novel)
        out["novel_clients"] = sorted(self.novel)
        out["attackers"] = sorted(self.attackers)
        if self.xi:
            out["xi"] = {"client_ids": self.xi_client_ids,
                         "rounds": {str(r): m for r, m in sorted(self.xi.items())}}
        return out


# ---------------------------------------------------------------------------
# Flower's own strategies, with validation and records
# ---------------------------------------------------------------------------
class TrackedStrategy:
    """Mixin that puts this project's checks and records around a Flower strategy.

    Use it before the Flower strategy in the bases, e.g.
    ``class FedAvg(TrackedStrategy, flwr.serverapp.strategy.FedAvg)``. It

    * remembers the shapes of the global model sent in ``configure_train``,
    * leaves novel clients (which never train) out of ``configure_train``,
    * leaves replies that fail :func:`reply_problem` out of the aggregation,
      with a warning naming the client, so they never reach the global model,
    * records every client's evaluation in ``self.history``.
    """

    history: RunHistory
    clients: dict[int, ClientInfo]

    def setup_tracking(self, clients: dict[int, ClientInfo], roles: Roles | None = None) -> None:
        """Set the node-to-client map and the scenario roles; start a fresh history."""
        self.clients = dict(clients)
        self.roles = roles or Roles(frozenset(), frozenset())
        self.history = RunHistory(novel=self.roles.novel, attackers=self.roles.attackers)
        self._shapes: dict[str, tuple[int, ...]] | None = None

    def client_of_node(self, node_id: int) -> int | str:
        """Client id of a node (the node id in brackets if unknown)."""
        info = self.clients.get(node_id)
        return info.client_id if info else f"[node {node_id}]"

    def client_of(self, msg: Message) -> int | str:
        """Client id of a reply's sender (the node id in brackets if unknown)."""
        return self.client_of_node(msg.metadata.src_node_id)

    def valid_train_replies(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """Return the usable replies, in the order of their client ids; warn about the others.

        Replies arrive in whatever order the clients finish; sorting them makes
        every sum over clients (the average, Panacea's step) the same in every run.
        """
        good = []
        for msg in replies:
            problem = (reply_problem(msg, self._shapes or {}) if msg.metadata.src_node_id in self.clients
                       else "node joined after the start of the run")
            if problem is None:
                good.append(msg)
            else:
                log(WARNING, "Round %d: reply of client %s left out: %s",
                    server_round, self.client_of(msg), problem)
        return sorted(good, key=lambda m: self.client_of(m))

    def participants(self, server_round: int, client_ids: Iterable[int]) -> list[int]:
        """The sampled ``client_ids`` that train in ``server_round``: not novel, not dropped out."""
        training = [c for c in client_ids if c not in self.roles.novel]
        kept = self.roles.participants(server_round, training)
        if len(kept) < len(training):
            log(INFO, "Round %d: clients %s drop out (drop-rate %.2f)", server_round,
                sorted(set(training) - set(kept)), self.roles.drop_rate)
        return kept

    def client_config(self, server_round: int, client_id: int, config: ConfigRecord) -> ConfigRecord:
        """``config`` for one client: its own local epochs (or steps) under ``heterogeneous-epochs``."""
        if not self.roles.heterogeneous_epochs:
            return config
        key = "local-steps" if int(config.get("local-steps", 0)) > 0 else "local-epochs"
        if key not in config:
            return config
        own = ConfigRecord(dict(config))
        own[key] = self.roles.local_units(server_round, client_id, int(config[key]))
        return own

    def configure_train(self, server_round, arrays, config, grid):  # noqa: D102
        self._shapes = {k: tuple(v.numpy().shape) for k, v in arrays.items()}
        messages = list(super().configure_train(server_round, arrays, config, grid))
        cid = {m.metadata.dst_node_id: self.client_of_node(m.metadata.dst_node_id) for m in messages}
        kept = set(self.participants(server_round, [c for c in cid.values() if isinstance(c, int)]))
        out = []
        for m in messages:
            c = cid[m.metadata.dst_node_id]
            if c not in kept:
                continue
            content = m.content
            if self.roles.heterogeneous_epochs:  # Flower shares one RecordDict among all messages
                content = RecordDict(dict(content.items()))
                name = next(k for k, v in content.items() if isinstance(v, ConfigRecord))
                content[name] = self.client_config(server_round, c, content[name])
            out.append(Message(content, message_type=m.metadata.message_type,
                               dst_node_id=m.metadata.dst_node_id))
        return out

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Hook: the valid replies, just before the Flower strategy aggregates them."""
        return replies

    def aggregate_train(self, server_round, replies):  # noqa: D102
        good = self.valid_train_replies(server_round, replies)
        self.history.record_train(server_round, good, self.client_of)
        return super().aggregate_train(server_round, self.before_aggregation(server_round, good))

    def aggregate_evaluate(self, server_round, replies):  # noqa: D102
        replies = list(replies)
        self.history.record_evaluation(server_round, replies, self.client_of)
        return super().aggregate_evaluate(server_round, replies)


# ---------------------------------------------------------------------------
# Personalized strategies
# ---------------------------------------------------------------------------
class PersonalizedStrategy(TrackedStrategy, Strategy):
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
        self.client_ids: list[int] = []
        self.setup_tracking({})

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

    # -- Strategy API --------------------------------------------------------
    def summary(self) -> None:
        """Log the strategy's settings."""
        log(INFO, "\t├── %s: fraction-train %.2f, server device %s",
            type(self).__name__, self.fraction_train, self.device)

    def setup_tracking(self, clients: dict[int, ClientInfo], roles: Roles | None = None) -> None:  # noqa: D102
        super().setup_tracking(clients, roles)
        self.client_ids = sorted(i.client_id for i in clients.values())
        self._row = {cid: r for r, cid in enumerate(self.client_ids)}
        self._node_of_row = {self._row[i.client_id]: n for n, i in clients.items()}
        # rows of the clients that train (all but the novel ones)
        self.training_rows = torch.tensor(
            [r for r, c in enumerate(self.client_ids) if c not in self.roles.novel], dtype=torch.long)
        self.layout, self.models = None, None

    def _ensure_models(self, arrays: ArrayRecord) -> None:
        """On first use: the flat layout of the model and :meth:`initial_models`."""
        if self.layout is None:
            if not self.client_ids:
                raise RuntimeError("no clients: call setup_tracking(discover_clients(...)) first")
            self.layout = FlatLayout.from_arrays(arrays, self.param_keys)
            self._shapes = dict(self.layout.shapes)
            self.models = self.initial_models(self.layout.flatten(arrays).to(self.device))

    def initial_models(self, initial: torch.Tensor) -> torch.Tensor | None:
        """The per-client store at the start: every client holds the initial model."""
        return initial.unsqueeze(0).repeat(len(self.client_ids), 1)

    def _messages(self, rows: Iterable[int], vectors: torch.Tensor,
                  configs: Sequence[ConfigRecord], message_type: str) -> list[Message]:
        return [
            Message(RecordDict({"arrays": self.layout.unflatten(vec), "config": cfg}),
                    message_type=message_type, dst_node_id=self._node_of_row[int(row)])
            for row, vec, cfg in zip(rows, vectors, configs)
        ]

    def sample_rows(self, server_round: int) -> torch.Tensor:
        """Rows (clients) that train in ``server_round``: a seeded sample of ``fraction-train``
        of the training clients, less those that drop out (``drop-rate``)."""
        pool = self.training_rows.numpy()
        k = max(1, int(round(self.fraction_train * len(pool))))
        rng = np.random.default_rng([self.seed, server_round])
        sampled = np.sort(rng.choice(pool, size=k, replace=False))
        kept = set(self.participants(server_round, [self.client_ids[r] for r in sampled]))
        return torch.as_tensor([r for r in sampled if self.client_ids[r] in kept], dtype=torch.long)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send each sampled client the model :meth:`personalize` makes for it."""
        self._ensure_models(arrays)
        rows = self.sample_rows(server_round)
        config["server-round"] = server_round
        vectors, cfg = self.personalize(server_round, rows, config)
        log(INFO, "configure_train: %d of %d clients", len(rows), len(self.client_ids))
        configs = [self.client_config(server_round, self.client_ids[int(r)], cfg) for r in rows]
        return self._messages(rows, vectors, configs, MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Store each valid reply's model as its client's model; invalid ones change nothing."""
        good = self.valid_train_replies(server_round, replies)
        self.history.record_train(server_round, good, self.client_of)
        if good:
            rows = torch.as_tensor([self._row[self.client_of(m)] for m in good])
            vectors = torch.stack(
                [self.layout.flatten(next(iter(m.content.array_records.values()))) for m in good]
            )
            self.update(server_round, rows, vectors.to(self.device))
        return None, mean_metrics([m.content for m in good]) if good else None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Send every client its own personalized model for testing."""
        self._ensure_models(arrays)
        config["server-round"] = server_round
        n = len(self.client_ids)
        return self._messages(range(n), self.evaluation_models(), [config] * n, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Record every client's test metrics; return their means over clients."""
        means = self.history.record_evaluation(server_round, list(replies), self.client_of)
        return MetricRecord(means) if means else None
