"""A run's folder: ``metrics.json`` with every checkpoint, the checkpoint, and the rules that keep
results from being lost.

``<results-dir>/<run name>/``

* ``metrics.json``: the run's records, rewritten atomically (strict JSON, no
  NaN) with every checkpoint (every round where ``checkpoint-every = 0``): it
  never claims a round a resume cannot continue from, and a run of thousands of
  short rounds spends no quadratic time rewriting it (``checkpoint-every = 20``
  there); ``"finished": true`` once the last round is done.
* ``xi/``: FedAMP's weight matrices, one ``.npy`` per recorded round (:class:`XiFiles`).
* ``models/``: each client's model and card (``save-models``; a partitioned run's:
  a member's are on its own node, :mod:`fedamp_flwr.server.delivery`).
* ``checkpoint/round-NNNNNN.pt``: everything the server needs to continue the
  run (the strategy's state, the global model, the random state, the
  history, the run config), written every ``checkpoint-every`` rounds to a
  temporary file renamed once fully written and synced to disk, then its
  sha256 in ``round-NNNNNN.pt.sha256``; the newest ``checkpoint-keep`` are
  kept. Never written from a state with a non-finite tensor. On resume the
  newest whose digest matches and whose tensors are finite (and fit the
  run's model) is loaded, each one refused said in a WARNING line. Loaded
  with ``torch.load(weights_only=True)``: tensors and plain values only,
  never code. The sha256 detects damage, not tampering (whoever can write
  the file can write its digest too); with a coordinator secret
  (``checkpoint-secret``, or the file ``$FEDAMP_CHECKPOINT_SECRET`` names:
  :func:`checkpoint_secret`) the digest is an HMAC-SHA256 of the file's name
  and bytes under that secret (``hmac-sha256:<hex>``), and a checkpoint
  edited with its digest recomputed is refused like a flipped byte.
* ``checkpoint/manifest.json``: the folder's generation, each kept checkpoint's seal and
  the marks of the members it forgot, sealed likewise; with the coordinator's register it
  refuses a folder put back from an older copy (:mod:`fedamp_flwr.server.manifest`).

Rules: the default run name is unique per run (it ends with the start
time); a folder that already holds a run (metrics or a checkpoint) is used
again only with ``resume = true`` (continue it from its checkpoint; only
``num-server-rounds`` may change, and only upwards) or ``overwrite = true``
(replace it).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import io
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.supercore import log

from strategies.core.records import RunFile
from tasks.export import sha256_of
from tasks.files import atomic_write, private_folder, strict_json

from ..config import ConfigError, RunConfig
from .checkpoint import Checkpoint, read_state
from .manifest import SEALED, Manifest, generation_floor, no_link
from .manifest import read as read_manifest
from .manifest import write as write_manifest

CHECKPOINT_FORMAT = 1
# Keys that may differ between a run and its resumption: how to treat the folder, and how long.
# Keys a resumed run may change: how long it runs and how it is operated, never what it
# computes (a run stopped by max-failed-rounds may go on with a larger one, say).
RESUMABLE_CHANGES = ("num-server-rounds", "resume", "overwrite", "max-failed-rounds",
                     "min-clients-evaluated",
                     "min-nodes", "round-timeout", "node-wait-timeout", "checkpoint-every",
                     "checkpoint-keep", "xi-every", "save-models", "member-roster",
                     "checkpoint-secret", "tensorboard", "mlflow", "mlflow-uri",
                     "alone")  # the clients' models trained alone: a measurement beside the run


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as strict JSON (NaN and infinities become null), atomically, readable
    by its owner only (a run's records hold every member's scores)."""
    text = json.dumps(strict_json(record), indent=1, allow_nan=False)
    atomic_write(path, lambda f: f.write(text.encode()), private=True)


