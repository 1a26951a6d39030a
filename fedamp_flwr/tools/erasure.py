"""``fedamp-flwr forget RUN_DIR NAME``: a member that withdraws is erased from every file the
coordinator keeps for a run.

What goes, in every kept checkpoint (read, checked and sealed again as the run sealed them)
and in metrics.json: its name (``client_names`` keeps its place as "", so that the others keep
their ids), its key, the attempts that named it, its scores in every round (the rounds' means
computed again over the others), its part of every per-client state the method declares in
its checkpoint (``client_state``, :mod:`strategies.core.client_state`; this module names no
method's keys; an older checkpoint's, by the keys its version wrote:
:func:`strategies.core.client_state.legacy_declaration`) set to zeros, its row and column of xi
(recorded matrices and ``xi/`` files) and of an inferred graph (``graph-inferred.csv``), its
delivered-model record and any model the run folder holds
for it (``models/``), its place in the collaboration policy's and warm start's records, and a
checkpoint the run refused and kept for a look (``*.refused``: deleted). Every other file of
the folder is then searched for the name.

What cannot go: what the member's updates did to the others. The other members' models, the
global model, Panacea's shared hypernetwork, FedAMP's sigma chosen from everyone's distances,
the pooled input scaling, the rounds' training loss were all shaped by it. ``--report`` lists
the kept checkpoints from before its first contribution: a run that ``warm-start``s from one
of them (or a fresh run) holds nothing of it.

``forgotten.json`` audits each erasure, written before the first file is changed ("erasing")
and completed after ("done"): who (the name, and the client id every sealed checkpoint gives
it), when, each file changed or removed with its sha256 before and after, and where a search
for the name (as a name, not inside a longer one) still found it. A run that
forgot a member cannot be resumed (a new run warm-starts from it), and a warm start refuses
a checkpoint that still names a forgotten member. A live run (its ServerApp holds the
folder's ``.lock``) is refused.

The folder's manifest (:mod:`fedamp_flwr.server.manifest`) is written before the first checkpoint is
rewritten (one generation on, a mark of the member, the new seals; the old seals kept for this
member's ``forget`` only) and again after the last (one more generation): the checkpoints from
before the erasure, put back, are refused by resume, warm start and ``forget``, with or
without ``forgotten.json``; an erasure cut short is finished by running ``forget`` again.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strategies.core.client_state import forget_client
from strategies.core.history import RunHistory
from strategies.core.protocol import is_name
from strategies.core.records import (
    METRICS,
    TRAINED,
    RunFile,
    client_key,
    headlines,
    is_client_map,
    mean_key,
)
from tasks.export import sha256_of
from tasks.files import atomic_write, strict_json

from ..config import ConfigError, redact_uri
from ..server.checkpoint import read_state
from ..server.manifest import Manifest, mark, no_link
from ..server.manifest import read as read_manifest
from ..server.manifest import write as write_manifest
from ..server.results import (
    CHECKPOINT_FORMAT,
    FORGOTTEN,
    LOCK,
    TENSORBOARD_FOLDER,
    XI_FOLDER,
    checkpoint_files,
    digest_path,
    hold_folder,
    read_checkpoint,
    seal,
    write_json,
)

GONE = "(a forgotten member)"  # what replaces the name in a line of text


def _round(rec: dict[str, Any], cid: int, novel: set[int], attackers: set[int]) -> None:
    """A round's record without client ``cid`` (its means over the others)."""
    for key in [k for k in rec if is_client_map(k)]:
        if isinstance(rec[key], dict):
            rec[key] = {k: v for k, v in rec[key].items() if str(k) != str(cid)}
    if isinstance(rec.get(TRAINED), list):
        rec[TRAINED] = [c for c in rec[TRAINED] if c != cid]
    for metric in METRICS:
        scores = rec.get(client_key(metric))
        if not isinstance(scores, dict):
            continue
        for is_novel in (False, True):
            values = [v for k, v in scores.items() if (int(k) in novel) == is_novel
                      and int(k) not in attackers]
            key = mean_key(metric, is_novel)
            if values:
                rec[key] = float(np.mean(values))
            else:
                rec.pop(key, None)


