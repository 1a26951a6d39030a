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
:data:`ABSENT` and :data:`REJECTED` by phase.

A run's headline (``metrics.json``'s top level, :func:`headlines`): the best mean over the
rounds of the task's :class:`Score`, ``bmta`` (best mean test accuracy, in percent: the
FedAMP paper's metric) or ``best_mean_mse``, and the novel clients' ``novel_bmta`` /
``novel_best_mean_mse``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .protocol import ACCURACY, LOSS, MSE

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


def run_score(run: Mapping[str, Any]) -> Score:
    """The score of a run's metrics.json: by its headline, else by its rounds (accuracy for
    a run with neither)."""
    rounds = run.get("rounds") or []
    if any(k in run for k in (ACCURACY_SCORE.headline, "novel_" + ACCURACY_SCORE.headline)):
        return ACCURACY_SCORE
    if any(k in run for k in (MSE_SCORE.headline, "novel_" + MSE_SCORE.headline)) or any(
            client_key(MSE) in r or mean_key(MSE) in r for r in rounds):
        return MSE_SCORE
    return ACCURACY_SCORE


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


def headline(run: Mapping[str, Any], novel: bool = False) -> tuple[Score, float | None]:
    """A run's score and its recorded headline (None where it has none)."""
    score = run_score(run)
    value = run.get(("novel_" if novel else "") + score.headline)
    return score, (None if value is None else float(value))
