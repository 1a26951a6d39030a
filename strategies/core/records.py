"""A run's records, spelled in one place: a round's record and ``metrics.json``'s headline.

Every key of a round's record that names a metric is built here, and read through the
functions here; no other module spells ``client_accuracy``, ``mean_mse``, ``bmta`` or
builds such a key from a prefix (``tests/test_structure.py`` holds that).

A round's record (``metrics.json``'s ``rounds[i]``, built by
:class:`strategies.core.history.RunHistory`): ``round``; for each metric ``m`` the clients
report (``accuracy`` for classification, ``mse`` for regression, ``loss``):

* ``client_<m>``: client id -> the client's test value;
* ``mean_<m>``: the mean over the benign clients (neither novel nor attackers),
  ``novel_mean_<m>`` over the novel clients;

and :data:`TRAINED`, :data:`MEAN_TRAIN_LOSS`, :data:`DP_SPENT`, :data:`GLOBAL_NORM`,
:data:`SERVER_LOSSES` (a method's own losses on the server: Panacea's),
:data:`ABSENT` and :data:`REJECTED` by phase.

A run's headline (``metrics.json``'s top level, :func:`headlines`): the best mean over the
rounds of the task's :class:`Score`, ``bmta`` (best mean test accuracy, in percent: the
FedAMP paper's metric) or ``best_mean_mse``, and the novel clients' ``novel_bmta`` /
``novel_best_mean_mse``.

The whole file (``metrics.json``'s top level) is a :class:`RunFile`: the ServerApp writes it
through :meth:`RunFile.to_dict`, every reader reads it through :meth:`RunFile.from_dict`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from .protocol import ACCURACY, KEPT_NAMES, LOSS, MSE

#: The version of a run's records (metrics.json's ``records_version``): 2 since they are
#: spelled here (issue 41), with the keys of version 1, which wrote no version.
VERSION, VERSION_KEY = 2, "records_version"
#: the metrics a client's evaluation reports, each recorded per client and as a mean
METRICS = (ACCURACY, MSE, LOSS)
#: the keys of a round's record that map client ids to values (ids are ints in memory)
CLIENT_MAPS = ("client_", "absent_", "rejected")
#: a round's record: the clients whose training was used, their mean training loss, the
#: epsilon each reported spent (``dp``), the global model's norm (strategies with one)
TRAINED, MEAN_TRAIN_LOSS, DP_SPENT, GLOBAL_NORM = ("trained_clients", "train_loss",
                                                   "client_dp_epsilon", "global_norm")
#: a round's record: the losses a method minimises on the server, by name (Panacea: ``model``,
#: the mean 1/2 ||theta - trained||^2 of its last server step, and ``graph``, the graph
#: reconstruction loss L_d of its generator)
SERVER_LOSSES = "server_losses"
#: by phase ("train", "evaluate"): client id -> why it did not take part / why its reply was
#: rejected (also among the absent)
ABSENT = {"train": "absent_clients", "evaluate": "absent_evaluation"}
REJECTED = {"train": "rejected", "evaluate": "rejected_evaluation"}


class Score(NamedTuple):
    """A task kind's headline metric: its name, its headline key, whether higher is better,
    and its scale in reports (accuracy in percent)."""

    metric: str
    headline: str
    higher_is_better: bool
    scale: float

    def best(self, values: Iterable[float]) -> float:
        return max(values) if self.higher_is_better else min(values)

    def gain(self, mine: float, others: Iterable[float]) -> float:
        """How much better ``mine`` is than the best of ``others`` (negative: worse): what
        federation gave a member over its better model alone, on both seats' lines."""
        best = self.best(others)
        return (mine - best) if self.higher_is_better else (best - mine)


ACCURACY_SCORE = Score(ACCURACY, "bmta", True, 100.0)
MSE_SCORE = Score(MSE, "best_mean_mse", False, 1.0)
SCORES = (ACCURACY_SCORE, MSE_SCORE)
#: every headline key of metrics.json
HEADLINES = tuple(k for s in SCORES for k in (s.headline, "novel_" + s.headline))


