"""The typed, validated run config: the app's generic keys, and each method's own.

Every key of ``[tool.flwr.app.config]`` is either a field of :class:`RunConfig`
(hyphens become underscores): the generic keys of the task, the rounds, local
training, run management and scenarios; or a field of a method's settings
class (:class:`strategies.core.settings.Settings`, registered with its
strategy), which the method's module declares and checks.
:meth:`RunConfig.from_run_config` checks names, types and ranges of both and
raises :class:`ConfigError` naming the key, the value and what is allowed,
before any work starts; the chosen strategy's settings are ``cfg.settings``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import strategies
import tasks
from strategies.core.policy import ApartPolicy, read_policy
from strategies.core.protocol import TRAINING_KEYS, is_name
from strategies.core.registry import GRAPHS, key_rows, method_keys, settings_classes, tuned_values
from strategies.core.settings import (
    MOST_BATCH,
    MOST_CHECKPOINTS,
    MOST_CLIENTS,
    MOST_EPOCHS,
    MOST_INPUTS,
    MOST_OUTPUTS,
    MOST_ROUNDS,
    MOST_SAMPLES,
    MOST_STEPS,
    MOST_TIMEOUT,
    ConfigError,
    NoSettings,
    Settings,
    SettingsContext,
    bad,
    check_value,
    coerce,
    field_keys,
    integer_in,
    integer_words,
    one_of,
    setting,
)
from tasks.graphs import SIMILARITIES
from tasks.models import model_problem
from tasks.recipes import PARTITIONINGS
from tasks.scenarios import Roles, scenario_roles

from .sizes import check_client_memory

#: the longest run-name (a folder name on the coordinator's and the members' machines)
RUN_NAME_MOST = 200
#: which models a run keeps (fedamp_flwr/server/delivery.py)
SAVE_MODES = ("final", "every-checkpoint", "best-validation", "none")
#: how members' vector inputs are standardized (tasks/tabular.py)
SCALINGS = ("pooled", "own", "none")
#: differential privacy on the members' machines (fedamp_flwr/member/ledger.py)
DP_MODES = ("none", "update", "dp-sgd")

# The generic settings that take "auto", and their values where neither the task nor the
# strategy says otherwise: the FedAMP paper's local training (10 epochs there; 5 here,
# see docs/reproducing.md). A method's own "auto" keys are its settings class's ``AUTO``.
GENERIC_AUTO: dict[str, Any] = {"local-epochs": 5, "local-steps": 0, "batch-size": 100,
                                "learning-rate": 1e-3, "optimizer": "adam", "alone": False}

#: The generic settings that take "auto" resolved when the run knows its clients (not from
#: the layers of :func:`auto_layers`): graph-k, each client's neighbours in an inferred graph.
LATE_AUTO = ("graph-k",)
#: graph-k = "auto": each client chooses this many neighbours, or every other client where
#: the run has fewer (:meth:`RunConfig.graph_k_for`)
GRAPH_K_AUTO = 3

#: the guard of an inferred graph compares it with this strategy (no graph) as the run config
#: would run it
NO_GRAPH_PATH = "pfedhn"
_bad = bad  # the shared ConfigError of a key (strategies.core.settings)
__all__ = ["AutoLayer", "ConfigError", "RunConfig", "auto_layers", "auto_values", "explain",
           "parse_shape"]


#: The "auto" local training of members' tables (vector inputs): a batch of 16 rows, so that
#: a member of a few dozen to a few hundred rows takes a few steps an epoch, not one, and a
#: learning rate of 3e-3. Chosen on validation rows (validation-fraction 0.25) for FedAMP,
#: HeurFedAMP and Separate on the wine table's three members (docs/tuning.md, python -m
#: experiments.tabular ... --set ... validation-fraction=0.25): the batch size among 100 (the
#: generic value), 32 and 16 (16 best or equal best for each), then the learning rate among
#: 1e-3, 3e-3 and 1e-2 with 2, 5 or 10 local epochs (3e-3 and 5: the best mean over the three
#: methods, Separate's best, within 0.1 point of FedAMP's and HeurFedAMP's).
TABLE_AUTO: dict[str, Any] = {"batch-size": 16, "learning-rate": 3e-3, "alone": True}


@dataclass(frozen=True)
class AutoLayer:
    """One of the three layers of "auto" values (:func:`auto_layers`): its name and, for each
    key, the layer's tables that name it with their values, in order (the last gives it)."""

    name: str
    sources: dict[str, list[tuple[str, Any]]]

    @property
    def values(self) -> dict[str, Any]:
        """The layer's value of each key it names."""
        return {key: tables[-1][1] for key, tables in self.sources.items()}


def _layer(name: str, tables: list[tuple[str, Mapping[str, Any]]]) -> AutoLayer:
    """The layer ``name`` of ``tables`` (where, in words; values), each overriding the ones
    before it."""
    sources: dict[str, list[tuple[str, Any]]] = {}
    for where, table in tables:
        for key, value in table.items():
            sources.setdefault(key, []).append((where, value))
    return AutoLayer(name, sources)


