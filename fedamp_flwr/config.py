"""The typed, validated run config.

Every key of ``[tool.flwr.app.config]`` is a field of :class:`RunConfig`
(hyphens become underscores). :meth:`RunConfig.from_run_config` checks names,
types and ranges and raises :class:`ConfigError` naming the key, the value
and what is allowed, before any work starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import strategies
import tasks
from tasks.models import model_problem
from tasks.partitioners import PARTITIONINGS
from tasks.scenarios import Roles, scenario_roles

GRAPHS = ("task", "file", "groups", "none")


# Settings that take "auto": the value for the task and the strategy, from
# auto_settings (the strategy's own defaults, the task's tuned ones).
AUTO_KEYS = ("local-epochs", "local-steps", "batch-size", "learning-rate",
             "panacea-client-lr", "panacea-client-momentum", "panacea-client-weight-decay",
             "panacea-client-clip", "panacea-server-lr", "panacea-server-steps",
             "panacea-server-weight-decay", "panacea-server-clip")

# The values of "auto" where neither the strategy nor the task says otherwise: the
# FedAMP paper's local training (10 epochs there; 5 here, see the README), and the
# Panacea settings this project has used since the start.
AUTO_DEFAULTS: dict[str, Any] = {
    "local-epochs": 5, "local-steps": 0, "batch-size": 100, "learning-rate": 1e-3,
    "panacea-client-lr": 0.1, "panacea-client-momentum": 0.0,
    "panacea-client-weight-decay": 0.0, "panacea-client-clip": 0.0,
    "panacea-server-lr": 0.1, "panacea-server-steps": 10,
    "panacea-server-weight-decay": 0.0, "panacea-server-clip": 0.0,
}


def auto_settings(dataset: str, strategy: str) -> dict[str, Any]:
    """The values of the "auto" settings for ``strategy`` on ``dataset``.

    From the most general to the most specific, each overriding the last:
    :data:`AUTO_DEFAULTS`, the task's defaults for every strategy
    (``TaskSpec.auto["*"]``), the strategy's own (``register_strategy(auto=...)``,
    e.g. pFedHN's reference trainer), the task's for that strategy
    (``TaskSpec.auto[strategy]``, tuned).
    """
    task = tasks.get_task(dataset).auto
    return {**AUTO_DEFAULTS, **task.get("*", {}), **strategies.STRATEGIES[strategy].auto,
            **task.get(strategy, {})}


# The words a ``float | str`` or ``int | str`` key takes besides numbers.
WORDS: dict[str, tuple[str, ...]] = {
    "fedamp-sigma": ("auto",), "heurfedamp-sigma": ("auto",),
    "fedamp-self-weight": ("eq6", "paper"), "heurfedamp-self-weight": ("paper",),
    **{key: ("auto",) for key in AUTO_KEYS},
}


class ConfigError(ValueError):
    """An invalid run-config value."""


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


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"run config '{key}' = {value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class RunConfig:
    """The run config of this app, validated. See pyproject.toml for the defaults."""

    strategy: str = "fedamp"
    dataset: str = "synthetic"
    partitioning: str = "practical"
    data_dir: str = ""
    dirichlet_alpha: float = 0.5
    test_samples: int = 100
    seed: int = 42
    results_dir: str = "results"
    run_name: str = ""
    label: str = ""
    resume: bool = False
    overwrite: bool = False
    checkpoint_every: int = 1
    xi_every: int = 1
    xi_dtype: str = "float32"
    num_server_rounds: int = 10
    round_timeout: float = 3600.0
    node_wait_timeout: float = 600.0
    max_update_ratio: float = 100.0
    max_failed_rounds: int = 0
    fraction_train: float = 1.0
    min_nodes: int = 2
    local_epochs: int | str = "auto"
    batch_size: int | str = "auto"
    learning_rate: float | str = "auto"
    optimizer: str = "adam"
    server_device: str = "auto"
    fedamp_alpha_k: float = 1e4
    fedamp_alpha_decay: float = 0.1
    fedamp_alpha_decay_every: int = 30
    fedamp_lambda: float = 1.0
    fedamp_sigma: float | str = "auto"
    heurfedamp_sigma: float | str = "auto"
    fedamp_self_weight: float | str = "eq6"
    heurfedamp_self_weight: float | str = 0.1
    fedamp_offline_clients: str = "exclude"
    fedprox_mu: float = 0.01
    local_steps: int | str = "auto"
    graph: str = "task"
    graph_file: str = ""
    novel_client_fraction: float = 0.0
    attack_ratio: float = 0.0
    fl60_noise_std: float = 1.0
    fl60_variant: str = "text"
    tpt48_split: str = "time"
    model: str = "auto"
    member_input_shape: str = ""
    member_task: str = "classification"
    member_outputs: int = 0
    member_class_names: str = ""
    member_label_column: str = "label"
    member_feature_columns: str = ""
    panacea_embed_dim: int = 100
    panacea_gnn_layers: int = 3
    panacea_hidden: int = 100
    panacea_mlp_layers: int = 3
    panacea_server_lr: float | str = "auto"
    panacea_server_momentum: float = 0.9
    panacea_server_steps: int | str = "auto"
    panacea_server_weight_decay: float | str = "auto"
    panacea_server_clip: float | str = "auto"
    panacea_lambda_d: float = 1.0
    panacea_client_lr: float | str = "auto"
    panacea_client_momentum: float | str = "auto"
    panacea_client_weight_decay: float | str = "auto"
    panacea_client_clip: float | str = "auto"
    drop_rate: float = 0.0
    heterogeneous_epochs: bool = False
    finetune_epochs: int = 1
    apfl_alpha: float = 0.5
    nonconvex_c: float = 1e-3
    nonconvex_normalize: bool = False
    fedtrimmedavg_beta: float = 0.2
    per_fedavg_alpha: float = 0.01
    pfedme_lambda: float = 15.0
    pfedme_inner_steps: int = 5
    pfedme_personal_lr: float = 0.01
    pfedme_beta: float = 1.0

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> "RunConfig":
        """Validate Flower's ``context.run_config`` and return the typed config."""
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown run config key(s) {unknown}; allowed: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for key, value in run_config.items():
            f = known[key]
            values[f.name] = _coerce(key, value, f.type, WORDS.get(key, ()))
        cfg = cls(**values)
        if cfg.strategy not in strategies.STRATEGIES:  # checked before "auto" needs it
            raise _bad("strategy", cfg.strategy, ", ".join(sorted(strategies.STRATEGIES)))
        if cfg.dataset not in tasks.TASKS:
            raise _bad("dataset", cfg.dataset, ", ".join(tasks.TASKS))
        cfg = cfg.resolved()
        cfg.validate()
        return cfg

    def resolved(self) -> "RunConfig":
        """This config with every "auto" setting (:data:`AUTO_KEYS`) given its value for the
        task and the strategy (:func:`auto_settings`)."""
        auto = auto_settings(self.dataset, self.strategy)
        return dataclasses.replace(self, **{
            key.replace("-", "_"): auto[key] for key in AUTO_KEYS
            if getattr(self, key.replace("-", "_")) == "auto"})

    def validate(self) -> None:
        """Check every value's range; raise :class:`ConfigError` on the first bad one."""
        def choice(key: str, value: str, allowed) -> None:
            if value not in allowed:
                raise _bad(key, value, ", ".join(allowed))

        def check(key: str, ok: bool, allowed: str) -> None:
            if not ok:
                raise _bad(key, getattr(self, key.replace("-", "_")), allowed)

        choice("strategy", self.strategy, sorted(strategies.STRATEGIES))
        choice("dataset", self.dataset, list(tasks.TASKS))
        choice("partitioning", self.partitioning, PARTITIONINGS)
        choice("optimizer", self.optimizer, ["adam", "sgd"])
        choice("graph", self.graph, GRAPHS)
        choice("fedamp-offline-clients", self.fedamp_offline_clients, ["exclude", "include"])
        choice("fl60-variant", self.fl60_variant, ["text", "grda"])
        choice("tpt48-split", self.tpt48_split, ["time", "random"])
        check("checkpoint-every", self.checkpoint_every >= 0,
              "an integer >= 0 (0: no checkpoints)")
        check("xi-every", self.xi_every >= 0, "an integer >= 0 (0: not written)")
        check("max-failed-rounds", self.max_failed_rounds >= 0,
              "an integer >= 0 (rounds in a row without usable replies before the run stops)")
        choice("xi-dtype", self.xi_dtype, ["float32", "float16"])
        for key in ("round-timeout", "node-wait-timeout", "max-update-ratio"):
            v = getattr(self, key.replace("-", "_"))
            check(key, 0 < v < math.inf, "a finite number > 0")
        if self.resume and not self.run_name:
            raise _bad("run-name", self.run_name, "the name of the run to continue when resume = true")
        if self.resume and self.overwrite:
            raise _bad("overwrite", True, "false when resume = true (resume continues a run, "
                       "overwrite replaces it)")
        for key in ("num-server-rounds", "local-epochs", "batch-size", "test-samples",
                    "fedamp-alpha-decay-every", "min-nodes", "panacea-embed-dim",
                    "panacea-hidden", "panacea-mlp-layers", "panacea-server-steps"):
            check(key, getattr(self, key.replace("-", "_")) >= 1, "an integer >= 1")
        check("learning-rate", self.learning_rate > 0, "a number > 0")
        check("fraction-train", 0 < self.fraction_train <= 1, "a number in (0, 1]")
        check("dirichlet-alpha", self.dirichlet_alpha > 0, "a number > 0")
        check("fedamp-alpha-k", self.fedamp_alpha_k > 0, "a number > 0")
        check("fedamp-alpha-decay", 0 < self.fedamp_alpha_decay <= 1, "a number in (0, 1]")
        check("fedamp-lambda", self.fedamp_lambda >= 0, "a number >= 0")
        for key in ("fedamp-sigma", "heurfedamp-sigma"):
            v = getattr(self, key.replace("-", "_"))
            check(key, v == "auto" or (not isinstance(v, str) and 0 < v < math.inf),
                  '"auto" or a finite number > 0')
        for key in ("fedamp-self-weight", "heurfedamp-self-weight"):
            v = getattr(self, key.replace("-", "_"))
            words = " or ".join(f'"{w}"' for w in WORDS[key])
            check(key, isinstance(v, str) or 0 <= v < 1, f"{words} or a number in [0, 1)")
            if (v == "paper" and self.strategy == key.split("-")[0] and tasks.client_groups(
                    self.dataset, self.partitioning, 2) is None):
                raise _bad(key, v, f'a number in [0, 1): "paper" (1 / (N_i + 1), N_i the clients of '
                                   f"i's group) needs a data setting with groups of clients of one "
                                   f"distribution (practical, iid, blocks), not {self.setting_name}")
        check("fedprox-mu", self.fedprox_mu >= 0, "a number >= 0")
        check("local-steps", self.local_steps >= 0, "an integer >= 0 (0: use local-epochs)")
        check("panacea-gnn-layers", self.panacea_gnn_layers >= 1, "an integer >= 1")
        for key in ("panacea-server-lr", "panacea-client-lr", "fl60-noise-std"):
            check(key, getattr(self, key.replace("-", "_")) > 0, "a number > 0")
        check("panacea-server-momentum", 0 <= self.panacea_server_momentum < 1, "a number in [0, 1)")
        check("panacea-client-momentum", 0 <= self.panacea_client_momentum < 1, "a number in [0, 1)")
        for key in ("panacea-client-weight-decay", "panacea-client-clip",
                    "panacea-server-weight-decay", "panacea-server-clip"):
            check(key, 0 <= getattr(self, key.replace("-", "_")) < math.inf,
                  "a finite number >= 0 (0: none)")
        check("panacea-lambda-d", self.panacea_lambda_d >= 0, "a number >= 0")
        check("novel-client-fraction", 0 <= self.novel_client_fraction < 1, "a number in [0, 1)")
        check("attack-ratio", 0 <= self.attack_ratio <= 0.5, "a number in [0, 0.5]")
        check("drop-rate", 0 <= self.drop_rate < 1, "a number in [0, 1)")
        check("finetune-epochs", self.finetune_epochs >= 1, "an integer >= 1")
        check("apfl-alpha", 0 < self.apfl_alpha <= 1, "a number in (0, 1]")
        check("nonconvex-c", math.isfinite(self.nonconvex_c), "a finite number")
        check("fedtrimmedavg-beta", 0 <= self.fedtrimmedavg_beta < 0.5, "a number in [0, 0.5)")
        for key in ("per-fedavg-alpha", "pfedme-lambda", "pfedme-personal-lr", "pfedme-beta"):
            check(key, getattr(self, key.replace("-", "_")) > 0, "a number > 0")
        check("pfedme-inner-steps", self.pfedme_inner_steps >= 1, "an integer >= 1")
        if self.graph == "file" and not self.graph_file:
            raise _bad("graph-file", self.graph_file, 'the path of an edge-list CSV when graph = "file"')
        check("server-device", self.server_device in ("auto", "cpu")
              or self.server_device.startswith("cuda"), '"auto", "cpu" or "cuda[:N]"')
        choice("model", self.model, ["auto", *tasks.MODELS])
        if self.dataset == tasks.MEMBERS:
            self._validate_members()
        spec = tasks.get_task(self.dataset)
        problem = model_problem(tasks.model_name(self.data_config(2), self.model),
                                tasks.data_info(self.data_config(2)).input_shape) \
            if spec.info is not None or self.dataset == tasks.MEMBERS else None
        if problem is not None:
            raise _bad("model", self.model, f"a model for this data: {problem}")
        if spec.needs_data_dir and not self.data_dir:
            raise _bad("data-dir", self.data_dir, f"the path of the {self.dataset} data")
        if spec.info is not None and spec.info.kind == tasks.REGRESSION and self.attack_ratio > 0:
            raise _bad("attack-ratio", self.attack_ratio,
                       f"0 for the regression task {self.dataset} (label flipping needs classes)")
        for key in ("fedamp-sigma", "heurfedamp-sigma"):
            strategy = key.split("-")[0]
            if self.strategy == strategy and self.sigma(strategy) is None:
                known = sorted(p for p, v in spec.paper_sigma.items() if strategy in v)
                raise _bad(key, "auto", f"a number > 0: the FedAMP paper's sigma (its Tables 4-6) "
                                        f"for {self.setting_name} is not recorded in this project"
                                        + (f" (it has {self.dataset}: {', '.join(known)})"
                                           if known else ""))

    def _validate_members(self) -> None:
        """The schema keys of a run over members' own data (``dataset = "members"``)."""
        shape = parse_shape(self.member_input_shape)
        if shape is None:
            raise _bad("member-input-shape", self.member_input_shape,
                       'the shape of one input: "F" (F features) or "C,H,W" (an image of C = 1 '
                       "or 3 channels), positive integers")
        if self.member_task not in (tasks.CLASSIFICATION, tasks.REGRESSION):
            raise _bad("member-task", self.member_task, "classification, regression")
        least = 2 if self.member_task == tasks.CLASSIFICATION else 1
        if self.member_outputs < least:
            raise _bad("member-outputs", self.member_outputs,
                       f"an integer >= {least} (the classes, or the regression outputs)")
        names = self.class_names()
        if names and (len(names) != self.member_outputs or len(set(names)) != len(names)):
            raise _bad("member-class-names", self.member_class_names,
                       f"{self.member_outputs} distinct comma-separated names (member-outputs), "
                       "or empty")
        if not self.member_label_column:
            raise _bad("member-label-column", self.member_label_column, "a column name")
        if self.attack_ratio > 0:
            raise _bad("attack-ratio", self.attack_ratio, "0 with dataset = \"members\" (label "
                       "flipping is a simulation scenario of the partitioned tasks)")
        if self.graph in ("task", "groups") and strategies.STRATEGIES[self.strategy].uses_graph:
            raise _bad("graph", self.graph, 'file (graph-file: an edge list over the members\' '
                       'client-ids) or none, with dataset = "members" (members bring no graph)')

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
            label_column=self.member_label_column,
            feature_columns=tuple(c.strip() for c in self.member_feature_columns.split(",")
                                  if c.strip()))

    def data_config(self, num_clients: int, member: str = "",
                    data_path: str = "") -> tasks.DataConfig:
        """The :class:`tasks.DataConfig` of this run with ``num_clients`` clients; for a
        member, its name and its own ``data_path`` (its node config's)."""
        return tasks.DataConfig(
            dataset=self.dataset, data_dir=data_path if member else self.data_dir,
            num_clients=num_clients,
            seed=self.seed, partitioning=self.partitioning,
            dirichlet_alpha=self.dirichlet_alpha, test_samples=self.test_samples,
            fl60_noise_std=self.fl60_noise_std, fl60_variant=self.fl60_variant,
            tpt48_split=self.tpt48_split, member=member, schema=self.member_schema(),
        )

    def roles(self, num_clients: int) -> Roles:
        """The scenario of this run: novel clients, attackers, drop-outs, epochs (the same
        on server and clients)."""
        return scenario_roles(num_clients, self.seed, self.novel_client_fraction, self.attack_ratio,
                              self.drop_rate, self.heterogeneous_epochs)

    def sigma(self, strategy: str) -> float | None:
        """sigma of ``strategy`` ("fedamp"/"heurfedamp"); "auto" = the paper's value (None if none)."""
        value = getattr(self, f"{strategy}_sigma")
        if value == "auto":
            spec = tasks.get_task(self.dataset)
            setting = "federated" if spec.federated else self.partitioning
            value = spec.paper_sigma.get(setting, {}).get(strategy)
        return None if value is None else float(value)

    @property
    def setting_name(self) -> str:
        """The data setting in words: ``mnist/practical``, or ``fl60`` for a federated task."""
        federated = tasks.get_task(self.dataset).federated
        return self.dataset if federated else f"{self.dataset}/{self.partitioning}"

    def self_weight(self, strategy: str) -> float | str | None:
        """The self weight of ``strategy`` ("fedamp"/"heurfedamp"): a number, "paper" (1 /
        (N_i + 1) from :meth:`groups`) or None (FedAMP's Eq. 6 rule, ``"eq6"``)."""
        value = getattr(self, f"{strategy}_self_weight")
        return None if value == "eq6" else value

    def groups(self, num_clients: int) -> list[int] | None:
        """Each client's group of same-distribution clients, where the data setting has them."""
        return tasks.client_groups(self.dataset, self.partitioning, num_clients)

    @property
    def setting(self) -> str:
        """``<strategy>-<dataset>[-<partitioning>]-s<seed>``: the partitioning only for pool
        datasets (federated tasks such as fl60 and tpt48 define their clients)."""
        parts = [self.strategy, self.dataset]
        if not tasks.get_task(self.dataset).federated:
            parts.append(self.partitioning)
        return "-".join(parts) + f"-s{self.seed}"

    def results_path(self, name: str) -> Path:
        """Folder of the run ``name``'s outputs (``<results-dir>/<name>``), made absolute."""
        return (Path(self.results_dir).expanduser() / name).resolve()

    def differences(self, other: dict[str, Any], allowed: Iterable[str] = ()) -> list[str]:
        """Keys whose value differs from ``other`` (a :meth:`to_dict`), except ``allowed``.

        A key that ``other`` lacks (a config written before the key existed) differs only
        if this config's value is not the key's default.
        """
        mine = self.to_dict()
        defaults = {f.name.replace("_", "-"): f.default for f in dataclasses.fields(self)}
        theirs = {**{k: v for k, v in defaults.items() if k not in other}, **other}
        return sorted(k for k in set(mine) | set(other)
                      if k not in set(allowed) and mine.get(k) != theirs.get(k))

    def to_dict(self) -> dict[str, Any]:
        """The config with Flower's hyphenated keys."""
        return {k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items()}


