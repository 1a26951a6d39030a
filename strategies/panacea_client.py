"""Panacea's settings and its client half, shared by Panacea, Panacea-GN and pFedHN
(:mod:`strategies.panacea`): the ``panacea-...`` keys, and the client's plain SGD from the
model the server's hypernetwork generated for it (with the inferred graph's guard's side
training, :mod:`strategies.graph_guard`)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord
from flwr.supercore import log

from tasks import ClientData
from tasks.loading import held_rows
from tasks.train import evaluate

from .core.client import ClientJob, ClientUpdate, instruction_problem, register_client_update
from .core.layout import record
from .core.protocol import (
    BATCH_SIZE,
    CLIENT_UPDATE,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    as_int,
    short_repr,
)
from .core.settings import (
    MOST_LAYERS,
    MOST_STEPS,
    MOST_WIDTH,
    TRAIN,
    Settings,
    integer_in,
    setting,
)
from .graph_guard import (
    HOLD_OUT,
    HOLD_OUT_RUN,
    OTHER,
    SIDE,
    SIDE_CONFIG,
    VALIDATION,
    held_out_error,
    hold_out_share,
    validation_record,
)

HYPERNETWORK = "hypernetwork"

def _positive(v: float) -> bool:
    return v > 0


def _momentum(v: float) -> bool:
    return 0 <= v < 1


def _none_or_more(v: float) -> bool:
    return 0 <= v < math.inf


@dataclass(frozen=True)
class PanaceaSettings(Settings):
    """The keys of Panacea, Panacea-GN and pFedHN (``panacea-...``).

    Keys left at "auto" take the strategy's value for the task (pFedHN: its reference
    trainer's, :data:`PFEDHN_REFERENCE`; Panacea on TPT-48: :data:`PANACEA_TPT48`), else
    :attr:`AUTO` (the values this project has used since the start). The clients' keys
    travel in the train messages.
    """

    AUTO = {"panacea-client-lr": 0.1, "panacea-client-momentum": 0.0,
            "panacea-client-weight-decay": 0.0, "panacea-client-clip": 0.0,
            "panacea-server-lr": 0.1, "panacea-server-steps": 10,
            "panacea-server-weight-decay": 0.0, "panacea-server-clip": 0.0}

    panacea_embed_dim: int = setting(100, "GH's client embedding size (the paper's 100)",
                                     **integer_in(1, MOST_WIDTH))
    panacea_gnn_layers: int = setting(3, "GH's GNN layers (the paper's 3)",
                                      **integer_in(1, MOST_LAYERS))
    panacea_hidden: int = setting(100, "GH's hidden width (the paper's 100)",
                                  **integer_in(1, MOST_WIDTH))
    panacea_mlp_layers: int = setting(3, "GH's MLP layers (the paper's 3)",
                                      **integer_in(1, MOST_LAYERS))
    panacea_server_lr: float | str = setting("auto", "the hypernetwork's SGD learning rate",
                                             ok=_positive, allowed="a number > 0")
    panacea_server_momentum: float = setting(0.9, "the hypernetwork's SGD momentum",
                                             ok=_momentum, allowed="a number in [0, 1)")
    panacea_server_steps: int | str = setting("auto", "K_s, the server's steps per round",
                                              **integer_in(1, MOST_STEPS))
    panacea_server_weight_decay: float | str = setting(
        "auto", "the hypernetwork's weight decay (0: none)", ok=_none_or_more,
        allowed="a finite number >= 0 (0: none)")
    panacea_server_clip: float | str = setting(
        "auto", "the hypernetwork's gradient-norm clip (0: none)", ok=_none_or_more,
        allowed="a finite number >= 0 (0: none)")
    panacea_lambda_d: float = setting(1.0, "the graph generator's weight lambda_d",
                                      ok=lambda v: v >= 0, allowed="a number >= 0")
    panacea_client_lr: float | str = setting("auto", "the clients' SGD learning rate",
                                             ok=_positive, allowed="a number > 0", sent=TRAIN)
    panacea_client_momentum: float | str = setting(
        "auto", "the clients' SGD momentum", ok=_momentum, allowed="a number in [0, 1)",
        sent=TRAIN)
    panacea_client_weight_decay: float | str = setting(
        "auto", "the clients' weight decay (0: none)", ok=_none_or_more,
        allowed="a finite number >= 0 (0: none)", sent=TRAIN)
    panacea_client_clip: float | str = setting(
        "auto", "the clients' gradient-norm clip (0: none)", ok=_none_or_more,
        allowed="a finite number >= 0 (0: none)", sent=TRAIN)

    SERVER_HOLDS = "the hypernetwork"

    def sizes(self, gnn_layers: int) -> dict:
        """GH's sizes, with ``gnn_layers`` GNN layers (0: no graph)."""
        return dict(embed_dim=self.panacea_embed_dim, gnn_layers=gnn_layers,
                    hidden=self.panacea_hidden, mlp_layers=self.panacea_mlp_layers)

    def describe(self) -> str:
        """The server's and the clients' SGD, for the run's log."""
        return (f"server SGD lr {float(self.panacea_server_lr):g} (momentum "
                f"{self.panacea_server_momentum:g}, weight decay "
                f"{float(self.panacea_server_weight_decay):g}, clip "
                f"{float(self.panacea_server_clip):g}) x {int(self.panacea_server_steps)} steps; "
                f"clients: SGD lr {float(self.panacea_client_lr):g} (momentum "
                f"{float(self.panacea_client_momentum):g}, weight decay "
                f"{float(self.panacea_client_weight_decay):g}, clip "
                f"{float(self.panacea_client_clip):g})")

    def server_floats(self, num_params: int, num_clients: int) -> int:
        """The server's hypernetwork GH (:class:`strategies.hypernetwork.GraphHyperNetwork`,
        counted from its sizes: the client embeddings, the GCN layers, the MLP, the graph
        generator and the heads, hidden x P) three times (weights, gradients, momentum), and
        the round's replies and generated models (2 n P)."""
        n, embed, hidden = num_clients, self.panacea_embed_dim, self.panacea_hidden
        gnn = embed * hidden + hidden + (self.panacea_gnn_layers - 1) * (hidden * hidden + hidden)
        mlp = hidden * hidden + hidden + (self.panacea_mlp_layers - 1) * (hidden * hidden + hidden)
        generator = 2 * (hidden * hidden + hidden)
        heads = hidden * num_params + num_params
        return 3 * (n * embed + gnn + mlp + generator + heads) + 2 * n * num_params


