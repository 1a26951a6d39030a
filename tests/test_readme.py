"""README.md, checked: what a fast test can pin of what it says, against the code it describes.

Read from README.md itself, so that an edit of either side that makes them disagree fails here:

* the Methods table lists exactly the registered strategies (``strategies.STRATEGIES``), each
  once; the Layout names files that exist and every module that registers a method; the
  Documentation list names every ``docs/*.md``; the Data section names every dataset
  (``tasks.TASKS``) and exactly the partitionings;
* every relative link points at a file, and every ``#anchor`` at a heading of it (GitHub's
  slugs);
* every ``--run-config "..."`` string passes the app's offline check (``fedamp-flwr
  check-config``, on this app's ``pyproject.toml``; a trailing ``...`` is the README's elision
  and is dropped; the placeholder ``data-dir='/path/to/...'`` passes because a pool dataset's
  folder is opened by the clients, not by the check); a ``check-config`` example that the README
  shows refused is refused with the words it quotes;
* every command of its code blocks and inline code names a command, module and options that
  exist, parsed by the tools' own parsers in process (``fedamp-flwr``, ``simulation.py`` with
  each grid expanded to validated runs, ``flwr run``, ``flower-supernode``, ``python -m``,
  ``pytest -m``); ``experiments.make_sites`` is run as written (a second, into ``tmp_path``);
* every bare name in inline code is a strategy, dataset, partitioning, run-config or node-config
  key (or one of a few named others); the defaults, the quick preset, the default task, the data
  folders, the install pins, CI's order and what it quotes of Flower (ports, messages, exit
  code) agree with the code, ``pyproject.toml``, ``.ci/run`` and the installed Flower; every
  folder a command writes to is git-ignored; the headline table is the recorded one.

Left to other tests (named in docs/ or found by name): that each strategy runs by its name
alone (tests/test_default_run.py), that a mistake stops a run before any node is waited for
and Flower records it failed (tests/test_default_run.py, tests/test_flower_e2e.py), the closing
lines (tests/test_default_run.py), predict and the models' files (tests/test_delivery.py), the
run page (tests/test_run_page.py), dashboards and progress (tests/test_dashboards.py,
tests/test_progress.py), the import layers (tests/test_structure.py), the install pair
(tests/test_install.py). Times, and numbers measured by long runs (the headline and Panacea
results, the wine table), are the docs' commands' to reproduce, not a test's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: what the README's commands start with that a test here can parse
TOOLS = ("flwr", "fedamp-flwr", "python", "python3", "simulation.py", "flower-supernode", "pip")
#: bare names in inline code that are neither a method, a dataset nor a key: the dev extra,
#: a tool, the import layers
OTHER_NAMES = {"dev", "mypy", "tasks", "strategies", "experiments"}


# -- reading Markdown ---------------------------------------------------------------------------

@dataclass
class Markdown:
    headings: list[str] = field(default_factory=list)
    prose: dict[str, str] = field(default_factory=dict)  # "## " section -> text, code left out
    code: list[tuple[str, str, str]] = field(default_factory=list)  # (section, info, text)


def read_markdown(path: Path) -> Markdown:
    md, section, fence, block, info = Markdown(), "", False, [], ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if fence:
                md.code.append((section, info, "\n".join(block)))
            fence, block, info = not fence, [], line[3:].strip()
            continue
        if fence:
            block.append(line)
            continue
        if line.startswith("#"):
            md.headings.append(line.lstrip("#").strip())
            if line.startswith("## "):
                section = line[3:].strip()
        md.prose[section] = md.prose.get(section, "") + line + "\n"
    return md


def slugs(headings: list[str]) -> set[str]:
    """GitHub's anchors: the text lowercased, without links' targets, backticks and punctuation
    other than '-' and '_', each space a '-'; a repeated one gets -1, -2, ..."""
    out: dict[str, int] = {}
    for text in headings:
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = out.get(slug, 0)
        out[slug] = n + 1
        if n:
            out[f"{slug}-{n}"] = 1
    return set(out)


def spans(text: str) -> list[str]:
    """Inline code, each with its whitespace (line breaks too) as single spaces."""
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", text)]


def table(text: str) -> list[list[str]]:
    """The body rows of the Markdown tables in ``text`` (each table's header and rule left
    out), as lists of cells."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.lstrip().startswith("|")]
    rule = [all(set(c) <= set("-: ") for c in r) for r in rows]
    header = [i + 1 < len(rows) and rule[i + 1] for i in range(len(rows))]
    return [r for r, is_rule, is_header in zip(rows, rule, header) if not (is_rule or is_header)]


