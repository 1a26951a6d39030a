"""The house: imports run downward only, and the run config's defaults are written once.

* Layers: ``tasks`` imports none of the others; ``strategies`` imports ``tasks``
  only; the app (``fedamp_flwr``) imports ``strategies`` and ``tasks``; the
  experiment runner (``experiments``, ``simulation.py``, ``benchmarks``) may
  import all. No module imports, directly or through others, itself (no
  circles), lazy imports inside functions included.
* ``pyproject.toml``'s ``[tool.flwr.app.config]`` and the code's defaults (the
  app's generic keys and every method's settings) agree, key by key.
* A reader can hold each piece: no function of the product over 60 lines (docstring
  included), no class of the app or the methods over 15 methods or 300 lines, FedAMP's
  strategy, client half and math 575 lines together.
"""

from __future__ import annotations

import ast
import dataclasses
import tomllib
from pathlib import Path

import pytest

from fedamp_flwr.config import default_values

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "strategies", "fedamp_flwr", "experiments", "benchmarks")
# what each layer may import (besides itself)
ALLOWED = {"tasks": set(), "strategies": {"tasks"}, "fedamp_flwr": {"tasks", "strategies"},
           "experiments": {"tasks", "strategies", "fedamp_flwr", "simulation"},
           "benchmarks": {"tasks", "strategies", "fedamp_flwr", "experiments", "simulation"},
           "simulation": {"tasks", "strategies", "fedamp_flwr", "experiments"}}


def _modules() -> dict[str, Path]:
    out = {"simulation": ROOT / "simulation.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that module ``name`` imports (anywhere in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {n: _imports(n, p, set(_modules())) for n, p in _modules().items()}


def _layer(name: str) -> str:
    return name.split(".")[0]


def test_imports_run_downward_only():
    wrong = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                   if _layer(b) != _layer(a) and _layer(b) not in ALLOWED[_layer(a)])
    assert wrong == []


def test_no_module_imports_itself_through_others():
    """No circles: a depth-first search finds no back edge (a package's __init__ importing
    its own submodules is fine; a submodule importing its package back is a circle)."""
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own submodule
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_no_module_imports_another_modules_private_names():
    """A name that starts with "_" is its module's own: no other module of the project
    imports it (``from x import _y``)."""
    found = sorted(f"{name}: {node.module} {alias.name}" for name, path in _modules().items()
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                           .split(".")[0] in PACKAGES)
                   for alias in node.names if alias.name.startswith("_"))
    assert found == []


def test_no_strategy_module_imports_the_app():
    assert not [n for n in GRAPH if _layer(n) == "strategies"
                and any(_layer(t) == "fedamp_flwr" for t in GRAPH[n])]


#: what each side of the app may import of the app (besides itself, docs/adding-a-method.md)
SIDES = {"fedamp_flwr.server": {"fedamp_flwr"}, "fedamp_flwr.member": {"fedamp_flwr"},
         "fedamp_flwr.tools": {"fedamp_flwr", "fedamp_flwr.server", "fedamp_flwr.member"},
         "fedamp_flwr": {"fedamp_flwr"}}
#: Flower's two apps: each starts its side (the ServerApp the server's, the ClientApp the
#: member's)
APPS = {"fedamp_flwr.server_app": "fedamp_flwr.server",
        "fedamp_flwr.client_app": "fedamp_flwr.member"}


def _side(name: str) -> str:
    return ".".join(name.split(".")[:2]) if name.count(".") >= 2 else "fedamp_flwr"


def test_each_side_of_the_app_imports_only_its_own_and_the_shared_modules():
    """The member's side imports nothing of the server's or the tools', the server's nothing
    of the member's or the tools', the shared modules neither side (but each app its own)."""
    wrong = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() if _layer(a) == "fedamp_flwr"
                   for b in targets if _layer(b) == "fedamp_flwr" and _side(b) != _side(a)
                   and _side(b) not in SIDES[_side(a)] and APPS.get(a) != _side(b))
    assert wrong == []
    assert {_side(n) for n in GRAPH if _layer(n) == "fedamp_flwr"} == set(SIDES)


#: the most lines of one function of the product (tests aside), docstring included
MOST_FUNCTION_LINES = 60


def test_no_function_of_the_product_is_longer_than_a_screen():
    long = sorted(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                  f"{node.end_lineno - node.lineno + 1} lines"
                  for path in _modules().values()
                  for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.end_lineno - node.lineno + 1 > MOST_FUNCTION_LINES)
    assert long == []


