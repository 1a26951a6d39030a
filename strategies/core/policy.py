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
A name the run never sees is kept in the policy and matches no one.

:func:`read_policy` reads and checks the file (a bad one is one line naming the key, the
value and what is allowed, before any work); :class:`ApartPolicy` is the policy, pure.
"""

from __future__ import annotations

import hashlib
import itertools
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .settings import ConfigError

KEY = "collaboration-policy"
#: the most bytes read of a policy file, the most names in it, and the longest name
MOST_BYTES = 1 << 20
MOST_NAMES = 10_000
LONGEST_NAME = 256


@dataclass(frozen=True)
class ApartPolicy:
    """Groups of member names, every pair within a group kept apart; ``digest``: the
    SHA-256 of the file it was read from (recorded with the run)."""

    groups: tuple[tuple[str, ...], ...] = ()
    digest: str = ""

    def pairs(self) -> list[tuple[str, str]]:
        """Every pair kept apart (each once, sorted)."""
        found = {tuple(sorted(p)) for g in self.groups for p in itertools.combinations(g, 2)}
        return sorted((a, b) for a, b in found)

    def mask(self, names: Sequence[str]) -> torch.Tensor:
        """The (n, n) boolean matrix of the pairs kept apart among clients named ``names``
        (row i: ``names[i]``), symmetric, false on the diagonal."""
        index = {name: i for i, name in enumerate(names)}
        out = torch.zeros(len(names), len(names), dtype=torch.bool)
        for group in self.groups:
            rows = torch.as_tensor([index[n] for n in group if n in index], dtype=torch.long)
            out[rows[:, None], rows[None, :]] = True
        out.fill_diagonal_(False)
        return out

    def record(self, path: str) -> dict:
        """What metrics.json says of the policy: the file, its digest, the pairs."""
        return {"file": path, "sha256": self.digest, "apart": [list(p) for p in self.pairs()]}


def _bad(path: str, what: str) -> ConfigError:
    return ConfigError(f"run config {KEY!r} = {path!r} is invalid: {what}; allowed: a TOML "
                       f"file of [[apart]] tables, each members = [two or more distinct names]")


def read_policy(path: str) -> ApartPolicy:
    """The policy of the TOML file ``path`` (see the module), checked: at most
    :data:`MOST_BYTES` bytes, only ``[[apart]]`` tables of ``members`` lists of two or more
    distinct non-empty names of at most :data:`LONGEST_NAME` characters, :data:`MOST_NAMES`
    names in all. Raises ConfigError naming the key and the value."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MOST_BYTES + 1)
    except OSError as err:
        raise _bad(path, f"cannot be read ({err.strerror or err})") from None
    if len(raw) > MOST_BYTES:
        raise _bad(path, f"more than {MOST_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise _bad(path, f"not TOML ({err})") from None
    if set(data) - {"apart"}:
        raise _bad(path, f"unknown table(s) {sorted(set(data) - {'apart'})}")
    entries = data.get("apart", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _bad(path, "'apart' must be an array of tables ([[apart]])")
    groups: list[tuple[str, ...]] = []
    for number, entry in enumerate(entries, start=1):
        members = entry.get("members")
        if set(entry) != {"members"} or not isinstance(members, list) or len(members) < 2 \
                or not all(isinstance(m, str) and 0 < len(m) <= LONGEST_NAME for m in members) \
                or len(set(members)) != len(members):
            raise _bad(path, f"[[apart]] number {number} is {entry!r}")
        groups.append(tuple(members))
    if sum(map(len, groups)) > MOST_NAMES:
        raise _bad(path, f"more than {MOST_NAMES} names")
    return ApartPolicy(tuple(groups), hashlib.sha256(raw).hexdigest())