def _xi(matrix: Any, ids: list[int], cid: int) -> Any:
    """A recorded xi matrix with client ``cid``'s row and column zero."""
    if cid not in ids:
        return matrix
    i = ids.index(cid)
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim == 2 and m.shape[0] > i:
        m[i, :] = 0
        m[:, i] = 0
    return m.tolist() if isinstance(matrix, list) else m.astype(np.asarray(matrix).dtype)


def _records(run: dict[str, Any], cid: int, name: str) -> None:
    """The name and client ``cid`` out of a metrics.json's or a checkpoint's fields."""
    names = run.get("client_names")
    if isinstance(names, list) and 0 <= cid < len(names) and names[cid] == name:
        names[cid] = ""
    for key in ("member_keys",):
        if isinstance(run.get(key), dict):
            run[key].pop(name, None)
    for key in ("impostors",):
        if isinstance(run.get(key), list):
            run[key] = [a for a in run[key] if not _names(repr(a), name)]
    models = run.get("models")
    if isinstance(models, dict) and isinstance(models.get("clients"), dict):
        models["clients"].pop(str(cid), None)
    policy = run.get("collaboration_policy")
    if isinstance(policy, dict) and isinstance(policy.get("apart"), list):
        policy["apart"] = [g for g in ([n for n in group if n != name]
                                       for group in policy["apart"]) if len(g) > 1]
    warm = run.get("warm_start")
    if isinstance(warm, dict):
        for key in ("returning", "new"):
            warm[key] = [n for n in warm.get(key, []) if n != name]
    graph = run.get("inferred_graph")
    if isinstance(graph, dict):
        graph["edges"] = [e for e in graph.get("edges", []) if cid not in e]
        if isinstance(graph.get("untrained_clients"), list):
            graph["untrained_clients"] = [c for c in graph["untrained_clients"] if c != cid]


def _history(history: dict[str, Any], cid: int, name: str, novel: set[int],
             attackers: set[int]) -> None:
    """A strategy's history state (:meth:`RunHistory.to_state`) without the client."""
    for rec in history.get("rounds", []):
        _round(rec, cid, novel, attackers)
    ids = list(history.get("xi_client_ids", []))
    history["xi"] = {r: _xi(m, ids, cid) for r, m in history.get("xi", {}).items()}
    notes = _without_key(history.get("notes", {}), str(cid))  # e.g. its scores alone
    _records(notes, cid, name)
    history["notes"] = notes


def _without_key(value: Any, key: str) -> Any:
    """``value`` without any dict entry of ``key`` (a client id), at any depth."""
    if isinstance(value, dict):
        return {k: _without_key(v, key) for k, v in value.items() if str(k) != key}
    if isinstance(value, list):
        return [_without_key(v, key) for v in value]
    return value


def _quoted(name: str) -> re.Pattern[str]:
    return re.compile(r"""(['"])""" + re.escape(name) + r"\1")


def _names(text: str, name: str) -> bool:
    """Whether a line of text names the member (quoted, as this app's lines name members)."""
    return bool(_quoted(name).search(text))


