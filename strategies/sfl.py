"""SFL, structured federated learning (Chen, Long, Wu, Zhou, Jiang, "Personalized Federated
Learning With a Graph", IJCAI 2022), as its authors' code trains it
(``dawenzi098/SFL-Structural-Federated-Learning``: ``aggregator.py: graph_dic``, ``main.py``).

The server keeps one model per client, X (n x d). After a round's training it smooths them
over the client graph (``graph_dic``):

    P = alpha A_hat^K X + (1 - alpha) X,    A_hat = D^-1 (A + I)

row-normalised with self loops (``data_util.normalize_adj`` of the code's graph, which
always links a client to itself), K = ``sfl-layers`` (the code's ``--layers``, 3) and
alpha = ``sfl-alpha`` (``--serveralpha``, 1). P replaces the store: the code writes it back
into its list of client models, so a client that did not train this round enters the next
round's smoothing with its smoothed model. Each client is tested on its P_i; every client
trains the next round from the read-out g = mean_i P_i (``main.py: read_out``;
``federated.py`` builds the local model from ``global_param``), with the plain local loss
(the generic client update, ``local``).

Deviations from the authors' code (docs/methods.md, "SFL"):

1. The client graph is the run's (``graph``: the task's, a file, the groups'), not the
   code's graph of clients that share a label, which it builds from the clients' true
   labels (a server does not have them).
2. Local training is the run's (optimizer, learning rate, epochs: tuned by the same
   protocol as every method, docs/tuning.md), not the code's 20 epochs of Nesterov SGD with
   a per-round warm-up to 0.4. The code's regulariser 0.3 ||theta - P_c|| + 0.3 ||theta - g||
   is computed on a detached copy of the weights, has no gradient and changes nothing: it
   is left out.
3. Integer tensors (batch-norm counters) stay the initial model's; the code casts them to
   float, smooths and truncates them back.
4. g is the mean over the training clients: novel clients (``novel-client-fraction``) do
   not train, their models enter no one's P, and each is tested on the smoothing of its
   neighbours' models (the code has no novel clients).
5. ``sfl-train-from = "own"`` (not the code): each client trains from its own P_i, the
   paper's personalised training, instead of g.
6. The learned graphs (``--agg graph_v2`` / ``graph_v3``) are not built: the code draws a
   new graph learner every round and trains it 10 SGD steps to fit row-normalised
   *distances* between the models, which leaves it at its random start (measured,
   docs/methods.md); ``graph = "inferred"`` is refused for SFL.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO

import torch
from flwr.app import ConfigRecord
from flwr.supercore import log

from .core.base import PersonalizedStrategy
from .core.registry import RunSetup, personal_kwargs, register_strategy
from .core.settings import Settings, SettingsContext, bad, integer_in, one_of, setting
from .fedamp_math import cloud_models

SFL = "sfl"
TRAIN_FROM = ("global", "own")
MOST_LAYERS = 100


@dataclass(frozen=True)
class SFLSettings(Settings):
    """SFL's keys."""

    sfl_alpha: float = setting(1.0, "alpha: P = alpha A_hat^K X + (1 - alpha) X (the code's "
                               "serveralpha)", ok=lambda v: 0 <= v <= 1,
                               allowed="a number in [0, 1]")
    sfl_layers: int = setting(3, "K, the hops of smoothing over the client graph (the code's "
                              "layers)", **integer_in(1, MOST_LAYERS))
    sfl_train_from: str = setting("global", "global: every client trains from the mean of the "
                                  "smoothed models (the authors' code); own: from its own",
                                  **one_of(*TRAIN_FROM))

    def check(self, run: SettingsContext) -> None:
        """What only the run can rule out: training from the mean of everyone's smoothed
        models under a collaboration policy (SFL takes only a graph it is given: its
        registration, checked with the run config)."""
        if run.strategy == SFL and run.policy and self.sfl_train_from == "global":
            raise bad("sfl-train-from", "global", "own with a collaboration-policy (every "
                      "client training from g, the mean of all the smoothed models, would "
                      "weigh the members kept apart)")

    SERVER_HOLDS = "every client's model and one smoothed copy"

    def server_floats(self, num_params: int, num_clients: int) -> int:
        """The store and its smoothed copy (2 n P), the (n, n) propagation in float64."""
        return 2 * num_clients * num_params + 2 * num_clients * num_clients