MD = read_markdown(README)
PROSE = "".join(MD.prose.values())


def _split(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def commands(inline: bool = True) -> list[list[str]]:
    """Every command of the README's bash blocks (and, with ``inline``, of its inline code), as
    its argv (leading ``VAR=value`` assignments dropped), for the tools of :data:`TOOLS`; a
    tool's name alone is a mention, not a command."""
    texts = [line for _, info, code in MD.code if info == "bash"
             for line in code.replace("\\\n", " ").splitlines()]
    texts += [s for s in spans(PROSE) if s.split()[0] in TOOLS] if inline else []
    out = []
    for text in texts:
        for argv in _pipeline(_split(text) or []):
            while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
                argv = argv[1:]
            if len(argv) > 1 and argv[0] in TOOLS:
                out.append(["python", *argv] if argv[0] == "simulation.py" else argv)
    return out


def _pipeline(tokens: list[str]) -> list[list[str]]:
    """The commands of ``a && b | c; d``."""
    out: list[list[str]] = [[]]
    for token in tokens:
        if token in ("&&", "||", "|", ";"):
            out.append([])
        else:
            out[-1].append(token)
    return out


def option_values(option: str) -> list[tuple[list[str], str]]:
    """(command, value) of every ``option VALUE`` of the README's commands and inline code."""
    found = [(argv, argv[i + 1]) for argv in commands() for i, a in enumerate(argv[:-1])
             if a == option]
    found += [([], argv[1]) for s in spans(PROSE) if s.startswith(option + " ")
              and (argv := _split(s)) and len(argv) == 2]
    return found


def _check_config_example(argv: list[str]) -> bool:
    """The README's ``fedamp-flwr check-config`` example, which it shows refused."""
    return argv[:2] == ["fedamp-flwr", "check-config"]


RUN_CONFIGS = sorted({re.sub(r"\s+\.\.\.$", "", v) for argv, v in option_values("--run-config")
                      if not _check_config_example(argv)})
CHECK_CONFIG_EXAMPLES = [v for argv, v in option_values("--run-config") if _check_config_example(argv)]


def _help_options(show_help) -> set[str]:
    """The ``--options`` an argparse program's ``--help`` lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        show_help()
    return set(re.findall(r"--[a-z][a-z0-9-]*", out.getvalue()))


def _subcommands():
    from fedamp_flwr.tools import cli

    parser = cli.parser_of()
    (choices,) = [a.choices for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    return parser, choices


def _flwr_commands():
    import typer
    from flwr.cli.app import app

    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def _parses(parse, argv: list[str]) -> str | None:
    """None where ``parse(argv)`` takes it; else what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse(argv)
    except SystemExit as exit_:
        return f"{shlex.join(argv)}: exit {exit_.code}: {err.getvalue().strip()}"
    return None


# -- the tables and lists ------------------------------------------------------------------------

def test_the_methods_table_lists_every_registered_strategy_once():
    import strategies

    named = [name for row in table(MD.prose["Methods"]) for name in re.findall(r"`([^`]+)`", row[0])]
    assert sorted(named) == sorted(strategies.STRATEGIES), "README.md, Methods"


def test_the_layout_names_files_that_exist_and_every_module_that_registers_a_method():
    import strategies

    missing, rows = [], {}
    for first, what in table(MD.prose["Layout"]):
        folders = [ROOT / n for n in re.findall(r"`([^`]+/)`", first)] or [ROOT]
        for name in re.findall(r"`([\w./]+(?:\.py|/))`", what):
            if not any((folder / name).exists() for folder in folders):
                missing.append(f"{first}: {name}")
        rows[first] = what
    assert not missing, f"README.md, Layout names files that do not exist: {missing}"
    modules = {e.factory.__module__ for e in strategies.STRATEGIES.values()}
    files = {m.split(".")[-1] + ".py" for m in modules if m.startswith("strategies.")}
    unnamed = sorted(f for f in files if f"`{f}`" not in rows["`strategies/`"])
    assert not unnamed, f"README.md, Layout's strategies/ row leaves out {unnamed}"


def test_the_documentation_list_names_every_doc():
    listed = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", MD.prose["Documentation"]))
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert listed == docs, f"README.md, Documentation: not listed {sorted(docs - listed)}, " \
                           f"no such doc {sorted(listed - docs)}"


def test_the_data_section_names_every_dataset_and_exactly_the_partitionings():
    import tasks
    from tasks.recipes import PARTITIONINGS

    text = MD.prose["Data"]
    said = re.search(r"`partitioning`: ((?:`[^`]+`,?\s*)+)", text)
    assert said is not None, "README.md, Data: no list of the partitionings"
    partitionings = re.findall(r"`([^`]+)`", said.group(1))
    assert partitionings == list(PARTITIONINGS)
    (first,) = [p for p in text.split("\n\n") if p.startswith("`dataset`:")]
    datasets = [s for s in spans(first) if s not in {*partitionings, "dataset", "partitioning",
                                                     "data-dir", ".npz"}]
    assert [d for d in datasets if d not in tasks.TASKS] == [], "not a dataset"
    assert sorted(set(tasks.TASKS) - set(datasets)) == [], "README.md, Data leaves out datasets"


# -- links ---------------------------------------------------------------------------------------

def _links() -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", PROSE)
            if not re.match(r"[a-z]+:", t)]


