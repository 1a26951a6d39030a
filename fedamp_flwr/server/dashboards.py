"""A run's records on the dashboards the field uses: TensorBoard and MLflow (issue 44).

``tensorboard = true`` writes TensorBoard event files to ``<run>/tensorboard/``;
``mlflow = true`` logs to one MLflow run per run of this app, at ``mlflow-uri`` (by
default a file store in ``<results-dir>/mlruns``, offline). Both get, each round, the
same scalars, made from the round's record in ``metrics.json`` by :func:`round_scalars`
(so a dashboard never says what metrics.json does not), named alike in every run so
that a grid's runs compare in one TensorBoard (``tensorboard --logdir
<output>/runs``) or one MLflow experiment (``fedamp-flwr``):

* ``mean_accuracy`` / ``mean_mse``, ``mean_loss``, ``novel_mean_...``: the round's means;
* ``client_accuracy/<name>``, ``client_loss/<name>``: each client's test values, by
  member name (a partitioned run: by client id);
* ``train_loss``, ``trained_clients`` (how many), ``global_norm``;
* ``absent_train/<reason>``, ``absent_evaluate/<reason>``: how many clients were left out
  of the phase, by the reason's kind (``node_not_connected``, ``rejected``, ...), and
  ``.../all``;
* ``epsilon/<name>``: the epsilon each member reported spent (run config ``dp``);
* ``server_loss/<name>``: a method's own losses on the server (Panacea's ``model`` and
  ``graph``);
* FedAMP's weights xi as an image (``xi``), in the rounds ``xi-every`` writes.

The run config goes in as TensorBoard text and MLflow parameters; at the end, the
models' cards on the coordinator's machine (``models/*.json``) and metrics.json's
``models`` record go to the MLflow run as artifacts.

Resume-safe: a resumed run writes TensorBoard's purge marker at its first round
(TensorBoard drops what the killed run wrote from that round on) and continues the
same MLflow run (found by the run's name and token, which a resume keeps), leaving out
the steps that run has already. A dashboard that fails (a package missing, a server
gone) says so in one WARNING line and is left out from then on; the run goes on and its
metrics.json is whole.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flwr.supercore import log

from strategies.core.protocol import is_name
from strategies.core.records import (
    ABSENT,
    DP_SPENT,
    GLOBAL_NORM,
    MEAN_TRAIN_LOSS,
    METRICS,
    REJECTED,
    SERVER_LOSSES,
    TRAINED,
    client_key,
    mean_key,
)
from strategies.core.screening import REASON_KINDS
from tasks.files import owner_only_tree, private_folder, strict_json

from ..config import ConfigError, RunConfig, redact_uri
from .results import MODELS_FOLDER, TENSORBOARD_FOLDER, write_json

#: the MLflow experiment every run of this app logs to
EXPERIMENT = "fedamp-flwr"
#: the MLflow tags that find a run again on resume
RUN_TAG, TOKEN_TAG = "fedamp.run", "fedamp.token"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")
#: a scalar every round has: the steps an MLflow run holds
ALWAYS = "absent_train/all"


def missing_extras(tensorboard: bool, mlflow: bool) -> list[str]:
    """The dashboards asked for whose package (an optional extra of the same name) is not
    installed."""
    return [name for name, on in (("tensorboard", tensorboard), ("mlflow", mlflow))
            if on and importlib.util.find_spec(name) is None]


def check_packages(cfg: RunConfig) -> None:
    """A dashboard asked for has its package (an optional extra): a ConfigError naming the
    key, before any work. The ServerApp's only: a member's node needs neither."""
    for package in missing_extras(cfg.tensorboard, cfg.mlflow):
        raise ConfigError(f"run config '{package}' = true needs the {package} package, which "
                          f"is not installed; allowed: false, or install it (pip install "
                          f"'fedamp-flwr[{package}]')")


def safe_name(text: str) -> str:
    """``text`` as a part of a metric's name both dashboards take (other characters: _)."""
    return _UNSAFE.sub("_", text)[:100] or "_"


