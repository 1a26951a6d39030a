"""What keeps a run folder's state from being rolled back: its sealed manifest, and the
coordinator's register of every folder's newest generation.

``checkpoint/manifest.json`` holds the folder's *generation* (one more with every checkpoint
written and with every erasure), the seal of each kept checkpoint, and a mark of each member
the run has forgotten (``fedamp-flwr forget``; :func:`mark`: a digest, never the name, which
only ``forgotten.json``, the audit, keeps). It is sealed as the checkpoints are: with the coordinator's
secret, an HMAC of the run's name and the manifest's bytes; without one, their sha256. Each
checkpoint holds the generation it was written at inside its own sealed bytes. Resume, warm
start and ``forget`` read a checkpoint only when the manifest lists its seal: one restored
from an older copy (from before an erasure, say), or one of another run, is refused, naming
why; and the manifest's forgotten names are refused whether or not ``forgotten.json`` is still
there.

Whoever can write the run folder could restore the manifest as well, with the checkpoints it
listed then (the whole folder from a backup). The register catches that: one small file per
run folder in the coordinator's state folder (``<state dir>/register/``, :func:`register_dir`,
outside every results folder), holding the folder's newest generation and forgotten names. A
manifest older than the register's generation, a manifest missing where the register (or a
checkpoint's own generation) says there was one, or a forgotten name the manifest lost: each
is refused, naming what does not match.

What this cannot prove: without a secret, the manifest's sha256 can be recomputed by whoever
edits it, at the register's generation and marks too (read off the manifest): the register
then catches a restore by mistake, not one on purpose; the register is the state folder's of
whoever runs the command (``forget`` must share the ServerApp's); a folder copied to
another path is one the register has not seen (its manifest still binds the checkpoints to
each other); whoever can write both the coordinator's state
folder and the run folder, and read the secret, can make any state look genuine. A folder
written by an older version has neither: it is read as before, with a WARNING.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.supercore import log

from tasks.files import atomic_write

from ..config import ConfigError
from ..identity import state_dir

MANIFEST = "manifest.json"
SEALED = "hmac-sha256:"
FORMAT = 1
#: what a manifest's seal covers before the run's name (never valid for anything else)
DOMAIN = b"fedamp-flwr run manifest 1\x00"


def no_link(given: Path, key: str) -> Path:
    """``given`` resolved, unless the run folder itself is a symbolic link: a ConfigError
    (the register knows a folder by its place, and a link would put another folder there)."""
    given = Path(given).expanduser()
    if given.is_symlink():
        raise ConfigError(f"{key}: {given} is a symbolic link (to {given.resolve()}); allowed: "
                          "the run's own folder, not a link to one")
    return given.resolve()


def register_dir() -> Path:
    """The coordinator's register of run folders: ``<state dir>/register``
    (:func:`fedamp_flwr.identity.state_dir`)."""
    return state_dir() / "register"


def register_path(folder: Path) -> Path:
    """The register's file of run folder ``folder`` (by its resolved path)."""
    key = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:32]
    return register_dir() / f"{key}.json"


def _seal(body: bytes, secret: bytes | None, run: str) -> str:
    if secret is None:
        return hashlib.sha256(body).hexdigest()
    return SEALED + hmac.new(secret, DOMAIN + run.encode() + b"\x00" + body,
                             hashlib.sha256).hexdigest()