class HypernetworkClient(ClientUpdate[PanaceaSettings]):
    """The client half of Panacea, Panacea-GN and pFedHN: plain SGD from the generated model.

    Trains the received theta_t for the message's ``local-steps`` (or
    ``local-epochs``) with SGD at ``panacea-client-lr`` (momentum, weight decay and
    gradient-norm clipping: ``panacea-client-momentum``, ``-weight-decay``,
    ``-clip``, 0 for none) and replies the trained model; it is tested on the
    generated model as received. The guard of an inferred graph
    (:mod:`strategies.graph_guard`): a message may also carry a side model
    (``panacea-side``) with its training's keys (``panacea-side-config``) and the share of
    rows to hold out (``panacea-hold-out``, the same rows every round). The client then
    also trains the side model, on its rows less the held-out ones, and replies it; where the
    message carries a second model to compare (``panacea-other``) it first tests both on the
    held-out rows and replies their errors (``panacea-validation``). The received model
    trains on every row, as without a guard.
    """

    name = HYPERNETWORK
    settings = PanaceaSettings

    def message_problem(self, config: ConfigRecord, train: bool) -> str | None:
        """The share to hold out (:func:`strategies.graph_guard.hold_out_share`)."""
        try:
            hold_out_share(config.get(HOLD_OUT, 0.0))
        except ValueError as err:
            return str(err)
        if not isinstance(config.get(HOLD_OUT_RUN, False), bool):
            return (f"message key '{HOLD_OUT_RUN}' = {short_repr(config.get(HOLD_OUT_RUN))} is "
                    "invalid; allowed: true or false")
        return None

    def train(self, job: ClientJob[PanaceaSettings]) -> tuple[float, dict]:
        share = hold_out_share(job.config.get(HOLD_OUT, 0.0))
        side, other = (job.content.array_records.get(k) for k in (SIDE, OTHER))
        side_config = job.content.config_records.get(SIDE_CONFIG)
        if (side is None) != (side_config is None) or (other is not None and side is None) \
                or (share == 0) != (side is None):
            raise ValueError(f"the train message carries {'panacea-side' if side else 'no side'}"
                             f" model, {'a' if side_config else 'no'} side config and "
                             f"'{HOLD_OUT}' = {share:g}: a side model comes with its config and "
                             "a share > 0, and a model to compare only with a side model")
        records = {} if side is None else self._side(job, share, side, side_config, other)
        if job.config.get(HOLD_OUT_RUN) is True and side is not None:  # the guard's watch
            _, rest = held_rows(len(job.data.y_train), share, job.run_seed, job.client_id,
                                HOLD_OUT)
            job = dataclasses.replace(job, data=ClientData(
                job.data.x_train[rest], job.data.y_train[rest], job.data.x_test,
                job.data.y_test), targets=job.targets[rest])
        return _fit(job), records

    def _side(self, job: ClientJob[PanaceaSettings], share: float, side: ArrayRecord,
              config: ConfigRecord | None, other: ArrayRecord | None) -> dict:
        """The guard's side training on the rows less the held-out ones; first, with a model to
        compare, both models' errors on the held-out rows."""
        assert config is not None
        problem = instruction_problem(ConfigRecord({**dict(config), CLIENT_UPDATE: self.name,
                                                    HOLD_OUT: share, HOLD_OUT_RUN: False}),
                                      train=True)
        if problem is not None:
            raise ValueError(f"'{SIDE_CONFIG}': {problem}")
        held, rest = held_rows(len(job.data.y_train), share, job.run_seed, job.client_id,
                               HOLD_OUT)
        model = copy.deepcopy(job.model)
        model.load_state_dict(side.to_torch_state_dict())
        records: dict = {}
        if other is not None:
            twin = copy.deepcopy(job.model)
            twin.load_state_dict(other.to_torch_state_dict())
            x, y, device = job.data.x_train[held], job.data.y_train[held], job.optim.device
            mine, theirs = (evaluate(m, x, y, device=device) for m in (model, twin))
            records[VALIDATION] = validation_record(held_out_error(mine.loss, mine.accuracy),
                                                    held_out_error(theirs.loss, theirs.accuracy))
        part = ClientData(job.data.x_train[rest], job.data.y_train[rest], job.data.x_test,
                          job.data.y_test)
        optim = dataclasses.replace(job.optim, batch_size=as_int(
            config.get(BATCH_SIZE, job.optim.batch_size), BATCH_SIZE))
        _fit(dataclasses.replace(
            job, model=model, data=part, targets=job.targets[rest], optim=optim,
            settings=PanaceaSettings.from_message(config),
            steps=as_int(config.get(LOCAL_STEPS, job.steps), LOCAL_STEPS),
            epochs=as_int(config.get(LOCAL_EPOCHS, job.epochs), LOCAL_EPOCHS)))
        records[SIDE] = record(model.state_dict())
        said = ("" if VALIDATION not in records else "; on the held-out rows the side model it "
                "trained errs {:.4g}, the other {:.4g} (sent)".format(
                    *records[VALIDATION].to_torch_state_dict()["error"].tolist()))
        log(INFO, "Round %d: for the server's guard of its inferred graph this node also trained "
            "a side model on %d of its %d training rows (%d held out, the same every round)%s",
            job.server_round, len(rest), len(job.data.y_train), len(held), said)
        return records


def _fit(job: ClientJob[PanaceaSettings]) -> float:
    """The family's local training: SGD with the message's ``panacea-client-*`` keys."""
    s = job.settings
    return job.fit(optimizer="sgd", learning_rate=float(s.panacea_client_lr),
                   momentum=float(s.panacea_client_momentum),
                   weight_decay=float(s.panacea_client_weight_decay),
                   clip_norm=float(s.panacea_client_clip))


# besides its settings' keys, every train message of the family says what to hold out
HypernetworkClient.train_keys = (*HypernetworkClient.train_keys, HOLD_OUT, HOLD_OUT_RUN)
register_client_update(HypernetworkClient)
