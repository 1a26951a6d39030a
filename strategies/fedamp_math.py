"""FedAMP's and HeurFedAMP's weights: pure functions on a stacked (m, d) tensor of
flattened models, in float64, tested on their own against values worked by hand
(``tests/test_weights.py``).

* :func:`fedamp_weights` (Eq. 6, attention-inducing function A(x) = 1 - exp(-x / sigma),
  A'(x) = exp(-x / sigma) / sigma): xi_ij = alpha_k A'(||w_i - w_j||^2) for j != i,
  xi_ii = 1 - sum_{j != i} xi_ij, from squared distances (:func:`pairwise_sq_distances`).
* :func:`heurfedamp_weights` (Eq. 8): xi_ii fixed,
  xi_ij = (1 - xi_ii) softmax_{j != i}(sigma cos(w_i, w_j)).
* :func:`cloud_models`: u_i = sum_j xi_ij w_j (Eq. 6).
* :func:`median_sq_distance`, :func:`median_cosine_distance`: sigma from the data.

Pairs kept apart (``apart``, boolean (m, m): a collaboration policy, not in the paper) weigh
each other 0: Eq. 6's xi_ii stays 1 - the others; a fixed self weight's softmax is over the
pairs allowed (a row with none keeps its own model).

What the weights' numerical safeguards did is returned as :class:`Flags`, not raised.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# Columns taken at a time when a Gram matrix is accumulated in float64: each block is
# converted in a buffer that stays in cache (100 clients x 2^13 columns: 6.5 MB).
GRAM_BLOCK = 1 << 13


class Flags(NamedTuple):
    """What the safeguards of :func:`fedamp_weights` did (not in the paper).

    ``rows``: of xi; ``rescaled_rows``: rows whose off-diagonal Eq. 6 weights summed above 1
    (:func:`fedamp_weights`), ``largest_row_sum`` the largest sum; ``underflow``: every
    off-diagonal weight is 0 (sigma too small for the squared distances, ``smallest`` to
    ``largest``): every client trains alone."""

    rows: int = 0
    rescaled_rows: int = 0
    largest_row_sum: float = 0.0
    underflow: bool = False
    smallest: float = 0.0
    largest: float = 0.0


def gram64(models: torch.Tensor, centre: bool = False, block: int = GRAM_BLOCK) -> torch.Tensor:
    """The (m, m) Gram matrix ``X X^T`` of the (m, d) models, accumulated in float64 by
    column blocks copied into one float64 buffer (the models stay in their dtype, on their
    device). ``centre``: of w_i - w_0, which leaves distances unchanged and cancels less
    (the difference of two float32 numbers is exact in float64)."""
    m, d = models.shape
    gram = torch.zeros(m, m, dtype=torch.float64, device=models.device)
    buffer = torch.empty(m, min(block, d), dtype=torch.float64, device=models.device)
    for start in range(0, d, block):
        x = buffer[:, :min(block, d - start)]
        x.copy_(models[:, start:start + block])
        if centre:
            x -= x[:1].clone()
        gram.addmm_(x, x.T)
    return gram


def pairwise_sq_distances(models: torch.Tensor, block: int = GRAM_BLOCK) -> torch.Tensor:
    """The (m, m) float64 ||w_i - w_j||^2 = ||c_i||^2 + ||c_j||^2 - 2 <c_i, c_j> from one
    centred Gram matrix (:func:`gram64`), clamped at 0, with an exact zero diagonal."""
    gram = gram64(models, centre=True, block=block)
    sq = gram.diagonal().clamp_min(0.0)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min_(0.0)
    d2.fill_diagonal_(0.0)
    return d2


def cosines(models: torch.Tensor) -> torch.Tensor:
    """The (m, m) float64 cos(w_i, w_j) from one Gram matrix; a zero model has cosine 0."""
    gram = gram64(models)
    norms = gram.diagonal().clamp_min(0.0).sqrt().clamp_min(1e-12)
    return gram / norms[:, None] / norms[None, :]


def cloud_models(xi: torch.Tensor, models: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """u = xi @ W (Eq. 6): the (k, d) cloud models of k rows of weights xi (k, m) over the
    (m, d) models, in the models' dtype, into ``out`` when it fits (a buffer reused from
    round to round: writing 100 fresh rows of the CNN costs page faults)."""
    weights, shape = xi.to(models.dtype), (xi.shape[0], models.shape[1])
    if out is None or (tuple(out.shape), out.dtype, out.device) != (shape, models.dtype,
                                                                    models.device):
        out = torch.empty(shape, dtype=models.dtype, device=models.device)
    return torch.mm(weights, models, out=out)


def _allowed(m: int, device: torch.device, apart: torch.Tensor | None) -> torch.Tensor:
    """The pairs i != j that may weigh each other: all but ``apart``'s (boolean (m, m))."""
    if apart is not None and (apart.shape != (m, m) or apart.dtype != torch.bool):
        raise ValueError(f"apart must be a boolean ({m}, {m}) matrix, got {apart.dtype}")
    off = ~torch.eye(m, dtype=torch.bool, device=device)
    return off if apart is None else off & ~apart.to(device)