#: the most methods, and lines (docstring included), of one class of the app and the methods
MOST_CLASS_METHODS, MOST_CLASS_LINES = 15, 300


def test_no_class_of_the_app_or_the_methods_is_longer_than_a_reader_holds():
    """Every class of ``fedamp_flwr`` and ``strategies``: at most 15 methods (properties
    included) and 300 lines; Panacea's file under 600 lines."""
    big = sorted(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {len(methods)} methods, "
                 f"{node.end_lineno - node.lineno + 1} lines"
                 for name, path in _modules().items()
                 if _layer(name) in ("fedamp_flwr", "strategies")
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ClassDef)
                 and (len(methods := [m for m in node.body if isinstance(
                     m, ast.FunctionDef | ast.AsyncFunctionDef)]) > MOST_CLASS_METHODS
                      or node.end_lineno - node.lineno + 1 > MOST_CLASS_LINES))
    assert big == []
    assert len((ROOT / "strategies" / "panacea.py").read_text().splitlines()) < 600


#: the server half of a FedAMP round, from the ServerApp's main to Eq. 6-7: the functions a
#: reader follows, by file (docs/adding-a-method.md, "Where a run goes")
FEDAMP_ROUND = {
    "fedamp_flwr/server_app.py": ["main", "_main", "ServerRun.__init__", "ServerRun.setup",
                                  "ServerRun.find", "ServerRun.build", "ServerRun.restore",
                                  "ServerRun.configs", "ServerRun.execute", "run_setup"],
    "fedamp_flwr/server/rounds.py": ["run_rounds", "play_round"],
    "fedamp_flwr/server/transport.py": ["send_and_receive"],
    "fedamp_flwr/server/recorder.py": ["RunRecorder.after_round"],
    "strategies/core/registry.py": ["build_strategy"],
    "strategies/core/base.py": [
        "ClientInstructions.train_keys", "ClientInstructions.instruct",
        "StrategyBase._screen_train", "StrategyBase.update_bound", "StrategyBase._within_bound",
        "PersonalRounds.configure_train", "PersonalRounds.sample_rows",
        "PersonalRounds.online_rows", "PersonalRounds._messages", "PersonalRounds.aggregate_train",
        "PersonalRounds.configure_evaluate", "PersonalRounds.aggregate_evaluate",
        "PersonalizedStrategy.update", "PersonalizedStrategy._ensure_models",
        "PersonalizedStrategy.initial_models"],
    "strategies/fedamp.py": [
        "_factory", "FedAMP.__init__", "FedAMP.alpha_at", "FedAMP.weights", "FedAMP.self_weights",
        "FedAMP.personalize", "FedAMP.sent_distances", "FedAMP.collaboration", "FedAMP.update",
        "FedAMP.data_sigma", "FedAMP._say", "_AMPSettings.sigma", "_AMPSettings.self_weight"],
    "strategies/fedamp_math.py": ["fedamp_weights", "cloud_models", "median_sq_distance"],
}


def test_the_server_half_of_a_fedamp_round_is_read_in_8_files_and_1500_lines():
    """Every function of :data:`FEDAMP_ROUND` exists (a rename fails here, so the list stays
    the path), in at most 8 files, at most 1,500 lines together, docstrings included."""
    lines = 0
    for name, wanted in FEDAMP_ROUND.items():
        tree = ast.parse((ROOT / name).read_text())
        found = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        found.update({f"{c.name}.{m.name}": m for c in tree.body if isinstance(c, ast.ClassDef)
                      for m in c.body if isinstance(m, ast.FunctionDef)})
        assert set(wanted) <= set(found), (name, sorted(set(wanted) - set(found)))
        lines += sum(found[f].end_lineno - min([found[f].lineno] + [
            d.lineno for d in found[f].decorator_list]) + 1 for f in wanted)
    assert len(FEDAMP_ROUND) <= 8 and lines <= 1500, lines


