"""A consortium's collaboration policy: pairs of members kept apart.

Competitors in one consortium (two banks) may agree to a federation but not to weigh each
other's models directly. The run config's ``collaboration-policy`` names a TOML file::

    [[apart]]
    members = ["bank-a", "bank-b"]

    [[apart]]                      # every pair of these three
    members = ["bank-c", "bank-d", "bank-e"]

Every pair of the members of one ``[[apart]]`` entry is kept apart: FedAMP's and
HeurFedAMP's weights xi between them are 0 in every round (:mod:`strategies.fedamp_math`),
and a client graph (given or inferred) has no edge between them. Members are named by their
node config's ``client-id``; in a partitioned simulation, by their partition id ("3").
A name the run never sees matches no one (the ServerApp names them in a warning).

The file lives on the coordinator's machine: only the ServerApp reads it
(:func:`read_policy`: a bad one is one line naming the key, the value and what is allowed,
before any round); a member's ClientApp never opens it. :class:`ApartPolicy` is the policy,
pure.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .protocol import is_name
from .settings import ConfigError

KEY = "collaboration-policy"
#: the most bytes read of a policy file, and the most names in it
MOST_BYTES = 1 << 20
MOST_NAMES = 10_000


@dataclass(frozen=True)
class ApartPolicy:
    """Groups of member names, every pair within a group kept apart; ``digest``: the
    SHA-256 of the file it was read from (recorded with the run, checked on resume)."""

    groups: tuple[tuple[str, ...], ...] = ()
    digest: str = ""

    def names(self) -> set[str]:
        """Every name the policy holds."""
        return {name for group in self.groups for name in group}

    def mask(self, names: Sequence[str]) -> torch.Tensor:
        """The (n, n) boolean matrix of the pairs kept apart among clients named ``names``
        (row i: ``names[i]``), symmetric, false on the diagonal: from the groups x clients
        incidence matrix G, (G^T G) > 0."""
        index = {name: i for i, name in enumerate(names)}
        incidence = torch.zeros(len(self.groups), len(names))
        for g, group in enumerate(self.groups):  # a loop over groups, not pairs
            incidence[g, [index[n] for n in group if n in index]] = 1.0
        out = (incidence.T @ incidence) > 0
        return out.fill_diagonal_(False)

    def record(self, path: str) -> dict:
        """What metrics.json and the checkpoint say of the policy: the file, its digest and
        the groups as written (every pair within a group is kept apart)."""
        return {"file": path, "sha256": self.digest, "apart": [list(g) for g in self.groups]}


def _bad(path: str, what: str) -> ConfigError:
    return ConfigError(f"run config {KEY!r} = {path!r} is invalid: {what}; allowed: a TOML "
                       "file of one or more [[apart]] tables, each members = [two or more "
                       "distinct member names (letters, digits and - _ . @, at most 64)]")


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict) or set(entry) != {"members"}:
        keys = sorted(entry)[:5] if isinstance(entry, dict) else type(entry).__name__
        return f"has {keys}, not exactly the key 'members'"
    members = entry["members"]
    if not isinstance(members, list) or len(members) < 2:
        return "'members' is not a list of two or more names"
    bad = next((m for m in members if not is_name(m)), None)
    if bad is not None:
        return f"names {str(bad)[:70]!r}, not a member name"
    if len(set(members)) != len(members):
        return "names a member twice"
    return None


def read_policy(path: str) -> ApartPolicy:
    """The policy of the TOML file ``path`` (``~`` expanded; see the module), checked: at
    most :data:`MOST_BYTES` bytes of UTF-8 (a byte-order mark allowed), one or more
    ``[[apart]]`` tables, each of only ``members``, two or more distinct member names
    (:func:`strategies.core.protocol.is_name`), :data:`MOST_NAMES` names in all. Raises
    ConfigError naming the key, the value and what is wrong. The ServerApp's only."""
    file = Path(path).expanduser()
    try:
        if not file.is_file():
            raise _bad(path, "not a file")
        with open(file, "rb") as f:
            raw = f.read(MOST_BYTES + 1)
    except OSError as err:
        raise _bad(path, f"cannot be read ({err.strerror or err})") from None
    if len(raw) > MOST_BYTES:
        raise _bad(path, f"more than {MOST_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise _bad(path, f"not TOML ({str(err)[:100]})") from None
    if set(data) - {"apart"}:
        raise _bad(path, f"unknown table(s) {sorted(set(data) - {'apart'})[:5]}")
    entries = data.get("apart")
    if not isinstance(entries, list) or not entries:
        raise _bad(path, "no [[apart]] table")
    groups: list[tuple[str, ...]] = []
    for number, entry in enumerate(entries, start=1):
        problem = _entry_problem(entry)
        if problem is not None:
            raise _bad(path, f"[[apart]] number {number} {problem}")
        groups.append(tuple(entry["members"]))
    if sum(map(len, groups)) > MOST_NAMES:
        raise _bad(path, f"more than {MOST_NAMES} names")
    return ApartPolicy(tuple(groups), hashlib.sha256(raw).hexdigest())
