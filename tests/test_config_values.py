"""Every run-config value is checked before any work: a hostile value of any key (generic or a
method's, found from the declarations, so that a new key is covered with no new test) is
either a value the key allows or one ConfigError line that names that key.

A refusal is checked by its reason (``err.key``, ``err.value``, ``err.kind``: see
:class:`ConfigError`), not by its words; one test per message family keeps the wording a
person reads (:func:`test_the_wording_of_an_invalid_value`,
:func:`test_the_wording_of_an_unknown_key`)."""

from __future__ import annotations

import copy
import logging
import math
import typing

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from fedamp_flwr.config import ConfigError, RunConfig, default_values, explain
from strategies.core.registry import method_keys, settings_classes
from strategies.core.settings import bad, type_name


def _types() -> dict[str, str]:
    """Every key's declared type, as written (``int``, ``float | str``, ...)."""
    hints = typing.get_type_hints(RunConfig)
    out = {key: type_name(hints[f.name]) for key, f in RunConfig.generic_fields().items()}
    for cls in settings_classes():
        cls_hints = typing.get_type_hints(cls)
        out.update({key: type_name(cls_hints[f.name]) for key, f in cls.keys().items()})
    return out


TYPES = _types()
NUMERIC = sorted(k for k, t in TYPES.items() if t in ("int", "float", "int | str", "float | str"))
HOSTILE = [math.nan, math.inf, -math.inf, -1, -1.5, 0, 0.0, 1e300, 10**30, 10**400, "", "x", "nan",
           "inf", "-inf", True, False]


def _refusal(key: str, value) -> ConfigError | None:
    """None if the config with ``key`` = ``value`` is accepted, else its ConfigError (any other
    exception fails the test)."""
    try:
        RunConfig.from_run_config({key: value})
    except ConfigError as err:
        return err
    return None


def _reason(err: ConfigError | None) -> tuple | None:
    """What a refusal says, in fields: (key, value, kind)."""
    return None if err is None else (err.key, err.value, err.kind)


def test_every_key_is_declared_once_with_its_default():
    assert set(TYPES) == set(default_values()) == set(RunConfig.generic_fields()) | set(
        method_keys())
    assert "learning-rate" in NUMERIC and "fedamp-alpha-k" in NUMERIC and "seed" in NUMERIC


def test_a_hostile_value_is_allowed_or_one_line_naming_its_key():
    """Every numeric key with every hostile value, in one loop: the problems are listed together."""
    wrong = []
    for key in NUMERIC:
        for value in HOSTILE:
            err = _refusal(key, value)
            must_refuse = (isinstance(value, float) and not math.isfinite(value)
                           or value in ("nan", "inf", "-inf") or isinstance(value, bool)
                           or (value in ("", "x") and "str" not in TYPES[key]))
            if err is None and must_refuse:
                wrong.append(f"{key} = {value!r} was accepted")
            elif err is not None and (err.key != key or err.kind != "invalid"
                                      or "\n" in str(err)):
                wrong.append(f"{key} = {value!r}: {_reason(err)} {err}")
    assert wrong == []


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(TYPES)),
       value=st.one_of(st.floats(), st.integers(), st.text(max_size=6), st.booleans()))
def test_any_value_of_any_key_is_allowed_or_names_its_key(key, value):
    err = _refusal(key, value)
    if err is not None:
        # a valid choice may need another key (dataset 'npz' needs data-dir): that key is named
        assert err.key is not None and err.kind in ConfigError.KINDS, (_reason(err), str(err))
        assert err.key == key or err.kind in ("conflict", "missing"), (_reason(err), str(err))
        if isinstance(value, float) and not math.isfinite(value):
            assert (err.key, err.kind) == (key, "invalid"), (_reason(err), str(err))


#: every integer key but seed (already in [0, 2^32)), and the timeouts: each has an upper bound
BOUNDED = sorted({k for k, t in TYPES.items() if t in ("int", "int | str") and k != "seed"}
                 | {"round-timeout", "node-wait-timeout"})


def test_the_bounded_keys_are_found_from_the_declarations():
    assert {"num-server-rounds", "batch-size", "local-steps", "member-outputs", "test-samples",
            "panacea-hidden", "panacea-embed-dim", "panacea-server-steps", "finetune-epochs",
            "pfedme-inner-steps", "round-timeout"} <= set(BOUNDED)


def test_a_size_of_1e9_is_refused_with_one_line_naming_its_key():
    wrong = []
    for key in BOUNDED:
        err = _refusal(key, 10**9)
        if err is None or _reason(err) != (key, 10**9, "invalid") or "\n" in str(err) \
                or "at most" not in (err.allowed or ""):  # 1e9 as a float too: 1e9 == 10**9
            wrong.append(f"{key} = 10**9: {_reason(err)} {err}")
    assert wrong == []