def _spells(path: Path, names: set[str]) -> bool:
    """Whether the code of ``path`` spells one of ``names``: a variable, an attribute, an
    argument, a keyword, an import or a string (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)}
    words = {getattr(node, field) for node in ast.walk(tree)
             for field in ("id", "attr", "arg", "asname", "name") if hasattr(node, field)}
    words |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
              and isinstance(node.value, str) and id(node) not in docs}
    return bool(words & names)


def _below(path: list[str]) -> bool:
    """Whether each module of ``path`` is below the one before it (imported by it, through
    others maybe): a value that goes along it never steps back up the import floors."""
    def name(file: str) -> str:
        return file.removesuffix(".py").replace("/", ".")

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in GRAPH[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen
    return all(name(b) in reached(name(a)) for a, b in zip(path, path[1:]))


#: the modules that the run config's learning rate passes to the optimizer (its message key's
#: name is strategies/core/protocol.py's; the value never enters it), and FedAMP's sigma to
#: Eq. 6 (parsed, as every key, by strategies/core/settings.py for fedamp_flwr/config.py):
#: docs/adding-a-method.md, "Where a run goes"
LEARNING_RATE_PATH = ["fedamp_flwr/config.py", "strategies/core/client.py", "tasks/train.py"]
SIGMA_PATH = ["strategies/fedamp.py", "strategies/fedamp_math.py"]


def test_the_learning_rate_and_sigma_pass_at_most_4_modules_downward():
    """Of the modules of a FedAMP round (the server half, :data:`FEDAMP_ROUND`, and the
    client's), only the learning rate's path spells it, and of the product's modules only
    sigma's path spells sigma; each path runs down the import floors."""
    rate = {"learning_rate", "LEARNING_RATE", "learning-rate", "lr"}
    client = ["fedamp_flwr/client_app.py", "strategies/core/client.py",
              "strategies/core/protocol.py", "tasks/train.py", "fedamp_flwr/config.py"]
    spelled = sorted(f for f in {*FEDAMP_ROUND, *client} if _spells(ROOT / f, rate))
    assert spelled == sorted([*LEARNING_RATE_PATH, "strategies/core/protocol.py"])
    sigma = {"sigma", "fedamp_sigma", "heurfedamp_sigma", "fedamp-sigma", "heurfedamp-sigma"}
    spelled = sorted(str(p.relative_to(ROOT)) for p in _modules().values()
                     if p.relative_to(ROOT).parts[0] in ("fedamp_flwr", "strategies", "tasks")
                     and _spells(p, sigma))
    assert spelled == SIGMA_PATH
    assert len(LEARNING_RATE_PATH) <= 4 and len(SIGMA_PATH) + 2 <= 4  # + settings, config
    assert _below(LEARNING_RATE_PATH) and _below(["fedamp_flwr/config.py", *SIGMA_PATH])


def test_fedamp_is_as_short_as_its_idea():
    """FedAMP's strategy, its client half (Eq. 7: FedProx's until its own) and its math."""
    lines = sum(len((ROOT / "strategies" / f).read_text().splitlines())
                for f in ("fedamp.py", "fedamp_math.py"))
    assert lines <= 575


def test_each_key_of_a_runs_records_is_spelled_in_one_module():
    """metrics.json's round records, headline and top-level keys are built and read through
    strategies/core/records.py: no other module of the product spells one, or a prefix of
    one (an f-string's "client_")."""
    from strategies.core import records

    keys = {records.client_key(m) for m in records.METRICS} | {
        records.mean_key(m, novel) for m in records.METRICS for novel in (False, True)} | set(
        records.HEADLINES) | {records.TRAINED, records.MEAN_TRAIN_LOSS, records.DP_SPENT,
                              records.GLOBAL_NORM, records.SERVER_LOSSES, *records.ABSENT.values(),
                              records.REJECTED["evaluate"]} | {"client_", "mean_", "novel_mean_"}
    # metrics.json's top level (records.RunFile), but for the words that also name a key of
    # another file (the checkpoint, a model card, status.json) or a run-config key
    keys |= {f.name for f in dataclasses.fields(records.RunFile)} - {
        "run_name", "strategy", "label", "dataset", "partitioning", "num_clients", "seed",
        "config", "finished", "rounds", "models", "xi", "wall_time_s", "client_names",
        "member_keys", "impostors", "impostor_count", "member_scaling", "collaboration_policy",
        "warm_start",
        "alone", "extra"}
    spelled = sorted(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
                     for name, path in _modules().items() if name != "strategies.core.records"
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Constant) and node.value in keys)
    assert spelled == []


def test_pyproject_and_the_code_have_the_same_keys_and_defaults():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    code = default_values()
    assert sorted(table) == sorted(code)
    for key, value in table.items():
        assert code[key] == value and type(code[key]) is type(value), key