def auto_layers(dataset: str, strategy: str, setting: str = "", table: bool = False,
                model: str = "auto") -> list[AutoLayer]:
    """Where the values of "auto" settings come from, for ``strategy`` on ``dataset`` (in the
    data setting ``setting``, ``<dataset>/<variant>``: :attr:`RunConfig.tuning_key`): three
    layers, most general first, each overriding the ones before:

    1. the key's declaration: :data:`GENERIC_AUTO` and each method's ``Settings.AUTO``;
    2. the run's task and strategy, the most specific table last: the task's
       (``TaskSpec.auto``), members' tables' (:data:`TABLE_AUTO`, with ``table``), the
       strategy's (``register_strategy(auto=...)``, e.g. pFedHN's reference trainer), the
       strategy's with the run's named ``model`` (``task_auto["model:<name>"]``: a members
       run of the traffic GRU) and the strategy's on this task (``task_auto[dataset]``);
    3. what a tuning run chose for this strategy and data setting (``strategies/tuned.json``,
       docs/tuning.md).

    ``fedamp-flwr explain KEY`` names the layer and the table that gave a run its value.
    """
    entry = strategies.STRATEGIES[strategy]
    return [
        _layer("the key's declaration", [("GENERIC_AUTO", GENERIC_AUTO)] + [
            (f"{cls.__name__}.AUTO", cls.AUTO) for cls in settings_classes()]),
        _layer("the run's task and strategy", [
            (f"the task {dataset!r}", tasks.get_task(dataset).auto),
            ("members' tables (TABLE_AUTO)", TABLE_AUTO if table else {}),
            (f"the strategy {strategy!r}", entry.auto),
            (f"the strategy {strategy!r} with the model {model!r}",
             entry.task_auto.get(f"model:{model}", {}) if model != "auto" else {}),
            (f"the strategy {strategy!r} on {dataset!r}", entry.task_auto.get(dataset, {}))]),
        _layer("the tuning", [(f"strategies/tuned.json ({strategy} on {setting})",
                               tuned_values(strategy, setting) if setting else {})])]


def auto_values(dataset: str, strategy: str, setting: str = "", table: bool = False,
                model: str = "auto") -> dict[str, Any]:
    """The values of the "auto" settings for ``strategy`` on ``dataset`` (:func:`auto_layers`,
    each layer overriding the ones before)."""
    values: dict[str, Any] = {}
    for layer in auto_layers(dataset, strategy, setting, table, model):
        values.update(layer.values)
    return values


def explain(run_config: Mapping[str, Any], key: str) -> list[str]:
    """Where the value of ``key`` in a run of ``run_config`` comes from, in lines: the run
    config, the key's declared default, or the layer of "auto" that gives it, with its table
    (and the layers it overrides). Raises ConfigError for an unknown key or a bad run
    config."""
    cfg = RunConfig.from_run_config(run_config)
    values = cfg.to_dict()
    if key not in values:
        raise ConfigError(f"unknown run config key {key!r}; allowed: a key of "
                          "docs/configuration.md (its generic keys and the methods')",
                          key=key, kind="unknown")
    value = values[key]
    if key in run_config and run_config[key] != "auto":
        return [f"{key} = {value!r}: set in the run config"]
    if default_values()[key] != "auto":
        return [f"{key} = {value!r}: the key's declared default"]
    layers = auto_layers(cfg.dataset, cfg.strategy, cfg.tuning_key, cfg.table_inputs,
                         cfg.model)
    found = [(f"layer {n} of {len(layers)}, {layer.name}", table, v)
             for n, layer in enumerate(layers, 1) for table, v in layer.sources.get(key, [])]
    if not found:
        doc = {**RunConfig.generic_fields(), **method_keys()}[key].metadata.get("doc", "")
        when = "when the run knows its clients" if key in LATE_AUTO else \
            "by the method when the run starts"
        return [f"{key} = {value!r}: resolved {when} ({doc})"]
    layer, table, _ = found[-1]
    lines = [f"{key} = {value!r}: \"auto\", given by {layer}: {table}"]
    return lines + [f"  (overrides {layer}: {table}: {v!r})" for layer, table, v in
                    reversed(found[:-1])]


def parse_shape(text: str) -> tuple[int, ...] | None:
    """``"6"`` or ``"1,28,28"`` as a shape (1 or 3 positive integers; 1 or 3 channels); None
    if it is not one."""
    try:
        shape = tuple(int(p) for p in text.replace(" ", "").split(","))
    except ValueError:
        return None
    if len(shape) not in (1, 3) or min(shape) < 1 or (len(shape) == 3 and shape[0] not in (1, 3)):
        return None
    return shape


def parse_categories(text: str) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """``"sex: female, male; smoker: no, yes"`` as ((column, categories), ...): columns
    separated by ``;``, each ``column: category, category, ...``, names stripped, distinct,
    non-empty; ``""`` gives (); None if ``text`` is not of that form."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for part in (p for p in text.split(";") if p.strip()):
        column, colon, rest = part.partition(":")
        names = tuple(n.strip() for n in rest.split(","))
        if not colon or not column.strip() or not all(names) or len(set(names)) != len(names):
            return None
        out.append((column.strip(), names))
    return tuple(out) if len({c for c, _ in out}) == len(out) else None


@dataclass(frozen=True)
class DataKeys:
    """The run config's keys of the data: the method, the task, how a pool is split, the
    seed; and the data setting they name (its labels, its client groups)."""

    strategy: str = setting("fedamp", "the method (docs/methods.md)",
                            allowed="a registered strategy's name (above)")
    dataset: str = setting("synthetic", "the task; members: every member brings its own file",
                           allowed="a task's name (Data and tasks, above)")
    partitioning: str = setting("practical", "how a pool dataset is split among the clients",
                                **one_of(*PARTITIONINGS))
    data_dir: str = setting("", 'the data\'s local folder (npz: the file); "": the hub')
    dirichlet_alpha: float = setting(0.5, "partitioning = dirichlet: the concentration",
                                     ok=lambda v: v > 0, allowed="a number > 0")
    test_samples: int = setting(100, "test samples per client, from its own mixture",
                                **integer_in(1, MOST_SAMPLES))
    validation_fraction: float = setting(
        0.0, "> 0: each client holds out this share of its training rows and is evaluated on "
        "it instead of its test split (a tuning run)", ok=lambda v: 0 <= v < 1,
        allowed="a number in [0, 1) (0: evaluate on the test split)")
    seed: int = setting(42, "the run's seed (data, models, sampling, scenarios)",
                        ok=lambda v: 0 <= v < 2**32,
                        allowed="an integer in [0, 2^32) (numpy and torch seeds)")

    @property
    def data_setting(self) -> str:
        """The data setting: the partitioning of a pool dataset, ``federated`` for a task whose
        data defines its clients (fl60, tpt48, npz, members)."""
        return "federated" if tasks.get_task(self.dataset).federated else self.partitioning

    @property
    def data_label(self) -> str:
        """The data setting in words: ``mnist/practical``, or ``fl60`` for a federated task."""
        federated = tasks.get_task(self.dataset).federated
        return self.dataset if federated else f"{self.dataset}/{self.partitioning}"

    def groups(self, num_clients: int) -> list[int] | None:
        """Each client's group of same-distribution clients, where the data setting has them."""
        return tasks.client_groups(self.dataset, self.partitioning, num_clients)

    @property
    def run_label(self) -> str:
        """``<strategy>-<dataset>[-<partitioning>]-s<seed>``: the partitioning only for pool
        datasets (federated tasks such as fl60 and tpt48 define their clients)."""
        parts = [self.strategy, self.dataset]
        if not tasks.get_task(self.dataset).federated:
            parts.append(self.partitioning)
        return "-".join(parts) + f"-s{self.seed}"


