"""SCAFFOLD (Karimireddy et al. 2020): control variates against client drift, global step 1.

Both halves of the method are here.

Server (:class:`Scaffold`): keeps the global model x and the server control
variate c (one tensor per trainable parameter, zero at the start). In a round
(Alg. 1) the sampled clients receive (x, c); the server sets
``x <- x + 1 * mean(y_i - x)`` (global step size 1: Flower's FedAvg of the
y_i) and ``c <- c + (1/N) sum_i delta c_i`` (line 17, N the number of clients
that train).

Client (:class:`ScaffoldClient`, ``client-update = "scaffold"``): the message
carries c as the ArrayRecord ``control``. The client keeps its own control
variate c_i across rounds in ``context.state`` (key ``scaffold-control``;
zero at first), trains with the gradient correction ``c - c_i`` added to
every gradient (line 10), sets ``c_i+`` to the gradient of its local loss at
the received x (option I, Eq. 4 (i)) and replies its model y_i and the
ArrayRecord ``control-delta`` = ``c_i+ - c_i``.

Choices: option I (the paper's Eq. 4 (i)) rather than option II, because
option II's ``(x - y_i) / (K lr)`` estimates the gradient only under plain
SGD, while the FedAMP paper's clients use Adam; it costs one extra pass over
the local data. x is averaged with Flower's FedAvg, i.e. weighted by the
clients' sample counts (the paper's mean is unweighted; the two agree for
equal client sizes).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Message
from torch import nn

from tasks.train import LossFn, loss_for

from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.layout import FlatLayout
from .core.registry import RunSetup, flower_kwargs, register_strategy
from .core.replies import array_spec, arrays_problem
from .core.settings import Settings
from .flower import FedAvg

SCAFFOLD = "scaffold"
CONTROL = "control"  # the server control variate c, in train messages
CONTROL_DELTA = "control-delta"  # c_i+ - c_i, in train replies
STATE = "scaffold-control"  # the client's c_i in context.state


def update_control(control: torch.Tensor, deltas: torch.Tensor, num_clients: int) -> torch.Tensor:
    """``c + (1 / N) sum_i delta_c_i`` (Alg. 1, line 17); ``deltas`` is (clients x d)."""
    return control + deltas.sum(0) / num_clients


def mean_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int,
    loss_fn: LossFn | None = None, device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Gradient of the mean loss over all of (x, y) at the model's weights, one tensor per
    parameter (SCAFFOLD's option I control variate, Eq. 4 (i))."""
    loss_fn = loss_fn or loss_for(y)
    model.to(device).train()
    params = list(model.parameters())
    grads = [torch.zeros_like(p) for p in params]
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        loss = loss_fn(model(xb), yb) * (len(xb) / max(len(x), 1))
        for g, d in zip(grads, torch.autograd.grad(loss, params)):
            g.add_(d)
    return [g.detach() for g in grads]


@register_client_update
class ScaffoldClient(ClientUpdate):
    """SCAFFOLD's client update (Alg. 1, lines 7-13, option I)."""

    name = SCAFFOLD

    def train(self, job: ClientJob) -> tuple[float, dict[str, ArrayRecord]]:
        """Train with the correction ``c - c_i``; keep ``c_i+``; reply ``c_i+ - c_i``."""
        if CONTROL not in job.content.array_records:
            raise ValueError(f"a '{SCAFFOLD}' train message needs the ArrayRecord '{CONTROL}'")
        server_c = job.content.array_records[CONTROL].to_torch_state_dict()
        names = [k for k, _ in job.model.named_parameters()]
        new_c = dict(zip(names, (g.cpu() for g in mean_gradient(
            job.model, job.data.x_train, job.targets, batch_size=job.optim.batch_size,
            device=job.optim.device))))
        own = job.saved_state(STATE)
        client_c = (own.to_torch_state_dict() if own is not None
                    else {k: torch.zeros_like(v) for k, v in new_c.items()})
        loss = job.fit(grad_correction=[server_c[k] - client_c[k] for k in names])
        job.state[STATE] = ArrayRecord(new_c)
        return loss, {CONTROL_DELTA: ArrayRecord({k: new_c[k] - client_c[k] for k in names})}


class Scaffold(FedAvg):
    """SCAFFOLD's server on top of Flower's FedAvg (which averages the models).

    Client contract: train messages name ``scaffold`` and carry the ArrayRecord
    ``control`` (c); replies carry the model and the ArrayRecord
    ``control-delta`` (c_i+ - c_i), or are left out of the round.

    Parameters
    ----------
    param_keys : list of str
        State-dict keys of the trainable parameters (the control variates' keys).
    **kwargs
        Flower FedAvg's arguments.
    """

    client_update = SCAFFOLD
    reply_records = (CONTROL_DELTA,)

    def __init__(self, param_keys: list[str], **kwargs) -> None:
        self.param_keys = list(param_keys)
        self.layout: FlatLayout | None = None  # of the trainable parameters
        self.control: torch.Tensor | None = None  # c, flat
        super().__init__(**kwargs)

    def _num_training_clients(self) -> int:
        novel = self.tracker.roles.novel
        return max(1, sum(1 for i in self.tracker.roster.clients.values() if i.client_id not in novel))

    def _ensure_control(self, arrays: ArrayRecord) -> tuple[FlatLayout, torch.Tensor]:
        """The layout of the trainable parameters and c (zero at the start)."""
        if self.layout is None or self.control is None:
            params = ArrayRecord({k: arrays[k] for k in self.param_keys})
            self.layout = FlatLayout.from_arrays(params)
            self.control = torch.zeros(self.layout.size)
        return self.layout, self.control

    def configure_train(self, server_round, arrays, config, grid):
        layout, control = self._ensure_control(arrays)
        messages = super().configure_train(server_round, arrays, config, grid)
        record = layout.unflatten(control)
        for m in messages:
            m.content[CONTROL] = record
        return messages

    def method_reply_problem(self, msg: Message) -> str | None:
        """A train reply needs a valid ``control-delta`` (the trainable parameters' keys and shapes)."""
        delta = msg.content.array_records.get(CONTROL_DELTA)
        if delta is None:
            return f"no '{CONTROL_DELTA}' ArrayRecord"
        assert self.layout is not None and self.control is not None  # set by configure_train
        return arrays_problem(delta, array_spec(self.layout.unflatten(self.control)))

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Take the control deltas out of the replies that FedAvg will aggregate; update c."""
        deltas = [m.content.array_records[CONTROL_DELTA] for m in replies]
        for m in replies:
            del m.content[CONTROL_DELTA]
        if deltas:
            assert self.layout is not None and self.control is not None  # set by configure_train
            stacked = torch.stack([self.layout.flatten(d) for d in deltas])
            self.control = update_control(self.control, stacked, self._num_training_clients())
        return replies

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.control is not None:
            state["control"] = self.control.clone()
        return state

    def load_state_dict(self, state: dict, initial_arrays: ArrayRecord) -> None:
        super().load_state_dict(state, initial_arrays)
        _, control = self._ensure_control(initial_arrays)
        if "control" in state:
            self.control = state["control"].to(control.dtype)


_CONTROL_LEAKS = ("its reply's second record, the control variate's change c_i+ - c_i, is the "
                  "member's mean gradient, unclipped and unnoised")


@register_strategy(SCAFFOLD, not_private={"update": _CONTROL_LEAKS, "dp-sgd": _CONTROL_LEAKS})
def _scaffold(settings: Settings, run: RunSetup) -> Scaffold:
    return Scaffold(param_keys=run.param_keys, **flower_kwargs(run))
