"""A member's name bound to a key: who may speak for a ``client-id``.

A member names itself in its node config (``client-id``); any node can write any name
there. So every member's node also holds a key of its own, an Ed25519 key pair made on
its first run (:func:`member_key`), and proves the name with it: in the query round the
server sends every node a fresh random challenge, and a member answers with its public
key and its signature over the challenge, its name and its node id (:func:`sign`). The
server checks the signature (:func:`verify`) and the key against the one bound to the
name (:mod:`fedamp_flwr.server.membership`): the key a roster names (run config
``member-roster``, a file on the coordinator's machine: :func:`read_roster`), or else the
key the name was first accepted with in this run (pinned on first use, kept in the
checkpoint). A node that cannot prove the name gets nothing for it.

Where the key lives: the node config's ``identity-dir`` (default
``$FEDAMP_STATE_DIR/identity``, ``$FEDAMP_STATE_DIR`` defaulting to
``$XDG_STATE_HOME/fedamp-flwr`` or ``~/.local/state/fedamp-flwr``), as
``<client-id>.key`` (PKCS#8 PEM, ``0600`` in a ``0700`` folder). ``fedamp-flwr identity``
prints it as the line a roster takes.

What it guarantees, against whom: docs/federation.md ("A member's name is its key's").
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from tasks.files import FILE_MODE, fsync_folder, private_folder

from .config import ConfigError

#: the node config key of the member's key folder, and the environment's state folder
IDENTITY_DIR, STATE_ENV = "identity-dir", "FEDAMP_STATE_DIR"
#: what a member's signature covers besides the challenge (never valid for anything else)
DOMAIN = b"fedamp-flwr member proof 1\x00"
PREFIX = "ed25519:"
#: the size of a challenge, a public key and a signature, in bytes
CHALLENGE_BYTES, KEY_BYTES, PROOF_BYTES = 32, 32, 64


class IdentityError(ValueError):
    """A key or roster that cannot be used (the message names the file and why)."""


def state_dir() -> Path:
    """This machine's folder for what the app keeps between runs (``$FEDAMP_STATE_DIR``,
    else ``$XDG_STATE_HOME/fedamp-flwr``, else ``~/.local/state/fedamp-flwr``)."""
    value = os.environ.get(STATE_ENV, "")
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME", "")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "fedamp-flwr"


def identity_dir(node_config: Mapping[str, object]) -> Path:
    """The member's key folder: the node config's ``identity-dir``, else
    ``<state_dir()>/identity`` (a ConfigError names a bad value)."""
    value = node_config.get(IDENTITY_DIR)
    if value is None:
        return state_dir() / "identity"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"node config '{IDENTITY_DIR}' = {value!r} is invalid; allowed: a "
                          "folder path (where this member's key is kept)")
    return Path(value.strip()).expanduser()


def member_key(folder: Path, name: str) -> Ed25519PrivateKey:
    """The member ``name``'s private key in ``folder`` (``<name>.key``), made there on first
    use: ``0600``, the folder ``0700``, written whole to a temporary file and linked in
    place, so that two processes starting at once end with one key. A key file that cannot
    be read is an :class:`IdentityError` (never replaced: it is the member's identity)."""
    path = folder / f"{name}.key"
    _check_private(folder, folder=True)
    if not path.exists():
        private_folder(folder)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        tmp = folder / f".{name}.key.tmp-{os.getpid()}-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)
                f.write(pem)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # fails where another process made it first: theirs stays
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
        fsync_folder(folder)
    _check_private(path, folder=False)
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise IdentityError(f"{path}: this member's key cannot be read ({err}); it is kept as "
                            "it is (a new key is a new identity: see docs/federation.md)"
                            ) from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise IdentityError(f"{path}: not an Ed25519 private key")
    return loaded


def _check_private(path: Path, folder: bool) -> None:
    """An :class:`IdentityError` where the key (or its folder, if it exists) is not this
    account's alone: a link, another owner, a key others may read, a folder others may
    write (where another account could plant a key it knows)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    problem = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else
               f"belongs to another account (uid {st.st_uid})" if st.st_uid != os.getuid() else
               f"can be written by other accounts (mode {oct(st.st_mode & 0o777)})"
               if folder and st.st_mode & 0o022 else
               f"can be read by other accounts (mode {oct(st.st_mode & 0o777)})"
               if not folder and st.st_mode & 0o077 else "")
    if problem:
        raise IdentityError(f"{path}: this member's key {'folder ' if folder else ''}{problem};"
                            " allowed: its owner's alone (a key folder 0700, the key 0600)")


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    """The raw 32 bytes of ``key``'s public key."""
    return key.public_key().public_bytes(serialization.Encoding.Raw,
                                         serialization.PublicFormat.Raw)


def key_text(public: bytes) -> str:
    """A public key as a roster writes it: ``ed25519:<base64>``."""
    return PREFIX + base64.b64encode(public).decode()


def parse_key(text: str) -> bytes:
    """The raw public key of ``ed25519:<base64>`` (ValueError if it is not one)."""
    if not text.startswith(PREFIX):
        raise ValueError(f"a key is {PREFIX}<base64 of 32 bytes>")
    try:
        raw = base64.b64decode(text[len(PREFIX):], validate=True)
    except ValueError:
        raise ValueError("its base64 cannot be read") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{len(raw)} bytes, a key has {KEY_BYTES}")
    return raw


def fingerprint(public: bytes) -> str:
    """A short name for a public key in log lines and records: ``SHA256:`` and the first 16
    base64 characters of its sha256."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(public).digest()).decode()[:16]


def _signed(challenge: bytes, name: str, node_id: int) -> bytes:
    return DOMAIN + challenge + b"\x00" + name.encode() + b"\x00" + str(int(node_id)).encode()


def sign(key: Ed25519PrivateKey, challenge: bytes, name: str, node_id: int) -> bytes:
    """The member's proof of ``name`` on node ``node_id`` for the server's ``challenge``."""
    return key.sign(_signed(challenge, name, node_id))


def verify(public: object, proof: object, challenge: bytes, name: str, node_id: int) -> bool:
    """Whether ``proof`` is the signature of the holder of ``public`` over ``challenge``,
    ``name`` and ``node_id`` (untrusted values of a reply: anything else is False)."""
    if not (isinstance(public, bytes) and len(public) == KEY_BYTES
            and isinstance(proof, bytes) and len(proof) == PROOF_BYTES):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(proof, _signed(challenge, name,
                                                                          node_id))
    except (InvalidSignature, ValueError):
        return False
    return True


def read_roster(path: str) -> dict[str, bytes]:
    """A roster: one member a line, ``<client-id> ed25519:<base64>`` (the line
    ``fedamp-flwr identity`` prints); blank lines and ``#`` comments skipped. Every problem
    (a bad name or key, a name twice, a key twice) is listed in one
    :class:`IdentityError` naming the file and the line."""
    from strategies.core.protocol import is_name

    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise IdentityError(f"{path}: the roster cannot be read ({err})") from None
    roster: dict[str, bytes] = {}
    owners: dict[bytes, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not is_name(parts[0]):
            problems.append(f"line {number}: not '<client-id> {PREFIX}<key>'")
            continue
        name, key = parts
        try:
            raw = parse_key(key)
        except ValueError as err:
            problems.append(f"line {number}: member '{name}': {err}")
            continue
        if name in roster:
            problems.append(f"line {number}: member '{name}' is named twice")
        elif raw in owners:
            problems.append(f"line {number}: member '{name}' has the key of '{owners[raw]}' "
                            "(every member its own key)")
        else:
            roster[name], owners[raw] = raw, name
    if problems:
        raise IdentityError(f"{path}: {len(problems)} problem(s): " + "; ".join(problems[:10]))
    if not roster:
        raise IdentityError(f"{path}: the roster names no member")
    return roster