@dataclass(frozen=True)
class FolderKeys(DataKeys):
    """The run config's keys of the run's folder: its name and place, resume and warm start,
    checkpoints, the weight matrices' files and the dashboards."""

    results_dir: str = setting("results", "where run folders are made")
    run_name: str = setting(
        "", 'the run\'s folder; "": a unique name with the start time',
        ok=lambda v: v == "" or is_name(v, RUN_NAME_MOST),
        allowed=f"letters, digits and - _ . @ (at most {RUN_NAME_MOST}; it names the run's "
        "folder, on members' nodes too), or \"\" for a unique name")
    label: str = setting("", "a name for the method in reports")
    resume: bool = setting(False, "continue the run run-name from its checkpoint")
    overwrite: bool = setting(False, "replace what the folder of run-name holds")
    warm_start: str = setting(
        "", "another run's folder: this run starts from its newest checkpoint, each returning "
        'member from its own model, by name ("": from the initial model)')
    checkpoint_every: int = setting(1, "checkpoint and metrics.json every this many rounds",
                                    **integer_in(0, MOST_ROUNDS, "0: no checkpoints"))
    checkpoint_keep: int = setting(2, "checkpoints kept", **integer_in(
        1, MOST_CHECKPOINTS, "checkpoints kept: a damaged one falls back to the one before"))
    xi_every: int = setting(1, "FedAMP's weight matrices to xi/ every this many rounds and the "
                            "last", **integer_in(0, MOST_ROUNDS, "0: not written"))
    xi_dtype: str = setting("float32", "the weight matrices' dtype", **one_of("float32",
                                                                            "float16"))
    tensorboard: bool = setting(False, "TensorBoard event files in the run's folder's "
                                "tensorboard/ (the tensorboard extra)")
    mlflow: bool = setting(False, "the run's records to an MLflow run (the mlflow extra)")
    mlflow_uri: str = setting(
        "", 'the MLflow tracking URI ("": a file store in <results-dir>/mlruns)',
        ok=lambda v: v == "" or (":" in v and "\n" not in v),
        allowed='"" (a file store in <results-dir>/mlruns) or a tracking URI with its scheme '
        "(file:/path, sqlite:///path.db, http://host:5000)")

    def results_path(self, name: str) -> Path:
        """Folder of the run ``name``'s outputs (``<results-dir>/<name>``), made absolute."""
        return (Path(self.results_dir).expanduser() / name).resolve()

    def mlflow_shown(self) -> str:
        """:meth:`mlflow_store` as logs and files may say it: without a password."""
        return redact_uri(self.mlflow_store())

    def mlflow_store(self) -> str:
        """The MLflow tracking URI of the run: ``mlflow-uri``, else a file store in
        ``<results-dir>/mlruns``."""
        return self.mlflow_uri or (Path(self.results_dir).expanduser().resolve()
                                   / "mlruns").as_uri()

    def _check_dashboards(self) -> None:
        """The MLflow keys together (the packages are the ServerApp's: a member's node needs
        neither, :func:`fedamp_flwr.server.dashboards.check_packages`)."""
        if self.mlflow_uri and not self.mlflow:
            raise _bad("mlflow-uri", self.mlflow_uri, '"" unless mlflow = true', kind="conflict")