def sfl_propagation(adjacency: torch.Tensor, alpha: float, layers: int,
                    senders: torch.Tensor | None = None) -> torch.Tensor:
    """The (n, n) matrix M of SFL's smoothing, P = M X = alpha A_hat^K X + (1 - alpha) X with
    A_hat = D^-1 (A + I) (``aggregator.py: graph_dic``, ``data_util.normalize_adj``), in
    float64. ``adjacency``: (n, n), non-negative (0/1 or weighted). ``senders``: (n,) bool,
    the clients whose models enter the smoothing (the others' columns are 0 before the rows
    are normalised); a row left with nothing keeps the client's own model."""
    n = adjacency.shape[0]
    eye = torch.eye(n, dtype=torch.float64, device=adjacency.device)
    a = adjacency.double() + eye
    if senders is not None:
        a = a * senders.to(a.device, torch.float64)[None, :]
    sums = a.sum(dim=1, keepdim=True)
    a = torch.where(sums > 0, a / sums.clamp_min(torch.finfo(torch.float64).tiny), eye)
    return alpha * torch.linalg.matrix_power(a, layers) + (1.0 - alpha) * eye


class SFLStrategy(PersonalizedStrategy):
    """SFL: each client's model smoothed over the client graph (see the module).

    Client contract: plain local training (``local``) of the received model (g, or the
    client's own P_i with ``train_from = "own"``); tested on its P_i as received.

    ``adjacency``: the (n, n) client graph in client-id order; ``alpha``, ``layers``,
    ``train_from``: :class:`SFLSettings`'; ``kwargs``:
    :class:`strategies.core.base.PersonalizedStrategy`'s.
    """

    # a client that joins after the start starts from g, the mean of the training clients'
    # smoothed models (what every client trains from), not the initial model, which would
    # pull its neighbours' smoothing back to the start (the code has no late joiners)
    JOINER_FROM_MEAN = True

    def __init__(self, settings: SFLSettings | None = None, *, adjacency: torch.Tensor,
                 **kwargs) -> None:
        s = SFLSettings() if settings is None else settings
        super().__init__(**kwargs)
        self.adjacency = adjacency.float()
        self.alpha, self.layers, self.train_from = s.sfl_alpha, s.sfl_layers, s.sfl_train_from
        self._sent: torch.Tensor | None = None  # g, as sent this round

    def summary(self) -> None:
        super().summary()
        edges = int((self.adjacency > 0).sum()) // 2
        log(INFO, "\t└── graph of %d edges, alpha %g, K %d, clients train from %s", edges,
            self.alpha, self.layers, "g = mean_i P_i" if self.train_from == "global"
            else "their own P_i")

    def propagation(self) -> torch.Tensor:
        """M over the run's clients now: the training clients' models enter it."""
        n = len(self.client_ids)
        if tuple(self.adjacency.shape) != (n, n):
            raise ValueError(f"the graph has {self.adjacency.shape[0]} clients, the run {n}")
        senders = torch.zeros(n, dtype=torch.bool)
        senders[self.training_rows] = True
        m = sfl_propagation(self.adjacency, self.alpha, self.layers, senders)
        apart = self.apart_mask(torch.arange(n))
        if apart is None:
            return m
        # the collaboration policy: K hops reach a pair kept apart through a common neighbour;
        # their weights are zeroed and the rows renormalised (a row left empty: its own model)
        m = m.masked_fill(apart.to(m.device), 0.0)
        sums = m.sum(dim=1, keepdim=True)
        return torch.where(sums > 0, m / sums.clamp_min(1e-300), torch.eye(n, dtype=m.dtype))

    def personalize(self, server_round: int, rows: torch.Tensor, config: ConfigRecord
                    ) -> tuple[torch.Tensor, ConfigRecord]:
        """g = mean_i P_i over the training clients for each of ``rows`` (or their own P_i)."""
        if self.train_from == "own":
            self._sent = None
            return self.store[rows], config
        g = self.store[self.training_rows.to(self.store.device)].mean(dim=0)
        self._sent = g
        return g.expand(len(rows), -1), config

    def sent_distances(self, rows: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        if self._sent is None:
            return super().sent_distances(rows, vectors)
        return (vectors - self._sent.to(vectors)).norm(dim=1)

    def update(self, server_round: int, rows: torch.Tensor, trained: torch.Tensor) -> None:
        """Store the trained models, then smooth every client's: the store becomes P."""
        super().update(server_round, rows, trained)
        m = self.learned_weights = self.propagation()  # every model is smoothed: all rows
        self.models = cloud_models(m.to(self.store.device), self.store)


    def add_client(self, info, adjacency: torch.Tensor | None = None) -> None:
        """A client that joins after the start (a new member): its place in the graph
        (``adjacency``: the run's graph with it, from the graph file by name)."""
        if info.client_id not in self._row:
            if adjacency is None:
                raise ValueError(f"{info.label} joins, but the run's graph does not say where")
            self.adjacency = adjacency.float()
        super().add_client(info, adjacency)


@register_strategy(SFL, settings=SFLSettings, graph=True)
def _sfl(settings: SFLSettings, run: RunSetup) -> SFLStrategy:
    if run.adjacency is None:  # refused with the run config before (a graph it is given)
        raise ValueError("SFL needs the client graph (run config graph)")
    return SFLStrategy(settings, adjacency=run.adjacency, **personal_kwargs(run))