def test_the_issues_examples_are_refused_by_their_key():
    for key in ("learning-rate", "fedamp-alpha-k", "fedamp-lambda", "fedprox-mu",
                "dirichlet-alpha"):
        assert _reason(_refusal(key, math.inf)) == (key, math.inf, "invalid")
    assert _reason(_refusal("seed", -1)) == ("seed", -1, "invalid")


@pytest.mark.parametrize("case, says", [
    ("text", "is not an .npz file"),
    ("pickled", "object arrays, which only pickle can read; refused"),
    ("nan", "x has non-finite values at index 3"),
    ("negative label", "y has labels [-1] outside"),
    ("shape", "x must be N x F, got shape (40, 2, 3)"),
])
def test_a_bad_npz_file_is_one_line_before_round_1(tmp_path, caplog, case, says):
    import logging

    from fedamp_flwr.tools.inprocess import run_inprocess

    path = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    x, y, client = rng.normal(size=(40, 3)), rng.integers(0, 3, 40), np.repeat(np.arange(2), 20)
    if case == "text":
        path.write_text("x,y\n1,2\n")
    elif case == "pickled":
        np.savez(path, x=np.array([{"a": 1}] * 40, dtype=object), y=y, client=client)
    else:
        if case == "nan":
            x[3, 1] = np.nan
        if case == "negative label":
            y[5] = -1
        if case == "shape":
            x = rng.normal(size=(40, 2, 3))
        np.savez(path, x=x, y=y, client=client)
    cfg = {"dataset": "npz", "data-dir": str(path), "strategy": "fedavg", "results-dir":
           str(tmp_path), "run-name": "run", "num-server-rounds": 1}
    with caplog.at_level(logging.INFO, logger="flwr"), pytest.raises(ConfigError):
        run_inprocess(cfg, 2)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, errors  # once: no client was asked
    assert errors[0].startswith(f"Run stopped: run config 'data-dir' = '{path}': {path}: ")
    assert says in errors[0]
    assert not any("ROUND" in r.getMessage() for r in caplog.records)


def test_a_node_without_the_road_graph_names_data_dir_once(tmp_path):
    """A traffic stand-in's node whose ``data-dir`` lacks the road graph: one line naming the
    key and its value once (the reader's words already name them, a ``tasks.DataDirError``:
    they were said twice); another file's error after the key, whatever its words."""
    import tasks
    from tasks.compcars import load_compcars

    cfg = RunConfig.from_run_config({"dataset": "traffic-generated", "data-dir": str(tmp_path),
                                     "strategy": "fedavg"})
    with pytest.raises(tasks.DataDirError) as err:
        tasks.load_client_data(cfg.data_config(207), 0)
    said = cfg.data_dir_problem(err.value)
    assert said.startswith(f"run config 'data-dir' = '{tmp_path}': the metr-la road graph "), said
    assert said.count("'data-dir'") == 1, said
    assert cfg.data_dir_problem(FileNotFoundError("x.npz not found")) == \
        f"run config 'data-dir' = '{tmp_path}': x.npz not found"
    # the error's type, not its words, says whether the key is named already
    same_words = FileNotFoundError(str(err.value))
    assert cfg.data_dir_problem(same_words).count("'data-dir'") == 2
    with pytest.raises(tasks.DataDirError, match="'compcars' needs CompCars' data folder"):
        load_compcars(tmp_path)


def test_defaults_are_valid():
    cfg = RunConfig.from_run_config({})
    assert cfg.strategy == "fedamp"
    # the synthetic task's own sigma (strategies/fedamp.py, PAPER_SIGMA)
    assert cfg.settings.sigma(cfg.dataset, cfg.data_setting) == 0.1
    fmnist = RunConfig.from_run_config({"dataset": "fmnist", "data-dir": "x"})
    assert fmnist.settings.sigma("fmnist", "practical") == 10.0


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ({"strategy": "fedsgd"}, "strategy", "apfl, fedamp, fedavg, fedavg-ft"),
        ({"drop-rate": 1.0}, "drop-rate", "[0, 1)"),
        ({"heterogeneous-epochs": 1}, "heterogeneous-epochs", "true or false"),
        ({"apfl-alpha": 0.0}, "apfl-alpha", "(0, 1]"),
        ({"finetune-epochs": 0}, "finetune-epochs", "integer >= 1"),
        ({"dataset": "imagenet"}, "dataset", "synthetic, mnist"),
        ({"partitioning": "weird"}, "partitioning", "practical, iid"),
        ({"fedamp-sigma": 0.0}, "fedamp-sigma", '"auto" or a finite number > 0'),
        ({"fedamp-sigma": -2}, "fedamp-sigma", '"auto" or a finite number > 0'),
        ({"heurfedamp-sigma": "big"}, "heurfedamp-sigma", '"auto" or a number'),
        ({"fedamp-sigma": float("inf")}, "fedamp-sigma", '"auto" or a number, finite'),
        ({"heurfedamp-self-weight": 1.0}, "heurfedamp-self-weight", "[0, 1)"),
        ({"heurfedamp-self-weight": -0.1}, "heurfedamp-self-weight", "[0, 1)"),
        ({"fraction-train": 0.0}, "fraction-train", "(0, 1]"),
        ({"local-epochs": 0}, "local-epochs", "integer >= 1"),
        ({"batch-size": "ten"}, "batch-size", "an integer"),
        ({"learning-rate": -1.0}, "learning-rate", "> 0"),
    ],
)
def test_bad_values_name_key_value_and_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config(override)
    assert (err.value.key, err.value.value, err.value.kind) == (key, override[key], "invalid")
    assert allowed in err.value.allowed  # what the key allows, as the declaration says it