@dataclass(frozen=True)
class RoundKeys(FolderKeys):
    """The run config's keys of the rounds and the clients' local training (their "auto"
    values: :func:`auto_values`)."""

    num_server_rounds: int = setting(10, "rounds", **integer_in(1, MOST_ROUNDS))
    round_timeout: float = setting(
        3600.0, "seconds to wait for a phase's replies", ok=lambda v: 0 < v <= MOST_TIMEOUT,
        allowed=f"a number > 0, at most {MOST_TIMEOUT:g} (seconds: 7 days)")
    node_wait_timeout: float = setting(
        600.0, "seconds to wait for min-nodes", ok=lambda v: 0 < v <= MOST_TIMEOUT,
        allowed=f"a number > 0, at most {MOST_TIMEOUT:g} (seconds: 7 days)")
    max_update_ratio: float = setting(
        100.0, "a reply is left out when its update's norm exceeds this x max(the sent "
        "model's norm, 1)",
        ok=lambda v: 0 < v < math.inf, allowed="a finite number > 0")
    max_failed_rounds: int = setting(0, "rounds in a row without usable replies before the "
                                     "run stops", **integer_in(0, MOST_ROUNDS, "rounds in a "
                                     "row without usable replies before the run stops"))
    min_clients_evaluated: int = setting(
        0, "> 0: a round whose evaluation covers fewer clients fails", **integer_in(
            0, MOST_CLIENTS, "0: any number; else a round whose evaluation covers fewer "
            "clients fails, as max-failed-rounds counts"))
    fraction_train: float = setting(1.0, "share of the clients trained each round",
                                    ok=lambda v: 0 < v <= 1, allowed="a number in (0, 1]")
    min_nodes: int = setting(2, "nodes to wait for", **integer_in(1, MOST_CLIENTS))
    # Local training ("auto": auto_values)
    local_epochs: int | str = setting("auto", "local epochs a round",
                                      **integer_in(1, MOST_EPOCHS))
    batch_size: int | str = setting("auto", "mini-batch size", **integer_in(1, MOST_BATCH))
    learning_rate: float | str = setting("auto", "the clients' learning rate",
                                         ok=lambda v: v > 0, allowed="a number > 0")
    optimizer: str = setting("auto", "the clients' optimizer", **one_of("adam", "sgd"))
    alone: bool | str = setting(
        "auto", "each client also trains the run's model alone on its own rows, a round's "
        "work each round (and a table's linear model), scored on the same test rows: the "
        "log's closing lines compare (auto: members' tables and the synthetic task)",
        ok=lambda v: isinstance(v, bool), allowed='"auto", true or false')
    server_device: str = setting(
        "auto", "where the server keeps and mixes models (auto: cuda if present)",
        ok=lambda v: v in ("auto", "cpu") or v.startswith("cuda"),
        allowed='"auto", "cpu" or "cuda[:N]"')
    client_batching: str = setting(
        "auto", "the in-process engine (simulation.py --engine inprocess) trains a round's "
        "clients as one stacked model where the model and method allow (auto), or one after "
        "another (off); Flower's engines and fleets train each client in its own process",
        **one_of("auto", "off"))
    local_steps: int | str = setting("auto", "> 0: this many steps a round instead of epochs",
                                     **integer_in(0, MOST_STEPS, "0: use local-epochs"))

    def resolved(self, auto: Mapping[str, Any]) -> Self:
        """This config with every generic "auto" setting (:data:`GENERIC_AUTO`) given its
        value from ``auto`` (:func:`auto_values`).

        A learning rate belongs to its optimizer (Adam's 1e-3 would barely move SGD, SGD's
        0.3 would throw Adam off): an "auto" learning rate with an ``optimizer`` other than
        the "auto" one is a ConfigError."""
        if (self.learning_rate == "auto" and self.optimizer != "auto"
                and self.optimizer != auto["optimizer"]):
            raise _bad("learning-rate", "auto",
                       f"a number: \"auto\" is {auto['learning-rate']:g}, the learning rate of "
                       f"optimizer {auto['optimizer']!r} here, and this run sets optimizer = "
                       f"{self.optimizer!r}", kind="conflict")
        return dataclasses.replace(self, **{
            key.replace("-", "_"): auto[key] for key in GENERIC_AUTO
            if getattr(self, key.replace("-", "_")) == "auto"})


@dataclass(frozen=True)
class GraphKeys(RoundKeys):
    """The run config's keys of the client graph and the collaboration policy."""

    graph: str = setting("task", "the client graph (Panacea)", **one_of(*GRAPHS))
    graph_file: str = setting("", 'graph = "file": an edge-list CSV of client ids')
    graph_k: int | str = setting(
        "auto", f'graph = "inferred": neighbours each client chooses (auto: {GRAPH_K_AUTO}, or '
        "every other client in a run of fewer)",
        **integer_in(1, MOST_CLIENTS, "and below the number of clients"))
    graph_warmup_rounds: int = setting(2, 'graph = "inferred": rounds before the graph is built',
                                       **integer_in(1, MOST_ROUNDS))
    graph_similarity: str = setting(
        "centered", 'graph = "inferred": how updates are compared (centered: their cosine '
        "less the clients' mean update)", **one_of(*SIMILARITIES))
    graph_guard_rounds: int = setting(
        4, 'graph = "inferred": the guard\'s rounds after the warm-up: the run trains as pFedHN '
        "while the graph's and no graph's hypernetworks train on the side; the graph takes "
        "over only if it wins on held-out training rows (0: no guard)",
        **integer_in(0, MOST_ROUNDS, "0: the inferred graph is used unchecked"))
    collaboration_policy: str = setting(
        "", "a TOML file of members kept apart ([[apart]] members = [...]): they never weigh "
        'each other\'s models ("": none)')

    def apart_policy(self) -> ApartPolicy | None:
        """The run's collaboration policy (``collaboration-policy``), read and checked: the
        ServerApp's only (the file is on the coordinator's machine; a member never opens
        it)."""
        return read_policy(self.collaboration_policy) if self.collaboration_policy else None

    def graph_choices(self) -> tuple[str, ...]:
        """The values of ``graph`` this run takes: its strategy's (every value where the
        strategy uses no graph: the key is not read), less "task" where the task defines no
        client graph, and less "task" and "groups" for members (they bring neither)."""
        entry = strategies.STRATEGIES[self.strategy]
        if not entry.uses_graph:
            return GRAPHS
        members = self.dataset == tasks.MEMBERS
        no_task = members or tasks.get_task(self.dataset).has_graph is False
        return tuple(g for g in entry.graphs
                     if not (g == "task" and no_task) and not (g == "groups" and members))

    def _check_graph(self) -> None:
        """``graph`` is one the strategy takes on this data (:meth:`graph_choices`)."""
        allowed = self.graph_choices()
        if self.graph in allowed:
            return
        why = ("members bring no client graph" if self.dataset == tasks.MEMBERS else
               f"the task {self.dataset!r} defines no client graph") \
            if self.graph in strategies.STRATEGIES[self.strategy].graphs else \
            "the graphs it takes"
        raise _bad("graph", self.graph, f"{', '.join(allowed)} (strategy {self.strategy!r} on "
                   f"{self.data_label}: {why})")

    def graph_k_for(self, num_clients: int) -> int:
        """``graph-k`` in a run of ``num_clients`` clients: "auto" is :data:`GRAPH_K_AUTO`, or
        every other client where the run has fewer; a number must be below the clients'
        count (a ConfigError naming the range)."""
        if self.graph_k == "auto":
            return max(1, min(GRAPH_K_AUTO, num_clients - 1))
        k = int(self.graph_k)
        if not k < num_clients:
            raise _bad("graph-k", k, f"auto, or an integer in [1, {max(1, num_clients - 1)}] "
                       f"(the run has {num_clients} clients)")
        return k

    def _check_policy(self) -> None:
        """The strategy can honour a policy: by its own weights (FedAMP, HeurFedAMP), by
        weighing no one (Separate), or through a client graph. No file is read here: every
        member's ClientApp checks the run config too."""
        entry = strategies.STRATEGIES[self.strategy]
        if entry.keeps_apart or entry.uses_graph:  # (a graph method takes no graph = "none")
            return
        can = sorted(n for n, e in strategies.STRATEGIES.items() if e.keeps_apart or e.uses_graph)
        raise _bad("collaboration-policy", self.collaboration_policy,
                   f'"" for strategy {self.strategy!r} (it mixes every client into models they '
                   f"all share); a policy with {', '.join(can)} (a graph method with a graph)",
                   kind="conflict")