def member_key(name: str, client_id: int) -> str:
    """A member's name in a metric's name: the same but for ``@``, which becomes ``:`` (no name
    has one, so two members never share a curve); the client id where it is no name."""
    return name.replace("@", ":") if is_name(name) else str(client_id)


def reason_kind(reason: str) -> str:
    """The kind of an absence's reason, one of :data:`REASON_KINDS` it begins with (the
    longest), else ``other``: a client's own words never make a metric's name."""
    text = str(reason)
    kind = next((k for k in sorted(REASON_KINDS, key=len, reverse=True)
                 if text.startswith(k)), "other")
    return "_".join(re.sub(r"[^a-z0-9 ]", "", kind.lower()).split())


def round_scalars(rec: Mapping[str, Any], names: Sequence[str] | None = None) -> dict[str, float]:
    """The scalars of a round's record (``metrics.json``'s ``rounds[i]``), by the names of the
    module docstring; ``names``: client id -> member name (None: by client id)."""
    def name(cid: Any) -> str:
        i = int(cid)
        return member_key(names[i], i) if names and 0 <= i < len(names) else str(i)

    out: dict[str, float] = {}
    for metric in METRICS:
        for novel in (False, True):
            value = rec.get(mean_key(metric, novel))
            if value is not None and _number(value):
                out[mean_key(metric, novel)] = float(value)
        for cid, value in (rec.get(client_key(metric)) or {}).items():
            if _number(value):
                out[f"{client_key(metric)}/{name(cid)}"] = float(value)
    if _number(rec.get(MEAN_TRAIN_LOSS)):
        out[MEAN_TRAIN_LOSS] = float(rec[MEAN_TRAIN_LOSS])
    if isinstance(rec.get(TRAINED), list):
        out[TRAINED] = float(len(rec[TRAINED]))  # how many
    if _number(rec.get(GLOBAL_NORM)):
        out[GLOBAL_NORM] = float(rec[GLOBAL_NORM])
    for phase in ABSENT:
        reasons = rec.get(ABSENT[phase]) or {}
        out[f"absent_{phase}/all"] = float(len(reasons))
        for kind, count in Counter(reason_kind(r) for r in reasons.values()).items():
            out[f"absent_{phase}/{kind}"] = float(count)
        out[f"rejected_{phase}"] = float(len(rec.get(REJECTED[phase]) or {}))
    for cid, value in (rec.get(DP_SPENT) or {}).items():
        if _number(value):
            out[f"epsilon/{name(cid)}"] = float(value)
    for key, value in (rec.get(SERVER_LOSSES) or {}).items():
        if _number(value):
            out[f"server_loss/{safe_name(str(key))}"] = float(value)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and bool(
        np.isfinite(value))