XI_FOLDER = "xi"
LOCK = ".lock"  # held (flock) by the ServerApp of a live run
HOLD_WAIT = 30.0  # seconds a run waits for the folder's holder to end (ResultsFolder.hold)
FORGOTTEN = "forgotten.json"  # the audit of the members a run has forgotten (tools/erasure.py)
MODELS_FOLDER = "models"  # each client's model and card (fedamp_flwr/server/delivery.py)
TENSORBOARD_FOLDER = "tensorboard"  # event files (fedamp_flwr/server/dashboards.py)


def load_xi(run_dir: str | Path) -> tuple[list[int], dict[int, np.ndarray]]:
    """The collaboration weights a run wrote (:class:`XiFiles`): client ids, and the (n, n)
    matrix of each recorded round (float32, or float16 with ``xi-dtype``)."""
    folder = Path(run_dir) / XI_FOLDER
    if not (folder / "client_ids.npy").is_file():
        return [], {}
    ids = np.load(folder / "client_ids.npy", allow_pickle=False).tolist()
    rounds = {int(p.stem.split("-")[1]): np.load(p, allow_pickle=False)
              for p in sorted(folder.glob("round-*.npy"))}
    return ids, rounds


class XiFiles:
    """Writes FedAMP's weight matrices beside metrics.json: ``xi/round-<k>.npy`` (one
    file per recorded round, written once, atomically) and ``xi/client_ids.npy``.

    Every ``every``-th round and the last one are recorded (``every`` = 0: none),
    in ``dtype``. A run of 1,000 clients and 90 rounds holds 90 x 4 MB in float32
    (half in float16) instead of about 2.5 GB of JSON. Members who join later are
    appended to ``client_ids.npy``: a round's (n, n) matrix covers its first n ids.
    """

    def __init__(self, folder: Path, every: int, dtype: str, last_round: int) -> None:
        self.folder, self.every, self.last = folder / XI_FOLDER, every, last_round
        self.dtype = np.dtype(dtype)
        self.latest: tuple[int, np.ndarray] | None = None  # the newest written: its round

    def __call__(self, server_round: int, client_ids: list[int], xi: torch.Tensor) -> bool:
        if not self.every or (server_round % self.every and server_round != self.last):
            return False
        ids = np.asarray(client_ids, dtype=np.int64)
        path = self.folder / "client_ids.npy"
        if not path.is_file() or not np.array_equal(np.load(path, allow_pickle=False), ids):
            atomic_write(path, lambda f: np.save(f, ids), private=True)
        matrix = xi.detach().cpu().numpy().astype(self.dtype)
        atomic_write(self.folder / f"round-{server_round:04d}.npy",
                     lambda f: np.save(f, matrix), private=True)
        self.latest = (server_round, matrix)
        return True

    def of_round(self, server_round: int) -> np.ndarray | None:
        """The matrix written for ``server_round`` (None: none was)."""
        return self.latest[1] if self.latest and self.latest[0] == server_round else None


#: the environment's name for the file of the coordinator's checkpoint secret
SECRET_ENV = "FEDAMP_CHECKPOINT_SECRET"
#: the fewest bytes a secret may have (an HMAC key shorter than its hash's 32 bytes is weak)
SECRET_LEAST = 32


def checkpoint_secret(cfg: RunConfig) -> bytes | None:
    """The coordinator's checkpoint secret: the bytes of the file that run config
    ``checkpoint-secret`` names, else ``$FEDAMP_CHECKPOINT_SECRET``'s, else None (checkpoints
    carry a plain sha256). A ConfigError names the key where the file cannot be read, holds
    fewer than :data:`SECRET_LEAST` bytes, or can be read by other accounts."""
    return read_secret(cfg.checkpoint_secret, "run config 'checkpoint-secret'")