@dataclass
class Manifest:
    """A run folder's manifest (see the module's docstring).

    ``checkpoints``: each kept checkpoint's file name and seal (with, while old ones are
    being deleted, theirs). ``forgotten``: the
    :func:`mark` of each member the run has forgotten. ``erasing``: where an erasure
    was cut short, the member and the seals of the checkpoints it was rewriting (``forget``
    of that member accepts them; nothing else does). ``present``: whether the folder had one
    (False: a new folder, or one of an older version)."""

    generation: int = 0
    checkpoints: dict[str, str] = field(default_factory=dict)
    forgotten: list[str] = field(default_factory=list)
    erasing: dict[str, Any] = field(default_factory=dict)
    present: bool = False
    #: where the manifest is missing: whether the register knows the folder, and whether the
    #: folder holds one checkpoint only (a new run's first, cut before its manifest)
    registered: bool = False
    lone: bool = False

    def body(self) -> bytes:
        return json.dumps({"format": FORMAT, "generation": self.generation,
                           "checkpoints": self.checkpoints, "forgotten": self.forgotten,
                           "erasing": self.erasing}, sort_keys=True, allow_nan=False).encode()

    def unlisted(self, name: str, seal: str, generation: object, member: str = "") -> str | None:
        """Why checkpoint file ``name`` of seal ``seal`` (holding ``generation``) is not the
        one the manifest records (None: it is). ``member``: the member a ``forget`` erases
        (the seals of its erasure cut short count)."""
        if generation == self.generation + 1 and isinstance(generation, int) and (
                self.present or self.lone):
            return None  # written after the manifest's last write, before a crash cut the next
        if not self.present:
            if generation is None and not self.registered:
                return None  # written by an older version, which kept no manifest
            return (f"it was written with the folder's manifest (generation {generation}), and "
                    f"checkpoint/{MANIFEST} is missing: deleted, or the folder restored in part"
                    if generation is not None else
                    "it is an older version's checkpoint, in a folder the coordinator's "
                    f"register records at generation {self.generation}")
        if self.lists(name, seal, member):
            return None
        return (f"it is not the {name} the folder's manifest (generation {self.generation}) "
                "records: an older copy restored (from before an erasure, say), or a file of "
                "another run")


    def lists(self, name: str, seal: str, member: str = "") -> bool:
        """Whether the manifest lists ``seal`` for checkpoint file ``name`` (``member``: the
        one a ``forget`` erases; the seals of its erasure cut short count)."""
        known = self.checkpoints.get(name, "")
        if known and hmac.compare_digest(known.encode(), seal.encode()):
            return True
        old = self.erasing.get("checkpoints", {}).get(name, "")
        return bool(member and self.erasing.get("member") == member and old and
                    hmac.compare_digest(old.encode(), seal.encode()))


def mark(name: str, secret: bytes | None, run: str) -> str:
    """What a manifest and the register keep of a forgotten member's name: a digest of it
    bound to the run (with the secret, an HMAC), so that no file but the audit names it."""
    return _seal(b"forgotten member\x00" + run.encode() + b"\x00" + name.encode(), secret,
                 run).removeprefix(SEALED)


def holds_forgotten(names: object, manifest: Manifest, secret: bytes | None, run: str) -> bool:
    """Whether a checkpoint's ``client_names`` hold a member the manifest marks forgotten."""
    marks = set(manifest.forgotten)
    return bool(marks) and isinstance(names, list) and any(
        mark(str(n), secret, run) in marks for n in names if n)