def heat_image(matrix: np.ndarray, least: int = 256) -> np.ndarray:
    """A (H, W, 3) uint8 picture of a matrix of weights in [0, 1] (viridis), each entry a
    square of pixels, at least ``least`` pixels a side."""
    from matplotlib import colormaps

    m = np.clip(np.nan_to_num(np.asarray(matrix, dtype=np.float64)), 0.0, 1.0)
    scale = max(1, -(-least // max(m.shape[0], 1)))
    rgb = (colormaps["viridis"](m)[..., :3] * 255).astype(np.uint8)
    return np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)


class Sink(Protocol):
    #: True: it takes only the rounds a checkpoint holds (it cannot take a step back)
    durable: bool

    def params(self, config: Mapping[str, Any]) -> None: ...
    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def image(self, step: int, tag: str, picture: np.ndarray) -> None: ...
    def artifacts(self, paths: Sequence[Path]) -> None: ...
    def close(self, finished: bool) -> None: ...


class TensorBoardSink:
    """Event files in ``folder``, each round as it ends; with TensorBoard's purge marker at
    ``first_round`` (a resumed run's first: what the killed run wrote from there is dropped,
    so each round's step is read once)."""

    durable = False

    def __init__(self, folder: Path, first_round: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = private_folder(folder)  # its files: their owner's alone (close)
        self.writer = SummaryWriter(str(folder), purge_step=first_round)
        self.first = first_round

    def params(self, config: Mapping[str, Any]) -> None:
        if self.first == 1:  # a resumed run's is there already
            rows = "\n".join(f"| {k} | {json.dumps(strict_json(v), allow_nan=False)} |"
                             for k, v in sorted(config.items()))
            self.writer.add_text("run_config", "| key | value |\n|---|---|\n" + rows, 0)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def image(self, step: int, tag: str, picture: np.ndarray) -> None:
        self.writer.add_image(tag, picture, step, dataformats="HWC")

    def artifacts(self, paths: Sequence[Path]) -> None:
        pass

    def close(self, finished: bool) -> None:
        self.writer.close()
        owner_only_tree(self.folder)


class MlflowSink:
    """One MLflow run per run of this app (tags :data:`RUN_TAG`, :data:`TOKEN_TAG`), given the
    rounds a checkpoint holds: a resumed run continues it from its checkpoint's round, so no
    step is logged twice, and :meth:`missing` says which of the checkpoint's rounds the killed
    run had not logged yet."""

    durable = True

    def __init__(self, uri: str, run_name: str, token: str) -> None:
        self.store: Path | None = None
        if uri.startswith("file:"):  # MLflow 3 keeps its file store behind this switch
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            from urllib.parse import urlparse
            from urllib.request import url2pathname

            # a local store: made 0700 before MLflow writes into it, its files 0600 at close
            self.store = private_folder(Path(url2pathname(urlparse(uri).path)))
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            try:
                experiment_id = self.client.create_experiment(EXPERIMENT)
            except Exception:  # another job made it first
                experiment = self.client.get_experiment_by_name(EXPERIMENT)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        else:
            experiment_id = experiment.experiment_id
        # the run's name is a checked name and its token hex: nothing to quote
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_name}' and "
            f"tags.`{TOKEN_TAG}` = '{token}'", max_results=1)
        self.resumed = bool(found)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(
                experiment_id, run_name=run_name,
                tags={RUN_TAG: run_name, TOKEN_TAG: token}).info.run_id

    def missing(self, steps: Sequence[int]) -> list[int]:
        """Which of ``steps`` the run has not logged (every round logs ``absent_train/all``)."""
        if not self.resumed:
            return list(steps)
        had = {m.step for m in self.client.get_metric_history(self.run_id, ALWAYS)}
        return [s for s in steps if s not in had]

    def params(self, config: Mapping[str, Any]) -> None:
        if self.resumed:  # MLflow's parameters are written once
            return
        from mlflow.entities import Param

        items = [Param(k, json.dumps(strict_json(v), allow_nan=False)[:6000])
                 for k, v in sorted(config.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        new = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(new), 1000):
            self.client.log_batch(self.run_id, metrics=new[i:i + 1000])

    def image(self, step: int, tag: str, picture: np.ndarray) -> None:
        self.client.log_image(self.run_id, picture, key=tag, step=step)

    def artifacts(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), "cards")

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if finished else "FAILED")
        if self.store is not None:
            owner_only_tree(self.store)


