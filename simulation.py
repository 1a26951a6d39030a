"""The experiment runner: a grid of `flwr run` simulations, then the papers' tables and plots.

    python simulation.py --preset quick --data-dir ../shared/data --output results/quick

Every run of the grid (strategies x settings x scenarios x seeds) is one
``flwr run`` of this app on Flower's simulation engine (Ray): the same
ServerApp and ClientApp as ``flwr run .``, one after another, against a
SuperLink that this script starts (``--simulation``, its own ``FLWR_HOME``
under the output folder) and stops at the end, with the processes it started,
by their process ids (also on Ctrl-C or SIGTERM, and before the next run
when a run times out). A run that already has ``runs/<name>/metrics.json``
with the same run config is not run again, so an interrupted grid resumes
where it stopped. At the end :func:`experiments.report.write_report` writes
``results.csv``, ``table.md`` and the plots into the output folder.

Presets (``--preset``; ``--list`` prints them with their grids):

* ``quick``: the FedAMP paper's practical setting on real MNIST and
  Fashion-MNIST files, 20 clients, 5 rounds of the paper's 10 local epochs
  (Adam 1e-3, batch 100), 500 test samples per client; Separate, FedAvg,
  FedProx, FedAvg-FT, FedAMP and HeurFedAMP (sigma 5 on MNIST). Under an
  hour on 2 CPU cores.
* ``fedamp-tables``: Tables 1-3 of Huang et al. (AAAI 2021): IID,
  pathological and practical settings of MNIST, FMNIST, EMNIST and CIFAR-100;
  Separate, FedAvg, FedProx, FedAvg-FT, FedProx-FT, SCAFFOLD, APFL, FedAMP,
  HeurFedAMP; 100 clients, 90 rounds of 10 epochs, batch 100, Adam 1e-3, the
  paper's sigmas.
* ``fedamp-scenarios``: the FedAMP appendix's robustness: drop rates 0, 0.1,
  0.3, 0.5 and heterogeneous epochs on FMNIST (practical).
* ``panacea-tables``: Tables 1 and 2 of the Panacea paper: fl60 and tpt48;
  FedAvg, FedAvg-FT, Per-FedAvg, pFedMe, pFedHN, Panacea-GN, Panacea; 3 seeds.
* ``panacea-robustness``: fl60 with 20% novel clients and attack ratios 0,
  0.1, 0.2, 0.3; FedAvg, FedMedian, Krum, Panacea.

``--strategies``, ``--datasets``, ``--seeds``, ``--rounds``,
``--num-supernodes`` and ``--set key=value`` narrow or change a preset.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from experiments import report  # noqa: E402
from experiments.flower_cli import (COMPLETED, FAILED, FlowerCliError, FlowerRun,  # noqa: E402
                                    RunOutcome, write_outcome)
from experiments.processes import SuperLink  # noqa: E402
from fedamp_flwr.config import ConfigError, RunConfig  # noqa: E402
from tasks import get_task  # noqa: E402

# Subfolder of --data-dir for each dataset (laid out like ../shared/data).
DATA_SUBDIRS = {"mnist": "mnist", "fmnist": "fashion_mnist", "emnist": "emnist",
                "cifar10": "cifar10", "cifar100": "cifar100", "tpt48": "tpt48"}
# Each run's outcome (Flower's run id and status), beside its metrics.json.
STATUS_FILE = report.STATUS_FILE
# The status of a run that Flower refused to start (flwr run failed).
NOT_SUBMITTED = "not-submitted"
# Datasets whose number of clients is fixed by the data.
FIXED_CLIENTS = {"fl60": 60, "tpt48": 48}


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


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a grid: its name, number of SuperNodes and full run-config overrides."""

    name: str
    num_clients: int
    run_config: dict[str, Any]


