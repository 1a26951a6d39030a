"""A member's privacy budget, kept and enforced on its own machine.

The run config's ``dp``, ``dp-clip``, ``dp-noise-multiplier`` and ``dp-delta`` are the
coordinator's request. A member's node config may only make them stricter
(:class:`NodePrivacy`): a smaller ``dp-clip``, a larger ``dp-noise-multiplier``, and
``dp-max-epsilon``, its own limit: the node declines to train (an error reply the server
records as that member's absence, with the reason, and a WARNING line in the member's own
log with the numbers) when the reply would take its spent epsilon past it, or when the run
asks no privacy at all.

A member's budget is kept at its own delta: its node config's ``dp-delta``, else
:data:`MEMBER_DELTA` (1e-5), whatever the run asks. Its limit is checked at that delta, and
its ledger records each release's epsilon at it; a run's smaller ``dp-delta`` only changes
the epsilon the member reports to the server (at the stricter delta), and a larger one
changes nothing. (Before, a member that set no ``dp-delta`` had its limit checked at the
run's: a coordinator asking delta 0.9 took a member's epsilon at 1e-5 past its limit.)

The ledger (:class:`Ledger`) is a JSON file per member, in the node config's
``privacy-dir`` (``<client-id>.json``), so that it survives every fresh ``flwr-clientapp``
process, SuperNode restarts, resumed runs and later runs: a member's budget spans every run
it joins. Each noised reply is written there before it is sent (a reply the server never
gets still counts: it may have been seen). Without a ``privacy-dir`` a member's node
declines, and so does any node with a ``dp-max-epsilon``; a partitioned run's clients (a
simulation) keep theirs in the run's folder, ``<results-dir>/<run>/privacy/``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context

from tasks.dp import epsilon
from tasks.files import FILE_MODE, atomic_write, private_folder, strict_json

from ..config import ConfigError, RunConfig

#: node config keys
PRIVACY_DIR, MAX_EPSILON, DELTA = "privacy-dir", "dp-max-epsilon", "dp-delta"
STRICTER = {"dp-clip": min, "dp-noise-multiplier": max}
#: a member's delta where its node config gives none (the run's may only be smaller)
MEMBER_DELTA = 1e-5


class Declined(Exception):
    """This member will not train this round (its privacy budget, or its own rule)."""


@dataclasses.dataclass(frozen=True)
class NodePrivacy:
    """The privacy a round's reply gets on this node: the run's request made stricter by the
    node config, the node's own limit and delta, and where its ledger lives (None: nowhere).

    ``delta``: the node's own (a member's node config ``dp-delta``, else
    :data:`MEMBER_DELTA`; a simulated client's, the run's), at which its limit is checked
    and its ledger kept; ``report_delta``: the smaller of it and the run's, at which the
    reply states its epsilon."""

    mode: str
    clip: float
    noise_multiplier: float
    delta: float
    max_epsilon: float
    ledger_dir: Path | None
    own_ledger: bool = False  # the node config's privacy-dir (not the run's folder)
    report_delta: float = MEMBER_DELTA

    @classmethod
    def of(cls, context: Context, cfg: RunConfig, run: str, member: bool) -> NodePrivacy:
        """From the run config and the node config (a bad node value: a ConfigError naming
        the key). ``run``: the run's folder (a partitioned run's clients' ledgers are in its
        ``privacy/``)."""
        node = context.node_config
        values = {"dp-clip": cfg.dp_clip, "dp-noise-multiplier": cfg.dp_noise_multiplier}
        for key, stricter in STRICTER.items():
            if key in node:
                own = node[key]
                if isinstance(own, bool) or not isinstance(own, (int, float)) or not (
                        0 < own < math.inf):
                    raise ConfigError(f"node config '{key}' = {own!r} is invalid; allowed: a "
                                      "finite number > 0")
                values[key] = stricter(values[key], float(own))
        delta = node.get(DELTA, MEMBER_DELTA if member else cfg.dp_delta)
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ConfigError(f"node config '{DELTA}' = {delta!r} is invalid; allowed: a number "
                              f"in (0, 1), e.g. {MEMBER_DELTA:g} (this member's delta: its "
                              "budget is kept at it)")
        limit = node.get(MAX_EPSILON, math.inf)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigError(f"node config '{MAX_EPSILON}' = {limit!r} is invalid; allowed: a "
                              "number > 0 (this member's epsilon over every run it joins)")
        folder = node.get(PRIVACY_DIR)
        if folder is not None and (not isinstance(folder, str) or not folder.strip()):
            raise ConfigError(f"node config '{PRIVACY_DIR}' = {folder!r} is invalid; allowed: "
                              "a folder path (this member's privacy ledger)")
        where = (Path(folder.strip()).expanduser() if folder
                 else Path(run) / "privacy" if run and not member else None)
        return cls(cfg.dp, values["dp-clip"], values["dp-noise-multiplier"], float(delta),
                   float(limit), where, own_ledger=bool(folder),
                   report_delta=min(float(delta), cfg.dp_delta))

    def check(self) -> None:
        """Decline (:class:`Declined`) a round this node's own rules forbid."""
        if math.isfinite(self.max_epsilon) and not self.own_ledger:
            raise Declined(f"this member's node sets {MAX_EPSILON} = {self.max_epsilon:g} but "
                           f"no {PRIVACY_DIR}: a limit needs the node's own ledger (not one in "
                           "a folder the run names)")
        if self.mode == "none" and math.isfinite(self.max_epsilon):
            raise Declined(f"this member's node sets {MAX_EPSILON} = {self.max_epsilon:g}, and "
                           "the run asks no privacy (dp = \"none\"); it trains only with "
                           "dp = \"update\"")
        if self.mode != "none" and self.ledger_dir is None:
            raise Declined(f"dp = {self.mode!r}: this member's node keeps no privacy ledger "
                           f"(start the SuperNode with --node-config \"... {PRIVACY_DIR}="
                           "'/path/for/its/budget'\")")


