"""A run's checkpoint, typed: :class:`Checkpoint` is what the ServerApp writes after a round
(``fedamp_flwr/server/recorder.py``) and reads back to resume (``server_app.ServerRun``) or to
start a new season from (``fedamp_flwr/server/seasons.py``).

The file around it (its digest or seal, the manifest's generation, ``format``) is
``fedamp_flwr/server/results.py``'s. The strategy's own part, ``strategy``, is the strategy's
(``state_dict`` / ``load_state_dict``; the parts it keeps per client are declared in
``strategies.core.client_state``): held here whole, never read.

The facts a run's metrics.json also records (its members, their keys, the refused claims,
the scaling, the policy, the warm start) are the same values, spelled as metrics.json spells
them (``fedamp_flwr/server/recorder.py`` makes them once for both), and written only where
the run has them.

Versions (``version``): 1, every checkpoint written before issue 59 (no ``version`` key;
what a version before it did not write reads as its default: no member keys, no state
kind, no token; its members' keys in hex, read as the ``ed25519:<base64>`` of a roster);
2, this one. A file of a newer version is refused, naming it.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError
from ..identity import key_text, parse_key

#: the checkpoint's version (1: the files before issue 59, which carry none)
VERSION = 2


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, dict) else None


class NewerCheckpoint(ConfigError):
    """A checkpoint of a version this app does not know: the run stops, naming it, rather
    than go back to an older checkpoint it can read."""


def _keys(value: Any, source: str, version: int) -> dict[str, str] | None:
    """Members' public keys by name, as a roster writes them (``ed25519:<base64>``; version 1
    wrote the raw key in hex); None: none bound."""
    if not isinstance(value, dict):
        return None
    out = {}
    for name, key in value.items():
        try:
            out[str(name)] = key_text(bytes.fromhex(key)) if version == 1 and \
                isinstance(key, str) and len(key) == 64 else key_text(parse_key(key))
        except (ValueError, TypeError, AttributeError) as err:
            raise ConfigError(f"{source}: the checkpoint's member keys cannot be read "
                              f"({name!r}: {err})") from None
    return out


def _number(value: Any, kind: type, default: Any) -> Any:
    """``value`` where it is a finite number >= 0 (an int for ``kind`` int), else
    ``default``."""
    ok = isinstance(value, int if kind is int else (int, float)) and not isinstance(value, bool)
    return kind(value) if ok and math.isfinite(value) and value >= 0 else default


def _random_state(value: Any, source: str) -> Any:
    """Python's ``random`` state as the file holds it, if ``random.setstate`` takes it."""
    try:
        random.Random().setstate(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise ConfigError(f"{source}: the checkpoint's 'random_state' cannot be used ({err})"
                          ) from None
    return value


@dataclass
class Checkpoint:
    """A run's state after round ``round``.

    Attributes
    ----------
    round, num_clients : int
        The rounds done; the clients the strategy holds.
    config : dict
        The run config, every key resolved (what a resume is compared with).
    arrays : dict[str, torch.Tensor]
        The global model.
    random_state : Any
        Python's ``random`` state (Flower's strategies sample with it).
    strategy : dict
        The strategy's own state (``state_dict``).
    wall_time_s : float
        The run's seconds so far.
    run_token : str
        The run's token (its members' model files carry it).
    state_kind : str
        The kind of state the method keeps (``seasons.family``; "": version 1's, its
        strategy's own).
    client_names : list[str] | None
        The members by client id ("": a forgotten one; None: a partitioned simulation).
    member_keys : dict[str, str] | None
        Each member's public key by name (``ed25519:<base64>``); None: none bound (a
        partitioned simulation, or a version that bound no name).
    impostors, impostor_count
        The refused attempts to take a member's name (the last ones) and their count (None:
        none).
    member_scaling, collaboration_policy, warm_start : dict | None
        The pooled input scaling, the policy's record (its sha256) and the warm start's
        record, where the run has them.
    version : int
        The version it was written in.
    """

    round: int
    config: dict[str, Any]
    num_clients: int
    arrays: dict[str, torch.Tensor]
    random_state: Any
    strategy: dict[str, Any]
    wall_time_s: float = 0.0
    run_token: str = ""
    state_kind: str = ""
    client_names: list[str] | None = None
    member_keys: dict[str, str] | None = None
    impostors: list[dict[str, Any]] | None = None
    impostor_count: int | None = None
    member_scaling: dict[str, Any] | None = None
    collaboration_policy: dict[str, Any] | None = None
    warm_start: dict[str, Any] | None = None
    version: int = VERSION

    #: written only where the run has them, as metrics.json writes them
    OPTIONAL = ("client_names", "member_keys", "impostors", "impostor_count", "member_scaling",
                "collaboration_policy", "warm_start")
    #: what a file must hold, and of which type
    REQUIRED = {"round": int, "num_clients": int, "config": dict, "arrays": dict,
                "strategy": dict}

    def to_state(self) -> dict[str, Any]:
        """What the checkpoint file holds (``results.RunFolder.save_checkpoint`` adds its
        ``format`` and ``generation``)."""
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in state.items() if not (k in self.OPTIONAL and v is None)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], source: str) -> Checkpoint:
        """The checkpoint a file held (read and checked by ``results.read_checkpoint``), of
        any version up to :data:`VERSION`; ``source`` names the run-config key that read it.
        Raises :class:`NewerCheckpoint` for a newer version, ConfigError for a bad one or a
        missing, mistyped or negative required field."""
        version = state.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigError(f"{source}: the checkpoint's version is {version!r}; allowed: 1 "
                              f"to {VERSION}")
        if version > VERSION:
            raise NewerCheckpoint(f"{source}: the checkpoint's version is {version}; allowed: "
                                  f"1 to {VERSION} (a newer version of the app wrote it: run "
                                  "that version)")
        for key, kind in cls.REQUIRED.items():
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, kind) or \
                    (isinstance(value, int) and value < 0):
                raise ConfigError(f"{source}: the checkpoint's {key!r} is {value!r:.40}; "
                                  f"allowed: {'an int >= 0' if kind is int else kind.__name__}")
        names, impostors = state.get("client_names"), state.get("impostors")
        return cls(
            round=state["round"], config=dict(state["config"]), num_clients=state["num_clients"],
            arrays=dict(state["arrays"]),
            random_state=_random_state(state.get("random_state"), source),
            strategy=dict(state["strategy"]),
            wall_time_s=_number(state.get("wall_time_s"), float, 0.0),
            run_token=str(state.get("run_token") or ""),
            state_kind=str(state.get("state_kind") or ""),
            client_names=[str(n) for n in names] if isinstance(names, list) and names else None,
            member_keys=_keys(state.get("member_keys"), source, version),
            impostors=[dict(a) for a in impostors if isinstance(a, dict)]
            if isinstance(impostors, list) and impostors else None,
            impostor_count=_number(state.get("impostor_count"), int, None),
            member_scaling=_dict_or_none(state.get("member_scaling")),
            collaboration_policy=_dict_or_none(state.get("collaboration_policy")),
            warm_start=_dict_or_none(state.get("warm_start")), version=version)

    def names(self) -> list[str]:
        """The members by client id, or, a partitioned simulation, the client ids as text."""
        return list(self.client_names or [str(i) for i in range(self.num_clients)])


def read_state(state: Mapping[str, Any], problem: str | None, source: str, path: Path
               ) -> tuple[Checkpoint | None, str | None]:
    """A checkpoint file's state (``results.read_checkpoint``: ``state`` and ``problem``) as a
    :class:`Checkpoint`, or None and why it cannot be one (the caller tries an older file);
    a file of a newer version raises :class:`NewerCheckpoint`, naming ``path``."""
    if problem is not None:
        return None, problem
    try:
        return Checkpoint.from_state(state, source), None
    except NewerCheckpoint as err:
        raise NewerCheckpoint(f"{err} ({path})") from None
    except ConfigError as err:
        return None, str(err)
