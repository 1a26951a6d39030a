"""The graph hypernetwork of Panacea (and Panacea-GN, pFedHN) and its server step.

The server-side model psi = {psi_e, psi_m} generates every client's model:

    z = E(h^(0), A)          client embeddings h^(0) through a GCN encoder E
    theta_t = M(z_t)         an MLP with one output head per target tensor

psi_e = {h^(0), E} (and the graph generator D), psi_m = M. The graph
generator D scores a client pair by s(f(z_u)^T f(z_v)) (f an MLP, s the
sigmoid) and adds the reconstruction loss

    L_d = E_{u,v}[-A_uv log s(.) - (1 - A_uv) log(1 - s(.))]

with weight lambda_d, to psi_e's update only. :func:`server_step` is one
update of psi toward the clients' trained models (the strategy that uses it,
with its deviations from the paper, is :mod:`strategies.panacea`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn


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
        vector (:class:`strategies.core.layout.FlatLayout`); the output is their concatenation.
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

    def encoder_parameters(self) -> list[torch.Tensor]:
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


def head_gradients(heads: Sequence[nn.Linear], features: torch.Tensor, trained: torch.Tensor
                   ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The backward of the model term through M's heads, written out: they are linear
    (theta_h = F W_h^T + b_h), so with R_h = (theta_h - trained_h) / k over the k rows of
    ``features`` F, the gradients of the mean of 1/2 ||theta_t - trained_t||^2 are
    R_h^T F for W_h, R_h's column sums for b_h, and sum_h R_h W_h for F.

    Returns
    -------
    tuple
        Each head's weight and bias gradient (in ``heads``' order), F's gradient, and that
        loss (a float64 scalar tensor, on F's device: read once the step is queued). A head
        at a time: no (k, d) theta and no copy of it (the residual is made in its head's
        output, in place), the products autograd's ``AddmmBackward`` would run.
    """
    f, k = features.detach(), len(features)
    width = sum(head.out_features for head in heads)
    if tuple(trained.shape) != (k, width):  # as theta - trained would have refused it
        raise ValueError(f"trained models of shape {tuple(trained.shape)}; the heads make "
                         f"({k}, {width})")
    grad_f = torch.zeros_like(f)
    grads: list[torch.Tensor] = []
    squares, start = f.new_zeros((), dtype=torch.float64), 0  # one sync, at the end
    with torch.no_grad():
        for head in heads:  # a loop over M's heads (one per tensor of the client's model)
            end = start + head.out_features
            r = torch.addmm(head.bias, f, head.weight.t()).sub_(trained[:, start:end])
            squares += r.square().sum().double()  # (torch's CPU dot: 1e-5 off at this size)
            r.div_(k)
            grads += [r.t() @ f, r.sum(dim=0)]
            grad_f.addmm_(r, head.weight)
            start = end
    return grads, grad_f, squares / (2 * k)


def _model_term(hnet: GraphHyperNetwork, z: torch.Tensor, trained: torch.Tensor,
                params: Sequence[torch.Tensor], retain: bool
                ) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Each of ``params``' gradient of the model term at embeddings ``z`` (None where it has
    none), and the term: M's heads by :func:`head_gradients`, the rest by autograd."""
    features = hnet.mlp(z)
    heads = [cast(nn.Linear, head) for head in hnet.heads]
    head_grads, grad_features, loss = head_gradients(heads, features, trained)
    of_heads = dict(zip((id(p) for head in heads for p in (head.weight, head.bias)), head_grads))
    body = [p for p in params if id(p) not in of_heads]
    # a scalar whose gradient at the features is grad_features: autograd's backward of M
    # and E from there (a scalar output, so that torch checks no grad_outputs' shapes)
    raw: Sequence[torch.Tensor | None] = [None] * len(body)
    if body and features.requires_grad:  # (M and E frozen: nothing to take back)
        raw = torch.autograd.grad((features * grad_features).sum(), body, allow_unused=True,
                                  retain_graph=retain)
    of_body = dict(zip((id(p) for p in body), raw))
    return [of_heads[id(p)] if id(p) in of_heads else of_body[id(p)] for p in params], loss


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
    losses: dict[str, float] | None = None,
) -> float:
    """One update of psi toward the clients' trained models.

    The gradient of the model term is that of ``torch.autograd.grad(theta, psi,
    grad_outputs=(theta - trained) / k)`` over the k rows (the gradient of the mean of
    1/2 ||theta_t - trained_t||^2): through M's linear heads written out
    (:func:`head_gradients`: no (k, d) theta is built, which at 207 clients of a
    25,793-value model is 21 MB a step, twice), then by autograd from the heads' input
    through M and E; with a graph generator, ``lambda_d * grad L_d`` is added to psi_e's
    gradients; with ``clip_norm`` > 0 the gradients' total norm is clipped to it (pFedHN's
    reference trainer: 50). (``test_server_step_uses_autograd_grad_with_the_residual``
    holds it to plain autograd.)

    Returns
    -------
    float
        The mean over rows of 1/2 ||theta_t - trained_t||^2 before the step; with
        ``losses``, that loss goes there as ``model`` and the graph reconstruction loss L_d
        as ``graph`` (where the generator has a term).
    """
    params = [p for p in hnet.parameters() if p.requires_grad]
    z = hnet.encode(prop)
    raw, model_loss = _model_term(hnet, z[rows], trained, params,
                                  retain=hnet.generator is not None and lambda_d > 0)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, raw)]
    if hnet.generator is not None and lambda_d > 0 and adj is not None and pairs is not None:
        loss_d = graph_reconstruction_loss(hnet.generator(z), adj, pairs)
        if losses is not None:
            losses["graph"] = float(loss_d.detach())
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
    loss = float(model_loss)  # read here, the step queued (on a GPU: its one sync)
    if losses is not None:
        losses["model"] = loss
    return loss