def data_digest(x: torch.Tensor, y: torch.Tensor) -> str:
    """The sha256 of a client's training data (its tensors' bytes), recorded with each
    release (which data a reply was trained on); not the ledger's key."""
    h = hashlib.sha256()
    for t in (x, y):
        t = t.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class Ledger:
    """A member's spent privacy: the Gaussian mechanisms its replies ran, in a JSON file.

    Keyed by the member's ``client-id`` alone: a budget that another seed's split, a
    validation share or an edited file could start again from zero would not be a budget
    (each release records the sha256 of the data it was trained on). Read and written under
    an exclusive lock (``<file>.lock``): two processes of one member (two runs on one
    SuperNode) never lose each other's release."""

    def __init__(self, folder: Path, client: str) -> None:
        self.path = Path(folder) / f"{client}.json"
        self.client = client
        self.releases: list[dict[str, Any]] = self._read()

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        try:
            data = json.loads(self.path.read_text())
            releases = data["releases"]
            if data.get("client_id") != self.client or not isinstance(releases, list):
                raise ValueError("not this member's ledger")
            for r in releases:
                float(r["noise_multiplier"]), float(r["sample_rate"]), int(r["steps"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            # never start a budget again from zero: a damaged ledger stops the member
            raise Declined(f"privacy ledger {self.path} cannot be read ({err}); it is kept as "
                           "it is: mend or move it by hand") from None
        return releases

    def history(self) -> list[tuple[float, float, int]]:
        return [(float(r["noise_multiplier"]), float(r["sample_rate"]), int(r["steps"]))
                for r in self.releases]

    def spent(self, delta: float) -> float:
        """The epsilon at ``delta`` of every release so far."""
        return epsilon(self.history(), delta)

    def would_spend(self, privacy: NodePrivacy, steps: int = 1, sample_rate: float = 1.0,
                    delta: float | None = None) -> float:
        """The epsilon (at the node's delta, or ``delta``) after one more release of
        ``steps`` at ``sample_rate``; :class:`Declined` where it would pass the member's
        limit (at the node's delta), or where the accountant gives no epsilon."""
        releases = [*self.history(), (privacy.noise_multiplier, sample_rate, steps)]
        try:
            after = epsilon(releases, privacy.delta)
            stated = after if delta is None or delta == privacy.delta else epsilon(releases, delta)
        except ValueError as err:
            raise Declined(f"privacy budget: {err}; no reply is noised or sent") from None
        if after > privacy.max_epsilon:
            raise Declined(f"privacy budget: this reply would take this member's epsilon to "
                           f"{after:.3g} (delta {privacy.delta:g}), past its {MAX_EPSILON} = "
                           f"{privacy.max_epsilon:g}; spent so far {self.spent(privacy.delta):.3g}")
        return stated

    def spend(self, privacy: NodePrivacy, run: str, server_round: int, steps: int = 1,
              sample_rate: float = 1.0, data_sha256: str = "") -> float:
        """Record a release (written to disk before the reply leaves, its epsilon at the
        node's delta) and return the epsilon spent with it at ``privacy.report_delta`` (what
        the reply states); :class:`Declined` where it would pass the member's limit. The
        ledger is read again under the lock: a release another process wrote since counts."""
        private_folder(self.path.parent)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                     | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # O_CREAT's mode passes through the umask
        with os.fdopen(fd, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.releases = self._read()
            after = self.would_spend(privacy, steps, sample_rate)
            stated = self.would_spend(privacy, steps, sample_rate, privacy.report_delta)
            self.releases.append({
                "run": run, "round": server_round, "mode": privacy.mode,
                "noise_multiplier": privacy.noise_multiplier, "sample_rate": sample_rate,
                "steps": steps, "clip": privacy.clip, "epsilon_after": after,
                "delta": privacy.delta, "data_sha256": data_sha256,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            text = json.dumps(strict_json({"client_id": self.client, "accountant": "opacus RDP",
                                           "releases": self.releases}), indent=1,
                              allow_nan=False)
            atomic_write(self.path, lambda f: f.write(text.encode()), private=True)
        return stated
