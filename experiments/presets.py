r"""The experiment grids: presets of the papers' tables and figures, and the runs they expand to.

A :class:`Grid` is strategies x data settings x scenarios x seeds;
:func:`expand` turns it into :class:`PlannedRun`\ s, each with its validated run
config (every run is checked before anything runs). The presets
(:data:`PRESETS`) are the papers' experiments; ``simulation.py --list``
prints them, and its options narrow or change one (:func:`apply_overrides`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedamp_flwr.config import ConfigError, RunConfig
from tasks import TRAFFIC_GENERATED, TRAFFIC_GRAPHS, get_task

# Subfolder of --data-dir for each dataset (laid out like ../shared/data).
DATA_SUBDIRS = {"mnist": "mnist", "fmnist": "fashion_mnist", "emnist": "emnist",
                "cifar10": "cifar10", "cifar100": "cifar100", "tpt48": "tpt48",
                "traffic-generated": "sensor_graphs", "metr-la": "metr-la",
                "pems-bay": "pems-bay", "compcars": "compcars"}
# Datasets whose number of clients is fixed by the data (the traffic stand-in's: its road
# graph's, by its run config's traffic-graph).
FIXED_CLIENTS = {"fl60": 60, "tpt48": 48, "metr-la": 207, "pems-bay": 325, "compcars": 30}
#: datasets whose files only their users have (not on these machines): a preset's setting of
#: one is left out, with a line saying so, where its folder is absent and --datasets does not
#: name it (named, it is refused)
USERS_FILES = ("metr-la", "pems-bay", "compcars")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One data setting of a grid: dataset, partitioning and its number of clients."""

    dataset: str
    partitioning: str = "practical"
    num_clients: int = 20
    run_config: tuple[tuple[str, Any], ...] = ()  # extra keys for this setting
    label: str = ""  # in run names, where two settings share dataset and partitioning