def fedamp_weights(models: torch.Tensor, alpha_k: float, sigma: float,
                   self_weight: float | torch.Tensor | None = None,
                   apart: torch.Tensor | None = None) -> tuple[torch.Tensor, Flags]:
    """FedAMP's message-passing weights (Eq. 6 with A'(x) = exp(-x / sigma) / sigma).

    ``models``: (m, d), one flattened model per row; ``alpha_k`` > 0: the step size of
    round k; ``sigma`` > 0. ``self_weight`` None: Eq. 6's own rule,
    xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma for j != i and
    xi_ii = 1 - sum_{j != i} xi_ij. A number (or one per row) in [0, 1]: xi_ii is fixed (the
    appendix's 1 / (N_i + 1)) and row i's off-diagonal weights, in Eq. 6's proportions, sum
    to 1 - xi_ii: xi_ij = (1 - xi_ii) softmax_{j != i}(-||w_i - w_j||^2 / sigma). ``apart``
    as the module says. Returns the (m, m) float64 xi (rows convex) and the :class:`Flags`.

    Deviations (not in the paper): a row whose off-diagonal weights sum above 1 (xi_ii
    would be negative) counts the own model as Eq. 6 counts one at distance 0 (alpha_k /
    sigma): xi_ij = e_ij / (1 + sum_l e_il), xi_ii = 1 / (1 + sum_l e_il) >= 1 / m, e_ij =
    exp(-||w_i - w_j||^2 / sigma); where every off-diagonal weight underflows to 0, FedAMP
    has become local training (flagged). With a fixed self weight
    the proportions are a softmax in log space, which cannot underflow; alpha_k cancels out.
    """
    if alpha_k <= 0 or sigma <= 0:
        raise ValueError(f"alpha_k and sigma must be > 0, got alpha_k={alpha_k}, sigma={sigma}")
    d2 = pairwise_sq_distances(models)
    m = d2.shape[0]
    off = _allowed(m, d2.device, apart)
    if self_weight is not None:
        logits = torch.where(off, -d2 / sigma, torch.full_like(d2, float("-inf")))
        return _with_self_weight(logits, self_weight), Flags(m)
    xi = torch.where(off, alpha_k * torch.exp(-d2 / sigma) / sigma, torch.zeros_like(d2))
    row_sum = xi.sum(dim=1)
    over = row_sum > 1.0
    own = alpha_k / sigma  # alpha_k A'(0): the weight Eq. 6 gives a model at distance 0
    xi[over] = xi[over] / (row_sum[over, None] + own)
    underflow = bool(off.any()) and not bool((xi[off] > 0).any())
    xi.diagonal().copy_((1.0 - xi.sum(dim=1)).clamp_min(0.0))
    if not off.any():
        return xi, Flags(m)
    dist = d2[off]
    return xi, Flags(m, int(over.sum()), float(row_sum.max()), underflow,
                     float(dist.min()), float(dist.max()))


def _with_self_weight(logits: torch.Tensor, self_weight: float | torch.Tensor) -> torch.Tensor:
    """xi from off-diagonal ``logits`` (-inf on the diagonal and for pairs kept apart) and a
    fixed self weight per row: xi_ii = s_i, xi_ij = (1 - s_i) softmax_j(logits_ij) (s_i = 1,
    or a row of -inf: the client keeps its own model). One client: xi = [[1]]."""
    m = logits.shape[0]
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64, device=logits.device)
    s = torch.as_tensor(self_weight, dtype=torch.float64, device=logits.device).expand(m)
    if bool(((s < 0) | (s > 1)).any()):
        raise ValueError(f"self weights must be in [0, 1], got {s.tolist()}")
    alone = torch.isneginf(logits).all(dim=1)
    logits = torch.where(alone[:, None], torch.zeros_like(logits), logits.double())
    xi = (1.0 - s)[:, None] * torch.softmax(logits, dim=1)
    xi[alone] = 0.0
    xi.diagonal().copy_(torch.where(alone, torch.ones_like(s), s))
    return xi


def heurfedamp_weights(models: torch.Tensor, sigma: float,
                       self_weight: float | torch.Tensor,
                       apart: torch.Tensor | None = None) -> torch.Tensor:
    """HeurFedAMP's message-passing weights (Eq. 8): the (m, m) float64 xi with
    xi_ii = ``self_weight`` (in [0, 1], one number or one per row) and, for j != i,
    xi_ij = (1 - xi_ii) exp(sigma cos(w_i, w_j)) / sum_{h != i} exp(sigma cos(w_i, w_h)),
    ``sigma`` > 0. The cosines from one float64 Gram matrix (:func:`cosines`), the softmax
    in float64 (max-subtracted); ``apart`` as the module says. One client: xi = [[1]]."""
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    m = models.shape[0]
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64, device=models.device)
    cos = cosines(models)
    off = _allowed(m, cos.device, apart)
    return _with_self_weight(torch.where(off, sigma * cos, torch.full_like(cos, float("-inf"))),
                             self_weight)


def _median_above_diagonal(matrix: torch.Tensor) -> float:
    m = matrix.shape[0]
    upper = torch.triu_indices(m, m, offset=1, device=matrix.device)
    return float(torch.quantile(matrix[upper[0], upper[1]].double(), 0.5))


def median_sq_distance(models: torch.Tensor) -> float:
    """The median of the m (m - 1) / 2 squared distances ``||w_i - w_j||^2`` (i < j), in
    float64 (the mean of the two middle ones for an even count): the median heuristic of
    kernel methods, FedAMP's sigma from the data (``fedamp-sigma-rule``). 0 for m < 2."""
    return _median_above_diagonal(pairwise_sq_distances(models)) if len(models) > 1 else 0.0


def median_cosine_distance(models: torch.Tensor) -> float:
    """The median of the m (m - 1) / 2 cosine distances ``1 - cos(w_i, w_j)`` (i < j), in
    float64. HeurFedAMP's ``exp(sigma cos)`` normalised equals ``exp(-(1 - cos) / s)``
    normalised with s = 1 / sigma: the median heuristic sets s to this median, sigma to its
    inverse (``fedamp-sigma-rule``). 0 for m < 2."""
    return _median_above_diagonal(1.0 - cosines(models)) if len(models) > 1 else 0.0
