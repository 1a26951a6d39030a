"""The ServerApp: validate the run config, find the clients, run the strategy, write metrics.json."""

from __future__ import annotations

import copy
import logging
import random
import time
from logging import ERROR, INFO, WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

import strategies
import tasks
from strategies.core.layout import dtypes_of, with_dtypes
from strategies.core.policy import ApartPolicy
from strategies.core.protocol import (
    BATCH_SIZE,
    DP_RUN,
    FEATURE_MEAN,
    FEATURE_STD,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
)
from strategies.core.records import (
    RunFile,
)
from strategies.core.replies import array_spec
from strategies.core.roster import ClientInfo
from strategies.core.settings import MOST_CLIENTS, RunCannotGoOn
from strategies.core.tracking import RunTracking
from tasks.dp import noise_allowance
from tasks.graphs import GraphError, build_graph, same_group_graph
from tasks.tabular import pooled, scaling_problem

from .config import GRAPH_K_AUTO, ConfigError, RunConfig
from .identity import IdentityError, fingerprint, parse_key, read_roster
from .server.checkpoint import Checkpoint
from .server.dashboards import Dashboards
from .server.delivery import ModelDelivery, new_token
from .server.discovery import ClientSetupError, discover_clients, discover_members
from .server.manifest import register_dir
from .server.membership import KEPT_ATTEMPTS, Membership
from .server.preflight import check_before_clients
from .server.recorder import RunRecorder
from .server.results import MODELS_FOLDER, RunFolder, Writer, XiFiles
from .server.rounds import RoundsFailedError, online_view, run_rounds
from .server.run_summary import say_summary
from .server.seasons import Season, check_family, read_warm_start
from .server.transport import send_and_receive
from .sizes import check_server_memory

app = ServerApp()


def server_device(cfg: RunConfig) -> str:
    """Where the server keeps and mixes models: ``server-device``, "auto" = cuda if present."""
    if cfg.server_device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.server_device.startswith("cuda"):
        try:
            torch.empty(0, device=cfg.server_device)
        except (RuntimeError, AssertionError) as err:
            raise ConfigError(f"run config 'server-device' = {cfg.server_device!r} is not usable "
                              f"here ({err}); allowed: auto, cpu or an available cuda device") from None
    return cfg.server_device


def run_setup(cfg: RunConfig, num_clients: int, param_keys: list[str],
              adjacency: torch.Tensor | None = None,
              tracking: RunTracking | None = None) -> strategies.RunSetup:
    """What the run determines beside its config: clients, parameter keys, device, graph,
    and what the strategy tracks (``tracking``; none: an empty run, as tests build one)."""
    infer = cfg.graph == "inferred" and strategies.STRATEGIES[cfg.strategy].uses_graph
    graph_k = 0
    if infer:  # a partitioned run's clients are all there; members may still join
        graph_k = cfg.graph_k_for(num_clients) if cfg.dataset != tasks.MEMBERS else \
            cfg.graph_k_for(MOST_CLIENTS)
        if cfg.graph_k == "auto" and graph_k < GRAPH_K_AUTO:
            log(INFO, "graph-k = auto: each client chooses %d neighbour(s) (the run has %d "
                "clients)", graph_k, num_clients)
    return strategies.RunSetup(
        num_clients=num_clients, param_keys=list(param_keys), device=server_device(cfg),
        adjacency=adjacency, num_attackers=len(cfg.roles(num_clients).attackers),
        fraction_train=cfg.fraction_train, seed=cfg.seed, dataset=cfg.dataset,
        data_setting=cfg.data_setting, groups=cfg.groups(num_clients),
        graph_k=graph_k,
        graph_warmup_rounds=cfg.graph_warmup_rounds if infer else 0,
        graph_guard_rounds=cfg.graph_guard_rounds if infer else 0,
        graph_similarity=cfg.graph_similarity,
        graph_guard_path=None if cfg.no_graph is None else (cfg.no_graph.settings, {
            LOCAL_STEPS: cfg.no_graph.local_steps, LOCAL_EPOCHS: cfg.no_graph.local_epochs,
            BATCH_SIZE: cfg.no_graph.batch_size}),
        true_adjacency=true_graph(cfg, cfg.data_config(num_clients)) if infer else None,
        tracking=tracking or RunTracking(),
    )


