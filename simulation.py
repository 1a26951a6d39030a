"""The experiment runner: a grid of `flwr run` simulations, then the papers' tables and plots.

    python simulation.py --preset quick --data-dir ../shared/data --output results/quick

Every run of the grid (strategies x settings x scenarios x seeds,
:mod:`experiments.presets`) is one run of this app on Flower's simulation
engine (Ray), submitted, followed, timed out and stopped through Flower's CLI
(:mod:`experiments.runner`): the same ServerApp and ClientApp as ``flwr run
.``, against a SuperLink that this script starts (its own ``FLWR_HOME`` under
the output folder and free ports) and stops at the end, with the processes it
started, by their process ids (also on Ctrl-C or SIGTERM). A run that already
has ``runs/<name>/metrics.json`` with the same run config is not run again,
so an interrupted grid resumes where it stopped. At the end
:func:`experiments.report.write_report` writes ``results.csv`` (with Flower's
status of every run), ``table.md`` and the plots into the output folder.

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
* ``fedamp-table3``: Table 3 alone (the practical setting of the four
  datasets, the nine methods): the paper-scale grid of docs/reproducing.md.
* ``fedamp-scenarios``: the FedAMP appendix's robustness: drop rates 0, 0.1,
  0.3, 0.5 and heterogeneous epochs on FMNIST (practical).
* ``panacea-tables``: Tables 1 and 2 of the Panacea paper (scenario 1: 20% of the clients
  novel): fl60, tpt48, the traffic stand-in on METR-LA's and PEMS-BAY's road graphs, and
  metr-la, pems-bay and compcars from the user's files; FedAvg, FedAvg-FT, Per-FedAvg,
  pFedMe, SFL, pFedHN, Panacea-GN, Panacea; 3 seeds.
* ``panacea-robustness``: fl60 with 20% novel clients and attack ratios 0,
  0.1, 0.2, 0.3; FedAvg, FedMedian, Krum, Panacea.

``--strategies``, ``--datasets``, ``--seeds``, ``--rounds``,
``--num-supernodes`` and ``--set key=value`` narrow or change a preset.
``--jobs N`` (or ``auto``) runs N runs at once, each in a process of its own
with its share of the CPU cores (:mod:`experiments.jobs`): one run leaves a
GPU mostly idle.

``--tune K`` runs the tuning protocol instead (:mod:`experiments.tuning`,
docs/tuning.md): K trials of every method in every data setting of the preset,
each trained without a held-out validation share of its clients' training data
and scored on it, and writes the chosen values to ``tuned.json`` and
``tuned.md`` (default output ``results/tune-<preset>``). ``--tuned FILE`` runs a
preset with a ``tuned.json``'s values.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not {"-h", "--help", "--list"} & set(sys.argv):
    # the imports below (torch, Flower) take seconds: the grid says so from its first second
    print("Loading torch and Flower...", flush=True)

import argparse
import json
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import report
from experiments.budget import Budget, apply_budget
from experiments.flower_cli import FlowerCliError
from experiments.jobs import parse_jobs
from experiments.presets import PRESETS, ConfigError, Grid, PlannedRun, apply_overrides, expand
from experiments.runner import run_grid
from experiments.tuning import VALIDATION_FRACTION, apply_tuned, choose, tuning_runs
from fedamp_flwr.server.dashboards import missing_extras
from strategies.core.registry import budget_tuned

ROOT = Path(__file__).resolve().parent


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
    p.add_argument("--datasets", help="comma-separated datasets (or dataset/label: one setting, "
                   "e.g. tpt48/time) instead of the preset's "
                   "(with the preset's partitionings), e.g. 'synthetic' or 'mnist,fmnist'")
    p.add_argument("--seeds", help="comma-separated seeds (default: the preset's)")
    p.add_argument("--scenarios", help="comma-separated indices of the preset's scenarios "
                   "(--list shows them, 0 first), e.g. 0 for panacea-tables' Table 1 alone")
    p.add_argument("--rounds", type=int, help="num-server-rounds of every run")
    p.add_argument("--budget", default=None, metavar="rounds=R|steps=S",
                   help="every run's budget: R communication rounds, or S local gradient steps "
                        "per client spent as each run's local-steps k chooses (S / k rounds); "
                        "experiments/budget.py")
    p.add_argument("--num-supernodes", type=int,
                   help="clients per run of a partitioned dataset (a federated one has its own)")
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
    p.add_argument("--jobs", default="1",
                   help="runs at a time, each in its own process with cores/jobs CPU threads "
                        "(a positive integer, or 'auto': up to 4 per GPU, else one per 8 cores)")
    p.add_argument("--tune", type=int, default=None, metavar="K",
                   help="tune instead: K trials of every method in every data setting, scored "
                        "on held-out validation data (docs/tuning.md)")
    p.add_argument("--validation-fraction", type=float, default=VALIDATION_FRACTION,
                   help="--tune: share of each client's training data held out to score trials")
    _dashboard_options(p)
    p.add_argument("--tuned", type=Path, default=None, metavar="FILE",
                   help="run with the values of a tuned.json (from --tune) for each method and "
                        "data setting it names; --set and --rounds still win")
    return p.parse_args(argv)


def _dashboard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", action="store_true",
                   help="every run writes TensorBoard event files (runs/<name>/tensorboard/): "
                        "tensorboard --logdir <output>/runs compares them")
    p.add_argument("--mlflow", action="store_true",
                   help="every run logs to MLflow, a file store in <output>/mlruns unless --set "
                        "mlflow-uri=URI says otherwise")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, grid in PRESETS.items():
            n = len(grid.strategies) * len(grid.settings) * len(grid.scenarios) * len(grid.seeds)
            print(f"{name}: {n} runs; strategies {', '.join(grid.strategies)}; settings "
                  f"{', '.join(f'{s.dataset}/{s.partitioning}' for s in grid.settings)}; "
                  f"scenarios {list(grid.scenarios)}; seeds {list(grid.seeds)}")
        return 0
    jobs = check_args(args)
    default_out = f"tune-{args.preset}" if args.tune else args.preset
    output = Path(args.output or ROOT / "results" / default_out).resolve()
    try:
        grid = apply_overrides(PRESETS[args.preset], args.strategies, args.seeds, args.rounds,
                               args.set + dashboard_settings(args, output), args.num_supernodes,
                               args.datasets, args.scenarios)
        runs = grid_runs(args, grid, output)
    except (ConfigError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    failed: list[str] = []
    if not args.report_only:
        try:
            failed = run_grid(runs, output, args.cpus_per_client, args.gpus_per_client,
                              args.ray_address, args.timeout, args.engine, jobs)
        except FlowerCliError as err:  # the app's FAB could not be built: no run started
            raise SystemExit(f"error: {err}") from None
    if args.tune:
        command = "python simulation.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        result = choose(runs, output, command, budget=args.budget or "")
        n = sum(map(len, result["strategies"].values()))
        print(f"Wrote tuned.json and tuned.md to {output}: {n} method/setting choices"
              + (f"; no finished trial: {', '.join(result['missing'])}" if result["missing"]
                 else ""))
        return 1 if failed else 0
    folders = [output / "runs" / r.name for r in runs if (output / "runs" / r.name).is_dir()]
    # the folder's earlier pieces (other strategies, datasets or seeds run into it) stay
    kept = report.keep_earlier(output, {r.name for r in runs})
    written = report.write_report(report.load_runs(folders), output,
                                  strategy_order=grid.strategies, kept=kept)
    print(f"Wrote {', '.join(p.name for p in written)} to {output}"
          + (f" (with {len(kept)} earlier run(s) of its results.csv that this grid does not "
             "plan)" if kept else ""))
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}")
        return 1
    return 0


def check_args(args: argparse.Namespace) -> int:
    """The options that no run can check, checked together (SystemExit naming the option);
    the number of jobs."""
    for key, value in (("--cpus-per-client", args.cpus_per_client),
                       ("--gpus-per-client", args.gpus_per_client)):
        if value < 0:
            raise SystemExit(f"{key} = {value} is invalid; allowed: a number >= 0")
    try:
        jobs = parse_jobs(args.jobs)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if args.tune is not None and args.tune < 1:
        raise SystemExit(f"error: --tune {args.tune} is invalid; allowed: an integer >= 1")
    if args.tune and args.tuned:
        raise SystemExit("error: --tune and --tuned together are invalid: a tuning grid's "
                         "trials set their own values; allowed: one of them")
    if args.validation_fraction != VALIDATION_FRACTION and not args.tune:
        raise SystemExit(f"error: --validation-fraction {args.validation_fraction} is used only "
                         "by --tune; allowed: --tune K with it, or --set validation-fraction=F "
                         "for plain runs")
    if not 0 < args.validation_fraction < 1:
        raise SystemExit(f"error: --validation-fraction {args.validation_fraction} is invalid; "
                         "allowed: a number in (0, 1)")
    for package in missing_extras(args.tensorboard, args.mlflow):
        raise SystemExit(f"error: --{package} needs the {package} package, which is not "
                         f"installed; allowed: pip install 'fedamp-flwr[{package}]', or "
                         f"without --{package}")
    if args.budget and (args.rounds or any(
            s.partition("=")[0].strip() == "num-server-rounds" for s in args.set)):
        raise SystemExit("error: --rounds (or --set num-server-rounds) and --budget together are "
                         "invalid: a budget sets the rounds; allowed: one of them")
    return jobs


def dashboard_settings(args: argparse.Namespace, output: Path) -> list[str]:
    """``--set`` values of ``--tensorboard`` and ``--mlflow`` (the grid's MLflow store: in its
    output folder, unless ``--set mlflow-uri`` names one)."""
    out = ["tensorboard=true"] if args.tensorboard else []
    if args.mlflow:
        out.append("mlflow=true")
        if not any(s.partition("=")[0].strip() == "mlflow-uri" for s in args.set):
            out.append(f"mlflow-uri={(output / 'mlruns').as_uri()}")
    return out


def grid_runs(args: argparse.Namespace, grid: Grid, output: Path) -> list[PlannedRun]:
    """The grid's runs (a tuning grid's trials with ``--tune``), with the tuned values of
    ``--tuned`` or of ``--budget`` (strategies/tuned.json's "budgets") and the budget applied;
    ``--set`` and ``--rounds`` win over tuned values."""
    data_dir = args.data_dir or None
    if args.tune:
        runs = tuning_runs(grid, args.tune, data_dir, output, args.validation_fraction)
    else:
        runs = expand(grid, data_dir, output)
    fixed = sorted({r.run_config["dataset"] for r in runs
                    if args.num_supernodes and r.num_clients != args.num_supernodes})
    if fixed:
        print(f"note: --num-supernodes {args.num_supernodes} is not for {', '.join(fixed)}: "
              "their data fix their clients")
    forced = [i.partition("=")[0].strip() for i in args.set] + (
        ["num-server-rounds"] if args.rounds else [])
    if args.budget and not args.tune and not args.tuned:
        if tuned := budget_tuned(args.budget):
            runs = apply_tuned(runs, tuned, forced)
            print(f"--budget {args.budget}: the values tuned under it (strategies/tuned.json)"
                  f" for {', '.join(sorted(tuned['strategies']))}")
    if args.tuned:
        tuned = read_tuned(args.tuned)
        if tuned.get("budget") and tuned["budget"] != args.budget:
            raise ConfigError(f"--tuned {str(args.tuned)!r} was chosen under --budget "
                              f"{tuned['budget']}; allowed: the same --budget "
                              "(its values spend that budget, not the preset's rounds)")
        runs = apply_tuned(runs, tuned, forced)
    return apply_budget(runs, Budget.parse(args.budget) if args.budget else None)


def read_tuned(path: Path) -> dict[str, Any]:
    """A ``tuned.json`` written by ``--tune``; a clear error where it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--tuned {str(path)!r}: {err}; allowed: a tuned.json written by "
                          "--tune") from None
    if not isinstance(data, dict) or not isinstance(data.get("strategies"), dict):
        raise ConfigError(f"--tuned {str(path)!r} has no 'strategies' object; allowed: a "
                          "tuned.json written by --tune")
    return data


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