@dataclasses.dataclass(frozen=True)
class Grid:
    """A grid of runs: every strategy x setting x scenario x seed.

    Parameters
    ----------
    strategies : tuple of str
        Strategy names (keys of ``strategies.STRATEGIES``), or variants of one,
        ``<strategy>@<variant>`` (e.g. ``fedamp@paper``), with their own
        ``per_strategy`` values and rows in the tables.
    settings : tuple of Setting
        Data settings.
    scenarios : tuple of dict
        Scenario run-config overrides ({} is the plain setting).
    seeds : tuple of int
        Seeds; the table reports mean and std over them.
    run_config : dict
        Run-config values common to every run.
    per_strategy : dict
        Extra run-config values of single strategies (e.g. fedprox-mu).
    """

    strategies: tuple[str, ...]
    settings: tuple[Setting, ...]
    scenarios: tuple[dict[str, Any], ...] = ({},)
    seeds: tuple[int, ...] = (0,)
    run_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    per_strategy: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    named_datasets: tuple[str, ...] = ()  # what --datasets named (refused if absent)
    preset_settings: tuple[Setting, ...] = ()  # the preset's own before --datasets (advice)


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a grid: its name, number of SuperNodes and full run-config overrides."""

    name: str
    num_clients: int
    run_config: dict[str, Any]


# The FedAMP paper's training: Adam 1e-3, batch 100, 10 local epochs, 90 rounds.
#: The DP-SGD noise multipliers of the "dp-tradeoff" and "dp-panacea" presets, by target
#: epsilon (delta 1e-5) over their rounds: FMNIST practical's 20 members (200-600 training
#: examples, batch 50, 1 epoch, 10 rounds), FL-60's 60 (80 examples, batch 16, 20 steps,
#: 60 rounds); the largest epsilon of any member is at most the target.
DP_NOISE = {"fmnist": {1: 6.66, 4: 2.14, 16: 0.869}, "fl60": {1: 28.1, 4: 8.1, 16: 2.63}}

_FEDAMP_TRAINING = {"num-server-rounds": 90, "local-epochs": 10, "batch-size": 100,
                    "learning-rate": 1e-3, "optimizer": "adam"}
_FEDAMP_BASELINES = ("separate", "fedavg", "fedprox", "fedavg-ft", "fedprox-ft", "scaffold",
                     "apfl", "fedamp", "heurfedamp")
# The appendix's self weight xi_ii = 1 / (N_i + 1) ("paper"), for the settings with
# groups of same-distribution clients (practical, IID).
_PAPER_SELF_WEIGHT = {"fedamp": {"fedamp-self-weight": "paper"},
                      "heurfedamp": {"heurfedamp-self-weight": "paper"}}
# The paper's sigma for the IID and pathological settings (its Tables 4-5) is not
# recorded here: those settings use the practical values (Table 6), said in the README;
# the pathological one (no groups) the project's self weights.
_SIGMA_STAND_IN = {d: (("fedamp-sigma", s[0]), ("heurfedamp-sigma", s[1])) for d, s in {
    "mnist": (100.0, 25.0), "fmnist": (10.0, 100.0), "emnist": (10.0, 50.0),
    "cifar100": (1e6, 10.0)}.items()}
_NO_GROUPS = (("fedamp-self-weight", "eq6"), ("heurfedamp-self-weight", 0.1))


def _fedamp_setting(dataset: str, partitioning: str) -> Setting:
    extra: tuple[tuple[str, Any], ...] = (
        () if partitioning == "practical" else _SIGMA_STAND_IN[dataset])
    if partitioning == "pathological":
        extra += _NO_GROUPS
    return Setting(dataset, partitioning, 62 if dataset == "emnist" else 100, extra)

#: every registered method, baselines first: the "default" preset's strategies
EVERY_METHOD = ("separate", "fedavg", "fedprox", "fedavg-ft", "fedprox-ft", "scaffold", "apfl",
                "per-fedavg", "pfedme", "nonconvex", "fedamp", "heurfedamp", "sfl", "pfedhn",
                "panacea-gn", "panacea", "fedmedian", "fedtrimmedavg", "krum")

PRESETS: dict[str, Grid] = {
    # The default run (the README's first command, `flwr run .` on 10 SuperNodes): the
    # embedded synthetic task, every method at its "auto" values, 10 rounds; its clients do
    # not also train alone (Separate is a run of its own here)
    "default": Grid(
        strategies=EVERY_METHOD,
        settings=(Setting("synthetic", "practical", 10),),
        seeds=(42,),
        run_config={"num-server-rounds": 10, "alone": False},
    ),
    "quick": Grid(
        strategies=("separate", "fedavg", "fedprox", "fedavg-ft", "fedamp", "heurfedamp"),
        # HeurFedAMP's sigma on MNIST: 5, not the paper's 25 (measured in the README:
        # at 20 clients and 5 rounds, 25 weights the own group too much).
        settings=(Setting("mnist", "practical", 20, (("heurfedamp-sigma", 5.0),)),
                  Setting("fmnist", "practical", 20)),
        # The paper's training for 5 of its 90 rounds; 500 test samples per client.
        run_config={**_FEDAMP_TRAINING, "num-server-rounds": 5, "test-samples": 500},
        per_strategy=_PAPER_SELF_WEIGHT,
    ),
    "fedamp-tables": Grid(
        strategies=_FEDAMP_BASELINES,
        settings=tuple(_fedamp_setting(d, p) for p in ("iid", "pathological", "practical")
                       for d in ("mnist", "fmnist", "emnist", "cifar100")),
        run_config=_FEDAMP_TRAINING,
        per_strategy=_PAPER_SELF_WEIGHT,
    ),
    # Table 3 alone (the practical setting): the paper-scale grid of docs/reproducing.md
    "fedamp-table3": Grid(
        strategies=_FEDAMP_BASELINES,
        settings=tuple(_fedamp_setting(d, "practical")
                       for d in ("mnist", "fmnist", "emnist", "cifar100")),
        run_config=_FEDAMP_TRAINING,
        per_strategy=_PAPER_SELF_WEIGHT,
    ),
    "fedamp-scenarios": Grid(
        strategies=("fedavg", "fedprox", "fedamp", "heurfedamp"),
        settings=(Setting("fmnist", "practical", 100),),
        scenarios=({}, {"drop-rate": 0.1}, {"drop-rate": 0.3}, {"drop-rate": 0.5},
                   {"heterogeneous-epochs": True}),
        run_config=_FEDAMP_TRAINING,
    ),
    "panacea-tables": Grid(
        strategies=("fedavg", "fedavg-ft", "per-fedavg", "pfedme", "sfl", "pfedhn", "panacea-gn",
                    "panacea"),
        # FL-60 as the paper's text describes it and as its source generates it; TPT-48
        # split in time and at random (the paper's); the traffic tasks (the users' files,
        # and the generated stand-in on their road graphs); local settings "auto"
        settings=(Setting("fl60", "practical", 60, (("fl60-variant", "text"),), "text"),
                  Setting("fl60", "practical", 60, (("fl60-variant", "grda"),), "grda"),
                  Setting("tpt48", "practical", 48, (("tpt48-split", "time"),), "time"),
                  Setting("tpt48", "practical", 48, (("tpt48-split", "random"),), "random"),
                  # the stand-in's five weeks, a window every 5 hours: 134 training windows
                  # a sensor, the training and test weeks alike (tasks/traffic.py)
                  Setting("traffic-generated", "practical", 207,
                          (("traffic-graph", "metr-la"), ("traffic-stride", 60)), "metr-la"),
                  Setting("traffic-generated", "practical", 325,
                          (("traffic-graph", "pems-bay"), ("traffic-stride", 60)), "pems-bay"),
                  Setting("metr-la", "practical", 207), Setting("pems-bay", "practical", 325),
                  Setting("compcars", "practical", 30)),
        # Table 1 (every client trains) and Table 2 (20% of the clients held out: novel)
        scenarios=({}, {"novel-client-fraction": 0.2}),
        seeds=(0, 1, 2),
        run_config={"num-server-rounds": 60},
    ),
    "nonconvex": Grid(
        # Ioste and Finger's combination as written (the sum of exp(c r_h) w_h, "@sum")
        # against its normalised form (the default) and FedAvg: their two-host setting
        # (MNIST digits 0-4 on one host, 5-9 on the other) and FMNIST practical with 20
        # clients
        strategies=("nonconvex@sum", "nonconvex", "fedavg"),
        settings=(Setting("mnist", "blocks", 2, label="two-host"),
                  Setting("fmnist", "practical", 20)),
        run_config={**_FEDAMP_TRAINING, "num-server-rounds": 5, "local-epochs": 1,
                    "test-samples": 500},
        per_strategy={"nonconvex@sum": {"nonconvex-normalize": False}},
    ),
    "fedamp-horizon": Grid(
        # Where collaboration pays: FMNIST practical, 20 clients, 30 rounds x 5 epochs of
        # the paper's training; FedAMP and HeurFedAMP with the appendix's self weight
        # ("@paper") and with the project's default rules (FedAMP's Eq. 6 rescaling,
        # HeurFedAMP's fixed 0.1). Seeds run one after another: `--seeds 0` first.
        strategies=("separate", "fedamp@paper", "heurfedamp@paper", "fedavg-ft", "fedamp",
                    "heurfedamp", "fedavg"),
        settings=(Setting("fmnist", "practical", 20),),
        seeds=(0, 1),
        run_config={**_FEDAMP_TRAINING, "num-server-rounds": 30, "local-epochs": 5,
                    "test-samples": 500},
        per_strategy={"fedamp@paper": {"fedamp-self-weight": "paper"},
                      "heurfedamp@paper": {"heurfedamp-self-weight": "paper"}},
    ),
    "panacea-robustness": Grid(
        strategies=("fedavg", "fedmedian", "krum", "panacea"),
        settings=(Setting("fl60", "practical", 60, (("fl60-noise-std", 0.1),)),),
        scenarios=tuple({"novel-client-fraction": 0.2, "attack-ratio": a} for a in (0.0, 0.1, 0.2, 0.3)),
        run_config={"num-server-rounds": 20},
    ),
    # Accuracy against epsilon (docs/privacy.md): every member trains with DP-SGD (clip 1,
    # delta 1e-5) at the noise multiplier that keeps each member's rounds at epsilon 1, 4
    # or 16 (DP_NOISE: tasks.dp.noise_multiplier_for over the members' sample rates
    # and steps, computed again by tests/test_privacy.py), and without DP (epsilon
    # infinite). FMNIST practical with the MLP: per-example gradients of the CNN cost
    # about 1.2 s a step of 100 on a 2-core CPU (Opacus), 12 times a plain step.
    "dp-tradeoff": Grid(
        strategies=("separate", "fedavg", "fedamp", "heurfedamp"),
        settings=(Setting("fmnist", "practical", 20),),
        scenarios=({}, *({"dp": "dp-sgd", "dp-noise-multiplier": z}
                         for z in DP_NOISE["fmnist"].values())),
        run_config={"num-server-rounds": 10, "local-epochs": 1, "batch-size": 50,
                    "learning-rate": 1e-3, "optimizer": "adam", "model": "mlp",
                    "test-samples": 500},
    ),
    "dp-panacea": Grid(
        strategies=("panacea",),
        settings=(Setting("fl60", "practical", 60, (("fl60-variant", "grda"),), "grda"),),
        scenarios=({}, *({"dp": "dp-sgd", "dp-noise-multiplier": z}
                         for z in DP_NOISE["fl60"].values())),
        # pinned: DP_NOISE["fl60"] was computed for these (not for what "auto" gives later)
        run_config={"num-server-rounds": 60, "local-steps": 20, "batch-size": 16},
    ),
}


# ---------------------------------------------------------------------------
# Building the grid
# ---------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    return str(value).replace(".", "p") if isinstance(value, float) else str(value)


def run_name(strategy: str, setting: Setting, scenario: dict[str, Any], seed: int) -> str:
    """``<strategy>-<dataset>[-<partitioning>][-<label>][-<scenario>]-s<seed>`` (file-name
    safe; the partitioning only for pool datasets: fl60 and tpt48 define their clients)."""
    parts = [strategy, setting.dataset]
    if not get_task(setting.dataset).federated:
        parts.append(setting.partitioning)
    parts += [setting.label] if setting.label else []
    parts += [f"{k}{_fmt(v)}" for k, v in sorted(scenario.items())]
    return "-".join(parts + [f"s{seed}"])


def expand(grid: Grid, data_dir: str | None, output: Path, check_data: bool = True) -> list[PlannedRun]:
    """The runs of ``grid``, each with its validated run config.

    ``check_data``: the dataset folders under ``data_dir`` must exist.

    Raises
    ------
    ConfigError
        If any run's config is invalid (before anything runs).
    """
    runs, said = [], set()
    optional = set(USERS_FILES) - set(grid.named_datasets)
    for setting, scenario, strategy, seed in itertools.product(
            grid.settings, grid.scenarios, grid.strategies, grid.seeds):
        name = run_name(strategy, setting, scenario, seed)
        n = FIXED_CLIENTS.get(setting.dataset, setting.num_clients)
        cfg: dict[str, Any] = {
            **grid.run_config, **grid.per_strategy.get(strategy, {}),
            **dict(setting.run_config), **scenario,
            "strategy": strategy.split("@")[0], "dataset": setting.dataset,
            **({"label": strategy} if "@" in strategy else {}),
            "partitioning": setting.partitioning, "seed": seed, "min-nodes": n,
            "run-name": name, "results-dir": str((output / "runs").resolve()),
        }
        if setting.dataset in DATA_SUBDIRS and data_dir:
            folder = Path(data_dir) / DATA_SUBDIRS[setting.dataset]
            if check_data and not folder.is_dir() and setting.dataset in optional:
                if setting.dataset not in said:
                    said.add(setting.dataset)
                    print(f"note: {setting.dataset} left out: --data-dir {data_dir!r} has no "
                          f"folder {DATA_SUBDIRS[setting.dataset]}/ with its files "
                          "(docs/reproducing.md); name it in --datasets to be told what is "
                          "missing", flush=True)
                continue
            if check_data and not folder.is_dir():
                raise ConfigError(_no_folder(data_dir, setting.dataset,
                                             grid.preset_settings or grid.settings))
            cfg["data-dir"] = str(folder.resolve())
        try:
            parsed = RunConfig.from_run_config(cfg)
        except ConfigError as err:
            raise ConfigError(f"run {name}: {err}") from None
        if setting.dataset == TRAFFIC_GENERATED:  # one client per sensor of the graph it runs
            n = cfg["min-nodes"] = FIXED_CLIENTS[parsed.traffic_graph]
        runs.append(PlannedRun(name, n, cfg))
    return runs


def _no_folder(data_dir: str, dataset: str, settings: Sequence[Setting] = ()) -> str:
    """Why ``dataset`` cannot run from ``data_dir``, and what would do: the hub only for a
    dataset it has; for a traffic dataset's own files, the stand-in on its road graph (the
    grid's setting of it where ``settings`` has one: a ``--set`` would move every setting)."""
    sub = DATA_SUBDIRS[dataset]
    said = (f"--data-dir {data_dir!r} has no folder {sub}/ for dataset {dataset!r}; allowed: a "
            "folder laid out like ../shared/data")
    if dataset in USERS_FILES:
        said += f", with your own {dataset} files in {sub}/ (docs/reproducing.md names them)"
        if dataset in TRAFFIC_GRAPHS:
            labelled = any(s.dataset == TRAFFIC_GENERATED and s.label == dataset for s in settings)
            how = (f"traffic-generated/{dataset}" if labelled else
                   f"traffic-generated --set traffic-graph={dataset}")
            said += (f"; without them, --datasets {how} runs the stand-in on its road graph "
                     f"(from {DATA_SUBDIRS[TRAFFIC_GENERATED]}/ there)")
    elif not get_task(dataset).needs_data_dir:
        said += ", or --data-dir '' to load from the Hugging Face hub"
    return said