def _text(value: Any, name: str) -> Any:
    """Every line of text of ``value`` with the quoted name replaced (the fields that hold
    the name itself are :func:`_records`')."""
    if isinstance(value, str):
        return _quoted(name).sub(GONE, value)
    if isinstance(value, dict):
        return {k: _text(v, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_text(v, name) for v in value]
    return value


def _scrub_run(data: dict[str, Any], cid: int, name: str) -> dict[str, Any]:
    """metrics.json's record without the member."""
    file = RunFile.from_dict(data)
    novel, attackers = set(file.novel_clients), set(file.attackers)
    file.novel_clients = [c for c in file.novel_clients if c != cid]
    file.attackers = [c for c in file.attackers if c != cid]
    if file.left_out:
        file.left_out = {k: v for k, v in file.left_out.items() if not _names(v, name)}
    if file.alone:
        file.alone.pop(str(cid), None)
    for rec in file.rounds:
        _round(rec, cid, novel, attackers)
    file.headlines = headlines(file.rounds)
    if file.coverage and file.num_clients:  # again, over the others
        history = RunHistory(novel=frozenset(novel), attackers=frozenset(attackers))
        history.load_state({"rounds": file.rounds})
        file.coverage = history.coverage(file.num_clients)
        file.coverage["never_evaluated"].pop(cid, None)
        file.coverage["benign_clients"] -= cid not in novel | attackers
    run = file.to_dict()
    _records(run, cid, name)
    xi = run.get("xi")
    if isinstance(xi, dict) and isinstance(xi.get("rounds"), dict):
        ids = list(xi.get("client_ids", []))
        xi["rounds"] = {r: _xi(m, ids, cid) for r, m in xi["rounds"].items()}
    return _text(run, name)


def _scrub_checkpoint(state: dict[str, Any], cid: int, name: str, novel: set[int],
                      attackers: set[int]) -> dict[str, Any]:
    """A checkpoint's state without the member (tensors zeroed in place); ``novel`` and
    ``attackers``: the run's (its rounds' means are over the others)."""
    _records(state, cid, name)
    strategy = state.get("strategy", {})
    forget_client(strategy, cid)  # its declared parts (strategies.core.client_state)
    if isinstance(strategy.get("history"), dict):
        _history(strategy["history"], cid, name, novel, attackers)
    return _text(state, name)


class Erasure:
    """One member's erasure from one run folder: planned (every file read and checked)
    before any file is written."""

    def __init__(self, run_dir: str | Path, name: str, secret: bytes | None) -> None:
        self.folder = no_link(Path(run_dir), "RUN_DIR")
        self.name, self.secret = name, secret
        if not is_name(name):
            raise ConfigError(f"NAME = {name[:80]!r} is not a member name (letters, digits and "
                              "- _ . @)")
        metrics = self.folder / "metrics.json"
        try:
            self.run = json.loads(metrics.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"RUN_DIR = '{self.folder}': its metrics.json cannot be read "
                              f"({err}); allowed: a run's folder") from None
        names = self.run.get("client_names") or []
        cut = self._cut_short()
        if name not in names and cut is None:
            raise ConfigError(f"NAME = {name!r}: run '{self.folder.name}' has no member of that "
                              f"name ({len([n for n in names if n])} members"
                              f"{'; a partitioned simulation names none' if not names else ''})")
        # an erasure cut short after metrics.json: the client id its audit recorded
        self.cid = names.index(name) if name in names else int(cut or 0)

    def _cut_short(self) -> int | None:
        """The client id of this member's erasure that is still "erasing" in forgotten.json
        (None: none)."""
        try:
            held = json.loads((self.folder / FORGOTTEN).read_text(encoding="utf-8"))
            entries = [e for e in held.get("forgotten", []) if isinstance(e, dict) and
                       e.get("member") == self.name and e.get("status") == "erasing"]
            return int(entries[-1]["client_id"]) if entries else None
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def first_round(self) -> int | None:
        """The first round whose training used the member's reply (None: none did)."""
        return next((int(r["round"]) for r in self.run.get("rounds", [])
                     if self.cid in r.get(TRAINED, [])), None)

    def report(self) -> list[str]:
        """Which kept checkpoints hold nothing of the member (from before its first
        contribution): the start of a run without it."""
        first = self.first_round()
        lines = [f"Member '{self.name}' (client {self.cid}) of run '{self.folder.name}': "
                 + (f"its first contribution was round {first}" if first else
                    "no round used its training")]
        for path in sorted(checkpoint_files(self.folder)):
            round_ = int(path.stem.split("-")[1])
            before = first is None or round_ < first
            said = ("before it: none of its updates (the pooled input scaling may hold its "
                    "column statistics)" if before else "shaped by it")
            lines.append(f"  {path.name}: {said}")
        if not any("before it" in line for line in lines[1:]):
            lines.append("  no kept checkpoint predates it: only a fresh run holds nothing of it")
        lines.append("A run from one that predates it: move the later checkpoints out of the "
                     "folder (keep its name: a sealed checkpoint is bound to it), then "
                     "warm-start = '<the folder>'; or a fresh run without it.")
        return lines

    def _plan(self, manifest: Manifest) -> list[tuple[Path, bytes | None]]:
        """Each file to change and its new bytes (None: to remove), every one read and made
        before any is written. A checkpoint (sealed: what metrics.json says is not) that
        places the member at another client id, or that the folder's ``manifest`` does not
        list, stops it."""
        plan: list[tuple[Path, bytes | None]] = []
        file = RunFile.from_dict(self.run)
        roles = set(file.novel_clients), set(file.attackers)
        for path in checkpoint_files(self.folder):
            state, problem = read_checkpoint(path, self.secret, self.folder.name, manifest,
                                              self.name)
            # a version this app cannot read is not rewritten (a newer one raises here)
            _, problem = read_state(state, problem, "RUN_DIR", path)
            names = state.get("client_names") or []
            if problem is None and self.name in names and names.index(self.name) != self.cid:
                problem = (f"it holds member {self.name!r} as client {names.index(self.name)}, "
                           f"metrics.json as client {self.cid}")
            if problem is not None:
                raise ConfigError(f"RUN_DIR = '{self.folder}': checkpoint {path.name} cannot be "
                                  f"rewritten: {problem}; nothing was changed")
            # a checkpoint from before the member joined holds no row of it
            plan.append((path, _checkpoint_bytes(state, self.cid if self.name in names else -1,
                                                 self.name, *roles, manifest.generation + 1)))
        for path in sorted((self.folder / "checkpoint").glob("*.refused")):
            plan.append((path, None))
        xi = self.folder / XI_FOLDER
        if (xi / "client_ids.npy").is_file():
            ids = np.load(xi / "client_ids.npy", allow_pickle=False).tolist()
            for path in sorted(xi.glob("round-*.npy")):
                matrix = np.load(path, allow_pickle=False)
                plan.append((path, _npy(_xi(matrix, ids, self.cid))))
        graph = self.folder / "graph-inferred.csv"
        if graph.is_file():
            rows = graph.read_text().splitlines()
            kept = [r for r in rows if self.name not in r.split(",")]
            plan.append((graph, ("\n".join(kept) + "\n").encode()))
        plan += [(page, None) for page in sorted(self.folder.glob("report*.html"))  # pages
                 if page.is_file() and not page.is_symlink() and
                 self._pattern().search(page.read_bytes())]
        boards = self.folder / TENSORBOARD_FOLDER  # a view of metrics.json, by member name
        plan += [(p, None) for p in sorted(boards.rglob("*")) if p.is_file() and
                 not p.is_symlink()] if boards.is_dir() and not boards.is_symlink() else []
        for suffix in (".safetensors", ".json"):  # a partitioned run's server-written model
            if (self.folder / "models" / f"{self.name}{suffix}").is_file():
                plan.append((self.folder / "models" / f"{self.name}{suffix}", None))
        # metrics.json last: a forget cut short before it finds the member by name again
        run = _scrub_run(copy.deepcopy(self.run), self.cid, self.name)
        plan.append((self.folder / "metrics.json",
                     json.dumps(strict_json(run), indent=1, allow_nan=False).encode()))
        return plan

    def _audit(self) -> dict[str, Any]:
        """forgotten.json as it is (checked: a run's erasures, each of a member)."""
        path = self.folder / FORGOTTEN
        if not path.is_file():
            return {"forgotten": []}
        try:
            held = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(held, dict) and isinstance(held.get("forgotten"), list) and all(
                    isinstance(e, dict) and is_name(e.get("member")) for e in held["forgotten"]):
                return held
            problem = "not a list of erasures"
        except (OSError, ValueError) as err:
            problem = str(err)
        raise ConfigError(f"RUN_DIR = '{self.folder}': its {FORGOTTEN} cannot be read "
                          f"({problem}); nothing was changed")

    def forget(self) -> dict[str, Any]:
        """Erase the member; write and return its audit entry (``forgotten.json``: written
        first, "erasing", then completed, so that an erasure cut short is never silent and the
        run is already refused to resume)."""
        lock = hold_folder(self.folder)
        if lock is None:
            raise ConfigError(f"RUN_DIR = '{self.folder}': the run is live (its ServerApp holds "
                              "the folder); allowed: once the run has stopped")
        try:
            held = self._audit()
            # a folder rolled back (its manifest, or the register's record of it) stops it here
            manifest = read_manifest(self.folder, self.secret, self.folder.name,
                                     f"RUN_DIR = '{self.folder}'")
            plan = self._plan(manifest)  # every file read and checked: nothing written yet
            files = [{"file": str(path.relative_to(self.folder)), "sha256_before": sha256_of(path),
                      **({"removed": True} if data is None else {})} for path, data in plan]
            entry = {"member": self.name, "client_id": self.cid,
                     "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "status": "erasing",
                     "first_contribution_round": self.first_round(), "files": files}
            held["forgotten"].append(entry)
            write_json(self.folder / FORGOTTEN, held)
            self._seal_ahead(manifest, plan)
            for (path, data), record in zip(plan, files, strict=True):
                if data is None:
                    path.unlink()
                    if path.suffix == ".pt":
                        digest_path(path).unlink(missing_ok=True)
                    continue
                _write(path, data)
                if path.suffix == ".pt":
                    _write(digest_path(path), f"{seal(path, self.secret, self.folder.name)}  "
                                              f"{path.name}\n".encode())
                record["sha256_after"] = sha256_of(path)
            # one generation more again: the manifest of the erasure under way (which lists
            # the checkpoints from before it for this member's forget) cannot be put back
            manifest.generation += 1
            manifest.erasing = {}
            write_manifest(self.folder, manifest, self.secret, self.folder.name)
            entry.update(status="done", name_still_found_in=self._search())
            config = self.run.get("config") if isinstance(self.run.get("config"), dict) else {}
            if config.get("mlflow") is True:  # a store this command does not own
                uri = redact_uri(str(config.get("mlflow-uri") or "")) or "<results-dir>/mlruns"
                entry["not_erased"] = (f"the run's MLflow run (tracking URI {uri}, "
                                       f"tag fedamp.run = '{self.folder.name}') holds the "
                                       "member's metrics: delete that MLflow run there")
            write_json(self.folder / FORGOTTEN, held)
            return entry
        finally:
            lock.close()

    def _seal_ahead(self, manifest: Manifest, plan: list[tuple[Path, bytes | None]]) -> None:
        """The manifest, before any checkpoint is rewritten: one generation on, the member
        forgotten, the new checkpoints' seals listed, and the old ones kept only for this
        member's ``forget`` (an erasure cut short is done again; nothing else reads them)."""
        checkpoints = [(path, data) for path, data in plan if path.suffix == ".pt" and data]
        old = {path.name: digest_path(path).read_text().split()[0] for path, _ in checkpoints}
        manifest.erasing = {"member": self.name, "checkpoints": old}
        manifest.generation += 1
        manifest.forgotten = sorted({*manifest.forgotten,
                                     mark(self.name, self.secret, self.folder.name)})
        manifest.checkpoints = {path.name: seal(path, self.secret, self.folder.name, data)
                                for path, data in checkpoints}
        write_manifest(self.folder, manifest, self.secret, self.folder.name)

    def _pattern(self) -> re.Pattern[bytes]:
        """The name as a name in a file's bytes (not inside a longer one)."""
        edge = rb"[A-Za-z0-9_.@-]"
        return re.compile(b"(?<!" + edge + b")" + re.escape(self.name.encode()) +
                          b"(?!" + edge + b")")

    def _search(self) -> list[str]:
        """The folder's files (regular ones; links are not followed) that still hold the
        name as a name (not inside a longer one), but forgotten.json."""
        pattern = self._pattern()
        found = []
        for path in sorted(self.folder.rglob("*")):
            if path.is_symlink() or not path.is_file() or path.name in (FORGOTTEN, LOCK):
                continue
            try:
                if pattern.search(path.read_bytes()):
                    found.append(str(path.relative_to(self.folder)))
            except OSError as err:
                found.append(f"{path.relative_to(self.folder)} (unreadable: {err})")
        return found


def _checkpoint_bytes(state: dict[str, Any], cid: int, name: str, novel: set[int],
                      attackers: set[int], generation: int) -> bytes:
    """A checkpoint's file without the member (``cid`` -1: it holds no row of it), of the
    folder's ``generation``."""
    import io

    out = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT,
                **_scrub_checkpoint(state, cid, name, novel, attackers),
                "generation": generation}, out)
    return out.getvalue()


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data), private=True)


def _npy(matrix: np.ndarray) -> bytes:
    import io

    out = io.BytesIO()
    np.save(out, matrix)
    return out.getvalue()