@dataclass(frozen=True)
class TaskKeys(GraphKeys):
    """The run config's keys of the scenarios, the tasks' own variants, the model and the
    members' own data; and the data config and scenario roles they make."""

    novel_client_fraction: float = setting(0.0, "share of clients that never train",
                                           ok=lambda v: 0 <= v < 1, allowed="a number in [0, 1)")
    attack_ratio: float = setting(0.0, "share of clients that flip their labels",
                                  ok=lambda v: 0 <= v <= 0.5, allowed="a number in [0, 0.5]")
    fl60_noise_std: float = setting(1.0, "FL-60's noise (paper: 1)", ok=lambda v: v > 0,
                                    allowed="a number > 0")
    fl60_variant: str = setting("text", "FL-60 as the text describes it, or GRDA's generator",
                                **one_of("text", "grda"))
    tpt48_split: str = setting("time", "TPT-48 split in time or at random (the paper's)",
                               **one_of("time", "random"))
    traffic_graph: str = setting("metr-la", "traffic-generated: the road graph it is generated "
                                 "on (data-dir holds it)", **one_of(*tasks.TRAFFIC_GRAPHS))
    traffic_days: int = setting(35, "traffic-generated: days of 5-minute readings (35: the "
                                "test's last 20% in time is one whole week)",
                                **integer_in(1, 366))
    traffic_stride: int = setting(12, "traffic tasks: steps between two windows' starts (12: "
                                  "one an hour)", **integer_in(1, 288))
    model: str = setting("auto", "the model (auto: the task's)",
                         allowed="auto, mlp, mlp-16, linear (one layer: logistic or "
                         "least-squares regression), cnn, resnet18, gru (one that fits the "
                         "data)")
    # Members' own data (dataset = "members")
    member_input_shape: str = setting("", 'one input\'s shape: "F" or "C,H,W"')
    # (member-task and member-scaling: checked with the other member- keys, and only then)
    member_task: str = setting("classification", "classification or regression",
                               allowed=f"{tasks.CLASSIFICATION}, {tasks.REGRESSION}")
    member_outputs: int = setting(0, "the classes, or the regression outputs", **integer_in(
        0, MOST_OUTPUTS, 'the classes, or the regression outputs, of dataset = "members"'))
    member_class_names: str = setting("", "the classes' names, comma-separated")
    member_label_column: str = setting("label", "a table's label column")
    member_feature_columns: str = setting("", "a table's feature columns (\"\": all others)")
    member_categories: str = setting("", "a table's categorical columns and their categories")
    member_roster: str = setting("", "a file of the members' names and public keys")
    member_scaling: str = setting("pooled", "how members' vector inputs are standardized",
                                  allowed=", ".join(SCALINGS))
    checkpoint_secret: str = setting("", "a file of the coordinator's secret sealing checkpoints")
    #: the chosen strategy's own settings (its keys checked, "auto" resolved)
    settings: Settings = field(default_factory=NoSettings, metadata={"key": False})
    #: every method's key, checked and resolved (what to_dict records of them)
    method_values: Mapping[str, Any] = field(default_factory=dict, metadata={"key": False})
    #: graph = "inferred" with its guard: this run config as ``strategy = "pfedhn"`` runs it
    #: (the guard's no-graph path)
    no_graph: RunConfig | None = field(default=None, metadata={"key": False})
    drop_rate: float = setting(0.0, "chance that a sampled client drops out of a round",
                               ok=lambda v: 0 <= v < 1, allowed="a number in [0, 1)")
    heterogeneous_epochs: bool = setting(False, "clients train for different epochs")
    save_models: str = setting("final", "which of each client's models it keeps",
                               **one_of(*SAVE_MODES))

    def _check_data(self) -> None:
        """The model fits the data, the data is where the task needs it, attacks have classes."""
        spec = tasks.get_task(self.dataset)
        problem = model_problem(tasks.model_name(self.data_config(2), self.model),
                                tasks.data_info(self.data_config(2)).input_shape) \
            if spec.info is not None or self.dataset == tasks.MEMBERS else None
        if problem is not None:
            raise _bad("model", self.model, f"a model for this data: {problem}")
        if spec.needs_data_dir and not self.data_dir:
            raise _bad("data-dir", self.data_dir, f"the path of the {self.dataset} data",
                       kind="missing")
        if spec.info is not None and spec.info.kind == tasks.REGRESSION and self.attack_ratio > 0:
            raise _bad("attack-ratio", self.attack_ratio,
                       f"0 for the regression task {self.dataset} (label flipping needs classes)",
                       kind="conflict")

    def _validate_members(self) -> None:
        """The schema keys of a run over members' own data (``dataset = "members"``)."""
        shape = parse_shape(self.member_input_shape)
        if shape is None or math.prod(shape) > MOST_INPUTS:
            raise _bad("member-input-shape", self.member_input_shape,
                       'the shape of one input: "F" (F features) or "C,H,W" (an image of C = 1 '
                       f"or 3 channels), positive integers, at most {MOST_INPUTS} values in all")
        if self.member_task not in (tasks.CLASSIFICATION, tasks.REGRESSION):
            raise _bad("member-task", self.member_task, "classification, regression")
        least = 2 if self.member_task == tasks.CLASSIFICATION else 1
        if not least <= self.member_outputs <= MOST_OUTPUTS:
            raise _bad("member-outputs", self.member_outputs, integer_words(
                least, MOST_OUTPUTS, "the classes, or the regression outputs"))
        names = self.class_names()
        if names and (len(names) != self.member_outputs or len(set(names)) != len(names)):
            raise _bad("member-class-names", self.member_class_names,
                       f"{self.member_outputs} distinct comma-separated names (member-outputs), "
                       "or empty")
        if not self.member_label_column:
            raise _bad("member-label-column", self.member_label_column, "a column name",
                       kind="missing")
        categories = parse_categories(self.member_categories)
        named = [c for c, _ in categories or ()]
        features = self.feature_columns()
        if categories is None or {self.member_label_column, "split"} & set(named) or (
                features and not set(named) <= set(features)) or (named and len(shape) != 1):
            raise _bad("member-categories", self.member_categories,
                       "the categorical feature columns, each with its categories: "
                       "'column: category, category; column: ...' (distinct names; neither "
                       "the label column nor split"
                       + ("; among member-feature-columns" if features else "")
                       + "), only with vector inputs (a table's)")
        schema = self.member_schema()
        assert schema is not None
        if features and len(shape) == 1 and schema.width(features) != shape[0]:
            raise _bad("member-input-shape", self.member_input_shape,
                       f'"{schema.width(features)}": member-feature-columns give '
                       f"{schema.width(features)} inputs, one per numeric column and one per "
                       "category of a categorical column (member-categories)", kind="conflict")
        if self.member_scaling not in SCALINGS:
            raise _bad("member-scaling", self.member_scaling, ", ".join(SCALINGS))
        if self.attack_ratio > 0:
            raise _bad("attack-ratio", self.attack_ratio, "0 with dataset = \"members\" (label "
                       "flipping is a simulation scenario of the partitioned tasks)", kind="conflict")

    def class_names(self) -> tuple[str, ...]:
        """``member-class-names`` as a tuple (empty if not given)."""
        return tuple(n.strip() for n in self.member_class_names.split(",") if n.strip())

    def member_schema(self) -> tasks.MemberSchema | None:
        """What a run over members' own data expects of every member's data (None otherwise)."""
        if self.dataset != tasks.MEMBERS:
            return None
        return tasks.MemberSchema(
            input_shape=parse_shape(self.member_input_shape) or (), kind=self.member_task,
            num_outputs=self.member_outputs, class_names=self.class_names(),
            label_column=self.member_label_column, feature_columns=self.feature_columns(),
            categories=parse_categories(self.member_categories) or ())

    def feature_columns(self) -> tuple[str, ...]:
        """``member-feature-columns`` as a tuple (empty if not given)."""
        return tuple(c.strip() for c in self.member_feature_columns.split(",") if c.strip())

    def data_config(self, num_clients: int, member: str = "",
                    data_path: str = "") -> tasks.DataConfig:
        """The :class:`tasks.DataConfig` of this run with ``num_clients`` clients; for a
        member, its name and its own ``data_path`` (its node config's)."""
        return tasks.DataConfig(
            dataset=self.dataset, data_dir=data_path if member else self.data_dir,
            num_clients=num_clients,
            seed=self.seed, partitioning=self.partitioning,
            dirichlet_alpha=self.dirichlet_alpha, test_samples=self.test_samples,
            validation_fraction=self.validation_fraction,
            fl60_noise_std=self.fl60_noise_std, fl60_variant=self.fl60_variant,
            tpt48_split=self.tpt48_split, traffic_graph=self.traffic_graph,
            traffic_days=self.traffic_days, traffic_stride=self.traffic_stride, member=member,
            schema=self.member_schema(),
        )

    def data_dir_problem(self, err: Exception) -> str:
        """A data file's error as one line naming ``data-dir``: the error's own words where
        they name it already (a reader's :class:`tasks.DataDirError`), else after the key."""
        if isinstance(err, tasks.DataDirError):
            return str(err)
        return f"run config 'data-dir' = {self.data_dir!r}: {err}"

    def roles(self, num_clients: int) -> Roles:
        """The scenario of this run: novel clients, attackers, drop-outs, epochs (the same
        on server and clients)."""
        return scenario_roles(num_clients, self.seed, self.novel_client_fraction, self.attack_ratio,
                              self.drop_rate, self.heterogeneous_epochs)

    @property
    def table_inputs(self) -> bool:
        """Whether the run is over members' tables (vector inputs): :data:`TABLE_AUTO`."""
        return self.dataset == tasks.MEMBERS and len(parse_shape(self.member_input_shape)
                                                     or ()) == 1

    @property
    def tuning_key(self) -> str:
        """The data setting as tuned values name it: ``<dataset>/<variant>``, the variant
        being the partitioning of a pool dataset, FL-60's ``fl60-variant``, TPT-48's
        ``tpt48-split`` (FL-60 text with another noise than 1: ``text-noise<std>``), else
        ``federated``."""
        variant = {"fl60": self.fl60_variant, "tpt48": self.tpt48_split,
                   tasks.TRAFFIC_GENERATED: self.traffic_graph}.get(self.dataset,
                                                                    self.data_setting)
        if self.dataset == "fl60" and self.fl60_variant == "text" and self.fl60_noise_std != 1.0:
            variant += f"-noise{self.fl60_noise_std:g}"  # another task than the one tuned
        return f"{self.dataset}/{variant}"


