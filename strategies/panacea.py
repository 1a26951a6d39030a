"""Panacea: graph-hypernetwork personalization ("Graph-Relational Federated
Learning: Enhanced Personalization and Robustness"), with its special cases
Panacea-GN (no graph generator) and pFedHN (Shamsian et al., ICML 2021: no
graph).

The server-side model psi = {psi_e, psi_m} generates every client's model:

    z = E(h^(0), A)          client embeddings h^(0) through a GCN encoder E
    theta_t = M(z_t)         an MLP with one output head per target tensor

psi_e = {h^(0), E} (and the graph generator D), psi_m = M. The graph
generator D scores a client pair by s(f(z_u)^T f(z_v)) (f an MLP, s the
sigmoid) and adds the reconstruction loss

    L_d = E_{u,v}[-A_uv log s(.) - (1 - A_uv) log(1 - s(.))]

with weight lambda_d, to psi_e's update only.

After clients return trained models, a server step is

    psi <- psi - alpha (d theta / d psi)^T (theta - theta_trained)  [- alpha lambda_d grad L_d]

averaged over the sampled clients, computed with ``torch.autograd.grad(theta,
psi, grad_outputs=(theta - theta_trained) / k)`` for k sampled clients.
Deviation: the paper sums over the sampled clients; the mean is the sum with
step alpha / k, so that alpha needs no retuning when the number of sampled
clients changes (the sum grows with it). Sign: the paper writes the step
with Delta theta = theta_trained - theta_sent; taken literally, psi <- psi -
alpha J^T Delta theta would move theta away from the trained weights. The
descent direction of 1/2 ||theta(psi) - theta_trained||^2, whose gradient is
J^T (theta - theta_trained) = -J^T Delta theta, is what pFedHN's reference code
does and what is implemented (``test_server_step_moves_toward_trained``). With
``server_steps`` K_s > 1 the residual theta(psi) - theta_trained is recomputed
at each step (the first step equals the paper's).
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ConfigRecord
from flwr.supercore import log
from torch import nn

from .base import PersonalizedStrategy
from .client import ClientJob, ClientUpdate, register_client_update
from .registry import RunSetup, personal_kwargs, register_strategy

if TYPE_CHECKING:
    from fedamp_flwr.config import RunConfig

HYPERNETWORK = "hypernetwork"
CLIENT_LR = "hn-client-lr"
CLIENT_MOMENTUM = "hn-client-momentum"
CLIENT_WEIGHT_DECAY = "hn-client-weight-decay"
CLIENT_CLIP = "hn-client-clip"


def normalized_adjacency(adj: torch.Tensor) -> torch.Tensor:
    """GCN propagation matrix D^-1/2 (A + I) D^-1/2 of a symmetric (n, n) adjacency."""
    a = adj.float() + torch.eye(adj.shape[0], device=adj.device)
    d = a.sum(dim=1).rsqrt()
    return d[:, None] * a * d[None, :]


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class GCNLayer(nn.Module):
    """One graph convolution H' = P H W (Kipf and Welling 2017), P the propagation matrix."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, h: torch.Tensor, prop: torch.Tensor) -> torch.Tensor:
        return prop @ self.linear(h)