def read(folder: Path, secret: bytes | None, run: str, key: str) -> Manifest:
    """Run folder ``folder``'s manifest, checked against its seal and the register; a
    ConfigError (``key`` names what asked) says what does not match."""
    path = folder / "checkpoint" / MANIFEST
    held = _register(folder, key)
    if not path.is_file():
        count = len(list((folder / "checkpoint").glob("round-*.pt")))
        if held is None or not count:  # a new folder, an older version's, or one holding nothing
            return Manifest(lone=count == 1)
        # each checkpoint is then checked against the register's generation (Manifest.unlisted)
        return Manifest(generation=held["generation"], forgotten=list(held["forgotten"]),
                        registered=True, lone=count == 1)
    try:
        raw = json.loads(path.read_bytes())
        given, body = str(raw.pop("seal")), raw
        manifest = Manifest(int(body["generation"]), dict(body["checkpoints"]),
                            [str(n) for n in body["forgotten"]], dict(body.get("erasing", {})),
                            present=True)
        if body.get("format") != FORMAT or manifest.generation < 0:
            raise ValueError(f"not a manifest of format {FORMAT}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{key}: {path} cannot be read ({type(err).__name__}: {err}); "
                          "allowed: the manifest the run wrote") from None
    if secret is not None and not given.startswith(SEALED):
        raise ConfigError(f"{key}: {path} is not sealed (a plain sha256, which anyone who can "
                          "write it can recompute), and this run has a checkpoint secret")
    if secret is None and given.startswith(SEALED):
        raise ConfigError(f"{key}: {path} is sealed with a coordinator secret that this run "
                          "does not have; give it (run config 'checkpoint-secret' or "
                          "$FEDAMP_CHECKPOINT_SECRET)")
    if not hmac.compare_digest(_seal(manifest.body(), secret, run).encode(), given.encode()):
        raise ConfigError(f"{key}: {path}'s seal does not verify: edited, or sealed with another "
                          "secret or for another run")
    if held is not None:
        if held["generation"] > manifest.generation:
            raise ConfigError(
                f"{key}: {path} is generation {manifest.generation}, and the coordinator's "
                f"register ({register_path(folder)}) records generation {held['generation']} "
                "of this folder: the folder was restored from an older copy; allowed: the "
                "folder as its last run or forget left it")
        lost = sorted(set(held["forgotten"]) - set(manifest.forgotten))
        if lost:
            raise ConfigError(
                f"{key}: the coordinator's register ({register_path(folder)}) records "
                f"{len(lost)} member(s) this run has forgotten that {path} does not: the folder "
                "was restored from before an erasure; allowed: the folder as forget left it")
    return manifest


def write(folder: Path, manifest: Manifest, secret: bytes | None, run: str) -> None:
    """Write ``manifest`` (sealed) into the folder, then its generation and forgotten names
    into the register; a register that cannot be written is said in a WARNING (the folder's
    rollback as a whole is then not detected), never stops the run."""
    body = json.loads(manifest.body())
    text = json.dumps({**body, "seal": _seal(manifest.body(), secret, run)}, indent=1,
                      allow_nan=False)
    atomic_write(folder / "checkpoint" / MANIFEST, lambda f: f.write(text.encode()),
                 private=True)
    manifest.present = True
    record = json.dumps({"run": run, "folder": str(Path(folder).resolve()),
                         "generation": manifest.generation,
                         "forgotten": sorted(manifest.forgotten)}, indent=1,
                        allow_nan=False).encode()
    try:
        atomic_write(register_path(folder), lambda f: f.write(record), private=True)
    except OSError as err:
        log(WARNING, "The coordinator's register %s cannot be written (%s): a restore of %s "
            "from an older copy, manifest included, cannot be detected", register_dir(), err,
            folder)


def _register(folder: Path, key: str) -> dict[str, Any] | None:
    """The register's record of ``folder`` (None: none, or the register cannot be read: said
    in a WARNING)."""
    path = register_path(folder)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        log(WARNING, "The coordinator's register %s cannot be read (%s): a restore of %s from "
            "an older copy cannot be detected", path, err, folder)
        return None
    try:
        held = json.loads(raw)
        record = {"generation": int(held["generation"]),
                  "forgotten": [str(n) for n in held["forgotten"]]}
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{key}: the coordinator's register {path} cannot be read "
                          f"({type(err).__name__}: {err}); allowed: the file this app wrote, "
                          "or none") from None
    return record


def generation_floor(folder: Path) -> int:
    """The generation a new run in ``folder`` starts above: the register's (a run of the same
    folder before, replaced by ``overwrite`` or deleted), else 0."""
    try:
        held = _register(folder, f"run folder {folder}")
    except ConfigError as err:
        log(WARNING, "%s; a new run starts its count afresh", err)
        return 0
    return held["generation"] if held else 0