@dataclass(frozen=True)
class RunConfig(TaskKeys):
    """The run config of this app, validated: its generic keys (by topic: :class:`DataKeys`,
    :class:`FolderKeys`, :class:`RoundKeys`, :class:`GraphKeys`, :class:`TaskKeys`, and here
    the members' differential privacy), and the chosen strategy's own settings
    (``settings``). See pyproject.toml for the defaults."""

    # Differential privacy (each member's own machine)
    dp: str = setting("none", "differential privacy of the members' replies", **one_of(*DP_MODES))
    dp_clip: float = setting(1.0, "the L2 bound C of an update or an example's gradient",
                             ok=lambda v: 0 < v < math.inf,
                             allowed="a finite number > 0 (an L2 norm bound)")
    dp_noise_multiplier: float = setting(
        1.0, "Gaussian noise of standard deviation this x C", ok=lambda v: 0 <= v < math.inf,
        allowed="a finite number > 0 with dp (no noise is no privacy), >= 0 without")
    dp_delta: float = setting(1e-5, "the delta members report epsilon at, where stricter",
                              ok=lambda v: 0 < v < 1, allowed="a number in (0, 1), e.g. 1e-5")

    @classmethod
    def generic_fields(cls) -> dict[str, dataclasses.Field]:
        """The generic run-config keys and their fields."""
        return {k: f for k, f in field_keys(cls).items() if f.metadata.get("key", True)}

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Validate Flower's ``context.run_config`` and return the typed config."""
        generic, methods = cls.generic_fields(), method_keys()
        unknown = sorted(set(run_config) - set(generic) - set(methods))
        if unknown:
            allowed = ", ".join(sorted(set(generic) | set(methods)))
            raise ConfigError(f"unknown run config key(s) {unknown}; allowed: {allowed}",
                              key=unknown[0], value=run_config[unknown[0]], allowed=allowed,
                              kind="unknown")
        values: dict[str, Any] = {}
        for key, value in run_config.items():
            if key in generic:
                f = generic[key]
                words = ("auto",) if key in GENERIC_AUTO or key in LATE_AUTO else ()
                values[f.name] = coerce(key, value, f.type, words)
        cfg = cls(**values)
        if cfg.strategy not in strategies.STRATEGIES:  # checked before "auto" needs it
            raise _bad("strategy", cfg.strategy, ", ".join(sorted(strategies.STRATEGIES)))
        if cfg.dataset not in tasks.TASKS:
            raise _bad("dataset", cfg.dataset, ", ".join(tasks.TASKS))
        auto = auto_values(cfg.dataset, cfg.strategy, cfg.tuning_key, cfg.table_inputs,
                           cfg.model)
        cfg = cfg.resolved(auto)
        cfg.validate()
        context, chosen = cfg.context(), strategies.STRATEGIES[cfg.strategy].settings
        settings: Settings = NoSettings()
        method_values: dict[str, Any] = {}
        for settings_cls in settings_classes():  # every method's keys: a bad value is an error
            own = settings_cls.from_values(run_config).resolved(auto)
            own.validate(context)
            method_values.update(own.to_dict())
            if settings_cls is chosen:
                settings = own
        cfg = dataclasses.replace(cfg, settings=settings, method_values=method_values)
        if cfg.graph == "inferred" and strategies.STRATEGIES[cfg.strategy].uses_graph and \
                cfg.graph_guard_rounds > 0:
            cfg = dataclasses.replace(cfg, no_graph=cls.from_run_config(
                {**run_config, "strategy": NO_GRAPH_PATH}))
        check_client_memory(cfg)  # every process builds the model (fedamp_flwr/sizes.py)
        return cfg

    def context(self) -> SettingsContext:
        """What a method's checks may need to know of the run."""
        return SettingsContext(strategy=self.strategy, dataset=self.dataset,
                               data_setting=self.data_setting, data_label=self.data_label,
                               has_groups=tasks.client_groups(self.dataset, self.partitioning,
                                                              2) is not None, graph=self.graph,
                               policy=bool(self.collaboration_policy))

    def validate(self) -> None:
        """Check every value; raise :class:`ConfigError` on the first bad one: each key's own
        range (:meth:`_check_values`), then the keys together and with the data
        (:meth:`_check_together`)."""
        self._check_values()
        self._check_together()

    def _check_values(self) -> None:
        """Each key's own range, as its declaration says; the choices that registries hold."""
        for key, f in self.generic_fields().items():
            check_value(key, f, getattr(self, f.name), ("auto",) if key in LATE_AUTO else ())
        rate, steps = self.learning_rate, self.local_steps  # numbers once "auto" is resolved
        assert not isinstance(rate, str) and not isinstance(steps, str), "resolve 'auto' first"
        for key, allowed in (("strategy", sorted(strategies.STRATEGIES)),
                             ("dataset", list(tasks.TASKS)), ("model", ["auto", *tasks.MODELS])):
            if getattr(self, key) not in allowed:
                raise _bad(key, getattr(self, key), ", ".join(allowed))

    def _check_together(self) -> None:
        """What the keys rule out together, and with the strategy and the data."""
        if self.dp != "none" and self.dp_noise_multiplier == 0:
            raise _bad("dp-noise-multiplier", 0.0, "a finite number > 0 with dp (no noise is "
                       "no privacy), >= 0 without", kind="conflict")
        why = strategies.STRATEGIES[self.strategy].not_private.get(self.dp)
        if why:
            other = [m for m in DP_MODES if m not in strategies.STRATEGIES[
                self.strategy].not_private]
            raise _bad("dp", self.dp, f"{' or '.join(other)} for strategy {self.strategy!r}: "
                       f"{why}", kind="conflict")
        if self.save_models == "best-validation" and self.validation_fraction <= 0:
            raise _bad("save-models", self.save_models, "final, every-checkpoint or none; "
                       "best-validation needs validation-fraction > 0 (the model is chosen on "
                       "validation rows, never on test rows)", kind="conflict")
        if self.resume and not self.run_name:
            raise _bad("run-name", self.run_name, "the name of the run to continue when resume = true",
                       kind="missing")
        if self.resume and self.overwrite:
            raise _bad("overwrite", True, "false when resume = true (resume continues a run, "
                       "overwrite replaces it)", kind="conflict")
        self._check_graph()
        if self.graph == "file" and not self.graph_file:
            raise _bad("graph-file", self.graph_file, 'the path of an edge-list CSV when graph = "file"',
                       kind="missing")
        if self.graph == "inferred" and strategies.STRATEGIES[self.strategy].uses_graph and \
                self.graph_warmup_rounds >= self.num_server_rounds:
            raise _bad("graph-warmup-rounds", self.graph_warmup_rounds, f"fewer than "
                       f"num-server-rounds ({self.num_server_rounds}): the graph is inferred "
                       "after the warm-up, and used in the rounds after it", kind="conflict")
        if self.graph == "inferred" and strategies.STRATEGIES[self.strategy].uses_graph and \
                self.graph_guard_rounds > 0:
            self._check_guard()
        if self.collaboration_policy:
            self._check_policy()
        if self.warm_start:
            self._check_warm_start()
        self._check_dashboards()
        if self.dataset == tasks.MEMBERS:
            self._validate_members()
        elif self.member_roster:
            raise _bad("member-roster", self.member_roster, '"" unless dataset = "members" (a '
                       "roster names members, a partitioned run has none)", kind="conflict")
        self._check_data()

    def _check_guard(self) -> None:
        """The guard's rounds fit in the run, and its held-out errors are never sent under dp
        (they are not made private)."""
        if self.graph_warmup_rounds + self.graph_guard_rounds >= self.num_server_rounds:
            raise _bad("graph-guard-rounds", self.graph_guard_rounds, "fewer than "
                       f"num-server-rounds ({self.num_server_rounds}) less graph-warmup-rounds "
                       f"({self.graph_warmup_rounds}), or 0: the graph is chosen after them",
                       kind="conflict")
        if self.dp != "none":
            raise _bad("graph-guard-rounds", self.graph_guard_rounds, f"0 with dp = {self.dp!r} "
                       "(the guard's held-out errors are not made private)", kind="conflict")

    def _check_warm_start(self) -> None:
        """A warm start names another run's folder, and a method that can start from one (the
        folder itself is read by the ServerApp only: it is on the coordinator's machine)."""
        if self.run_name and Path(self.warm_start).expanduser().resolve() == \
                self.results_path(self.run_name):
            raise _bad("warm-start", self.warm_start, "another run's folder (this run's own is "
                       "continued with resume = true)", kind="conflict")
        if strategies.STRATEGIES[self.strategy].uses_graph and self.graph == "inferred":
            raise _bad("warm-start", self.warm_start, f'"" for strategy {self.strategy!r} with '
                       'graph = "inferred" (the graph is inferred from the first rounds\' '
                       "updates of the initial model; give the graph as a file instead)",
                       kind="conflict")

    def differences(self, other: Mapping[str, Any], allowed: Iterable[str] = ()) -> list[str]:
        """Keys whose value differs from ``other`` (a :meth:`to_dict`), except ``allowed``.

        A key that ``other`` lacks (a config written before the key existed) differs only
        if this config's value is not the key's default; a key that this version does not
        know (one removed since, e.g. ``member-alone``) is not compared: it changes nothing.
        """
        mine, known = self.to_dict(), default_values()
        theirs = {**{k: v for k, v in known.items() if k not in other}, **other}
        return sorted(k for k in set(mine) | set(other) if k not in set(allowed)
                      and k in known and mine.get(k) != theirs.get(k))

    def value(self, key: str) -> Any:
        """The value of run-config ``key`` (generic or a method's, "auto" resolved)."""
        return self.to_dict()[key]

    def to_dict(self) -> dict[str, Any]:
        """Every key of the config (generic and every method's), with Flower's hyphens."""
        generic = {key: getattr(self, f.name) for key, f in self.generic_fields().items()}
        return {**generic, **self.method_values}

    def training(self) -> dict[str, Any]:
        """The local training every train message carries, under the run config's own keys
        (:data:`strategies.core.protocol.TRAINING_KEYS`): a member's node reads them back
        (``Optim.from_message``), its own run config's where a message has none."""
        keys = field_keys(type(self))  # (every message asks: not the whole to_dict)
        return {key: getattr(self, keys[key].name) for key in TRAINING_KEYS}  # generic keys


def generic_reference() -> str:
    """The configuration reference's table of the generic keys, from their declarations
    (docs/configuration.md holds it; ``tests/test_structure.py`` checks it is current)."""
    return "\n".join(key_rows(RunConfig.generic_fields(), auto=list(GENERIC_AUTO))) + "\n"


def default_values() -> dict[str, Any]:
    """Every run-config key's default, as the code declares it (generic and every method's)."""
    out = {key: f.default for key, f in RunConfig.generic_fields().items()}
    out.update({key: f.default for key, f in method_keys().items()})
    return out


def redact_uri(uri: str) -> str:
    """``uri`` without the password of its user part (``http://user:***@host``)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    except ValueError:
        return "<an unreadable URI>"