class Dashboards:
    """The run's dashboards (:meth:`open`), on a thread of their own (a slow server never holds
    up a round or a checkpoint). Each round goes to TensorBoard as it ends (:meth:`round`),
    and to MLflow once a checkpoint holds it (:meth:`durable`). A sink that raises is named in
    one WARNING and left out."""

    def __init__(self, sinks: dict[str, Sink]) -> None:
        self.sinks = sinks
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedamp-dashboards")
        self._held: dict[int, tuple[dict[str, float], np.ndarray | None]] = {}

    @classmethod
    def open(cls, cfg: RunConfig, folder: Path, first_round: int, token: str,
             done: Mapping[int, Mapping[str, Any]], names: Sequence[str] | None
             ) -> Dashboards | None:
        """The dashboards ``cfg`` asks for (None: none), the run config given to each; a
        resumed run's rounds ``done`` (its checkpoint's) that MLflow lacks logged."""
        makers: dict[str, Callable[[], Sink]] = {}
        if cfg.tensorboard:
            makers["TensorBoard"] = lambda: TensorBoardSink(folder / TENSORBOARD_FOLDER,
                                                            first_round)
        if cfg.mlflow:
            makers["MLflow"] = lambda: MlflowSink(cfg.mlflow_store(), folder.name, token)
        if not makers:
            return None
        board = cls({})
        for what, make in makers.items():
            try:
                board.sinks[what] = make()
            except Exception as err:  # a server gone, a store it cannot write
                log(WARNING, "%s: cannot start (%s: %s); the run goes on without it", what,
                    type(err).__name__, err)
        board._each("params", None, {**cfg.to_dict(), "mlflow-uri": redact_uri(cfg.mlflow_uri)})
        mlflow = board.sinks.get("MLflow")
        if isinstance(mlflow, MlflowSink) and done:
            try:
                late = mlflow.missing(sorted(done))
            except Exception as err:
                late = []
                board._failed("MLflow", "missing", err)
            for step in late:
                board._held[step] = (round_scalars(done[step], names), None)
            board._durable(max(done))
        where = [f"TensorBoard in {folder / TENSORBOARD_FOLDER}" if "TensorBoard" in board.sinks
                 else "", f"MLflow at {cfg.mlflow_shown()} (experiment {EXPERIMENT!r}, run "
                 f"{mlflow.run_id})" if isinstance(mlflow, MlflowSink) else ""]
        if any(where):
            log(INFO, "Dashboards: %s", "; ".join(w for w in where if w))
        return board

    def _failed(self, what: str, method: str, err: Exception) -> None:
        log(WARNING, "%s: %s failed (%s: %s); its records stop here (metrics.json is whole)",
            what, method, type(err).__name__, err)
        self.sinks.pop(what, None)

    def _each(self, method: str, durable: bool | None, *args: Any) -> None:
        """``method`` of each sink (``durable``: of those that are, or are not; None: all)."""
        for what, sink in list(self.sinks.items()):
            if durable is None or sink.durable == durable:
                try:
                    getattr(sink, method)(*args)
                except Exception as err:
                    self._failed(what, method, err)

    def round(self, step: int, rec: Mapping[str, Any], xi: np.ndarray | None,
              names: Sequence[str] | None) -> None:
        """One round's record (a copy), FedAMP's xi of the round where written, the members'
        names: to the sinks that take a round as it ends, and held for the others."""
        self._pool.submit(self._round, step, rec, xi, names)

    def _round(self, step: int, rec: Mapping[str, Any], xi: np.ndarray | None,
               names: Sequence[str] | None) -> None:
        try:
            values = round_scalars(rec, names)
            picture = heat_image(xi) if xi is not None else None
        except Exception as err:  # a record this code cannot read: said, never fatal
            log(WARNING, "Dashboards: round %d not shown (%s: %s)", step, type(err).__name__, err)
            return
        self._held[step] = (values, picture)
        self._each("scalars", False, step, values)
        if picture is not None:
            self._each("image", False, step, "xi", picture)

    def durable(self, step: int) -> None:
        """The rounds up to ``step`` are in a checkpoint (or, without checkpoints, in
        metrics.json): to the sinks that take only those."""
        self._pool.submit(self._durable, step)

    def _durable(self, step: int) -> None:
        for k in sorted(k for k in self._held if k <= step):
            values, picture = self._held.pop(k)
            self._each("scalars", True, k, values)
            if picture is not None:
                self._each("image", True, k, "xi", picture)

    def close(self, folder: Path, models: Mapping[str, Any] | None, finished: bool) -> None:
        """After every round given: the models' cards (and metrics.json's ``models``) as
        artifacts, and the runs ended (a round no checkpoint holds is left out)."""
        self._pool.shutdown(wait=True)
        kept = folder / MODELS_FOLDER
        cards = sorted(kept.glob("*.json")) if kept.is_dir() else []
        with tempfile.TemporaryDirectory() as tmp:
            if models is not None:
                cards.append(Path(tmp) / "models.json")
                write_json(cards[-1], dict(models))
            if cards:
                self._each("artifacts", None, cards)
        self._each("close", None, finished)