def version_of(run: Mapping[str, Any]) -> int:
    """The records version of a run's metrics.json (1 where it names none)."""
    value = run.get(VERSION_KEY, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def client_key(metric: str) -> str:
    """The key of a round's record that maps client ids to their ``metric``."""
    return f"client_{metric}"


def mean_key(metric: str, novel: bool = False) -> str:
    """The key of a round's record of the benign (or ``novel``) clients' mean ``metric``."""
    return ("novel_" if novel else "") + f"mean_{metric}"


def is_client_map(key: str) -> bool:
    """Whether a round record's ``key`` maps client ids to values."""
    return key.startswith(CLIENT_MAPS)


def score_of(regression: bool) -> Score:
    return MSE_SCORE if regression else ACCURACY_SCORE


def round_score(rec: Mapping[str, Any]) -> Score | None:
    """The score a round's record holds (accuracy where it has both), or None."""
    return next((s for s in SCORES if client_key(s.metric) in rec), None)


def client_scores(rec: Mapping[str, Any], score: Score | None = None) -> dict:
    """Client id -> its score in a round's record (``score``: the record's own, by default)."""
    score = score or round_score(rec)
    return dict(rec.get(client_key(score.metric), {})) if score else {}


def evaluated_clients(rec: Mapping[str, Any]) -> set:
    """The clients whose evaluation a round's record holds (any metric)."""
    return {c for m in METRICS for c in rec.get(client_key(m), {})}


def mean_score(rec: Mapping[str, Any], score: Score, novel: bool = False) -> float | None:
    """A round's mean ``score`` (None where it has none)."""
    value = rec.get(mean_key(score.metric, novel))
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def best_of_rounds(rounds: Iterable[Mapping[str, Any]], regression: bool,
                   novel: bool = False) -> float | None:
    """A run's headline from its rounds' records: the BMTA (best mean test accuracy over the
    rounds, in percent) or the lowest mean test MSE; ``novel``: the novel clients' means.
    None where no round has a mean. The one place the headline is computed."""
    score = score_of(regression)
    values = [v for r in rounds if (v := mean_score(r, score, novel)) is not None]
    return score.scale * score.best(values) if values else None


def headlines(rounds: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """metrics.json's headline keys of a run's rounds (only those it has)."""
    rounds = list(rounds)
    out: dict[str, float] = {}
    for score in SCORES:
        best = best_of_rounds(rounds, score is MSE_SCORE)
        if best is not None:
            out[score.headline] = best
            novel = best_of_rounds(rounds, score is MSE_SCORE, novel=True)
            if novel is not None:
                out["novel_" + score.headline] = novel
    return out


#: RunFile's fields left out of the file where they are None (a run without members, a
#: federated task's partitioning, a run that keeps no models or weights)
_ONLY_WHEN_SET = ("partitioning", "client_names", "left_out", "member_keys", "impostors",
                  "impostor_count", "member_scaling", "collaboration_policy", "warm_start",
                  "models", "xi")


@dataclass
class RunFile:
    """``metrics.json``: a run's file, field by field in the file's order.

    Who ran what: ``run_name``, ``strategy``, ``label``, ``dataset``, ``task_kind``
    (``classification`` or ``regression``), ``partitioning`` (a federated task has none),
    ``num_clients``. A members run: ``client_names`` (the names, by client id),
    ``left_out`` (node -> why it could not join), ``member_keys`` (name -> the public key
    that proved it) and ``member_roster``, ``impostors`` (the newest refused claims) and
    ``impostor_count``, ``member_scaling`` (the members' pooled scaling);
    ``collaboration_policy`` (its file, digest and the pairs kept apart); ``warm_start``
    (the run it started from: its name, round and checkpoint digest, the returning and the
    new members). Then ``seed`` and
    ``config`` (the resolved run config); ``extra``, the method's own records and notes
    (FedAMP's ``sigma`` and ``<method>_sigma``, Panacea's ``inferred_graph``), written at
    the top level; ``completed_rounds``, ``finished``, ``coverage`` (whom the headline
    covers), ``models`` (the models kept), ``wall_time_s``; the history:
    ``records_version``, ``rounds`` (the round records above), ``headlines`` (written at
    the top level), ``alone`` (client id -> its members' scores alone), ``novel_clients``,
    ``attackers``, ``xi`` (where FedAMP's weights are).

    :meth:`from_dict` reads any JSON object: a key missing or of the wrong type gives the
    field's default (a file without ``finished``, written by hand or by an older version,
    counts as finished), a key it does not know goes to ``extra``.
    """

    run_name: str = ""
    strategy: str = "?"
    label: str = ""
    dataset: str = "?"
    task_kind: str | None = None
    partitioning: str | None = None
    num_clients: int | None = None
    client_names: list[str] | None = None
    left_out: dict[str, str] | None = None
    member_keys: dict[str, str] | None = None
    member_roster: str | None = None
    impostors: list[dict[str, Any]] | None = None
    impostor_count: int | None = None
    member_scaling: dict[str, Any] | None = None
    collaboration_policy: dict[str, Any] | None = None
    warm_start: dict[str, Any] | None = None
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    completed_rounds: int = 0
    finished: bool = True
    coverage: dict[str, Any] | None = None
    models: dict[str, Any] | None = None
    wall_time_s: float | None = None
    records_version: int = VERSION
    rounds: list[dict[str, Any]] = field(default_factory=list)
    headlines: dict[str, float] = field(default_factory=dict)
    alone: dict[str, dict[str, float]] | None = None
    novel_clients: list[Any] = field(default_factory=list)
    attackers: list[Any] = field(default_factory=list)
    xi: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``metrics.json``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("extra", "headlines"):
                out.update(value)
            elif f.name == "member_roster":  # beside the keys it bound
                if self.member_keys is not None:
                    out[f.name] = value
            elif value is not None or f.name not in _ONLY_WHEN_SET + ("alone",):
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunFile:
        """The file of a parsed ``metrics.json`` (see the class)."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {"extra": {}, "headlines": {}}
        defaults = cls()
        for key, value in data.items():
            if key in HEADLINES:
                if is_number(value):
                    kwargs["headlines"][key] = float(value)
            elif key in known and key not in ("extra", "headlines"):
                if _fits(value, getattr(defaults, key), key):
                    kwargs[key] = value
            else:
                kwargs["extra"][key] = value
        kwargs["rounds"] = [r for r in kwargs.get("rounds", []) if isinstance(r, dict)]
        kwargs["records_version"] = version_of(data)
        return cls(**kwargs)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunFile:
        """The file at ``path`` (OSError where it cannot be read, ValueError where it is not
        a JSON object)."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a JSON object")
        return cls.from_dict(data)

    @property
    def score(self) -> Score:
        """The run's score: by its headline, else by its rounds (accuracy for a run with
        neither)."""
        if any(k in self.headlines for k in (ACCURACY_SCORE.headline,
                                             "novel_" + ACCURACY_SCORE.headline)):
            return ACCURACY_SCORE
        if any(k in self.headlines for k in (MSE_SCORE.headline, "novel_" + MSE_SCORE.headline)
               ) or any(client_key(MSE) in r or mean_key(MSE) in r for r in self.rounds):
            return MSE_SCORE
        return ACCURACY_SCORE

    def headline(self, novel: bool = False) -> tuple[Score, float | None]:
        """The run's score and its recorded headline (None where it has none)."""
        score = self.score
        return score, self.headlines.get(("novel_" if novel else "") + score.headline)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number (an int or float, not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


#: the type each RunFile field holds where its default is None
_NONE_DEFAULTS = {"task_kind": str, "partitioning": str, "num_clients": int,
                  "client_names": list, "left_out": dict, "member_keys": dict,
                  "member_roster": str, "impostors": list, "impostor_count": int,
                  "member_scaling": dict, "collaboration_policy": dict, "warm_start": dict,
                  "seed": int,
                  "coverage": dict, "models": dict, "wall_time_s": float, "alone": dict, "xi": dict}


def _fits(value: Any, default: Any, key: str) -> bool:
    """Whether a read ``value`` has the type of its field (else the default stays)."""
    kind = _NONE_DEFAULTS.get(key) if default is None else type(default)
    if value is None:
        return default is None
    if kind is float:
        return is_number(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if kind is not None else True


def kept_said(alone: dict[str, Any]) -> str:
    """What a member's record of its scores alone (metrics.json's ``alone``) says of the
    model it took home by its own rule (fedamp_flwr/member/member_choice.py): "; kept: NAME (its
    federated model's score on its held-out rows against the best alone's: GAIN)", or ""
    where it says nothing (or nothing readable: a record is untrusted)."""
    code = alone.get("kept")
    if not isinstance(code, int | float) or isinstance(code, bool) or code not in (0, 1, 2):
        return ""
    gain = alone.get("held_out_gain")
    gain_said = (f" (the federated model against the best alone on its held-out rows: "
                 f"{gain:+.3g}, by the member's metric)"
                 if isinstance(gain, int | float) and not isinstance(gain, bool)
                 and math.isfinite(gain) else "")
    return f"; kept: {KEPT_NAMES[int(code)]}{gain_said}"