# The FedAMP paper's training: Adam 1e-3, batch 100, 10 local epochs, 90 rounds.
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
    extra = () if partitioning == "practical" else _SIGMA_STAND_IN[dataset]
    if partitioning == "pathological":
        extra += _NO_GROUPS
    return Setting(dataset, partitioning, 62 if dataset == "emnist" else 100, extra)

PRESETS: dict[str, Grid] = {
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
    "fedamp-scenarios": Grid(
        strategies=("fedavg", "fedprox", "fedamp", "heurfedamp"),
        settings=(Setting("fmnist", "practical", 100),),
        scenarios=({}, {"drop-rate": 0.1}, {"drop-rate": 0.3}, {"drop-rate": 0.5},
                   {"heterogeneous-epochs": True}),
        run_config=_FEDAMP_TRAINING,
    ),
    "panacea-tables": Grid(
        strategies=("fedavg", "fedavg-ft", "per-fedavg", "pfedme", "pfedhn", "panacea-gn", "panacea"),
        # FL-60 as the paper's text describes it and as its source generates it; TPT-48
        # split in time and at random (the paper's); local settings "auto" (tuned per task)
        settings=(Setting("fl60", "practical", 60, (("fl60-variant", "text"),), "text"),
                  Setting("fl60", "practical", 60, (("fl60-variant", "grda"),), "grda"),
                  Setting("tpt48", "practical", 48, (("tpt48-split", "time"),), "time"),
                  Setting("tpt48", "practical", 48, (("tpt48-split", "random"),), "random")),
        seeds=(0, 1, 2),
        run_config={"num-server-rounds": 60},
    ),
    "nonconvex": Grid(
        # Ioste and Finger's combination as written (the sum of exp(c r_h) w_h) against its
        # normalised form and FedAvg: their two-host setting (MNIST digits 0-4 on one host,
        # 5-9 on the other) and FMNIST practical with 20 clients
        strategies=("nonconvex", "nonconvex@normalized", "fedavg"),
        settings=(Setting("mnist", "blocks", 2, label="two-host"),
                  Setting("fmnist", "practical", 20)),
        run_config={**_FEDAMP_TRAINING, "num-server-rounds": 5, "local-epochs": 1,
                    "test-samples": 500},
        per_strategy={"nonconvex@normalized": {"nonconvex-normalize": True}},
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


def expand(grid: Grid, data_dir: str | None, output: Path, check_data: bool = True) -> list[Run]:
    """The runs of ``grid``, each with its validated run config.

    ``check_data``: the dataset folders under ``data_dir`` must exist.

    Raises
    ------
    ConfigError
        If any run's config is invalid (before anything runs).
    """
    runs = []
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
            if check_data and not folder.is_dir():
                raise ConfigError(f"--data-dir {data_dir!r} has no folder {DATA_SUBDIRS[setting.dataset]}/ "
                                  f"for dataset {setting.dataset!r}; allowed: a folder laid out like "
                                  "../shared/data, or --data-dir '' to load from the Hugging Face hub")
            cfg["data-dir"] = str(folder.resolve())
        try:
            RunConfig.from_run_config(cfg)
        except ConfigError as err:
            raise ConfigError(f"run {name}: {err}") from None
        runs.append(Run(name, n, cfg))
    return runs


def with_datasets(settings: Sequence[Setting], datasets: Sequence[str]) -> tuple[Setting, ...]:
    """The preset's settings of ``datasets``; a dataset the preset lacks gets each of the
    preset's partitionings with the first setting's number of clients."""
    out: list[Setting] = []
    partitionings = list(dict.fromkeys(s.partitioning for s in settings))
    for d in datasets:
        own = [s for s in settings if s.dataset == d]
        out += own or [Setting(d, p, settings[0].num_clients) for p in partitionings]
    return tuple(out)


def apply_overrides(grid: Grid, strategies: str | None, seeds: str | None,
                    rounds: int | None, sets: Sequence[str], num_clients: int | None,
                    datasets: str | None = None) -> Grid:
    """Narrow or change a preset by the command line's options."""
    changes: dict[str, Any] = {}
    if datasets:
        changes["settings"] = with_datasets(
            grid.settings, [d.strip() for d in datasets.split(",") if d.strip()])
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


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------
def metrics_path(output: Path, run: Run) -> Path:
    return output / "runs" / run.name / "metrics.json"


def previous_run(output: Path, run: Run) -> dict | None:
    """The metrics.json ``run`` left before, if its run config is the same."""
    path = metrics_path(output, run)
    try:
        metrics = json.loads(path.read_text())
        config = metrics["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    same = all(config.get(k) == v for k, v in run.run_config.items()
               if k != "num-server-rounds")
    return metrics if same else None


def is_done(output: Path, run: Run) -> bool:
    """Whether ``run`` finished before with the same run config (resume)."""
    metrics = previous_run(output, run)
    return bool(metrics and metrics.get("finished")
                and metrics["config"].get("num-server-rounds") == run.run_config.get("num-server-rounds"))


def resumable(output: Path, run: Run) -> int:
    """The rounds a half-finished ``run`` has done and checkpointed (0: start afresh)."""
    metrics = previous_run(output, run)
    checkpoint = output / "runs" / run.name / "checkpoint" / "state.pt"
    if not metrics or not checkpoint.is_file():
        return 0
    done = int(metrics.get("completed_rounds", 0))
    return done if done <= int(run.run_config.get("num-server-rounds", done)) else 0


def federation_config(num_clients: int, cpus: float, gpus: float) -> str:
    """The ``--federation-config`` of a run: SuperNodes and each ClientApp's resources."""
    def num(v: float) -> str:  # Flower wants integral resources as integers
        return str(int(v)) if float(v).is_integer() else repr(float(v))

    parts = [f"num-supernodes={num_clients}", f"client-resources-num-cpus={num(cpus)}",
             f"client-resources-num-gpus={num(gpus)}"]
    return " ".join(parts)


def _progress(prefix: str):
    """A log-line handler that prints the ServerApp's per-round test line under ``prefix``."""
    def show(line: str) -> None:
        if "mean test" in line:
            print(f"{prefix}   {line.split('INFO :', 1)[-1].strip()}", flush=True)
    return show


def _start(output: Path, run: Run, prefix: str) -> tuple[Path, dict[str, Any], bool]:
    """The run's folder and run config: continue a half-finished run from its checkpoint,
    else start afresh over what is there. The bool: whether it resumes."""
    run_dir = output / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    done = resumable(output, run)
    if done:
        print(f"{prefix}: resuming after round {done} from its checkpoint", flush=True)
    extra = {"resume": True} if done else {"overwrite": True}
    return run_dir, {**run.run_config, **extra}, bool(done)


def run_one(link: SuperLink, output: Path, run: Run, fed_config: str, prefix: str,
            timeout: float, app: Path = ROOT) -> RunOutcome:
    """One run of ``app`` through Flower's CLI (:class:`experiments.flower_cli.FlowerRun`),
    continuing a half-finished one from its checkpoint; prints a line per round.

    Its outcome (Flower's run id and status, whether it timed out) is written to
    ``runs/<name>/status.json`` and returned. A run still going after ``timeout``
    seconds (a clock, whatever the log says) is stopped with ``flwr stop``.
    """
    run_dir, run_config, resumed = _start(output, run, prefix)
    log_path = run_dir / "log.txt"
    if not resumed:
        log_path.write_text("")
    flower = FlowerRun(link.env, app, run_config, fed_config, log_path, _progress(prefix))
    try:
        flower.submit()
    except FlowerCliError as err:
        outcome = RunOutcome(None, NOT_SUBMITTED, str(err))
        with open(log_path, "a") as log:
            log.write(f"ERROR : {err}\n")
    else:
        outcome = flower.follow(timeout)
    if outcome.timed_out:
        print(f"{prefix} timed out after {timeout:.0f}s: stopped with flwr stop {outcome.run_id}",
              flush=True)
    write_outcome(run_dir / STATUS_FILE, outcome, engine="flower", **_identity(run))
    return outcome


def run_one_inprocess(output: Path, run: Run, prefix: str) -> RunOutcome:
    """One run of this app's ServerApp and ClientApp in this process (``--engine inprocess``);
    prints a line per round; its outcome goes to ``runs/<name>/status.json`` too."""
    import logging

    from fedamp_flwr.inprocess import run_inprocess

    run_dir, run_config, _ = _start(output, run, prefix)
    show = _progress(prefix)

    class Progress(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            show("INFO : " + record.getMessage())

    progress = Progress()
    logging.getLogger("flwr").addHandler(progress)
    started = time.monotonic()
    outcome = RunOutcome(None, COMPLETED)
    try:
        run_inprocess(run_config, run.num_clients, run_dir / "log.txt")
    except Exception as err:  # recorded in the log and reported; the grid goes on
        outcome = RunOutcome(None, FAILED, f"{type(err).__name__}: {err}")
        with open(run_dir / "log.txt", "a") as log:
            log.write(f"ERROR : {type(err).__name__}: {err}\n")
    finally:
        logging.getLogger("flwr").removeHandler(progress)
    outcome.seconds = round(time.monotonic() - started, 2)
    write_outcome(run_dir / STATUS_FILE, outcome, engine="inprocess", **_identity(run))
    return outcome


def _identity(run: Run) -> dict[str, Any]:
    """What ``status.json`` says of the run besides its outcome (its row in results.csv
    when it wrote no metrics.json)."""
    c = run.run_config
    return {"run_name": run.name, "run": {
        "strategy": c.get("strategy"), "label": c.get("label", ""), "dataset": c.get("dataset"),
        "partitioning": c.get("partitioning"), "seed": c.get("seed"),
        "num_clients": run.num_clients, "config": c}}


def succeeded(output: Path, run: Run, outcome: RunOutcome) -> bool:
    """Whether a run ended well: Flower says ``finished:completed`` and its metrics.json says
    it finished."""
    return outcome.status == COMPLETED and is_done(output, run)


def run_grid(runs: list[Run], output: Path, cpus: float, gpus: float, ray_address: str | None,
             timeout: float, engine: str = "flower") -> list[str]:
    """Run every run not done yet; return the names of the runs that failed."""
    todo = [r for r in runs if not is_done(output, r)]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run", flush=True)
    failed: list[str] = []
    if not todo:
        return failed
    link_or_none = (SuperLink(output / ".flwr-home", ray_address) if engine == "flower"
                    else contextlib.nullcontext())
    with link_or_none as link:
        for i, run in enumerate(todo, 1):
            prefix = f"[{i}/{len(todo)}] {run.name}"
            print(f"{prefix}: {run.num_clients} clients", flush=True)
            started = time.monotonic()
            fed = federation_config(run.num_clients, cpus, gpus)
            outcome = (run_one(link, output, run, fed, prefix, timeout) if engine == "flower"
                       else run_one_inprocess(output, run, prefix))
            if succeeded(output, run, outcome):
                m = json.loads(metrics_path(output, run).read_text())
                score = (f"BMTA {m['bmta']:.2f}%" if "bmta" in m
                         else f"best mean MSE {m.get('best_mean_mse', float('nan')):.4g}")
                print(f"{prefix}: {score} ({time.monotonic() - started:.0f}s)", flush=True)
            else:
                failed.append(run.name)
                why = f"{outcome.status}{' (timed out)' if outcome.timed_out else ''}"
                print(f"{prefix}: FAILED ({why}), see {output / 'runs' / run.name / 'log.txt'}",
                      flush=True)
    return failed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    class Formatter(argparse.RawDescriptionHelpFormatter):
        """The module docstring as written; each option's default where it has one."""

        def _get_help_string(self, action: argparse.Action) -> str:
            text = action.help or ""
            if action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text:
                text += " (default: %(default)s)"
            return text

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=Formatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                   help="the grid to run (--list shows each one's runs)")
    p.add_argument("--list", action="store_true", help="print the presets' runs and exit")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"),
                   help="folder with one subfolder per dataset, laid out like ../shared/data "
                        "(mnist/, fashion_mnist/, tpt48/, ...); '' = the Hugging Face hub")
    p.add_argument("--output", default=None, help="results folder (default results/<preset>)")
    p.add_argument("--strategies", help="comma-separated subset/replacement of the preset's strategies")
    p.add_argument("--datasets", help="comma-separated datasets instead of the preset's "
                   "(with the preset's partitionings), e.g. 'synthetic' or 'mnist,fmnist'")
    p.add_argument("--seeds", help="comma-separated seeds (default: the preset's)")
    p.add_argument("--rounds", type=int, help="num-server-rounds of every run")
    p.add_argument("--num-supernodes", type=int,
                   help="clients (SuperNodes) per run for partitioned datasets (fl60/tpt48 are fixed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a run-config value for every run (repeatable)")
    p.add_argument("--cpus-per-client", type=float, default=1.0,
                   help="CPUs reserved for each ClientApp (Ray client resources)")
    p.add_argument("--gpus-per-client", type=float, default=0.0,
                   help="GPU share of each ClientApp, e.g. 0.1 = ten clients per GPU")
    p.add_argument("--ray-address", default=None,
                   help="attach to a running Ray cluster (e.g. 'auto' or 'HOST:6379')")
    p.add_argument("--timeout", type=float, default=6 * 3600,
                   help="seconds per run (6 hours), --engine flower")
    p.add_argument("--report-only", action="store_true", help="only (re)write table and plots")
    p.add_argument("--engine", choices=("flower", "inprocess"), default="flower",
                   help="flower: each run a `flwr run` on Flower's simulation engine; inprocess: "
                        "the same ServerApp and ClientApp functions in this process, without "
                        "Flower's engine (fast for small models; no --timeout)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, grid in PRESETS.items():
            n = len(grid.strategies) * len(grid.settings) * len(grid.scenarios) * len(grid.seeds)
            print(f"{name}: {n} runs; strategies {', '.join(grid.strategies)}; settings "
                  f"{', '.join(f'{s.dataset}/{s.partitioning}' for s in grid.settings)}; "
                  f"scenarios {list(grid.scenarios)}; seeds {list(grid.seeds)}")
        return 0
    for key, value in (("--cpus-per-client", args.cpus_per_client),
                       ("--gpus-per-client", args.gpus_per_client)):
        if value < 0:
            raise SystemExit(f"{key} = {value} is invalid; allowed: a number >= 0")
    output = Path(args.output or ROOT / "results" / args.preset).resolve()
    grid = apply_overrides(PRESETS[args.preset], args.strategies, args.seeds, args.rounds,
                           args.set, args.num_supernodes, args.datasets)
    data_dir = args.data_dir or None
    try:
        runs = expand(grid, data_dir, output)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    failed: list[str] = []
    if not args.report_only:
        failed = run_grid(runs, output, args.cpus_per_client, args.gpus_per_client,
                          args.ray_address, args.timeout, args.engine)
    folders = [output / "runs" / r.name for r in runs if (output / "runs" / r.name).is_dir()]
    written = report.write_report(report.load_runs(folders), output,
                                  strategy_order=grid.strategies)
    print(f"Wrote {', '.join(p.name for p in written)} to {output}")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}")
        return 1
    return 0


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupted)  # `kill <pid>` cleans up like Ctrl-C
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; finished runs are kept: the same command resumes the grid",
              file=sys.stderr)
        sys.exit(130)