def _coerce(key: str, value: Any, annotation: str, words: tuple[str, ...] = ()) -> Any:
    """Convert ``value`` to the field's type or raise a ConfigError naming ``key``.

    ``float | str`` fields take a number or one of their ``words`` (:data:`WORDS`).
    """
    ann = str(annotation)
    if ann == "bool":
        if not isinstance(value, bool):
            raise _bad(key, value, "true or false")
        return value
    if ann == "str":
        if not isinstance(value, str):
            raise _bad(key, value, "a string")
        return value
    if ann == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise _bad(key, value, "an integer")
        return value
    if ann == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(key, value, "a number")
        return float(value)
    if ann == "int | str":
        if isinstance(value, str) and value in words:
            return value
        allowed = " or ".join(f'"{w}"' for w in words) + " or an integer"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()):
            raise _bad(key, value, allowed)
        return int(value)
    if ann != "float | str":
        raise TypeError(f"run config '{key}': no coercion for the field type {ann!r}")
    # float | str: one of the field's words, or a number
    allowed = " or ".join(f'"{w}"' for w in words) + " or a number"
    if isinstance(value, str):
        if value in words:
            return value
        try:
            return float(value)
        except ValueError:
            raise _bad(key, value, allowed) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(key, value, allowed)
    return float(value)