def test_the_wording_of_an_invalid_value():
    """The one test of the words a person reads for a bad value: the key, the value as Python
    writes it, and what is allowed."""
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"drop-rate": 1.0})
    assert str(err.value) == "run config 'drop-rate' = 1.0 is invalid; allowed: a number in [0, 1)"


@pytest.mark.parametrize("run_config, reason", [
    ({"sigma": 3}, ("sigma", 3, "unknown")),
    ({"sigma": 3, "alpha": 1}, ("alpha", 1, "unknown")),  # the first of them, sorted
    ({"resume": True}, ("run-name", "", "missing")),
    ({"graph": "file"}, ("graph-file", "", "missing")),
    ({"resume": True, "run-name": "a", "overwrite": True}, ("overwrite", True, "conflict")),
    ({"mlflow-uri": "http://x"}, ("mlflow-uri", "http://x", "conflict")),
    ({"dp": "update", "dp-noise-multiplier": 0}, ("dp-noise-multiplier", 0, "conflict")),
])
def test_a_refusal_says_its_kind(run_config, reason):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config(run_config)
    assert _reason(err.value) == reason


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError) as err:
        explain({}, "sigma")
    assert (err.value.key, err.value.kind) == ("sigma", "unknown")


def test_the_wording_of_an_unknown_key():
    """The one test of the words a person reads for unknown keys: every one of them, and every
    key there is."""
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"sigma": 3, "alpha": 1})
    keys = sorted(default_values())
    assert err.value.allowed == ", ".join(keys)
    assert str(err.value) == f"unknown run config key(s) ['alpha', 'sigma']; allowed: {', '.join(keys)}"


def test_bad_fills_the_reason_and_it_survives_a_copy():
    err = bad("graph", "ring", "full, knn", kind="conflict")
    assert (err.key, err.value, err.allowed, err.kind) == ("graph", "ring", "full, knn", "conflict")
    assert bad("graph", "ring", "full, knn").kind == "invalid"
    for sent in (err, ConfigError("run config 'x' = 1 is invalid"),
                 _refusal("seed", -1), _refusal("sigma", 3)):
        back = copy.deepcopy(sent)  # through __reduce__, as pickle (a process boundary) goes
        assert type(back) is ConfigError and str(back) == str(sent) and back.args == sent.args
        assert (back.key, back.value, back.allowed, back.kind) == (
            sent.key, sent.value, sent.allowed, sent.kind)
    assert ConfigError("m").kind == "invalid" and ConfigError("m").key is None


@pytest.mark.parametrize("run_config, says, reason", [
    ({"fedamp-sigma": -1}, "'fedamp-sigma' = -1", ("fedamp-sigma", "invalid")),
    ({"dataset": "mnist", "data-dir": "/no/such/folder"}, "/no/such/folder", None),
])
def test_a_config_error_stops_the_run_with_one_line_and_no_traceback_of_the_app(
        tmp_path, caplog, run_config, says, reason):
    import traceback

    from fedamp_flwr import server_app
    from fedamp_flwr.tools.inprocess import InProcessGrid, task_identity

    cfg = {**run_config, "results-dir": str(tmp_path)}
    caplog.set_level(logging.INFO, logger="flwr")
    with task_identity(), pytest.raises(Exception) as raised:
        server_app.main(InProcessGrid(cfg, 2), Context(run_id=1, node_id=0, node_config={},
                                                       state=RecordDict(), run_config=cfg))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("Run stopped: ") and says in errors[0]
    assert "\n" not in errors[0].split(":", 1)[0]
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [f.name for f in frames][1:] == ["main"]  # below the caller: only the entry point
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    if reason:  # a config error keeps its reason for Flower's caller (the nodes' says its words)
        assert (raised.value.key, raised.value.kind) == reason
