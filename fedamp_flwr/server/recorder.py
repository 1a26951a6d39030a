"""What a run writes after its rounds: the checkpoint (the run's state, for ``resume``), then
metrics.json (its records), both copied in memory at once and written in that order by the
run's writer thread while the next round runs, and the dashboards of each round.

:class:`RunRecorder` observes the rounds of a :class:`fedamp_flwr.server_app.ServerRun`
(:meth:`RunRecorder.after_round`, handed to :func:`fedamp_flwr.server.rounds.run_rounds`) and closes
the dashboards when the run ends (:meth:`RunRecorder.close`). It reads the run's facts through
:class:`RecordedRun`: it keeps none of its own.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from logging import ERROR, INFO, WARNING
from typing import Any, Protocol

from flwr.app import ArrayRecord
from flwr.supercore import log

import tasks
from strategies.core.base import StrategyBase
from strategies.core.policy import ApartPolicy
from strategies.core.records import RunFile

from ..config import RunConfig
from ..identity import key_text
from .checkpoint import Checkpoint
from .dashboards import Dashboards
from .delivery import ModelDelivery
from .membership import Membership
from .results import RunFolder, UnsafeCheckpoint, Writer, XiFiles, snapshot
from .seasons import Season, family


class RecordedRun(Protocol):
    """The run's facts its records hold (:class:`fedamp_flwr.server_app.ServerRun`)."""

    cfg: RunConfig
    folder: RunFolder
    writer: Writer
    strategy: StrategyBase
    members: Membership
    scaling: dict | None  # the members' input scaling
    policy: ApartPolicy | None
    season: Season
    token: str  # the run's own token (its models' cards name it)
    kind: str  # the task's kind
    delivery: ModelDelivery | None
    boards: Dashboards | None
    xi_files: XiFiles
    spent: float  # seconds of the run before this session
    started: float  # when this session's rounds started (time.time())

    @property
    def num_clients(self) -> int: ...


class RunRecorder:
    """The checkpoint, metrics.json and the dashboards of ``run`` after each round."""

    def __init__(self, run: RecordedRun) -> None:
        self.run = run

    def facts(self) -> dict[str, Any]:
        """What both metrics.json and the checkpoint record of the run's members, made once
        (None: the run has none): the names by client id, who may speak for each (the public
        keys), every node refused for one, the members' input scaling, the collaboration
        policy and the warm start."""
        run = self.run
        members, named = run.members, bool(run.members.names)
        return dict(
            client_names=list(members.names) if named else None,
            member_keys={n: key_text(k) for n, k in sorted(members.keys.items())}
            if named else None,
            impostors=list(members.attempts) if members.attempts else None,
            impostor_count=members.impostors or None,
            member_scaling=run.scaling or None,
            collaboration_policy=run.policy.record(run.cfg.collaboration_policy)
            if run.policy is not None else None, warm_start=run.season.record or None)

    def record(self, completed: int, facts: dict[str, Any] | None = None) -> RunFile:
        """metrics.json after ``completed`` rounds (``facts``: :meth:`facts`, made already)."""
        run = self.run
        cfg, members, history = run.cfg, run.members, run.strategy.history
        return history.run_file(
            run_name=run.folder.name, strategy=cfg.strategy, label=cfg.label,
            dataset=cfg.dataset, task_kind=run.kind,
            partitioning=None if tasks.get_task(cfg.dataset).federated else cfg.partitioning,
            num_clients=run.num_clients, **(facts or self.facts()),
            # members whose data did not fit, or that could not join: by node, with why
            left_out={str(node): why for node, why in sorted(members.refused.items())}
            if members.refused else None, member_roster=cfg.member_roster or None,
            seed=cfg.seed, config=cfg.to_dict(),
            extra=cfg.settings.record(cfg.context()), completed_rounds=completed,
            finished=completed == cfg.num_server_rounds,
            coverage=history.coverage(run.num_clients),
            models=run.delivery.record() if run.delivery is not None else None,
            wall_time_s=round(run.spent + time.time() - run.started, 2))

    def after_round(self, server_round: int, arrays: ArrayRecord, stopping: bool = False) -> None:
        """The checkpoint first (metrics.json never claims more rounds than can be resumed),
        then metrics.json: both taken now and written by the writer's thread, in that order,
        while the next round runs."""
        run, cfg = self.run, self.run.cfg
        last = server_round == cfg.num_server_rounds or stopping  # the run's last round
        checkpoint = bool(cfg.checkpoint_every) and (server_round % cfg.checkpoint_every == 0
                                                     or last)
        facts = self.facts()  # the same for both files
        if checkpoint:
            self._checkpoint(server_round, arrays, facts)
        if checkpoint or not cfg.checkpoint_every:  # with its checkpoint, else every round
            metrics = copy.deepcopy(self.record(server_round, facts).to_dict())  # the next adds
            run.writer.submit(lambda: run.folder.write_metrics(metrics))
        if run.boards is not None:  # every round; MLflow's once its checkpoint is written
            boards = run.boards
            boards.round(server_round, copy.deepcopy(run.strategy.history.rounds.get(
                server_round, {})), run.xi_files.of_round(server_round),
                list(run.members.names) or None)
            if checkpoint or not cfg.checkpoint_every:
                run.writer.submit(lambda: boards.durable(server_round))

    def close(self, finished: bool) -> None:
        """The dashboards told how the run ended, with the models' cards (after every write);
        a failure here is said, never raised over the run's own outcome."""
        run = self.run
        if run.boards is None:
            return
        try:
            with contextlib.suppress(Exception):  # a failed write was raised by execute()
                run.writer.close()
            models = run.delivery.record() if run.delivery is not None else None
            run.boards.close(run.folder.path, models, finished)
        except Exception as err:
            log(WARNING, "Dashboards: not closed (%s: %s)", type(err).__name__, err)

    def _checkpoint(self, server_round: int, arrays: ArrayRecord, facts: dict[str, Any]
                    ) -> None:
        """Copy the run's state now (``facts``: :meth:`facts`); the writer's thread writes
        it."""
        run = self.run
        cfg, strategy = run.cfg, run.strategy
        copied = time.perf_counter()
        state = snapshot(Checkpoint(
            round=server_round, config=cfg.to_dict(), num_clients=run.num_clients,
            arrays=arrays.to_torch_state_dict(), random_state=random.getstate(),
            strategy=strategy.state_dict(), wall_time_s=run.spent + time.time() - run.started,
            run_token=run.token, state_kind=family(strategy, cfg.strategy),
            **facts).to_state())
        copied = time.perf_counter() - copied

        def write() -> None:
            try:
                size, seconds = run.folder.save_checkpoint(state)
            except UnsafeCheckpoint as err:
                log(ERROR, "Checkpoint not written: %s (a resume starts from the last "
                    "checkpoint written)", err)
                return
            log(INFO, "Round %d: checkpoint written (%.1f MB; %.2fs to copy in memory, "
                "%.2fs to write, in the background)", server_round, size / 1e6, copied, seconds)

        run.writer.submit(write)