def test_the_readme_has_relative_links():
    assert len(_links()) >= 10  # the parser below finds them


@pytest.mark.parametrize("target", sorted(set(_links())))
def test_a_relative_link_points_at_a_file_and_its_anchor_at_a_heading(target):
    path, _, anchor = target.partition("#")
    file = (README.parent / path) if path else README
    assert file.exists(), f"README.md links to {target}: no file {path}"
    if anchor:
        assert anchor in slugs(read_markdown(file).headings), \
            f"README.md links to {target}: {path or 'README.md'} has no heading #{anchor}"


# -- run configs ---------------------------------------------------------------------------------

def test_the_readme_gives_run_configs_and_a_check_config_example():
    assert len(RUN_CONFIGS) >= 5 and CHECK_CONFIG_EXAMPLES


@pytest.mark.parametrize("run_config", RUN_CONFIGS)
def test_every_run_config_of_the_readme_passes_the_offline_check(run_config, capsys):
    from fedamp_flwr.tools import cli

    rc = cli.main(["check-config", "--run-config", run_config, "--app", str(ROOT)])
    assert rc == 0, capsys.readouterr().err


def test_the_readmes_refused_examples_are_refused_with_the_words_it_quotes(capsys):
    """The ``check-config`` example and the ServerApp's ``Run stopped:`` line."""
    from fedamp_flwr.tools import cli

    quoted = [s for s in spans(PROSE) if s.startswith("error: run config")]
    for run_config in CHECK_CONFIG_EXAMPLES:
        rc = cli.main(["check-config", "--run-config", run_config, "--app", str(ROOT)])
        said = capsys.readouterr()
        assert rc == 1 and any(said.err.startswith(q.removesuffix(" (...)")) for q in quoted), \
            (run_config, said.err, quoted)
    (stopped,) = [s for s in spans(PROSE) if s.startswith("ERROR : Run stopped: ")]
    text = stopped.removeprefix("ERROR : Run stopped: ").removesuffix(" ...")
    key, value = re.match(r"run config '([\w-]+)' = (\S+) is invalid", text).groups()
    assert cli.main(["check-config", "--run-config", f"{key}={value}", "--app", str(ROOT)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {text}")


# -- commands ------------------------------------------------------------------------------------

def test_the_readme_has_commands_of_every_tool():
    assert {argv[0] for argv in commands()} >= {"flwr", "fedamp-flwr", "python", "pip",
                                                 "flower-supernode"}


def test_every_fedamp_flwr_command_names_a_command_and_its_options():
    """Parsed by its parser, each option spelled in full (argparse takes a prefix)."""
    parser, subcommands = _subcommands()
    said = []
    for argv in (a for a in commands() if a[0] == "fedamp-flwr"):
        if argv[1] not in subcommands:
            said.append(f"no command {argv[1]}")
        elif len(argv) > 2:
            said += [s for s in [_parses(parser.parse_args, argv[1:])] if s]
            said += [a for a in argv[2:] if a.startswith("--")
                     and a not in subcommands[argv[1]]._option_string_actions]
    assert not said


def test_every_simulation_command_parses_with_its_options_in_full():
    import simulation

    runs = [argv[2:] for argv in commands() if argv[:2] == ["python", "simulation.py"]]
    options = _help_options(lambda: simulation.parse_args(["--help"]))
    said = [_parses(simulation.parse_args, args) for args in runs]
    said += [a for args in runs for a in args if a.startswith("--") and a not in options]
    assert runs and [s for s in said if s] == []


@pytest.mark.parametrize("argv", [a for a in commands(inline=False)
                                  if a[:2] == ["python", "simulation.py"]],
                         ids=lambda argv: shlex.join(argv[2:]))
def test_every_simulation_command_parses_and_expands_to_valid_runs(argv, tmp_path):
    """Options, presets and narrowing as ``simulation.py`` checks them, every run's config
    validated (nothing run, nothing written); ``$DATA`` a folder with the runner's data
    subfolders, empty."""
    import simulation
    from experiments.presets import DATA_SUBDIRS, PRESETS, apply_overrides

    for sub in DATA_SUBDIRS.values():
        (tmp_path / "data" / sub).mkdir(parents=True, exist_ok=True)
    args = [a.replace("$DATA", str(tmp_path / "data")) for a in argv[2:]]
    assert _parses(simulation.parse_args, args) is None
    parsed = simulation.parse_args(args)
    if parsed.list:
        with contextlib.redirect_stdout(io.StringIO()):
            assert simulation.main(args) == 0
        return
    simulation.check_args(parsed)
    grid = apply_overrides(PRESETS[parsed.preset], parsed.strategies, parsed.seeds,
                           parsed.rounds, parsed.set, parsed.num_supernodes, parsed.datasets,
                           parsed.scenarios)
    assert simulation.grid_runs(parsed, grid, tmp_path / "out")


def test_every_option_in_the_prose_is_an_option_of_its_tool():
    """An inline ``--option``: of simulation.py in Experiments, else of a tool the README uses."""
    import simulation

    parser, subcommands = _subcommands()
    ours = {o for sub in subcommands.values() for o in sub._option_string_actions}
    flwr_run = {o for p in _flwr_commands()["run"].params for o in p.opts}
    runner = _help_options(lambda: simulation.parse_args(["--help"]))
    wrong = []
    for section, text in MD.prose.items():
        allowed = runner if section == "Experiments" else runner | ours | flwr_run
        wrong += [s for s in spans(text) if s.startswith("--") and s.split()[0] not in allowed]
    assert not wrong


def test_every_flwr_and_supernode_command_parses():
    from flwr.common.config import parse_config_args
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    from fedamp_flwr import cards, client_app, identity
    from fedamp_flwr.member import ledger

    flwr = _flwr_commands()
    node_keys = {client_app.DATA_PATH, client_app.MEMBER_NAME, ledger.PRIVACY_DIR,
                 ledger.MAX_EPSILON, ledger.DELTA, cards.MODEL_DIR, identity.IDENTITY_DIR}
    for argv in commands():
        argv = [a for a in argv if a != "..."]  # the README's elision
        if argv[0] == "flwr":
            assert argv[1] in flwr, argv
            if argv[1] == "run":
                flwr["run"].make_context("run", argv[2:])  # click: raises on a bad option
        elif argv[0] == "flower-supernode":
            args = _parse_args_run_supernode().parse_args(argv[1:])
            assert set(parse_config_args([args.node_config])) <= node_keys
    for s in spans(PROSE):  # `flwr ls`, `flwr stop`
        if s.startswith("flwr ") and len(s.split()) == 2:
            assert s.split()[1] in flwr, s


def test_every_python_module_and_pytest_selection_exists():
    markers = {m.split(":")[0] for m in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
    for argv in commands():
        if argv[0] in ("python", "python3") and argv[1] == "-m":
            assert importlib.util.find_spec(argv[2]) is not None, argv
        if argv[:3] == ["python", "-m", "pytest"]:
            for i, a in enumerate(argv[3:], 3):
                if argv[i - 1] == "-m":
                    words = set(re.findall(r"\w+", a)) - {"and", "or", "not"}
                    assert words <= markers, (argv, markers)
                elif not a.startswith("-"):
                    assert (ROOT / a).exists(), argv


def test_make_sites_as_the_readme_runs_it_names_the_file_predict_reads():
    """Its options are make_sites' own, and its member 0 is the file the predict line reads
    (that make_sites writes ``<member name>.npz``: tests/test_members.py)."""
    from experiments import make_sites

    (argv,) = [a for a in commands() if a[:3] == ["python", "-m", "experiments.make_sites"]]
    (predict,) = [a for a in commands() if a[:2] == ["fedamp-flwr", "predict"]]
    options = _help_options(lambda: make_sites.main(["--help"]))
    assert [a for a in argv[3:] if a.startswith("--") and a not in options] == []
    data = Path(predict[3])
    assert data.parent == Path(argv[argv.index("--out") + 1]), "predict reads make_sites' folder"
    n = int(argv[argv.index("--num-clients") + 1])
    assert data.name == f"{make_sites.member_name(0, n)}.npz"


def test_every_folder_a_command_writes_is_ignored_by_git():
    ignored = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    written = [v for opt in ("--out", "--output") for _, v in option_values(opt)]
    written += [v.replace("$PWD/", "") for _, _, code in MD.code
                for v in re.findall(r"FLWR_HOME=(\S+)", code)]
    assert written
    assert [w for w in written if Path(w).parts[0] not in ignored] == []


# -- names and defaults --------------------------------------------------------------------------

def test_every_bare_name_in_inline_code_is_a_method_dataset_or_key():
    import strategies
    import tasks
    from fedamp_flwr import client_app
    from fedamp_flwr.config import default_values
    from fedamp_flwr.member import ledger
    from tasks.recipes import PARTITIONINGS

    known = {*strategies.STRATEGIES, *tasks.TASKS, *PARTITIONINGS, *default_values(),
             client_app.DATA_PATH, client_app.MEMBER_NAME, ledger.PRIVACY_DIR,
             ledger.MAX_EPSILON, *OTHER_NAMES}
    names = {s for s in spans(PROSE) if re.fullmatch(r"[a-z][a-z0-9-]*", s)}
    assert names and sorted(names - known) == []
    keys = [m.group(1) for s in spans(PROSE) if (m := re.fullmatch(r"([a-z][a-z0-9-]*) = .+", s))]
    assert keys and sorted(set(keys) - set(default_values())) == []


def test_the_defaults_the_readme_states():
    from fedamp_flwr.config import RunConfig, default_values

    defaults = default_values()
    code = "\n".join(c for _, _, c in MD.code)
    strategy, dataset = re.search(r"Run the default: (\S+) on the embedded (\S+) task",
                                  code).groups()
    assert (strategy.lower(), dataset) == (defaults["strategy"], defaults["dataset"])
    assert re.search(r"`(\w+)` \(the default", MD.prose["Data"]).group(1) == defaults["dataset"]
    assert re.search(r"under `([\w-]+)/<run name>/`", PROSE).group(1) == defaults["results-dir"]
    store = re.search(r"a file store in `([\w/-]+)`", PROSE).group(1)
    cfg = RunConfig.from_run_config({**defaults, "mlflow": True})
    assert cfg.mlflow_store() == (Path.cwd() / store).resolve().as_uri()
    runs_on = int(re.search(r"own default is (\d+) simulated SuperNodes", PROSE).group(1))
    assert defaults["min-nodes"] <= runs_on  # "Every command here also runs on those 2"


def test_the_default_task_is_as_described():
    import tasks

    classes, dims, groups = map(int, re.search(r"(\d+)-class data in (\d+) dimensions, in (\d+) "
                                               r"groups", PROSE).groups())
    spec = tasks.TASKS["synthetic"]
    assert spec.info.num_outputs == classes and spec.info.input_shape == (dims,)
    assert len(spec.practical.group_classes) == groups
    assert {len(c) for c in spec.practical.group_classes} == {2}  # "their group's two classes"


def test_the_experiments_data_folders_and_presets():
    import strategies
    import tasks
    from experiments.presets import DATA_SUBDIRS, PRESETS

    text = MD.prose["Experiments"]
    folders = re.findall(r"`([\w-]+)/`", text.split("laid out as")[0])
    assert folders and sorted(set(folders) - set(DATA_SUBDIRS.values())) == []
    assert set(PRESETS["default"].strategies) == set(strategies.STRATEGIES)  # "every method"
    assert not tasks.TASKS["synthetic"].needs_data_dir and not tasks.TASKS["fl60"].needs_data_dir
    for image in ("mnist", "fmnist", "emnist", "cifar10", "cifar100"):  # --data-dir '': the hub
        assert tasks.TASKS[image].hub is not None, image


# -- install and CI ------------------------------------------------------------------------------

def test_the_install_pins_agree_with_ci_and_pyproject():
    from packaging.requirements import Requirement

    text = MD.prose["Install"] + "\n".join(c for s, _, c in MD.code if s == "Install")
    pins = set(re.findall(r"(torch|torchvision)==([\d.]+)", text))
    ci = (ROOT / ".ci" / "run").read_text()
    assert pins and pins == set(re.findall(r"(torch|torchvision)==([\d.]+)", ci))
    project = PYPROJECT["project"]
    requirements = {r.name: r for r in map(Requirement, project["dependencies"])}
    for name, version in pins:
        assert requirements[name].specifier.contains(version), (name, version)
    python, major, minor = re.search(r"Python (\d+\.\d+) or newer \(flwr (\d+)\.(\d+)",
                                     text).groups()
    assert project["requires-python"] == f">={python}"
    flwr = requirements["flwr"].specifier  # "flwr 1.41": 1.41.x and no other
    assert flwr.contains(f"{major}.{minor}.0") and not flwr.contains(f"{major}.{int(minor) + 1}.0")
    extras = set(re.findall(r'"\.\[(\w+)\]"', PROSE + "\n".join(c for _, _, c in MD.code)))
    assert extras and extras <= set(project["optional-dependencies"])


def test_ci_lints_and_type_checks_before_the_tests_as_the_readme_says():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    order = [next(i for i, line in enumerate(ci) if line.startswith(cmd))
             for cmd in ("ruff check .", "mypy", "python -m pytest")]
    assert order == sorted(order)
    dev = " ".join(PYPROJECT["project"]["optional-dependencies"]["dev"])
    assert "ruff" in dev and "mypy" in dev and {"ruff", "mypy"} <= set(PYPROJECT["tool"])


# -- what it quotes of Flower --------------------------------------------------------------------

def test_what_the_readme_quotes_of_flower_holds_for_the_installed_flower(tmp_path, monkeypatch):
    import flwr.cli.constant
    import flwr.cli.local_superlink
    import flwr.simulation.app
    from flwr.common import constant
    from flwr.supercore.exit.exit_code import ExitCode

    defaults = dict(re.findall(r'os\.environ\.get\(\s*"(FLWR_LOCAL_\w+)", "(\d+)"\s*\)',
                               inspect.getsource(flwr.cli.constant)))
    ports = re.search(r"fixed\s+ports \((\d+), (\d+)\)", PROSE).groups()
    assert sorted(ports) == sorted(defaults.values())
    (export,) = [c for _, _, c in MD.code if c.startswith("export FLWR_HOME")]
    assert set(re.findall(r"(FLWR_LOCAL_\w+)=", export)) == set(defaults)
    warning = re.search(r'its log says so: "([^"]+)"', " ".join(PROSE.split())).group(1)
    assert warning in inspect.getsource(flwr.simulation.app)
    assert int(re.search(r"`Exit Code: (\d+)`", PROSE).group(1)) == ExitCode.SIMULATION_EXCEPTION
    assert constant.FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION in "\n".join(
        c for _, _, c in MD.code)
    assert f"default `~/{constant.FLWR_DIR}`" in PROSE
    # `pgrep -f "flower-superlink.*$FLWR_HOME"`: the local SuperLink's command line names it
    monkeypatch.setenv(constant.FLWR_HOME, str(tmp_path))
    assert "--log-file" in inspect.getsource(flwr.cli.local_superlink._start_local_superlink)
    _, log_file = flwr.cli.local_superlink._get_local_superlink_paths()
    assert log_file.is_relative_to(tmp_path)


# -- the headline results ------------------------------------------------------------------------

def test_the_quick_preset_is_what_the_headline_section_says():
    from experiments.presets import PRESETS

    text = " ".join(MD.prose["Headline results"].split())
    clients, seed = map(int, re.search(r"(\d+) clients, BMTA in %, seed (\d+)", text).groups())
    rounds, epochs, lr, batch = re.search(r"(\d+) communication rounds x (\d+) local epochs "
                                          r"\(Adam ([\d.e-]+), batch (\d+)\)", text).groups()
    quick = PRESETS["quick"]
    assert {s.num_clients for s in quick.settings} == {clients} and quick.seeds == (seed,)
    assert quick.run_config["num-server-rounds"] == int(rounds)
    assert quick.run_config["local-epochs"] == int(epochs)
    assert quick.run_config["optimizer"] == "adam" and quick.run_config["learning-rate"] == float(lr)
    assert quick.run_config["batch-size"] == int(batch)
    methods = [row[0] for row in table(MD.prose["Headline results"])]
    assert methods == list(quick.strategies)


def test_the_headline_table_is_the_recorded_one():
    """docs/quick/table.md (what the preset wrote) and docs/reproducing.md (with the paper)."""
    rows = table(MD.prose["Headline results"])
    recorded = {r[0]: r[1:] for r in table((ROOT / "docs" / "quick" / "table.md").read_text())}
    assert rows and all(recorded[r[0]] == r[1:3] for r in rows)
    reproducing = table((ROOT / "docs" / "reproducing.md").read_text())
    assert all(r in reproducing for r in rows)