class GraphHyperNetwork(nn.Module):
    """GH(h^(0), A; psi): client embeddings -> GCN encoder -> MLP with per-tensor heads.

    Parameters
    ----------
    num_clients : int
        Number of clients (rows of the embedding table).
    head_sizes : Sequence[int]
        Number of values of each target tensor, in the order of the flat model
        vector (:class:`strategies.layout.FlatLayout`); the output is their concatenation.
    embed_dim : int (default: 100)
        Dimension of h^(0) (paper: 100).
    gnn_layers : int (default: 3)
        GCN layers of E (paper: 3); 0 means no encoder (pFedHN: z = h^(0)).
    hidden : int (default: 100)
        Width of E's layers and of M's hidden layers (paper: 100).
    mlp_layers : int (default: 3)
        Linear layers of M before the heads (paper: 3).
    generator : bool (default: True)
        Whether the graph generator D exists (False for Panacea-GN and pFedHN).
    """

    def __init__(self, num_clients: int, head_sizes: Sequence[int], embed_dim: int = 100,
                 gnn_layers: int = 3, hidden: int = 100, mlp_layers: int = 3,
                 generator: bool = True) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(num_clients, embed_dim)
        nn.init.normal_(self.embeddings.weight, std=1.0)
        dims = [embed_dim] + [hidden] * gnn_layers
        self.encoder = nn.ModuleList(GCNLayer(a, b) for a, b in zip(dims[:-1], dims[1:]))
        z_dim = dims[-1]
        self.mlp = nn.Sequential(_mlp([z_dim] + [hidden] * mlp_layers), nn.ReLU())
        self.heads = nn.ModuleList(nn.Linear(hidden, int(n)) for n in head_sizes)
        self.generator = _mlp([z_dim, hidden, hidden]) if generator else None

    def encoder_parameters(self) -> list[nn.Parameter]:
        """psi_e: embeddings, encoder and graph generator."""
        gen = list(self.generator.parameters()) if self.generator is not None else []
        return [self.embeddings.weight, *self.encoder.parameters(), *gen]

    def encode(self, prop: torch.Tensor | None) -> torch.Tensor:
        """z for every client: h^(0) through the GCN layers (ReLU between), or h^(0) if none."""
        h = self.embeddings.weight
        for i, layer in enumerate(self.encoder):
            h = layer(h, prop)
            if i < len(self.encoder) - 1:
                h = torch.relu(h)
        return h

    def generate(self, z: torch.Tensor) -> torch.Tensor:
        """Flat target models (k, d) from embeddings z (k, z_dim)."""
        features = self.mlp(z)
        return torch.cat([head(features) for head in self.heads], dim=1)

    def forward(self, prop: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        """theta for clients ``rows``: (len(rows), d)."""
        return self.generate(self.encode(prop)[rows])


def graph_reconstruction_loss(f: torch.Tensor, adj: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """L_d over ``pairs`` (P, 2): mean of -A log s(f_u.f_v) - (1 - A) log(1 - s(f_u.f_v))."""
    scores = (f[pairs[:, 0]] * f[pairs[:, 1]]).sum(dim=1)
    target = adj[pairs[:, 0], pairs[:, 1]].float()
    return nn.functional.binary_cross_entropy_with_logits(scores, target)


def sample_pairs(adj: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """All edges (u < v) and as many random non-adjacent pairs: the pairs of L_d.

    A choice the paper leaves open ("sampled client pairs"): balancing edges
    and non-edges keeps L_d informative on sparse graphs.
    """
    device, adj = adj.device, adj.cpu()  # drawn with a CPU generator
    n = adj.shape[0]
    upper = torch.triu(adj > 0, diagonal=1)
    pos = upper.nonzero()
    k = max(len(pos), 1)
    u = torch.randint(0, n, (4 * k,), generator=generator)
    v = torch.randint(0, n, (4 * k,), generator=generator)
    keep = (u != v) & (adj[u, v] == 0)
    neg = torch.stack([u[keep], v[keep]], dim=1)[:k]
    return torch.cat([pos, neg]).to(device)


def server_step(
    hnet: GraphHyperNetwork,
    optimizer: torch.optim.Optimizer,
    prop: torch.Tensor | None,
    rows: torch.Tensor,
    trained: torch.Tensor,
    adj: torch.Tensor | None = None,
    lambda_d: float = 0.0,
    pairs: torch.Tensor | None = None,
    clip_norm: float = 0.0,
) -> float:
    """One update of psi toward the clients' trained models.

    Gradients of the model term come from ``torch.autograd.grad(theta, psi,
    grad_outputs=(theta - trained) / k)`` over the k rows (the gradient of
    the mean of 1/2 ||theta_t - trained_t||^2); with a graph generator,
    ``lambda_d * grad L_d`` is added to psi_e's gradients; with ``clip_norm``
    > 0 the gradients' total norm is clipped to it (pFedHN's reference trainer: 50).

    Returns
    -------
    float
        The mean over rows of 1/2 ||theta_t - trained_t||^2 before the step.
    """
    params = [p for p in hnet.parameters() if p.requires_grad]
    z = hnet.encode(prop)
    theta = hnet.generate(z[rows])
    residual = (theta - trained).detach()
    grads = torch.autograd.grad(theta, params, grad_outputs=residual / len(rows), allow_unused=True,
                                retain_graph=hnet.generator is not None and lambda_d > 0)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    if hnet.generator is not None and lambda_d > 0 and adj is not None and pairs is not None:
        loss_d = graph_reconstruction_loss(hnet.generator(z), adj, pairs)
        psi_e = hnet.encoder_parameters()
        extra = torch.autograd.grad(loss_d, psi_e, allow_unused=True)
        index = {id(p): i for i, p in enumerate(params)}
        for p, g in zip(psi_e, extra):
            if g is not None:
                grads[index[id(p)]] = grads[index[id(p)]] + lambda_d * g
    optimizer.zero_grad(set_to_none=True)
    for p, g in zip(params, grads):
        p.grad = g
    if clip_norm > 0:
        nn.utils.clip_grad_norm_(params, clip_norm)
    optimizer.step()
    return 0.5 * float((residual ** 2).sum()) / len(rows)


@register_client_update
class HypernetworkClient(ClientUpdate):
    """The client half of Panacea, Panacea-GN and pFedHN: plain SGD from the generated model.

    Trains the received theta_t for the message's ``local-steps`` (or
    ``local-epochs``) with SGD at ``hn-client-lr`` (momentum, weight decay and
    gradient-norm clipping: ``hn-client-momentum``, ``-weight-decay``,
    ``-clip``, 0 for none) and replies the trained model; it is tested on the
    generated model as received.
    """

    name = HYPERNETWORK
    train_keys = (CLIENT_LR, CLIENT_MOMENTUM, CLIENT_WEIGHT_DECAY, CLIENT_CLIP)

    def train(self, job: ClientJob) -> tuple[float, dict]:  # noqa: D102
        c = job.config
        return job.fit(optimizer="sgd", lr=float(c[CLIENT_LR]), momentum=float(c[CLIENT_MOMENTUM]),
                       weight_decay=float(c[CLIENT_WEIGHT_DECAY]),
                       clip_norm=float(c[CLIENT_CLIP])), {}


class Panacea(PersonalizedStrategy):
    """Panacea (and, by its arguments, Panacea-GN and pFedHN) as a Flower strategy.

    Each sampled client receives theta_t = GH(h_t, A) and trains it with SGD
    at ``client_lr`` (client contract: train messages name ``hypernetwork``
    and carry ``hn-client-lr``; the run's ``local-steps``, or
    ``local-epochs`` when 0); the server then runs ``server_steps`` steps of
    :func:`server_step` on the valid trained models (SGD with momentum, whose
    state lives across rounds). Every client, novel ones included, is
    evaluated on the model generated for it, without fine-tuning.

    Parameters
    ----------
    adjacency : torch.Tensor | None
        (n, n) symmetric 0/1 client graph in the order of the sorted client
        ids; None for pFedHN.
    embed_dim, gnn_layers, hidden, mlp_layers : int
        Sizes of GH (paper: 100, 3, 100, 3); ``gnn_layers`` is ignored without a graph.
    generator : bool
        Whether to train the graph generator D (Panacea: True; Panacea-GN: False).
    lambda_d : float
        Weight of L_d in psi_e's update.
    server_lr, server_momentum : float
        SGD of psi.
    server_steps : int
        K_s, server steps per round.
    client_lr : float
        Learning rate of the clients' SGD (which trains the run's
        ``local-steps`` K_c, or ``local-epochs`` when that is 0).
    **kwargs
        Passed to :class:`strategies.base.PersonalizedStrategy`.
    """

    client_update = HYPERNETWORK

    def __init__(self, adjacency: torch.Tensor | None = None, embed_dim: int = 100,
                 gnn_layers: int = 3, hidden: int = 100, mlp_layers: int = 3,
                 generator: bool = True, lambda_d: float = 1.0, server_lr: float = 0.01,
                 server_momentum: float = 0.9, server_steps: int = 1, client_lr: float = 0.05,
                 server_weight_decay: float = 0.0, server_clip: float = 0.0,
                 client_momentum: float = 0.0, client_weight_decay: float = 0.0,
                 client_clip: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.server_weight_decay, self.server_clip = server_weight_decay, server_clip
        self.client_momentum, self.client_weight_decay = client_momentum, client_weight_decay
        self.client_clip = client_clip
        self.adjacency = adjacency
        self.sizes = dict(embed_dim=embed_dim, gnn_layers=gnn_layers if adjacency is not None else 0,
                          hidden=hidden, mlp_layers=mlp_layers)
        self.use_generator = generator and adjacency is not None
        self.lambda_d = lambda_d
        self.server_lr, self.server_momentum = server_lr, server_momentum
        self.server_steps = server_steps
        self.client_lr = client_lr
        self.hnet: GraphHyperNetwork | None = None

    def train_keys(self) -> dict:  # noqa: D102
        return {CLIENT_LR: self.client_lr, CLIENT_MOMENTUM: self.client_momentum,
                CLIENT_WEIGHT_DECAY: self.client_weight_decay, CLIENT_CLIP: self.client_clip}

    def summary(self) -> None:  # noqa: D102
        super().summary()
        log(INFO, "\t└── graph %s, generator %s, sizes %s, server SGD lr %g (momentum %g, weight "
            "decay %g, clip %g) x %d steps; clients: SGD lr %g (momentum %g, weight decay %g, "
            "clip %g)",
            "none" if self.adjacency is None else f"{int(self.adjacency.sum()) // 2} edges",
            self.use_generator, self.sizes, self.server_lr, self.server_momentum,
            self.server_weight_decay, self.server_clip, self.server_steps, self.client_lr,
            self.client_momentum, self.client_weight_decay, self.client_clip)

    def initial_models(self, initial: torch.Tensor) -> None:
        """Build GH and its optimizer; no per-client store (GH generates the models)."""
        n = len(self.client_ids)
        if self.adjacency is not None and tuple(self.adjacency.shape) != (n, n):
            raise ValueError(f"the graph has {self.adjacency.shape[0]} clients, the run {n}")
        params = self.layout.float_keys[: self.layout.num_param_keys]
        sizes = [int(np.prod(self.layout.shapes[k])) for k in params]
        # Floating-point buffers (batch-norm statistics) are not generated: a
        # linear head could make a running variance negative. They stay at
        # the initial model's values.
        self.buffers = initial[self.layout.num_params :]
        torch.manual_seed(self.seed)
        self.hnet = GraphHyperNetwork(n, sizes, generator=self.use_generator, **self.sizes)
        self.hnet.to(self.device)
        self.optimizer = torch.optim.SGD(self.hnet.parameters(), lr=self.server_lr,
                                         momentum=self.server_momentum,
                                         weight_decay=self.server_weight_decay)
        self.adj = None if self.adjacency is None else self.adjacency.to(self.device)
        self.prop = None if self.adj is None else normalized_adjacency(self.adj)
        self.pair_gen = torch.Generator().manual_seed(self.seed)
        log(INFO, "Hypernetwork: %d clients, %d parameters; target model of %d values",
            n, sum(p.numel() for p in self.hnet.parameters()), self.layout.size)
        return None

    def add_client(self, info, adjacency: torch.Tensor | None = None) -> None:
        """A client that joins after the start (a new member) gets an embedding h^(0) of its own
        (drawn as the others were, N(0, 1), seeded) and its place in the graph (``adjacency``:
        the run's graph with it; its edges come from the graph file by name). The optimizer's
        momentum of the other embeddings is kept; the new row's starts at zero."""
        known = info.client_id in self._row
        super().add_client(info, adjacency)
        if known:
            return
        if self.adjacency is not None:
            if adjacency is None:
                raise ValueError(f"{info.label} joins, but the run's graph does not say where")
            self.adjacency = adjacency.float()
        if self.hnet is None:  # before the first round: initial_models builds GH for all
            return
        old = self.hnet.embeddings.weight
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + info.client_id)
        extra = torch.randn(1, old.shape[1], generator=gen).to(old)
        new = nn.Parameter(torch.cat([old.detach(), extra]))
        self.hnet.embeddings.weight = new
        self.hnet.embeddings.num_embeddings = new.shape[0]
        for group in self.optimizer.param_groups:
            group["params"] = [new if p is old else p for p in group["params"]]
        state = self.optimizer.state.pop(old, None)
        if state is not None:
            if state.get("momentum_buffer") is not None:
                buf = state["momentum_buffer"]
                state["momentum_buffer"] = torch.cat([buf, torch.zeros_like(buf[:1])])
            self.optimizer.state[new] = state
        if self.adjacency is not None:
            self.adj = self.adjacency.to(self.device)
            self.prop = normalized_adjacency(self.adj)

    @torch.no_grad()
    def generated(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Full flat models for ``rows`` (all clients if None): generated parameters, initial buffers."""
        z = self.hnet.encode(self.prop)
        theta = self.hnet.generate(z if rows is None else z[rows.to(z.device)])
        return torch.cat([theta, self.buffers.expand(len(theta), -1)], dim=1)

    def personalize(self, server_round: int, rows: torch.Tensor, config: ConfigRecord
                    ) -> tuple[torch.Tensor, ConfigRecord]:
        """theta_t = GH(h_t, A) for the sampled clients."""
        return self.generated(rows), config

    def sent_distances(self, rows: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """``||w - theta_t||``: GH has not changed since it generated what was sent."""
        return (vectors - self.generated(rows)).norm(dim=1)

    def state_dict(self) -> dict:
        """GH (embeddings, encoder, generator, heads), its optimizer and the pair sampler."""
        state = super().state_dict()
        if self.hnet is not None:
            state.update(hnet=self.hnet.state_dict(), optimizer=self.optimizer.state_dict(),
                         pair_gen=self.pair_gen.get_state())
        return state

    def load_state_dict(self, state: dict, initial_arrays) -> None:  # noqa: D102
        super().load_state_dict(state, initial_arrays)
        if "hnet" in state:
            self.hnet.load_state_dict(state["hnet"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.pair_gen.set_state(state["pair_gen"])

    def update(self, server_round: int, rows: torch.Tensor, trained: torch.Tensor) -> None:
        """K_s server steps of psi toward the trained models."""
        rows = rows.to(self.device)
        loss = 0.0
        for _ in range(self.server_steps):
            pairs = sample_pairs(self.adj, self.pair_gen) if self.use_generator else None
            loss = server_step(self.hnet, self.optimizer, self.prop, rows,
                               trained[:, : self.layout.num_params], self.adj, self.lambda_d, pairs,
                               self.server_clip)
        log(INFO, "Round %d: server step on %d clients, mean 1/2 ||theta - trained||^2 = %.4g",
            server_round, len(rows), loss)
        if not all(bool(torch.isfinite(p).all()) for p in self.hnet.parameters()):
            raise RuntimeError(
                f"round {server_round}: the hypernetwork's parameters are no longer finite after "
                f"{self.server_steps} server steps at lr {self.server_lr:g} (momentum "
                f"{self.server_momentum:g}): the steps are too large for this task; lower "
                f"panacea-server-lr or panacea-server-steps (the last checkpoint is intact)")

    def evaluation_models(self) -> torch.Tensor:
        """Every client's generated model (novel clients from their untrained embeddings)."""
        return self.generated()


def _panacea_kwargs(cfg: RunConfig, run: RunSetup, graph: bool, generator: bool) -> dict:
    if graph and run.adjacency is None:
        raise ValueError("run config 'graph' = 'none' is invalid for Panacea and Panacea-GN; "
                         "allowed: task, file, groups (pfedhn needs no graph)")
    return dict(adjacency=run.adjacency if graph else None, generator=generator,
                embed_dim=cfg.panacea_embed_dim, gnn_layers=cfg.panacea_gnn_layers,
                hidden=cfg.panacea_hidden, mlp_layers=cfg.panacea_mlp_layers,
                lambda_d=cfg.panacea_lambda_d, server_lr=cfg.panacea_server_lr,
                server_momentum=cfg.panacea_server_momentum,
                server_steps=cfg.panacea_server_steps, client_lr=cfg.panacea_client_lr,
                server_weight_decay=cfg.panacea_server_weight_decay,
                server_clip=cfg.panacea_server_clip, client_momentum=cfg.panacea_client_momentum,
                client_weight_decay=cfg.panacea_client_weight_decay,
                client_clip=cfg.panacea_client_clip, **personal_kwargs(cfg, run))


# pFedHN's reference trainer (Shamsian et al. 2021, github.com/AvivSham/pFedHN,
# experiments/pfedhn/trainer.py defaults): clients run 50 inner SGD steps at lr 5e-3 with
# momentum 0.9 and weight decay 5e-5, gradients clipped to norm 50; the hypernetwork takes
# one SGD step at lr 1e-2 (momentum 0.9, weight decay 1e-3), gradients clipped to norm 50.
PFEDHN_REFERENCE = {
    "local-steps": 50, "panacea-client-lr": 5e-3, "panacea-client-momentum": 0.9,
    "panacea-client-weight-decay": 5e-5, "panacea-client-clip": 50.0,
    "panacea-server-lr": 1e-2, "panacea-server-steps": 1,
    "panacea-server-weight-decay": 1e-3, "panacea-server-clip": 50.0,
}


@register_strategy("panacea", graph=True)
def _panacea(cfg: RunConfig, run: RunSetup) -> Panacea:
    return Panacea(**_panacea_kwargs(cfg, run, graph=True, generator=True))


@register_strategy("panacea-gn", graph=True)
def _panacea_gn(cfg: RunConfig, run: RunSetup) -> Panacea:
    return Panacea(**_panacea_kwargs(cfg, run, graph=True, generator=False))


@register_strategy("pfedhn", auto=PFEDHN_REFERENCE)
def _pfedhn(cfg: RunConfig, run: RunSetup) -> Panacea:
    return Panacea(**_panacea_kwargs(cfg, run, graph=False, generator=False))