@pytest.mark.parametrize("key", ["fedamp-sigma", "panacea-client-lr", "fedprox-mu"])
def test_a_methods_key_is_declared_by_its_module(key):
    from strategies.core.registry import STRATEGIES

    owners = {e.settings.__module__ for e in STRATEGIES.values() if key in e.settings.keys()}
    assert owners and all(o.startswith("strategies.") and ".core." not in o for o in owners)


def test_every_methods_key_is_declared_once_with_its_doc_and_check():
    from strategies.core.registry import method_keys

    for key, f in method_keys().items():
        assert f.metadata.get("doc"), f"{key}: declare it with strategies.core.settings.setting()"
        assert f.type in ("bool", "str") or f.metadata.get("ok"), f"{key}: no check declared"


def test_the_configuration_reference_is_the_declarations():
    from fedamp_flwr.config import generic_reference
    from strategies.core.registry import method_reference

    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert method_reference() in doc, ("docs/configuration.md's table of the methods' keys "
                                       "differs: python -m tests.test_structure --reference")
    assert generic_reference() in doc, ("docs/configuration.md's table of the generic keys "
                                        "differs: python -m tests.test_structure --reference")


def test_every_generic_key_is_declared_with_its_doc():
    from fedamp_flwr.config import RunConfig

    for key, f in RunConfig.generic_fields().items():
        assert f.metadata.get("doc"), f"{key}: declare it with setting()"


def test_a_client_half_owns_the_keys_its_settings_send_and_no_others():
    import strategies
    from strategies.core.settings import ConfigError

    updates = strategies.CLIENT_UPDATES
    assert updates["hypernetwork"].train_keys == (
        "panacea-client-lr", "panacea-client-momentum", "panacea-client-weight-decay",
        "panacea-client-clip", "panacea-hold-out",
        "panacea-hold-out-run")  # the last two: the guard's, set each round
    assert updates["proximal"].train_keys == ("proximal-mu",)  # Flower FedProx's key
    assert updates["fedamp"].train_keys == ("fedamp-pull",)  # lambda / alpha_k, each round
    assert updates["finetune"].train_keys == () and updates["finetune"].evaluate_keys == (
        "finetune-epochs",)
    settings = updates["apfl"].settings
    assert settings.from_message({"apfl-alpha": 0.25}).apfl_alpha == 0.25
    with pytest.raises(ConfigError, match="'apfl-alpha' = 5.0 is invalid; allowed: a number in"):
        settings.from_message({"apfl-alpha": 5.0})  # a message's value is checked as the config's
    from flwr.app import ConfigRecord

    from strategies.core.client import instruction_problem

    problem = instruction_problem(ConfigRecord({"client-update": "apfl", "apfl-alpha": 5.0}), True)
    assert problem is not None and "carries a bad value" in problem and "'apfl-alpha' = 5.0" in problem


if __name__ == "__main__":
    import sys

    import strategies  # noqa: F401 - registers every method
    from fedamp_flwr.config import generic_reference
    from strategies.core.registry import method_reference

    if sys.argv[1:] != ["--reference"]:
        sys.exit("usage: python -m tests.test_structure --reference")
    print("<!-- generic keys: generated -->\n" + generic_reference())
    print("<!-- methods' keys: generated -->\n" + method_reference(), end="")


def _test_module_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each ``from X import name`` in a test file, lazy imports included,
    with a relative ``X`` named inside ``tests``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module.startswith("tests."):
                module = module.removeprefix("tests.")
            else:
                continue
            out += [(module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name.removeprefix("tests."), "*") for alias in node.names
                    if alias.name.startswith("tests.")]
    return out


def _imports_from_tests(path: Path) -> list[str]:
    return [f"{path.name}: from {module} import {name}"
            for module, name in _test_module_imports(path)
            if module.split(".")[0].startswith("test_") or module == "conftest"]


def test_no_test_module_imports_from_another(tmp_path):
    """The tests' helpers live in one place (tests/helpers.py; fixtures in tests/conftest.py):
    no test module takes a name, private or not, from another test module or the conftest."""
    assert [line for path in sorted((ROOT / "tests").glob("test_*.py"))
            for line in _imports_from_tests(path)] == []
    # the check sees such an import at the top, lazy in a function, or absolute
    sample = tmp_path / "test_sample.py"
    sample.write_text("from .helpers import ROOT\nfrom .test_members import _sites\n"
                      "def f():\n    from tests.test_survival import run\n"
                      "    from .conftest import processes\n")
    assert _imports_from_tests(sample) == [
        "test_sample.py: from test_members import _sites",
        "test_sample.py: from test_survival import run",
        "test_sample.py: from conftest import processes"]
