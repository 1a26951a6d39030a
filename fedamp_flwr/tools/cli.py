"""``fedamp-flwr``: what a member runs on its own machine, before and after a run.

``fedamp-flwr check-data DATA --run-config "..."``
    Checks a data file or image folder against the run's schema with the reader
    and checks the run itself uses (:mod:`tasks.members`), and lists every
    problem found. Exit status 0 only when the file fits, 1 when it does not, 2
    when the run config is invalid.
``fedamp-flwr predict MODEL DATA [--out predictions.csv] [--rows all|train|test]``
    Rebuilds the model of a ``.safetensors`` file from its card (the weights'
    sha256 checked), reads DATA (``.npz``, CSV, Parquet or an image folder)
    through the same reader and the card's schema, and writes one row per sample
    of DATA, in file order: ``row`` (its number in DATA, 0 first; ``--rows all``
    only), ``prediction`` (the class, by name where the card names them; or the
    regression outputs), then the class probabilities. Where DATA has labels it
    prints the accuracy (or MSE) as the run measures it, then the scores an
    analyst reads (:mod:`tasks.scores`: balanced accuracy, AUC, log loss, the
    Brier score and the confusion matrix; MSE, MAE and R^2). With
    ``--rows test`` (``train``) only the rows the run tested (trained) on, chosen
    as the run chose them: on the member's own file the score is the card's.

``fedamp-flwr xi-graph RUN [--round R] [--k K] [--out graph.csv]``
    Turns a FedAMP run's weights xi of one round into a client graph file that
    Panacea reads (``graph = "file"``): each client's K largest weights, an
    edge where either end chose the other, members by name.

``fedamp-flwr privacy PRIVACY_DIR [--delta D]``
    States what a member's replies have revealed so far: for each ledger in its
    ``privacy-dir`` (one per client id), the noised replies (runs,
    rounds, noise multipliers) and the epsilon they spent together at delta
    (by default the smallest its releases name: the member's own, its node
    config's ``dp-delta`` or 1e-5, which each release records), computed again
    with the accountant from the ledger's history, not read from it.

``fedamp-flwr identity --client-id NAME [--identity-dir DIR]``
    Prints the member's public key as the line a coordinator's roster takes
    (``NAME ed25519:<base64>``), making the key on first use where the member's
    SuperNode keeps it (node config ``identity-dir``; default
    ``$FEDAMP_STATE_DIR/identity``, :mod:`fedamp_flwr.identity`).
``fedamp-flwr roster RUN_DIR``
    Prints the names and keys a run bound (its metrics.json's ``member_keys``) as a
    roster: what a coordinator gives the next run (``member-roster``) so that each
    name keeps its key.

``fedamp-flwr verify-app APP_DIR --fab REVIEWED.fab``
    Checks the app a SuperNode installed (``$FLWR_HOME/apps/<publisher>.<name>.<version>.
    <sha256 prefix>``: the code its ClientApp processes run, whatever the member
    installed with pip) against the FAB the member built from the source it
    reviewed (``flwr build``, which is reproducible): every file of the reviewed
    FAB's manifest with the same sha256, no other file. Exit status 0 only when
    they are the same app.

``fedamp-flwr forget RUN_DIR NAME [--report] [--checkpoint-secret FILE]``
    The coordinator's: erases a member that withdraws from every file it keeps for a run
    (:mod:`fedamp_flwr.tools.erasure`) and audits it in the run's ``forgotten.json``; ``--report``
    changes nothing and says which kept checkpoints predate the member's first
    contribution. The checkpoints are sealed again with the run's secret (the file, else
    ``$FEDAMP_CHECKPOINT_SECRET``'s). A live run is refused.

``fedamp-flwr check-config --run-config "..." [--clients N]``
    The coordinator's: the run config ``flwr run`` would give the ServerApp (this app's
    ``pyproject.toml`` table, then the overrides), checked offline as the ServerApp checks
    it before it waits for any node: every key, the files it names (graph file, policy,
    an npz task's file); with ``--clients N`` also what the run's size decides (graph-k,
    the client graph). One line; exit status 0 when the run would start, 1 when it would
    stop.

``fedamp-flwr report RUN_DIR [--out FILE] [--member NAME | --members]``
    The coordinator's: one self-contained HTML page of a run (:mod:`fedamp_flwr.server.run_page`:
    its headline, each client's curve, absences, xi or the inferred graph, each member's
    epsilon, the run config), ``report.html`` in the run's folder; ``--member NAME``: that
    member's page, with its numbers alone, to hand to it (``report-<NAME>.html``);
    ``--members``: one such page per member.

Nothing here connects anywhere; they read only the files named.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tasks
from strategies.core.records import RunFile
from tasks.data import Split, to_tensors
from tasks.export import ModelFileError, load_model, predict
from tasks.files import write_private_text
from tasks.members import load_member_data, read_member_rows
from tasks.scores import of_outputs
from tasks.scores import said as scores_line
from tasks.train import evaluate

from ..config import ConfigError, RunConfig, default_values, explain
from ..member import member_choice

#: a ``--run-config`` pair as ``flwr run`` reads one (``flwr.common.config.parse_config_args``)
_PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


def read_run_config(text: str) -> dict[str, Any]:
    """``--run-config``'s text as ``flwr run`` reads it (Flower 1.41's ``parse_config_args``,
    ``tests/test_default_run.py`` compares them): ``key=value`` pairs, each value a TOML
    value, what is no pair dropped; or a ``.toml`` file's table, flattened (``a.b``).
    Without importing Flower's CLI (a tenth of a second of check-config's three). A
    ConfigError names a text it cannot read, and one that sets no key where it is not
    empty (Flower would ignore it)."""
    import tomllib

    allowed = "allowed: \"key=value key2='text'\" as flwr run takes it, or a .toml file"
    try:
        if text.strip().endswith(".toml"):
            with Path(text.strip()).expanduser().open("rb") as f:
                table = tomllib.load(f)
        else:
            table = tomllib.loads("\n".join(f"{k} = {v}" for k, v in _PAIR.findall(text)))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"--run-config {text!r} cannot be read ({err}); {allowed}") from None

    def flat(d: dict, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    given = flat(table)
    if text.strip() and not given:
        raise ConfigError(f"--run-config {text!r} sets no key (flwr run would ignore it "
                          f"too); {allowed}")
    return given


def _run_config(text: str) -> RunConfig:
    """The run config a coordinator's ``--run-config`` string gives (defaults for the rest)."""
    given = read_run_config(text)
    given.setdefault("dataset", tasks.MEMBERS)
    # a file is checked against the data keys; a method not named has no say in that
    given.setdefault("strategy", "fedavg")
    return RunConfig.from_run_config({**default_values(), **given})