def with_datasets(settings: Sequence[Setting], datasets: Sequence[str]) -> tuple[Setting, ...]:
    """The preset's settings of ``datasets`` (``dataset`` or ``dataset/label``: one labelled
    setting, e.g. ``tpt48/time``); a dataset the preset lacks gets each of the preset's
    partitionings with the first setting's number of clients."""
    out: list[Setting] = []
    partitionings = list(dict.fromkeys(s.partitioning for s in settings))
    for d in datasets:
        dataset, _, label = d.partition("/")
        own = [s for s in settings if s.dataset == dataset and (not label or s.label == label)]
        if label and not own:
            labels = sorted({s.label for s in settings if s.dataset == dataset and s.label})
            raise ConfigError(f"--datasets {d!r}: the preset has no setting {label!r} of "
                              f"{dataset}; allowed: {', '.join(labels) or 'the dataset alone'}")
        out += own or [Setting(dataset, p, settings[0].num_clients) for p in partitionings]
    return tuple(out)


def apply_overrides(grid: Grid, strategies: str | None, seeds: str | None,
                    rounds: int | None, sets: Sequence[str], num_clients: int | None,
                    datasets: str | None = None, scenarios: str | None = None) -> Grid:
    """Narrow or change a preset by the command line's options."""
    changes: dict[str, Any] = {}
    if scenarios:
        try:
            picked = list(dict.fromkeys(int(i) for i in scenarios.split(",") if i.strip()))
        except ValueError:
            picked = [-1]
        if not picked or not all(0 <= i < len(grid.scenarios) for i in picked):
            raise ConfigError(f"--scenarios {scenarios!r}; allowed: comma-separated indices "
                              f"0..{len(grid.scenarios) - 1} of {list(grid.scenarios)}")
        changes["scenarios"] = tuple(grid.scenarios[i] for i in picked)
    if datasets:
        named = [d.strip() for d in datasets.split(",") if d.strip()]
        changes["settings"] = with_datasets(grid.settings, named)
        changes["named_datasets"] = tuple(d.partition("/")[0] for d in named)
        changes["preset_settings"] = grid.preset_settings or grid.settings
    if strategies:
        changes["strategies"] = tuple(s.strip() for s in strategies.split(",") if s.strip())
    if seeds:
        changes["seeds"] = tuple(int(s) for s in seeds.split(","))
    forced: dict[str, Any] = {}  # --rounds and --set: they win over a setting's or strategy's own
    if rounds:
        forced["num-server-rounds"] = rounds
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} is invalid; allowed: key=value")
        forced[key.strip()] = _parse_value(value.strip())
    changes["run_config"] = {**grid.run_config, **forced}
    changes["settings"] = tuple(
        dataclasses.replace(s, num_clients=num_clients or s.num_clients,
                            run_config=tuple((k, v) for k, v in s.run_config if k not in forced))
        for s in changes.get("settings", grid.settings))
    changes["per_strategy"] = {name: {k: v for k, v in values.items() if k not in forced}
                               for name, values in grid.per_strategy.items()}
    return dataclasses.replace(grid, **changes)


def _parse_value(text: str) -> Any:
    """A --set value: true/false, an int, a float, else a string (quotes optional)."""
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip("'\"")