def true_graph(cfg: RunConfig, dc: tasks.DataConfig) -> torch.Tensor | None:
    """The graph an inferred one is measured against: the task's own (FL-60, TPT-48, the
    synthetic task), else its groups' (a partitioned setting with groups; edgeless where
    every client is its own group), else None (members' data)."""
    if cfg.dataset == tasks.MEMBERS:
        return None
    try:
        adj = tasks.task_graph(dc)
    except (OSError, ValueError) as err:  # only a measurement: the run goes on without it
        log(WARNING, "The task's graph cannot be read on the server (%s): the inferred "
            "graph is not measured against it", err)
        return None
    if adj is None:
        groups = cfg.groups(dc.num_clients)
        adj = None if groups is None else same_group_graph(list(groups))
    return None if adj is None else torch.from_numpy(np.asarray(adj, dtype=np.float32))


def client_graph(cfg: RunConfig, dc: tasks.DataConfig, names: list[str] | None = None,
                 policy: ApartPolicy | None = None) -> torch.Tensor | None:
    """The validated client graph of the run (only for strategies that use one).

    Rows are client ids 0..n-1 (:func:`fedamp_flwr.server.discovery.discover_clients` ensures
    that every partition id has its node); in a run over members' own data,
    ``names`` are the members' names by client id, which the graph file uses. ``policy``:
    the run's collaboration policy, whose pairs kept apart lose their edge.
    """
    if not strategies.STRATEGIES[cfg.strategy].uses_graph or cfg.graph in ("none", "inferred"):
        return None  # "inferred": the strategy builds it from the clients' updates
    task_adj = tasks.task_graph(dc) if cfg.graph == "task" else None
    adj = build_graph(cfg.graph, dc.num_clients, task_adj, cfg.graph_file, cfg.dataset,
                      cfg.groups(dc.num_clients), names)
    assert adj is not None  # only graph = "none" gives none, returned above
    graph = torch.from_numpy(adj)
    if policy is not None:  # the pairs kept apart lose their edge
        before = int(graph.sum()) // 2
        graph = graph.masked_fill(policy.mask(names or [str(i) for i in range(len(adj))]), 0)
        log(INFO, "collaboration-policy: %d edge(s) between members kept apart removed",
            before - int(graph.sum()) // 2)
    log(INFO, "Client graph '%s': %d clients, %d edges", cfg.graph, dc.num_clients,
        int(graph.sum()) // 2)
    return graph


def find_clients(cfg: RunConfig, grid: Grid, known: list[str], keys: dict[str, bytes],
                 source: str = "checkpoint") -> tuple[dict[int, ClientInfo], Membership]:
    """The clients of the run (node id -> info) and its members: partitions (every partition
    id on one node; no members), or members (those who prove their names, :mod:`fedamp_flwr.identity`,
    and whose data fits the run config's schema, numbered by name; ``known``: a
    checkpoint's, which keep their ids)."""
    schema = cfg.member_schema()
    if schema is None:
        return discover_clients(grid, cfg.min_nodes, timeout=cfg.node_wait_timeout), Membership()
    roster = member_roster(cfg, keys)
    # the keys in effect: the roster's where there is one (a key it revokes is gone)
    members = Membership(schema=schema, keys=dict(roster if roster is not None else keys),
                         roster=roster)
    if roster is None and keys:
        log(INFO, "Member names bound to the keys they first proved (%s): %s", source,
            ", ".join(f"{n} {fingerprint(k)}" for n, k in sorted(keys.items())))
    return discover_members(grid, cfg.min_nodes, members, timeout=cfg.node_wait_timeout,
                            known=known), members


def member_roster(cfg: RunConfig, pinned: dict[str, bytes]) -> dict[str, bytes] | None:
    """The run's ``member-roster`` (None: none), read and checked; a key it changes from the
    one a checkpoint bound is logged (a member's key rotated by the coordinator)."""
    if not cfg.member_roster:
        return None
    try:
        roster = read_roster(cfg.member_roster)
    except IdentityError as err:
        raise ConfigError(f"run config 'member-roster' = {cfg.member_roster!r}: {err}") from None
    for name, key in sorted(pinned.items()):
        if name in roster and roster[name] != key:
            log(WARNING, "Member '%s': the roster binds its name to the key %s (the run had "
                "%s): its key is rotated", name, fingerprint(roster[name]), fingerprint(key))
        elif name not in roster:
            log(WARNING, "Member '%s' of the run is not on the roster: it can no longer join",
                name)
    log(INFO, "Member roster %s: %d members, each with its own key", cfg.member_roster,
        len(roster))
    return roster


def member_scaling(cfg: RunConfig, clients: dict[int, ClientInfo],
                   checkpoint: Checkpoint | None) -> dict | None:
    """The run's standardizing statistics for members' vector inputs (member-scaling =
    "pooled"): pooled from the column statistics the members found now gave (a resumed run keeps
    its checkpoint's: the models were trained on them); None where there are none (another
    member-scaling, image inputs, or no member gave sums: under dp each uses its own)."""
    schema = cfg.member_schema()
    if schema is None or len(schema.input_shape) != 1:
        return None
    if checkpoint is not None and "member-scaling" not in checkpoint.config \
            and cfg.member_scaling != "none":  # its models were trained on raw inputs
        raise ConfigError(f"run config 'member-scaling' = {cfg.member_scaling!r}: the run being "
                          "resumed (an older version's) did not standardize its members' "
                          "inputs; allowed: none, to resume it")
    if cfg.member_scaling != "pooled":
        return None
    held = checkpoint.member_scaling if checkpoint else None
    if held is not None:  # what the members standardize by: checked as a message's is
        problem = scaling_problem(held.get("mean"), held.get("std"), schema.input_shape[0])
        if problem is not None:
            raise ConfigError(f"run config 'member-scaling' = 'pooled': the checkpoint's pooled "
                              f"scaling cannot be used ({problem}); allowed: a checkpoint "
                              "this app wrote")
        return held
    stats = [i.stats for i in clients.values() if i.stats]
    if not stats:
        log(INFO, "No member gave its column statistics (dp, or too few rows): each member "
            "standardizes its inputs by its own training rows")
        return None
    try:
        mean, std = pooled(stats)
    except ValueError as err:
        log(WARNING, "The members' column statistics cannot be pooled (%s): each member "
            "standardizes its inputs by its own training rows", err)
        return None
    rows = sum(int(s[0]) for s in stats)
    log(INFO, "Inputs standardized by each column's mean and standard deviation pooled over "
        "%d members' %d training rows (their counts, means and centred sums of squares)",
        len(stats), rows)
    return {"mean": mean, "std": std, "members": len(stats), "rows": rows}


def checkpoint_keys(checkpoint: Checkpoint | None, cfg: RunConfig,
                    source: str = "run config 'resume' = true") -> dict[str, bytes]:
    """The name -> key bindings a checkpoint holds: a resumed run's own, or those of the
    run a warm start reads (``source`` names which), so that a returning member's name stays
    bound to the key it proved before. A members' checkpoint of an older version binds no
    name: it is resumed or started from only with a roster (else the first node to claim a
    member's name would get that member's stored model)."""
    if not checkpoint or not checkpoint.client_names:
        return {}
    held = checkpoint.member_keys
    if held is None:
        if not cfg.member_roster:
            raise ConfigError(f"run config 'member-roster' = '': the checkpoint ({source}) "
                              "binds no member name to a key (an older version wrote it), so "
                              "any node could take a member's stored model by its name; "
                              "allowed: a roster of the members' keys (fedamp-flwr identity on "
                              "each member's machine)")
        return {}
    keys = {n: parse_key(k) for n, k in held.items()}  # read by Checkpoint.from_state
    # a member of the run whose name binds no key (a roster dropped it, or the record was
    # altered) would go to the first node to claim it, with its stored state
    unbound = sorted(n for n in checkpoint.client_names if n and n not in keys)
    if unbound and not cfg.member_roster:
        raise ConfigError(f"run config 'member-roster' = '': the checkpoint ({source}) binds no "
                          f"key to its member(s) {unbound[:5]}, so any node could take their "
                          "stored state by name; allowed: a roster of the members' keys "
                          "(fedamp-flwr roster on that run prints the ones it bound)")
    return keys


def model_fits(cfg: RunConfig):
    """A check of a checkpoint's global model against the run's: the same keys and shapes."""
    def check(state: dict) -> str | None:
        shapes = {k: tuple(v.shape) for k, v in
                  tasks.build_model(cfg.data_config(1), cfg.model).state_dict().items()}
        arrays = state.get("arrays")
        if not isinstance(arrays, dict):
            return "no global model in it"
        got = {k: tuple(v.shape) for k, v in arrays.items() if isinstance(v, torch.Tensor)}
        if got != shapes:
            diff = sorted(set(got.items()) ^ set(shapes.items()))[:3]
            return f"its global model does not fit the run's model ({diff})"
        return None
    return check


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured strategy round by round; write metrics.json and checkpoints.

    A bad run config, node config or data folder stops the run with one ERROR line
    ("Run stopped: ...", naming the key and what is allowed) before any training;
    so do rounds without usable replies (``max-failed-rounds``), after the round's
    records are written. The exception Flower then reports (the run's status
    ``finished:failed``) carries no traceback of this app.
    """
    try:
        _main(grid, context)
    except (ConfigError, ClientSetupError, RoundsFailedError, GraphError, RunCannotGoOn) as err:
        log(ERROR, "Run stopped: %s", err)
        # a copy without the app's traceback, its reason kept (a ConfigError's key and kind)
        stop = copy.copy(err)
        stop.__traceback__ = None
        setattr(stop, SAID, True)  # Flower's log of it needs no traceback (SaidOnce)
        raise stop from None


#: the attribute that marks an exception the ServerApp raised after it said why the run
#: stopped, in one line ("Run stopped: ..."): Flower then records the run as failed
SAID = "fedamp_said"


class SaidOnce(logging.Filter):
    """Flower logs the exception a ServerApp raises with its traceback ("Simulation raised an
    exception", "ServerApp raised an exception"). Where the app has said why already (the
    exception is marked :data:`SAID`), the traceback (Flower's frames and the app's re-raise)
    says nothing more: the record keeps its words, with the reason, and loses the
    traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and getattr(exc, SAID, False):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def _filter_once(logger: logging.Logger) -> None:
    """:class:`SaidOnce` on ``logger``, once (the module may be imported again)."""
    if not any(type(f).__name__ == SaidOnce.__name__ for f in logger.filters):
        logger.addFilter(SaidOnce())


_filter_once(logging.getLogger("flwr"))


def _main(grid: Grid, context: Context) -> None:
    run = ServerRun(grid, RunConfig.from_run_config(context.run_config))
    finished = False
    try:
        run.setup()
        run.restore()
        say_summary(run, result := run.execute())
        finished = result.finished
    finally:
        try:
            run.recorder.close(finished)
        finally:
            run.folder.release()


class ServerRun:
    """One run of the ServerApp, step by step: :meth:`setup` (the run folder, a checkpoint,
    the clients and members, the model and the strategy), :meth:`restore` (a checkpoint's
    state or a warm start's, :class:`fedamp_flwr.server.seasons.Season`, then the members that join)
    and :meth:`execute` (the rounds, each followed by the checkpoint, metrics.json and the
    dashboards of :class:`fedamp_flwr.server.recorder.RunRecorder`); the log's summary is
    :func:`fedamp_flwr.server.run_summary.say_summary`. Nothing of a step runs before the step before
    it has checked its inputs."""

    def __init__(self, grid: Grid, cfg: RunConfig) -> None:
        self.grid, self.cfg = grid, cfg
        check_before_clients(cfg)  # everything but the clients, before one is waited for
        # read once, on the coordinator's machine: the run keeps the policy it started with
        self.policy = cfg.apart_policy()
        self.folder = RunFolder(cfg)
        self.writer = Writer()
        self.delivery: ModelDelivery | None = None
        self.arrays: ArrayRecord | None = None
        self.done, self.spent, self.started = 0, 0.0, time.time()
        self.boards: Dashboards | None = None
        self.recorder = RunRecorder(self)

    def setup(self) -> None:
        """The run folder claimed, the checkpoint read, the clients found, the strategy built."""
        cfg, folder = self.cfg, self.folder
        if cfg.checkpoint_every and folder.secret is not None:  # read (and checked) already
            log(INFO, "Checkpoints are sealed with the coordinator's secret (HMAC-SHA256), and "
                "listed in the folder's sealed manifest; this machine's register (%s) keeps "
                "its generation", register_dir())
        elif cfg.checkpoint_every:
            log(INFO, "Checkpoints carry a plain sha256 (no checkpoint-secret): it detects "
                "damage, not an edit; whoever can write %s can edit a checkpoint, its digest "
                "and the manifest. This machine's register (%s) still refuses the folder put "
                "back from an older copy (docs/survival.md)", folder.path, register_dir())
        folder.claim()
        self.checkpoint = folder.load_checkpoint(check=model_fits(cfg)) if cfg.resume else None
        if self.checkpoint is not None:
            self.same_policy(self.checkpoint.collaboration_policy)
        # a new season's run starts from another run's last state (a resumed one has its own)
        self.season = Season(cfg, read_warm_start(cfg, folder.secret, model_fits(cfg))
                             if cfg.warm_start and self.checkpoint is None else None,
                             self.checkpoint.warm_start if self.checkpoint else None)
        log(INFO, "Run '%s': strategy %s, data %s; results in %s%s", folder.name, cfg.strategy,
            cfg.data_label, folder.path, f"; resuming after round {self.checkpoint.round}"
            if self.checkpoint else "")
        if cfg.validation_fraction > 0:
            log(INFO, "validation-fraction = %g: each client trains without that share of its "
                "training data and every 'test' number of this run is on it (a tuning run)",
                cfg.validation_fraction)
        self.find()
        self.build()

    def same_policy(self, held: object) -> None:
        """A resumed run keeps the collaboration policy it started with (its file's sha256)."""
        had = held.get("sha256") if isinstance(held, dict) else None
        now = self.policy.digest if self.policy is not None else None
        if had != now:
            raise ConfigError(f"run config 'collaboration-policy' = "
                              f"{self.cfg.collaboration_policy!r}: the run started with "
                              f"{'a policy of sha256 ' + str(had) if had else 'no policy'}; "
                              "allowed: the same file, unchanged, when resume = true (a "
                              "changed policy is a new run)")

    def say_policy(self) -> None:
        """Where the collaboration policy cannot hold: names no client has (yet), and a
        members run without a roster (a name goes to whoever proves it first)."""
        if self.policy is None:
            return
        known = set(self.base) if self.base else {str(i) for i in range(self.n)}
        unknown = sorted(self.policy.names() - known)
        log(WARNING if unknown else INFO, "collaboration-policy: %d group(s) kept apart%s",
            len(self.policy.groups), f"; names no client of the run has (yet): {unknown[:10]}"
            if unknown else "")
        if self.has_members and not self.cfg.member_roster:
            log(WARNING, "collaboration-policy without a member-roster: a name is taken by the "
                "first node to prove it, so a member kept apart could join under a name the "
                "policy does not hold (give a member-roster, docs/federation.md)")

    def find(self) -> None:
        """The clients and members (a checkpoint's first, in their order; the others join)."""
        cfg, checkpoint = self.cfg, self.checkpoint
        known = list(checkpoint.client_names or []) if checkpoint else []
        # the names bound to keys: the run's own (resumed), or last season's (a warm start)
        warm = self.season.warm
        keys = checkpoint_keys(checkpoint, cfg) if checkpoint else checkpoint_keys(
            warm.checkpoint if warm else None, cfg, self.season.key)
        clients, members = find_clients(cfg, self.grid, known, keys,
                                        "checkpoint" if checkpoint else "warm start")
        if checkpoint:  # the attempts of the run so far, before this session's
            before = list(checkpoint.impostors or [])
            members.attempts[:0] = before
            del members.attempts[:-KEPT_ATTEMPTS]
            members.impostors += max(checkpoint.impostor_count or 0, len(before))
        self.members = members
        # the models a warm start brings were trained on its run's scaling: it is kept
        self.scaling = member_scaling(cfg, clients, checkpoint or (
            warm.checkpoint if warm is not None else None))
        self.has_members = bool(members.names)
        # a checkpoint's members first: the strategy resumes with them, newer ones join after
        self.base = known if checkpoint and members.names else list(members.names)
        n = self.n = len(self.base) if members.names else len(clients)
        self.joining = [i for i in clients.values() if i.client_id >= n]
        self.clients = {node: i for node, i in clients.items() if i.client_id < n}
        check_server_memory(cfg, n, read_data=True)  # the clients found (npz: its file read)
        self.dc = cfg.data_config(n)

    def build(self) -> None:
        """The model and the strategy, with the clients, the scenario and the reply checks."""
        cfg, n = self.cfg, self.n
        self.say_policy()
        adjacency = client_graph(cfg, self.dc, self.base or None, self.policy)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)  # Flower's strategies sample nodes with the random module
        model = tasks.build_model(self.dc, cfg.model)
        self.initial = ArrayRecord(model.state_dict())
        param_keys = [name for name, _ in model.named_parameters()]
        roles = cfg.roles(n)
        if roles.novel or roles.attackers or roles.drop_rate or roles.heterogeneous_epochs:
            log(INFO, "Scenario: novel clients %s, attackers %s, drop-rate %.2f, heterogeneous "
                "epochs %s", sorted(roles.novel), sorted(roles.attackers), roles.drop_rate,
                roles.heterogeneous_epochs)
        noise = noise_allowance(cfg.dp_clip, cfg.dp_noise_multiplier, sum(  # dp = "update":
            p.numel() for p in model.state_dict().values() if torch.is_floating_point(p))) \
            if cfg.dp == "update" else 0.0  # a member's own noise is not a hostile update
        self.xi_files = XiFiles(self.folder.path, cfg.xi_every, cfg.xi_dtype,
                                cfg.num_server_rounds)
        tracking = RunTracking(self.clients, roles, cfg.max_update_ratio, noise,
                               self.members.schema is not None, self.xi_files, self.policy)
        self.strategy = strategies.build_strategy(
            cfg.strategy, cfg.settings, run_setup(cfg, n, param_keys, adjacency, tracking))
        self.members.names = list(self.base)
        if self.season.warm is not None:
            check_family(self.season.warm, self.strategy, cfg.strategy, self.season.key)

    def restore(self) -> None:
        """Continue from the checkpoint (its strategy state, model, random state, rounds),
        take the members that join, and open the models' delivery."""
        cfg, checkpoint = self.cfg, self.checkpoint
        self.arrays = self.initial
        token = checkpoint.run_token if checkpoint else ""
        self.token = token or new_token()
        if checkpoint is not None:
            if checkpoint.num_clients != self.n:
                raise ConfigError(f"run config 'resume' = true: the run had "
                                  f"{checkpoint.num_clients} clients, {self.n} are "
                                  "connected; allowed: the same clients")
            try:
                self.strategy.load_state_dict(checkpoint.strategy, self.initial)
            except (ValueError, KeyError, RuntimeError) as err:
                raise ConfigError(f"run config 'resume' = true: the checkpoint's state does "
                                  f"not fit this run's strategy ({type(err).__name__}: {err})"
                                  ) from None
            # in the model's dtypes (a checkpoint of an older version may hold float64 counters)
            self.arrays = with_dtypes(ArrayRecord(checkpoint.arrays), dtypes_of(self.initial))
            random.setstate(checkpoint.random_state)
            self.done, self.spent = checkpoint.round, checkpoint.wall_time_s
        elif self.season.warm is not None:
            self.arrays = self.season.start(self.strategy,
                                            self.base or [str(i) for i in range(self.n)],
                                            self.initial)
        for info in sorted(self.joining, key=lambda i: i.client_id):
            self.join(info)
        self.started = time.time()
        self.kind = tasks.data_info(self.dc).kind
        if cfg.save_models != "none":
            self.delivery = ModelDelivery(
                cfg, self.dc, self.folder.name, self.token, self.folder.path / MODELS_FOLDER,
                array_spec(self.initial), self.strategy.history, lambda: self.members.names,
                self.writer.submit, self.strategy.learned_from, lambda: self.season.card_starts(
                    self.strategy.started_from, self.members.names or [
                        str(i) for i in range(self.num_clients)]), self.strategy.graph_edges)
        history = self.strategy.history.rounds
        self.boards = Dashboards.open(cfg, self.folder.path, self.done + 1, self.token,
                                      {k: r for k, r in history.items() if k <= self.done},
                                      list(self.members.names) or None)

    def join(self, info: ClientInfo) -> None:
        """A member the run does not know yet joins with the next client id (a graph file
        that cannot place it leaves it out, with the reason, and the run goes on)."""
        cfg, members = self.cfg, self.members
        graph = None
        if strategies.STRATEGIES[cfg.strategy].uses_graph and cfg.graph not in ("none", "inferred"):
            try:
                graph = client_graph(cfg, cfg.data_config(info.client_id + 1),
                                     members.names + [info.name], self.policy)
            except (GraphError, OSError) as err:
                members.refused[info.node_id] = f"{info.label} cannot join: the client graph: {err}"
                log(WARNING, "%s", members.refused[info.node_id])
                return
        if len(members.names) >= MOST_CLIENTS:
            members.refused[info.node_id] = (f"{info.label} cannot join: the run has "
                                              f"{MOST_CLIENTS} members, the most it takes")
            log(WARNING, "%s", members.refused[info.node_id])
            return
        self.strategy.add_client(info, graph)
        members.joined(info)
        self.season.join(self.strategy, info)

    @property
    def num_clients(self) -> int:
        return len(self.members.names) or self.n

    def configs(self) -> tuple[ConfigRecord, ConfigRecord]:
        """What every training and every evaluation message carries."""
        cfg, scaling = self.cfg, self.scaling
        scaled = ({FEATURE_MEAN: list(scaling["mean"]), FEATURE_STD: list(scaling["std"])}
                  if scaling else {})
        train = ConfigRecord({
            **cfg.training(), **scaled,
            **({DP_RUN: str(self.folder.path.resolve())} if cfg.dp != "none" else {}),
        })
        return train, ConfigRecord({BATCH_SIZE: cfg.batch_size, **scaled})

    def execute(self) -> RunFile:
        """The rounds left, then the models still to deliver; the final metrics.json record."""
        cfg, delivery = self.cfg, self.delivery
        train_config, evaluate_config = self.configs()
        assert self.arrays is not None, "restore() first"
        try:
            if self.done < cfg.num_server_rounds:
                self.arrays = run_rounds(
                    self.strategy, self.grid, self.arrays, first_round=self.done + 1,
                    last_round=cfg.num_server_rounds, train_config=train_config,
                    evaluate_config=evaluate_config, round_timeout=cfg.round_timeout,
                    query_timeout=min(cfg.node_wait_timeout, cfg.round_timeout),
                    after_round=self.recorder.after_round, max_failed_rounds=cfg.max_failed_rounds,
                    on_join=self.join if self.has_members else None, members=self.members,
                    delivery=delivery, min_clients_evaluated=cfg.min_clients_evaluated)
                if delivery is not None:
                    delivery.deliver_rest(self.strategy, self.grid,
                                          online_view(self.grid, self.strategy.tracker),
                                          self.arrays, evaluate_config, cfg.round_timeout,
                                          send_and_receive)
            else:
                log(INFO, "The run has done its %d rounds already; raise num-server-rounds to "
                    "go on", self.done)
                self.folder.write_metrics(self.recorder.record(self.done).to_dict())
        finally:
            self.writer.close()  # every checkpoint and metrics.json written, whatever happened
        return self.recorder.record(cfg.num_server_rounds)
