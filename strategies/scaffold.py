"""SCAFFOLD (Karimireddy et al. 2020): control variates against client drift, global step 1.

The server keeps the global model x and the server control variate c (one
tensor per trainable parameter, zero at the start); each client keeps its own
control variate c_i across rounds in its ``context.state``. In a round
(Alg. 1), the sampled clients receive (x, c), train with the gradient
correction ``c - c_i`` and return their model y_i and ``delta c_i = c_i+ - c_i``
(option I: ``c_i+`` is the client's full local gradient at x; see
``fedamp_flwr/client_app.py``). The server sets ``x <- x + 1 * mean(y_i - x)``
(global step size 1) and ``c <- c + (1/N) sum_i delta c_i`` (line 17, N the
number of clients that train).

Choices: option I (the paper's Eq. 4 (i)) rather than option II, because
option II's ``(x - y_i) / (K lr)`` estimates the gradient only under plain
SGD, while the FedAMP paper's clients use Adam; it costs one extra pass over
the local data. x is averaged with Flower's FedAvg, i.e. weighted by the
clients' sample counts (the paper's mean is unweighted; the two agree for
equal client sizes).
"""

from __future__ import annotations

from logging import WARNING

import torch
from flwr.app import ArrayRecord, Message
from flwr.supercore import log

from .base import FlatLayout, arrays_problem
from .flower import FedAvg

CONTROL = "control"
CONTROL_DELTA = "control-delta"


def update_control(control: torch.Tensor, deltas: torch.Tensor, num_clients: int) -> torch.Tensor:
    """``c + (1 / N) sum_i delta_c_i`` (Alg. 1, line 17); ``deltas`` is (clients x d)."""
    return control + deltas.sum(0) / num_clients


class Scaffold(FedAvg):
    """SCAFFOLD on top of Flower's FedAvg (which averages the models).

    Parameters
    ----------
    param_keys : list of str
        State-dict keys of the trainable parameters (the control variates' keys).
    **kwargs
        Flower FedAvg's arguments.
    """

    def __init__(self, param_keys: list[str], **kwargs) -> None:
        self.param_keys = list(param_keys)
        self.layout: FlatLayout | None = None  # of the trainable parameters
        self.control: torch.Tensor | None = None  # c, flat
        self._deltas: dict[int, ArrayRecord] = {}
        super().__init__(**kwargs)

    def _num_training_clients(self) -> int:
        return max(1, sum(1 for i in self.clients.values() if i.client_id not in self.roles.novel))

    def configure_train(self, server_round, arrays, config, grid):  # noqa: D102
        if self.control is None:
            self.layout = FlatLayout.from_arrays(ArrayRecord({k: arrays[k] for k in self.param_keys}))
            self.control = torch.zeros(self.layout.size)
        config["scaffold"] = True
        messages = super().configure_train(server_round, arrays, config, grid)
        record = self.layout.unflatten(self.control)
        for m in messages:
            m.content[CONTROL] = record
        return messages

    def aggregate_train(self, server_round, replies):  # noqa: D102
        """Take each reply's ``control-delta`` out (replies without a valid one are left out),
        then aggregate the models as FedAvg and update c from the kept replies."""
        shapes = self.layout.shapes if self.layout is not None else {}
        kept, self._deltas = [], {}
        for m in replies:
            if m.has_error() or self.control is None:
                kept.append(m)
                continue
            delta = m.content.array_records.get(CONTROL_DELTA)
            problem = "no 'control-delta' ArrayRecord" if delta is None else arrays_problem(delta, shapes)
            if problem is not None:
                log(WARNING, "Round %d: reply of client %s left out: %s", server_round,
                    self.client_of(m), problem)
                continue
            del m.content[CONTROL_DELTA]
            self._deltas[id(m)] = delta
            kept.append(m)
        return super().aggregate_train(server_round, kept)

    def before_aggregation(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Update c with the control deltas of the replies that FedAvg will aggregate."""
        deltas = [self._deltas[id(m)] for m in replies if id(m) in self._deltas]
        if deltas and self.control is not None:
            stacked = torch.stack([self.layout.flatten(d) for d in deltas])
            self.control = update_control(self.control, stacked, self._num_training_clients())
        self._deltas = {}
        return replies
