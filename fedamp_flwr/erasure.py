"""``fedamp-flwr forget RUN_DIR NAME``: a member that withdraws is erased from every file the
coordinator keeps for a run.

What goes, in every kept checkpoint (read, checked and sealed again as the run sealed them)
and in metrics.json: its name (``client_names`` keeps its place as "", so that the others keep
their ids), its key, the attempts that named it, its scores in every round (the rounds' means
computed again over the others), its row of the per-client state (FedAMP's, SFL's and
Separate's stored model, Panacea's embedding and its momentum, the warm-up's sums) set to
zeros, its row and column of xi (recorded matrices and ``xi/`` files) and of an inferred
graph (``graph-inferred.csv``), its delivered-model record and any model the run folder holds
for it (``models/``), its place in the collaboration policy's and warm start's records, and a
checkpoint the run refused and kept for a look (``*.refused``: deleted). Every other file of
the folder is then searched for the name.

What cannot go: what the member's updates did to the others. The other members' models, the
global model, Panacea's shared hypernetwork, FedAMP's sigma chosen from everyone's distances,
the pooled input scaling, the rounds' training loss were all shaped by it. ``--report`` lists
the kept checkpoints from before its first contribution: a run that ``warm-start``s from one
of them (or a fresh run) holds nothing of it.

``forgotten.json`` audits each erasure: who (the name and its client id), when, each file
changed or removed with its sha256 before and after, and what the search found. A run that
forgot a member cannot be resumed (a new run warm-starts from it), and a warm start refuses
a checkpoint that still names a forgotten member. A live run (its ServerApp holds the
folder's ``.lock``) is refused.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

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

from .config import ConfigError
from .results import (
    CHECKPOINT_FORMAT,
    FORGOTTEN,
    XI_FOLDER,
    _read_checkpoint,
    checkpoint_files,
    digest_path,
    hold_folder,
    seal,
    write_json,
)

GONE = "(a forgotten member)"  # what replaces the name in a line of text


def _per_client_rows(strategy: dict[str, Any], cid: int) -> None:
    """Zero client ``cid``'s row of every per-client tensor of a strategy's state."""
    for key in ("models", "update_sum", "update_count"):
        if isinstance(strategy.get(key), torch.Tensor) and len(strategy[key]) > cid:
            strategy[key][cid] = 0
    graph = strategy.get("inferred_adjacency")
    if isinstance(graph, torch.Tensor) and len(graph) > cid:
        graph[cid, :] = 0
        graph[:, cid] = 0
    hnet = strategy.get("hnet")
    if isinstance(hnet, dict) and "embeddings.weight" in hnet:
        hnet["embeddings.weight"][cid] = 0
        # the optimizer numbers GH's parameters in their order: the embeddings come first
        index = [k for k, v in hnet.items() if v.is_floating_point()].index("embeddings.weight")
        state = strategy.get("optimizer", {}).get("state", {}).get(index, {})
        if isinstance(state.get("momentum_buffer"), torch.Tensor):
            state["momentum_buffer"][cid] = 0


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
    if isinstance(names, list) and cid < len(names):
        names[cid] = ""
    for key in ("member_keys",):
        if isinstance(run.get(key), dict):
            run[key].pop(name, None)
    for key in ("impostors",):
        if isinstance(run.get(key), list):
            run[key] = [a for a in run[key] if name not in json.dumps(a)]
    models = run.get("models")
    if isinstance(models, dict) and isinstance(models.get("clients"), dict):
        models["clients"].pop(str(cid), None)
    policy = run.get("collaboration_policy")
    if isinstance(policy, dict) and isinstance(policy.get("groups"), list):
        policy["groups"] = [g for g in ([n for n in group if n != name]
                                        for group in policy["groups"]) if len(g) > 1]
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


def _text(value: Any, name: str) -> Any:
    """Every line of text of ``value`` with the quoted name replaced (dict keys that are the
    name dropped)."""
    pattern = re.compile(r"""(['"])""" + re.escape(name) + r"\1")
    if isinstance(value, str):
        return GONE if value == name else pattern.sub(GONE, value)
    if isinstance(value, dict):
        return {k: _text(v, name) for k, v in value.items() if k != name}
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
        file.left_out = {k: v for k, v in file.left_out.items() if name not in v}
    if file.alone:
        file.alone.pop(str(cid), None)
    if file.coverage:
        file.coverage = _without_key(file.coverage, str(cid))
    for rec in file.rounds:
        _round(rec, cid, novel, attackers)
    file.headlines = headlines(file.rounds)
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
    _per_client_rows(strategy, cid)
    if isinstance(strategy.get("history"), dict):
        _history(strategy["history"], cid, name, novel, attackers)
    return _text(state, name)


class Erasure:
    """One member's erasure from one run folder: planned (every file read and checked)
    before any file is written."""

    def __init__(self, run_dir: str | Path, name: str, secret: bytes | None) -> None:
        self.folder = Path(run_dir).expanduser().resolve()
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
        if name not in names:
            raise ConfigError(f"NAME = {name!r}: run '{self.folder.name}' has no member of that "
                              f"name ({len([n for n in names if n])} members"
                              f"{'; a partitioned simulation names none' if not names else ''})")
        self.cid = names.index(name)

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
            said = "before it: holds nothing of it" if before else "shaped by it"
            lines.append(f"  {path.name}: {said}")
        if not any("before it" in line for line in lines[1:]):
            lines.append("  no kept checkpoint predates it: only a fresh run holds nothing of it")
        lines.append("A run from one that predates it: warm-start = '<that run folder>' after "
                     "keeping only that checkpoint; or a fresh run without it.")
        return lines

    def _plan(self) -> list[tuple[Path, bytes | None]]:
        """Each file to change and its new bytes (None: to remove), every one read and made
        before any is written."""
        plan: list[tuple[Path, bytes | None]] = []
        for path in checkpoint_files(self.folder):
            state, problem = _read_checkpoint(path, self.secret, self.folder.name)
            if problem is not None:
                raise ConfigError(f"RUN_DIR = '{self.folder}': checkpoint {path.name} cannot be "
                                  f"rewritten: {problem}; nothing was changed")
            plan.append((path, self._checkpoint_bytes(state)))
        for path in sorted((self.folder / "checkpoint").glob("*.refused")):
            plan.append((path, None))
        run = _scrub_run(json.loads(json.dumps(self.run)), self.cid, self.name)
        text = json.dumps(strict_json(run), indent=1, allow_nan=False).encode()
        plan.append((self.folder / "metrics.json", text))
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
        for path in sorted((self.folder / "models").glob(f"{self.name}.*")):
            plan.append((path, None))
        return plan

    def _checkpoint_bytes(self, state: dict[str, Any]) -> bytes:
        import io

        out = io.BytesIO()
        file = RunFile.from_dict(self.run)
        torch.save({"format": CHECKPOINT_FORMAT, **_scrub_checkpoint(
            state, self.cid, self.name, set(file.novel_clients), set(file.attackers))}, out)
        return out.getvalue()

    def forget(self) -> dict[str, Any]:
        """Erase the member; write and return its audit entry (``forgotten.json``)."""
        lock = hold_folder(self.folder)
        if lock is None:
            raise ConfigError(f"RUN_DIR = '{self.folder}': the run is live (its ServerApp holds "
                              "the folder); allowed: once the run has stopped")
        try:
            first = self.first_round()
            plan = self._plan()  # every file read and checked: nothing written yet
            files = []
            for path, data in plan:
                before = sha256_of(path)
                if data is None:
                    path.unlink()
                    if digest_path(path).exists() and path.suffix == ".pt":
                        digest_path(path).unlink()
                    files.append({"file": str(path.relative_to(self.folder)),
                                  "sha256_before": before, "removed": True})
                    continue
                _write(path, data)
                if path.suffix == ".pt":
                    _write(digest_path(path), f"{seal(path, self.secret, self.folder.name)}  "
                                              f"{path.name}\n".encode())
                files.append({"file": str(path.relative_to(self.folder)),
                              "sha256_before": before, "sha256_after": sha256_of(path)})
            still = [str(p.relative_to(self.folder)) for p in sorted(self.folder.rglob("*"))
                     if p.is_file() and p.name not in (FORGOTTEN, ".lock")
                     and self.name.encode() in p.read_bytes()]
            entry = {"member": self.name, "client_id": self.cid,
                     "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "first_contribution_round": first, "files": files,
                     "name_still_found_in": still}
            path = self.folder / FORGOTTEN
            held = json.loads(path.read_text()) if path.is_file() else {"forgotten": []}
            held["forgotten"].append(entry)
            write_json(path, held)
            return entry
        finally:
            lock.close()


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data), private=True)


def _npy(matrix: np.ndarray) -> bytes:
    import io

    out = io.BytesIO()
    np.save(out, matrix)
    return out.getvalue()