def read_secret(given: str, key: str) -> bytes | None:
    """The checkpoint secret of the file ``given`` (``key`` names it in an error), else of
    ``$FEDAMP_CHECKPOINT_SECRET``'s, else None."""
    path, key = (given, key) if given else (os.environ.get(SECRET_ENV, ""), f"${SECRET_ENV}")
    if not path:
        return None
    where = Path(path).expanduser()
    try:
        secret = where.read_bytes().strip()
        mode = where.stat().st_mode
    except OSError as err:
        raise ConfigError(f"{key} = {path!r}: the checkpoint secret cannot be read ({err}); "
                          "allowed: a file readable by the coordinator only") from None
    if len(secret) < SECRET_LEAST:
        raise ConfigError(f"{key} = {path!r}: the checkpoint secret has {len(secret)} bytes; "
                          f"allowed: a file of at least {SECRET_LEAST} (e.g. `head -c 32 "
                          "/dev/urandom | base64 > secret`)")
    if mode & 0o077:
        raise ConfigError(f"{key} = {path!r}: the checkpoint secret can be read by other "
                          f"accounts (mode {oct(mode & 0o777)}); allowed: a file of mode 0600")
    return secret


def seal(path: Path, secret: bytes | None, run: str, data: bytes | None = None) -> str:
    """A checkpoint file's digest: its sha256, or, with a ``secret``, ``hmac-sha256:`` and the
    HMAC of the run's name, the file's name and its bytes (a sealed file moved to another
    run or round does not verify). ``data``: the file's bytes, read already."""
    if secret is None:
        return sha256_of(path) if data is None else hashlib.sha256(data).hexdigest()
    mac = hmac.new(secret, run.encode() + b"\x00" + path.name.encode() + b"\x00",
                   hashlib.sha256)
    if data is not None:
        mac.update(data)
    else:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                mac.update(block)
    return SEALED + mac.hexdigest()