def check_data(data: str, run_config: str, client_id: str) -> int:
    try:
        cfg = _run_config(run_config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    schema = cfg.member_schema()
    if schema is None:
        print(f"error: run config 'dataset' = {cfg.dataset!r}: check-data checks a member's file "
              "against a run over members' data (dataset = \"members\")", file=sys.stderr)
        return 2
    try:
        train, test = load_member_data(data, schema, cfg.seed, client_id)
    except tasks.MemberDataError as err:
        print(f"does not fit: {err}")
        return 1
    print(f"fits: {data}: {len(train.y)} training and {len(test.y)} test rows, "
          f"{schema.describe()}" + _classes(train, test, schema))
    return 0


def _classes(train: Split, test: Split, schema: tasks.MemberSchema) -> str:
    if schema.kind != tasks.CLASSIFICATION:
        return ""
    present = sorted(set(np.concatenate([train.y, test.y]).tolist()))
    names = [schema.class_names[i] if schema.class_names else str(i) for i in present]
    return f"; classes present: {', '.join(names)}"


def run_rows(card: dict, data: str, schema: tasks.MemberSchema, which: str) -> Split:
    """The rows of ``data`` that the run ``card`` describes used to train (``which`` =
    "train") or to test ("test": the rows its score is on), as the run chose them: the rows
    the file marks, else the seeded 80/20 split of the member's name and the run's seed;
    with validation-fraction, the held-out share of the training rows
    (``tasks.loading.hold_out``). ModelFileError where the card does not say."""
    from tasks.loading import ClientData, hold_out

    spec = card.get("rows")
    try:
        if not isinstance(spec, dict):
            raise TypeError("no 'rows'")
        seed, fraction = int(spec["seed"]), float(spec["validation_fraction"])
        member, index = str(spec.get("member") or ""), int(spec["validation_index"])
    except (KeyError, TypeError, ValueError):
        raise ModelFileError(f"the card does not say which rows its run used ({str(spec)[:100]}; "
                             "a card of an older version); predict on all rows instead") from None
    if not member and read_member_rows(data, schema).test is None:
        raise ModelFileError("the card is a simulated client's: its rows were its partition's, "
                             "not a split of this file (which marks no test rows); predict on "
                             "all rows instead")
    train, test = load_member_data(data, schema, seed, member)
    if fraction > 0:
        (xa, ya), (xb, yb) = to_tensors(train), to_tensors(test)
        held = hold_out(ClientData(xa, ya, xb, yb), fraction, seed, index)
        # to_tensors has scaled images already: the rows are given back as the run saw them
        train = Split(held.x_train.numpy(), held.y_train.numpy())
        test = Split(held.x_test.numpy(), held.y_test.numpy())
    share = spec.get("held_out_fraction")  # the member's own choice of its model
    if share is not None and (isinstance(share, bool) or not isinstance(share, int | float)
                              or not 0 < share <= 0.5):
        raise ModelFileError(f"the card's rows.held_out_fraction {str(share)[:40]!r} is not a "
                             "number in (0, 0.5]")
    if which == "held-out" and not share:
        raise ModelFileError("the card says of no rows held out to choose the model on (its "
                             "member kept the federated model by its node config, or a card "
                             "of an older version)")
    if share and which in ("train", "held-out"):
        rows = member_choice.held_out(len(train.y), float(share), member)
        if rows is None:
            raise ModelFileError(f"the card's held_out_fraction {share} leaves too few of "
                                 f"{len(train.y)} training rows: not this member's file?")
        return Split(train.x[rows[0].numpy()], train.y[rows[0].numpy()]) if which == "held-out" \
            else Split(train.x[rows[1].numpy()], train.y[rows[1].numpy()])
    return train if which == "train" else test


def card_standardize(card: dict, x: torch.Tensor, where: str) -> torch.Tensor:
    """``x`` standardized as the card's model saw its inputs (its ``preprocessing``'s
    ``standardize``: each column's mean and standard deviation), or as it is where the card
    has none; ModelFileError where the card's values cannot be used."""
    from tasks.tabular import scaling_problem, standardize

    spec = card.get("preprocessing", {})
    spec = spec.get("standardize") if isinstance(spec, dict) else None
    if spec is None or len(x) == 0:
        return x
    mean = spec.get("mean") if isinstance(spec, dict) else None
    std = spec.get("std") if isinstance(spec, dict) else None
    problem = scaling_problem(mean, std, int(x[0].numel()) if len(x) else 0) if x.dim() == 2 \
        else "the inputs are not vectors"
    if problem is not None:
        raise ModelFileError(f"{where}: the card's standardize cannot be applied: {problem}")
    assert isinstance(mean, list) and isinstance(std, list)
    return standardize(x, mean, std)


def predict_file(model_path: str, data: str, out: str | None, which: str = "all") -> int:
    import pandas as pd

    try:
        loaded = load_model(model_path)
        if which == "all":
            rows = read_member_rows(data, loaded.schema, labels=False)
            x, _ = to_tensors(Split(rows.x, np.zeros(len(rows.x), dtype=np.int64)))
            labelled = None if rows.y is None else Split(rows.x, rows.y)
        else:
            chosen = run_rows(loaded.card, data, loaded.schema, which)
            x, _ = to_tensors(Split(chosen.x, np.zeros(len(chosen.x), dtype=np.int64)))
            labelled = chosen
        x = card_standardize(loaded.card, x, model_path)
    except (ModelFileError, tasks.MemberDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    schema = loaded.schema
    outputs = predict(loaded.model, x)
    # the row's number in the file (0 first), so that a prediction joins back to its row
    table: dict[str, object] = {"row": np.arange(len(x))} if which == "all" else {}
    if schema.kind == tasks.CLASSIFICATION:
        classes = outputs.argmax(1).numpy()
        names = list(schema.class_names) or [str(i) for i in range(schema.num_outputs)]
        table["prediction"] = [names[c] for c in classes] if schema.class_names else classes
        probabilities = torch.softmax(outputs.double(), dim=1).numpy()
        for i, name in enumerate(names):
            table[f"p_{name}"] = probabilities[:, i]
    else:
        flat = outputs.reshape(len(outputs), -1).numpy()
        for i in range(flat.shape[1]):
            table["prediction" if flat.shape[1] == 1 else f"prediction_{i}"] = flat[:, i]
    path = Path(out or "predictions.csv")
    write_private_text(path, pd.DataFrame(table).to_csv(index=False))  # a member's own
    card = loaded.card
    who = card.get("member") or f"client {card.get('client_id')}"
    print(f"{len(x)} predictions of {who}'s model "
          f"(run {card.get('run')}, round {card.get('round')}) written to {path}")
    if labelled is not None:
        _, y = to_tensors(labelled)
        result = evaluate(loaded.model, x, y)
        score = (f"accuracy {result.accuracy!r}" if result.accuracy is not None
                 else f"mse {result.mse!r}")
        what = {"all": "labelled rows", "train": "training rows the run used",
                "test": "rows the run tested on",
                "held-out": "rows the member held out to choose its model on"}[which]
        recorded = card.get("score")
        recorded = recorded if isinstance(recorded, dict) else {}
        said = (f" (the card: {recorded.get('accuracy', recorded.get('mse'))!r})"
                if which == "test" else "")
        print(f"On the {len(y)} {what}: {scores_line(of_outputs(outputs, y))}")
        print(f"{score} on {len(y)} {what} of {data}{said}")  # last: the run's own measure
    return 0


def xi_graph(run_dir: str, server_round: int | None, k: int, out: str) -> int:
    """A FedAMP run's weights xi of one round as the edge list ``graph = "file"`` reads."""

    from tasks.graphs import GraphError, knn_graph, write_edge_list

    from ..server.results import load_xi

    ids, rounds = load_xi(run_dir)
    if not rounds:
        print(f"error: {run_dir} holds no FedAMP weights (xi/round-*.npy: a FedAMP or "
              "HeurFedAMP run with xi-every > 0)", file=sys.stderr)
        return 1
    chosen = max(rounds) if server_round is None else server_round
    if chosen not in rounds:
        print(f"error: {run_dir} has no weights of round {chosen}; it has rounds "
              f"{sorted(rounds)}", file=sys.stderr)
        return 1
    xi = rounds[chosen].astype("float64")
    try:
        names = RunFile.read(Path(run_dir) / "metrics.json").client_names
    except (OSError, ValueError):
        names = None
    try:
        adj = knn_graph(xi, k)
    except GraphError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    labels = [names[i] for i in ids[: len(xi)]] if names else None
    edges = write_edge_list(Path(out), adj, labels)
    print(f"{edges} edges among {len(xi)} clients (each client's {k} largest weights of round "
          f"{chosen}, both ways) written to {out}; use it with graph='file' graph-file='{out}'")
    return 0


def privacy_report(folder: str, delta: float | None) -> int:
    """Print what each ledger in ``folder`` spent; 1 where one cannot be read."""
    from ..member.ledger import Declined, Ledger

    files = sorted(Path(folder).expanduser().glob("*.json"))
    if not files:
        print(f"{folder}: no privacy ledger (a node writes one per client id once it replies "
              "under dp)")
        return 1
    status = 0
    for path in files:
        try:  # read and checked as the node reads it
            ledger = Ledger(path.parent, path.stem)
            releases = ledger.releases
            # at the smallest delta its releases name (the member's own, which each release
            # records; a ledger of an older version may name a run's), unless asked another
            at = delta if delta is not None else min(
                (float(r["delta"]) for r in releases), default=1e-5)
            spent = ledger.spent(at)
        except (Declined, ValueError, KeyError, TypeError) as err:
            print(f"{path}: cannot be read ({err})")
            status = 1
            continue
        runs = sorted({str(r["run"]).rsplit("/", 1)[-1] for r in releases})
        sets = len({r.get("data_sha256") for r in releases})
        print(f"{ledger.client}: {len(releases)} noised replies in {len(runs)} run(s) "
              f"({', '.join(runs)}), trained on {sets} version(s) of its data; epsilon "
              f"{spent:.4g} at delta {at:g}")
    return status


def show_identity(name: str, folder: str | None) -> int:
    """Print the member ``name``'s roster line (its key made on first use)."""
    from strategies.core.protocol import is_name

    from ..identity import (
        IDENTITY_DIR,
        IdentityError,
        identity_dir,
        key_text,
        member_key,
        public_bytes,
    )

    if not is_name(name):
        print(f"error: --client-id {name!r} is invalid; allowed: letters, digits and - _ . @ "
              "(at most 64), the node config's client-id", file=sys.stderr)
        return 2
    try:
        where = identity_dir({IDENTITY_DIR: folder} if folder is not None else {})
        key = member_key(where, name)
    except (ConfigError, IdentityError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{name} {key_text(public_bytes(key))}")
    print(f"# the key of member {name!r}, kept in {where / (name + '.key')} (owner only); "
          "give the coordinator the line above for its member-roster", file=sys.stderr)
    return 0


def roster_of(run_dir: str) -> int:
    """Print the names and keys a run bound, as a roster."""
    path = Path(run_dir).expanduser() / "metrics.json"
    try:
        keys = RunFile.read(path).member_keys or {}
    except (OSError, ValueError) as err:
        print(f"error: {path} cannot be read ({err})", file=sys.stderr)
        return 1
    lines = [f"{name} {key}" for name, key in sorted(keys.items())
             if isinstance(key, str) and key.startswith("ed25519:")]
    if not lines:
        print(f"error: {path} binds no member name to a key (a run over members' data of "
              "this version records them under member_keys)", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def verify_app(app_dir: str, fab: str) -> int:
    """Compare an installed app folder with a reviewed FAB's manifest; 0 when they match."""
    import zipfile

    from tasks.export import sha256_of

    root = Path(app_dir).expanduser()
    try:
        with zipfile.ZipFile(fab) as z:
            manifest = z.read(".info/CONTENT").decode()
            fab_hash = sha256_of(Path(fab))
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        print(f"{fab}: not a FAB with a CONTENT manifest ({err})")
        return 2
    if not root.is_dir():
        print(f"{app_dir}: no such folder (the SuperNode installs the app under "
              "$FLWR_HOME/apps/ when its first message of a run arrives)")
        return 2
    expected = {}
    for line in manifest.strip().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        expected[path] = digest
    problems = [f"missing: {p}" for p in sorted(expected) if not (root / p).is_file()]
    problems += [f"changed: {p}" for p in sorted(expected)
                 if (root / p).is_file() and sha256_of(root / p) != expected[p]]
    present = {str(f.relative_to(root)) for f in root.rglob("*")
               if f.is_file() and "__pycache__" not in f.parts}
    problems += [f"not in the reviewed app: {p}" for p in sorted(present - set(expected))]
    if not root.name.endswith(fab_hash[:8]):
        problems.append(f"the folder's name does not end with the reviewed FAB's sha256 "
                        f"prefix {fab_hash[:8]}")
    for p in problems:
        print(p)
    verdict = "is" if not problems else "is NOT"
    print(f"{root} {verdict} the reviewed app ({fab}, sha256 {fab_hash[:16]}...): "
          f"{len(expected)} files checked")
    return 0 if not problems else 1


def app_defaults(app: str) -> dict[str, Any]:
    """The run config ``flwr run APP`` starts from: the app's ``pyproject.toml``
    ``[tool.flwr.app.config]`` table (as the user may have edited it), else the keys'
    declared defaults."""
    import tomllib

    path = Path(app).expanduser() / "pyproject.toml"
    try:
        table = tomllib.loads(path.read_text())["tool"]["flwr"]["app"]["config"]
    except (OSError, KeyError, TypeError):
        return default_values()
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not TOML ({err})") from None
    return dict(table) if isinstance(table, dict) else default_values()


def check_config(run_config: str, clients: int | None, app: str) -> int:
    """``check-config``: the run config ``flwr run`` would give the ServerApp, checked as it
    checks it before waiting for any node (and, with ``clients``, as it checks it once it
    has them); one line, exit status 0 (it would start) or 1 (it would stop)."""
    from tasks.graphs import GraphError

    from ..server.preflight import check_before_clients, check_with_clients

    try:
        cfg = RunConfig.from_run_config({**app_defaults(app), **read_run_config(run_config)})
        check_before_clients(cfg)
        if clients is not None:
            check_with_clients(cfg, clients)
    except (ConfigError, GraphError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    size = (f"with {clients} clients" if clients is not None else
            "(graph-k and the client graph depend on the clients: --clients N checks them)")
    print(f"ok: strategy {cfg.strategy!r} on {cfg.data_label}, {cfg.num_server_rounds} rounds "
          f"{size}")
    return 0


def explain_key(key: str, run_config: str) -> int:
    """Print where ``key``'s value comes from in a run of ``run_config``."""
    try:
        for line in explain(read_run_config(run_config), key):
            print(line)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def report_page(run: str, out: str | None, member: str | None, members: bool) -> int:
    """``report``: the run's page, a member's, or one per member."""
    from ..server.run_page import member_names, write_page  # matplotlib: only here

    try:
        if members:
            if out:
                raise ConfigError("--out with --members is invalid: each member's page is "
                                  "report-<NAME>.html in the run's folder; allowed: one of them")
            names = member_names(run)
            if not names:
                raise ConfigError(f"RUN_DIR = {run!r}: the run names no member a page can be "
                                  "made for (a partitioned simulation names none; a name that "
                                  "is no member name, or that two clients hold, is left out); "
                                  "allowed: without --members")
            for name in names:
                print(f"Wrote {write_page(run, None, name)}")
            return 0
        print(f"Wrote {write_page(run, out, member)}")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:  # a folder it cannot write, a path it cannot take
        print(f"error: the page cannot be written: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


def forget_member(run: str, name: str, report: bool, secret_file: str) -> int:
    """``forget``: erase (or ``report`` on) member ``name`` of run folder ``run``."""
    from ..server.results import read_secret
    from .erasure import Erasure

    try:
        erasure = Erasure(run, name, read_secret(secret_file, "--checkpoint-secret"))
        if report:
            for line in erasure.report():
                print(line)
            return 0
        entry = erasure.forget()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:  # a damaged run file
        print(f"error: RUN_DIR = {run!r}: {type(err).__name__}: {err} (see forgotten.json for "
              "what was done)", file=sys.stderr)
        return 2
    changed = [f for f in entry["files"] if not f.get("removed")]
    removed = [f for f in entry["files"] if f.get("removed")]
    print(f"Member '{name}' (client {entry['client_id']}) forgotten by run "
          f"'{Path(run).resolve().name}': {len(changed)} file(s) rewritten, {len(removed)} "
          f"removed; audit in {Path(run).resolve() / 'forgotten.json'}")
    if entry.get("not_erased"):
        print(f"warning: not erased here: {entry['not_erased']}", file=sys.stderr)
    if erasure.secret is None:
        print("warning: the run has no checkpoint secret: its manifest (which remembers this "
              "erasure) carries a plain sha256 that whoever can write the folder can recompute; "
              "this machine's register still refuses the folder put back from before the "
              "erasure, as long as the register is not edited too", file=sys.stderr)
    if entry["name_still_found_in"]:
        print(f"warning: the name is still found in {entry['name_still_found_in']}",
              file=sys.stderr)
        return 1
    print("What it cannot undo: the other members' models, the global model or hypernetwork, "
          "and the run's aggregates were shaped by its updates (fedamp-flwr forget --report: "
          "the checkpoints from before it).")
    return 0


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedamp-flwr", description="Check a member's data before it joins a run, predict "
        "with a delivered model, turn a FedAMP run's weights into a client graph, state a "
        "member's spent privacy; a run's page, a member's erasure.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check-data", help="check a member's data against a run's schema "
                           "before joining")
    check.add_argument("data", help="the data file (.npz, .csv, .parquet) or image folder")
    check.add_argument("--run-config", default="", help="the run's config as the coordinator "
                       "gives it to flwr run, e.g. \"member-input-shape='8' member-outputs=2\"")
    check.add_argument("--client-id", default="check", help="the member's name (seeds the "
                       "80/20 split of a file without one)")
    pred = sub.add_parser("predict", help="predict with a delivered model")
    pred.add_argument("model", help="the model's .safetensors file (its card .json beside it)")
    pred.add_argument("data", help="the data file (.npz, .csv, .parquet) or image folder")
    pred.add_argument("--out", default=None, help="the CSV to write (default predictions.csv)")
    pred.add_argument("--rows", choices=("all", "train", "test", "held-out"), default="all",
                      help="all rows of DATA, in file order (default); or the rows the run "
                           "trained on, or tested on (its score's rows: the card's score), or "
                           "those the member held out to choose its model on, as the run "
                           "chose them")
    graph = sub.add_parser("xi-graph", help="a FedAMP run's weights as a client graph file")
    graph.add_argument("run", help="the FedAMP run's folder (<results-dir>/<run name>)")
    graph.add_argument("--round", type=int, default=None, help="the round (default: the last "
                       "recorded)")
    graph.add_argument("--k", type=int, default=3, help="neighbours per client (default 3)")
    graph.add_argument("--out", default="graph.csv", help="the edge list to write")
    priv = sub.add_parser("privacy", help="what a member's noised replies have spent")
    priv.add_argument("folder", help="the node's privacy-dir")
    priv.add_argument("--delta", type=float, default=None, help="the delta to state epsilon "
                      "at (default: the smallest its releases name, the member's own)")
    ident = sub.add_parser("identity", help="this member's public key, as a roster line")
    ident.add_argument("--client-id", required=True, help="the member's name (its node config's "
                       "client-id)")
    ident.add_argument("--identity-dir", default=None, help="where its key is kept (its node "
                       "config's identity-dir; default $FEDAMP_STATE_DIR/identity)")
    rost = sub.add_parser("roster", help="the names and keys a run bound, as a roster")
    rost.add_argument("run", help="the run's folder (<results-dir>/<run name>)")
    verify = sub.add_parser("verify-app", help="the app a SuperNode installed, against the "
                            "FAB built from the reviewed source")
    verify.add_argument("app_dir", help="$FLWR_HOME/apps/<publisher>.<name>.<version>.<hash>")
    verify.add_argument("--fab", required=True, help="the FAB built with flwr build from the "
                        "reviewed source")
    _coordinators_commands(sub)
    checked = sub.add_parser("check-config", help="check a run config offline, as the "
                             "ServerApp checks it before any node is waited for")
    checked.add_argument("--run-config", default="", help="the run config as given to flwr "
                         "run, e.g. \"strategy='panacea' graph='inferred'\"")
    checked.add_argument("--clients", type=int, default=None, help="check what depends on the "
                         "run's size too: graph-k, the client graph (a simulation's "
                         "num-supernodes)")
    checked.add_argument("--app", default=".", help="the app folder whose pyproject.toml "
                         "gives the defaults (default: the current folder; else the keys' "
                         "declared defaults)")
    explained = sub.add_parser("explain", help="where a run-config key's value comes from")
    explained.add_argument("key", help="the run-config key, e.g. learning-rate")
    explained.add_argument("--run-config", default="", help="the run's config as given to flwr "
                           "run, e.g. \"strategy='pfedhn' dataset='tpt48'\"")
    return parser


def _coordinators_commands(sub: Any) -> None:
    """The coordinator's commands on a run's folder: forget, report."""
    forget = sub.add_parser("forget", help="erase a member from every file the coordinator "
                            "keeps for a run (with an audit)")
    forget.add_argument("run", help="the run's folder (<results-dir>/<run name>)")
    forget.add_argument("name", help="the member's name (its client-id)")
    forget.add_argument("--report", action="store_true", help="change nothing: say which kept "
                        "checkpoints predate the member's first contribution")
    forget.add_argument("--checkpoint-secret", default="", help="the run's checkpoint secret "
                        "file (default: $FEDAMP_CHECKPOINT_SECRET's, where the run had one)")
    page = sub.add_parser("report", help="a run's page (HTML, self-contained), or a member's")
    page.add_argument("run", help="the run's folder (<results-dir>/<run name>)")
    page.add_argument("--out", default=None, help="the page to write (default "
                      "<run>/report.html, or report-<NAME>.html with --member)")
    who = page.add_mutually_exclusive_group()
    who.add_argument("--member", default=None, help="a member's page: its own numbers alone")
    who.add_argument("--members", action="store_true", help="a page per member, beside "
                     "report.html")


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_of()
    args = parser.parse_args(argv)
    if args.command == "explain":
        return explain_key(args.key, args.run_config)
    if args.command == "check-config":
        if args.clients is not None and args.clients < 1:
            parser.error(f"--clients {args.clients} is invalid; allowed: an integer >= 1")
        return check_config(args.run_config, args.clients, args.app)
    if args.command == "report":
        return report_page(args.run, args.out, args.member, args.members)
    if args.command == "forget":
        return forget_member(args.run, args.name, args.report, args.checkpoint_secret)
    if args.command == "identity":
        return show_identity(args.client_id, args.identity_dir)
    if args.command == "roster":
        return roster_of(args.run)
    if args.command == "verify-app":
        return verify_app(args.app_dir, args.fab)
    if args.command == "privacy":
        if args.delta is not None and not 0 < args.delta < 1:
            parser.error(f"--delta {args.delta} is invalid; allowed: a number in (0, 1)")
        return privacy_report(args.folder, args.delta)
    if args.command == "xi-graph":
        return xi_graph(args.run, args.round, args.k, args.out)
    if args.command == "check-data":
        return check_data(args.data, args.run_config, args.client_id)
    return predict_file(args.model, args.data, args.out, args.rows)


if __name__ == "__main__":
    sys.exit(main())