class RunFolder:
    """The folder of one run, and the checks that keep its results.

    Parameters
    ----------
    cfg : RunConfig
        The run's config (``results-dir``, ``run-name``, ``resume``, ``overwrite``).
    now : float | None
        The start time for a default run name (default: now).
    """

    def __init__(self, cfg: RunConfig, now: float | None = None) -> None:
        self.cfg = cfg
        if cfg.run_name:
            self.name = cfg.run_name
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
            base, i = f"{cfg.run_label}-{stamp}", 1
            self.name = base
            while cfg.results_path(self.name).exists():
                i += 1
                self.name = f"{base}-{i}"
        self.path = cfg.results_path(self.name)
        self._secret: tuple[bytes | None] | None = None
        self._lock: Any = None
        self._manifest: Manifest | None = None  # the folder's, as this run last wrote or read it

    @property
    def secret(self) -> bytes | None:
        """The coordinator's checkpoint secret (:func:`checkpoint_secret`), read once."""
        if self._secret is None:
            self._secret = (checkpoint_secret(self.cfg),)
        return self._secret[0]

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.json"

    def previous(self) -> RunFile | None:
        """The metrics.json a run left in this folder, if any (unreadable: unfinished)."""
        try:
            return RunFile.read(self.metrics_path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            return RunFile(finished=False, extra={"unreadable": str(err)})

    def claim(self) -> None:
        """Check that this run may use the folder; raise ConfigError naming the keys if not.
        The folder is then this ServerApp's (:meth:`hold`) until :meth:`release`.

        With ``overwrite = true`` the old metrics and checkpoint are removed.
        """
        self.hold()
        held = self.previous()
        has_checkpoint = bool(self.checkpoints())
        if self.cfg.resume:
            if (self.path / FORGOTTEN).is_file():
                raise ConfigError(
                    f"run config 'resume' = true: {self.path} has forgotten a member "
                    f"({FORGOTTEN}); allowed: a new run with warm-start = '{self.path}'")
            if not has_checkpoint:
                raise ConfigError(
                    f"run config 'resume' = true, but {self.path} holds no checkpoint "
                    f"(checkpoint/round-*.pt); allowed: the run-name of a run that wrote one "
                    f"(checkpoint-every > 0)")
            return
        if held is None and not has_checkpoint:
            return
        if self.cfg.overwrite:
            self.metrics_path.unlink(missing_ok=True)
            shutil.rmtree(self.path / "checkpoint", ignore_errors=True)
            shutil.rmtree(self.path / XI_FOLDER, ignore_errors=True)
            shutil.rmtree(self.path / MODELS_FOLDER, ignore_errors=True)
            # a simulation's clients' privacy ledgers are the run's (a member's are on its node)
            shutil.rmtree(self.path / "privacy", ignore_errors=True)
            (self.path / "graph-inferred.csv").unlink(missing_ok=True)
            shutil.rmtree(self.path / TENSORBOARD_FOLDER, ignore_errors=True)  # its views
            for page in self.path.glob("report*.html"):
                page.unlink(missing_ok=True)
            if (self.path / FORGOTTEN).is_file():  # the audit of the run replaced: kept apart
                stamp = time.strftime("%Y%m%d-%H%M%S")
                (self.path / FORGOTTEN).replace(self.path / f"forgotten-until-{stamp}.json")
            return
        state = ("a finished run" if held and held.finished else
                 f"a metrics.json it cannot read ({held.extra['unreadable']})"
                 if held and "unreadable" in held.extra else
                 f"an unfinished run (round {held.completed_rounds} of "
                 f"{held.config.get('num-server-rounds', '?')})" if held else
                 "a checkpoint")
        raise ConfigError(
            f"run config 'run-name' = {self.name!r}: {self.path} already holds {state}; allowed: "
            f"another run-name, resume = true to continue it, or overwrite = true to replace it")

    def hold(self) -> None:
        """Hold the folder for this run (an exclusive ``flock`` on its ``.lock``, released
        when the process ends, or by :meth:`release`): a second ServerApp of the same run,
        or ``fedamp-flwr forget``, is refused while it runs.

        A holder is waited for up to :data:`HOLD_WAIT` seconds first: the ServerApp of a
        SuperLink that went away lives on for a few seconds (Flower's SuperExec and ServerApp
        each notice their parent's end, then push their last output), and the run resubmitted
        with ``resume = true`` as soon as the SuperLink is back (``experiments.watch``) must
        not be refused for it."""
        private_folder(self.path)
        self._lock = hold_folder(self.path)
        if self._lock is None:
            log(INFO, "%s is held by process %s (another ServerApp of this run, or fedamp-flwr "
                "forget); waiting up to %.0f s for it to end", self.path, holder_of(self.path),
                HOLD_WAIT)
            started = time.monotonic()
            self._lock = hold_folder(self.path, wait=HOLD_WAIT)
            if self._lock is not None:
                log(INFO, "%s held by this run, after %.1f s", self.path, time.monotonic() - started)
        if self._lock is None:
            raise ConfigError(f"run config 'run-name' = {self.name!r}: {self.path} is in use by "
                              f"another run of the ServerApp, or fedamp-flwr forget (process "
                              f"{holder_of(self.path)}), still after {HOLD_WAIT:.0f} s; "
                              "allowed: another run-name, or wait for that run to end")

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # -- checkpoints ---------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """The run's checkpoint files, newest first (:func:`checkpoint_files`)."""
        return checkpoint_files(self.path)

    def save_checkpoint(self, state: dict[str, Any]) -> tuple[int, float]:
        """Write the checkpoint of ``state["round"]`` atomically, then its digest; keep the
        newest ``checkpoint-keep`` ones. Return its size in bytes and the seconds it took.

        Raises :class:`UnsafeCheckpoint` (and writes nothing) when a tensor of the state
        is not finite: a checkpoint is never written from a broken state.
        """
        started = time.perf_counter()
        bad = nonfinite_tensor(state)
        if bad is not None:
            raise UnsafeCheckpoint(f"round {state['round']}: the server's state holds non-finite "
                                   f"values in {bad}; no checkpoint written")
        path = self.path / "checkpoint" / f"round-{int(state['round']):06d}.pt"
        # a new run's count goes on from the register's (a replaced run of this folder)
        manifest = self._manifest or Manifest(generation=generation_floor(self.path))
        generation = manifest.generation + 1
        atomic_write(path, lambda f: torch.save(
            {"format": CHECKPOINT_FORMAT, **state, "generation": generation}, f), private=True)
        digest = seal(path, self.secret, self.name)
        atomic_write(digest_path(path), lambda f: f.write(f"{digest}  {path.name}\n".encode()),
                     private=True)
        files = self.checkpoints()
        old = files[max(self.cfg.checkpoint_keep, 1):]
        # the first manifest of a folder takes its checkpoints as they are (an older
        # version's, resumed); the ones about to go stay listed until they are gone
        listed = {**({} if manifest.present else _recorded(files)), **manifest.checkpoints,
                  path.name: digest}
        manifest.generation = generation
        manifest.checkpoints = {p.name: listed[p.name] for p in files if p.name in listed}
        write_manifest(self.path, manifest, self.secret, self.name)  # before the old go
        self._manifest = manifest
        for stale in old:
            digest_path(stale).unlink(missing_ok=True)
            stale.unlink(missing_ok=True)
        return path.stat().st_size, time.perf_counter() - started

    def load_checkpoint(self, check: Callable[[dict[str, Any]], str | None] | None = None
                        ) -> Checkpoint:
        """The newest intact checkpoint of a run to resume, checked against this run's config.

        Each file's sha256 must be the one recorded beside it, every tensor in it
        finite, its state a :class:`~fedamp_flwr.server.checkpoint.Checkpoint` of a version this
        app reads, and ``check(state)`` (the caller's: shapes against the run's model)
        None. A file that fails is refused with a WARNING line naming it and why, and
        the one before is tried (``checkpoint-keep`` are kept).

        Raises ConfigError when none is intact, or naming the keys that differ from the
        run being resumed (only ``num-server-rounds`` and operational keys may change).
        """
        if self.secret is None and any(_is_sealed(p) for p in self.checkpoints()):
            raise ConfigError(f"run config 'checkpoint-secret' = '': the checkpoints of "
                              f"{self.path} are sealed with a coordinator secret; allowed: the "
                              f"file of that secret (run config 'checkpoint-secret' or "
                              f"${SECRET_ENV})")
        key = "run config 'resume' = true"
        no_link(Path(self.cfg.results_dir) / self.name, key)
        manifest = read_manifest(self.path, self.secret, self.name, key)
        if manifest.forgotten:  # forgotten.json deleted, or not: the manifest remembers
            raise ConfigError(f"{key}: {self.path} has forgotten a member (its checkpoint/"
                              "manifest.json, or the coordinator's register); allowed: a new "
                              f"run with warm-start = '{self.path}'")
        warn_unversioned(self.path, manifest)
        refused: list[tuple[Path, str]] = []
        for path in self.checkpoints():
            state, problem = read_checkpoint(path, self.secret, self.name, manifest)
            checkpoint, problem = read_state(state, problem, key, path)
            if problem is None:
                problem = check(state) if check is not None else None
            if problem is None:
                assert checkpoint is not None
                if refused:
                    log(WARNING, "Resuming from %s (round %d), the newest intact checkpoint",
                        path.name, checkpoint.round)
                self._same_run(checkpoint)
                self._manifest = manifest
                for bad, _ in refused:  # kept for a look, out of the checkpoints' count
                    for f in (bad, digest_path(bad)):
                        if f.exists():
                            f.replace(f.with_name(f.name + ".refused"))
                return checkpoint
            refused.append((path, problem))
            log(WARNING, "Checkpoint %s refused: %s; trying the one before", path, problem)
        # none intact: every file stays as it is (a wrong or missing secret, say, is mended
        # by giving the right one, not by starting over)
        why = "; ".join(f"{p.name}: {w}" for p, w in refused) if refused else "no checkpoint in it"
        raise ConfigError(f"run config 'resume' = true: {self.path / 'checkpoint'} holds no "
                          f"intact checkpoint ({why}); allowed: overwrite = true to start over")

    def _same_run(self, checkpoint: Checkpoint) -> None:
        """Raises ConfigError where the run config differs from the checkpoint's run (but for
        the keys a resume may change) or asks fewer rounds than it has done."""
        differ = self.cfg.differences(checkpoint.config, allowed=RESUMABLE_CHANGES)
        if differ:
            changes = ", ".join(f"'{k}' = {self.cfg.to_dict().get(k)!r} (was "
                                f"{checkpoint.config.get(k)!r})" for k in differ)
            raise ConfigError(f"run config 'resume' = true, but the config differs from the run "
                              f"being resumed: {changes}; allowed: the same config, with a larger "
                              f"'num-server-rounds'")
        if self.cfg.num_server_rounds < checkpoint.round:
            raise ConfigError(f"run config 'num-server-rounds' = {self.cfg.num_server_rounds} is "
                              f"below the {checkpoint.round} rounds the run has done; allowed: "
                              f"an integer >= {checkpoint.round}")

    def write_metrics(self, record: dict[str, Any]) -> None:
        """Rewrite metrics.json (atomic, strict JSON); an inferred client graph the record
        holds (``inferred_graph``) also as the edge list ``graph = "file"`` reads,
        ``graph-inferred.csv``, by member name where the run has names."""
        write_json(self.metrics_path, record)
        run = RunFile.from_dict(record)
        graph = run.extra.get("inferred_graph")
        if graph:
            names = run.client_names or None
            label = (lambda i: names[i]) if names else str
            rows = ["u,v"] + [f"{label(u)},{label(v)}" for u, v in graph["edges"]]
            text = ("\n".join(rows) + "\n").encode()
            atomic_write(self.path / "graph-inferred.csv", lambda f: f.write(text), private=True)


def hold_folder(path: Path, wait: float = 0.0) -> Any:
    """An open ``.lock`` file of the run folder ``path`` holding an exclusive ``flock`` (the
    holder's process id written in it), or None where another process holds it (the run is
    live) still after ``wait`` seconds."""
    lock = os.fdopen(os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+")
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                lock.close()
                return None
            time.sleep(0.2)
        except OSError as err:  # a file system without flock: nothing can hold it
            log(WARNING, "%s cannot be locked (%s): a second run of it, or fedamp-flwr forget, "
                "is not kept out while it runs", path, err)
            return lock
    try:  # for the message of a run that finds it held (holder_of): not needed to hold it
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
    except OSError:
        pass
    return lock


def holder_of(path: Path) -> str:
    """The process id the holder of the run folder ``path`` wrote in its ``.lock``, as
    written (at most 20 characters), or "unknown"."""
    try:
        with os.fdopen(os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW), "rb") as lock:
            said = lock.read(21).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return said if said.isdigit() and len(said) <= 20 else "unknown"


class UnsafeCheckpoint(RuntimeError):
    """A state that must not become a checkpoint (a non-finite tensor)."""


def digest_path(checkpoint: Path) -> Path:
    """Where a checkpoint's sha256 is recorded (``round-NNNNNN.pt.sha256``)."""
    return checkpoint.with_name(checkpoint.name + ".sha256")


def checkpoint_files(run_dir: str | Path) -> list[Path]:
    """A run folder's checkpoints, newest first: ``checkpoint/round-*.pt``."""
    return sorted((Path(run_dir) / "checkpoint").glob("round-*.pt"), reverse=True)


def nonfinite_tensor(value: Any, where: str = "state") -> str | None:
    """Where the first floating-point tensor of ``value`` with a non-finite value is, or None."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return where
        return None
    items = (value.items() if isinstance(value, dict) else
             enumerate(value) if isinstance(value, (list, tuple)) else ())
    for key, item in items:
        found = nonfinite_tensor(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def _is_sealed(path: Path) -> bool:
    """Whether a checkpoint's digest is a seal (:func:`seal` with a secret)."""
    try:
        return digest_path(path).read_text().startswith(SEALED)
    except (OSError, UnicodeDecodeError):
        return False


def _recorded(files: list[Path]) -> dict[str, str]:
    """Each checkpoint's digest as recorded beside it (those with none left out)."""
    out = {}
    for path in files:
        try:
            out[path.name] = digest_path(path).read_text().split()[0]
        except (OSError, IndexError, UnicodeDecodeError):
            continue
    return out


def warn_unversioned(folder: Path, manifest: Manifest) -> None:
    """A WARNING where a folder with checkpoints has no manifest (an older version's)."""
    if not manifest.present and checkpoint_files(folder):
        log(WARNING, "%s has no checkpoint/manifest.json (written by an older version): a "
            "checkpoint restored there from an older copy cannot be told from the run's own",
            folder)


def read_checkpoint(path: Path, secret: bytes | None = None, run: str = "",
                    manifest: Manifest | None = None, member: str = ""
                    ) -> tuple[dict[str, Any], str | None]:
    """A checkpoint file's state, or why it cannot be used (its digest or seal, its
    contents, and, given the folder's ``manifest``, whether it is the file the manifest
    lists: :meth:`Manifest.unlisted`, ``member`` the one a ``forget`` erases); with a
    ``secret`` only a checkpoint of run ``run`` sealed with it is read. The file is read
    once: the bytes checked are the bytes loaded."""
    try:
        recorded = digest_path(path).read_text().split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return {}, f"no digest beside it ({digest_path(path).name}): not completely written"
    sealed = recorded.startswith(SEALED)
    if secret is not None and not sealed:
        return {}, ("not sealed (its digest is a plain sha256, which anyone who can write "
                    "the file can recompute), and this run has a checkpoint secret")
    if secret is None and sealed:
        return {}, ("sealed with a coordinator secret that this run does not have; give it "
                    f"(run config 'checkpoint-secret' or ${SECRET_ENV})")
    try:
        data = path.read_bytes()
    except OSError as err:
        return {}, f"cannot be read ({err})"
    actual = seal(path, secret, run, data)
    # a digest left stale by a crash between a checkpoint and its digest: the sealed manifest
    # vouches for the file
    vouched = manifest is not None and manifest.present and manifest.lists(path.name, actual,
                                                                           member)
    if not vouched and not hmac.compare_digest(actual.encode(), recorded.encode()):
        if sealed:  # never a prefix of the right seal in a log line
            return {}, ("its seal does not verify: the file was changed or damaged, or "
                        "sealed with another secret or for another run or round")
        return {}, (f"its sha256 {actual[:12]}... is not the recorded {recorded[:12]}...: "
                    "the file was changed or damaged")
    try:
        state = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:
        return {}, f"cannot be read ({type(err).__name__}: {err})"
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        return {}, f"not a checkpoint of this app (format {CHECKPOINT_FORMAT})"
    bad = nonfinite_tensor(state)
    if bad is not None:
        return {}, f"non-finite values in {bad}"
    if manifest is not None:
        problem = manifest.unlisted(path.name, actual, state.get("generation"), member)
        if problem is not None:
            return {}, problem
    return state, None


def snapshot(value: Any) -> Any:
    """``value`` with every tensor copied (dicts, lists and tuples rebuilt): what a checkpoint
    holds while the run goes on and changes the strategy's tensors in place."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value)
    return value


class Writer:
    """Writes a run's files in the order they were given, on one background thread.

    The ServerApp hands it each round's checkpoint (a :func:`snapshot`, taken in
    memory at once) and metrics.json, and goes on with the next round while the
    disk writes them: a checkpoint of 100 clients' CNNs (680 MB) no longer holds
    up a round. One thread, in order: metrics.json is written after the round's
    checkpoint, so it never claims a round that cannot be resumed. A write that
    failed raises at the next :meth:`submit` or at :meth:`close`, which waits for
    every write.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedamp-writer")
        self._pending: list[Future] = []

    def submit(self, write: Callable[[], None]) -> None:
        """Queue ``write``; raise the error of an earlier write that failed."""
        self._check()
        self._pending.append(self._pool.submit(write))

    def _check(self) -> None:
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for f in done:
            f.result()

    def flush(self) -> None:
        """Wait for every queued write (raising the first error)."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        """Flush, and end the thread."""
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)
