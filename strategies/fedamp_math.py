"""FedAMP's and HeurFedAMP's weights: pure functions on a stacked (m, d) tensor of
flattened models, tested on their own (``tests/test_weights.py``).

* :func:`fedamp_weights` (paper Eq. 6, with the attention-inducing function
  A(x) = 1 - exp(-x / sigma), whose derivative A'(x) = exp(-x / sigma) / sigma
  is used): xi_ij = alpha_k A'(||w_i - w_j||^2) for j != i and
  xi_ii = 1 - sum_{j != i} xi_ij; :func:`fedamp_weights_from_distances` from
  squared distances.
* :func:`heurfedamp_weights` (Eq. 8): xi_ii is a fixed self weight and
  xi_ij = (1 - xi_ii) softmax_{j != i}(sigma cos(w_i, w_j)).
* :func:`cloud_models`: u_i = sum_j xi_ij w_j (Eq. 6).
* :func:`median_sq_distance`: sigma from the data (the median heuristic).
* The squared distances, exact where a weight depends on them:
  :func:`fedamp_sq_distances` (a centred float32 Gram matrix with Higham and
  Mary's rounding bound, and float64 for the pairs whose error could move a
  weight by :data:`ROW_TOLERANCE`), :func:`gram64`, :func:`pairwise_sq_distances`.

The strategy that uses them is :mod:`strategies.fedamp`.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch


class RowsRescaledWarning(UserWarning):
    """Some rows' off-diagonal FedAMP weights summed above 1 and were rescaled (the strategy
    logs it as INFO: with the paper's alpha_k it is the rule, not a fault)."""


class WeightsUnderflowWarning(UserWarning):
    """All off-diagonal FedAMP weights underflowed to 0: training is purely local."""


# Columns of the models taken at a time when a Gram matrix is accumulated in float64: each
# block is converted in a buffer that stays in cache (100 clients x 2^13 columns: 6.5 MB).
GRAM_BLOCK = 1 << 13
# Columns per float32 Gram block (:func:`sq_distances_float32`): the blocks' float32 inner
# products are added in float64, so the rounding bound grows with sqrt(block), not sqrt(d);
# 4 times larger blocks would save about 10% of the time and double the bound.
FLOAT32_BLOCK = 1 << 11
# Higham and Mary's probabilistic bound on a float32 inner product of n terms (SIAM J. Sci.
# Comput. 41(5), 2019, Thm. 3.1): |error| <= lambda sqrt(n) u sum |x_k y_k| with probability
# at least 1 - 2 exp(-lambda^2 (1 - u)^2 / 2), u = 2^-24; lambda = 10: 1 - 4e-22 per sum.
ROUNDING_LAMBDA = 10.0
UNIT_ROUNDOFF_32 = 2.0 ** -24
# What the weights of one row may be off by, together, where distances come from float32:
# the largest possible errors of a row are recomputed in float64 until the rest sum below it.
ROW_TOLERANCE = 2.5e-7
# After a round whose float32 distances needed too many float64 pairs, FedAMP computes the
# next rounds' distances in float64 at once, and tries float32 again after this many.
FLOAT32_RETRY_ROUNDS = 10
# Pairs recomputed in float64 cost about as much as the whole float64 Gram matrix when they
# are 1 / this of all pairs (measured on a 2-core CPU: 100 pairs of 200,000 parameters took
# 91 ms, the Gram matrix of 100 such models 73 ms); beyond that, the Gram matrix is cheaper.
PAIRS_PER_GRAM = 128


def _block_buffer(models: torch.Tensor, block: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(models.shape[0], min(block, models.shape[1]), dtype=dtype,
                       device=models.device)


def gram64(models: torch.Tensor, centre: bool = False, block: int = GRAM_BLOCK) -> torch.Tensor:
    """The (m, m) Gram matrix ``X X^T`` of the (m, d) models, accumulated in float64.

    Column blocks of ``block`` are copied into one float64 buffer in turn (the
    models stay in their dtype), on the models' device; with ``centre``, the
    models are taken relative to the first one, w_i - w_0 (which leaves
    distances unchanged; the difference of two float32 numbers is exact in
    float64, and no pass over the models is needed for a mean).
    """
    m, d = models.shape
    gram = torch.zeros(m, m, dtype=torch.float64, device=models.device)
    buffer = _block_buffer(models, block, torch.float64)
    for start in range(0, d, block):
        x = buffer[:, :min(block, d - start)]
        x.copy_(models[:, start:start + block])
        if centre:
            x -= x[:1].clone()
        gram.addmm_(x, x.T)
    return gram


def _distances_from_gram(gram: torch.Tensor) -> torch.Tensor:
    sq = gram.diagonal().clamp_min(0.0)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min_(0.0)
    d2.fill_diagonal_(0.0)
    return d2


def pairwise_sq_distances(models: torch.Tensor, block: int = GRAM_BLOCK) -> torch.Tensor:
    """Return the (m, m) float64 matrix of ||w_i - w_j||^2 from one Gram matrix.

    ||w_i||^2 + ||w_j||^2 - 2 <w_i, w_j> on the models taken relative to the
    first one (distances do not change; the terms cancel less), the Gram matrix
    accumulated in float64 by column blocks (:func:`gram64`): exact to float64
    rounding however small sigma is against the distances. Clamped at 0, with
    an exact zero diagonal.
    """
    return _distances_from_gram(gram64(models, centre=True, block=block))


def sq_distances_float32(models: torch.Tensor, block: int = FLOAT32_BLOCK
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """||w_i - w_j||^2 from float32 Gram matrices (BLAS speed), and a bound on their error.

    The models are taken relative to the first one, c_i = w_i - w_0 (distances do
    not change; models trained from one start share most of their norm, which
    would otherwise cancel), and the Gram matrix of the c_i is the float64 sum of
    the float32 products of column blocks of ``block``. Returns the (m, m)
    float64 distances (clamped at 0, zero diagonal) and, per pair,
    ``(lambda sqrt(block) + 2) u (|c_i| + |c_j|)^2``: the error of ||c_i||^2 +
    ||c_j||^2 - 2 <c_i, c_j> when each block's float32 inner product is within
    Higham and Mary's probabilistic bound (:data:`ROUNDING_LAMBDA`; over the
    blocks, sum_k |x_k y_k| <= |x| |y|), plus the rounding of c_i itself.
    """
    m, d = models.shape
    x = models if models.dtype == torch.float32 else models.float()
    gram = torch.zeros(m, m, dtype=torch.float64, device=models.device)
    buffer = _block_buffer(x, block, torch.float32)
    product = torch.empty(m, m, dtype=torch.float32, device=models.device)
    for start in range(0, d, block):
        xb = buffer[:, :min(block, d - start)]
        torch.sub(x[:, start:start + block], x[:1, start:start + block], out=xb)
        gram += torch.mm(xb, xb.T, out=product)
    d2 = _distances_from_gram(gram)
    norms = gram.diagonal().clamp_min(0.0).sqrt()
    scale = (ROUNDING_LAMBDA * math.sqrt(min(block, d)) + 2.0) * UNIT_ROUNDOFF_32
    bound = scale * (norms[:, None] + norms[None, :]) ** 2
    bound.fill_diagonal_(0.0)
    return d2, bound


def exact_sq_distances(models: torch.Tensor, rows: torch.Tensor | slice,
                       cols: torch.Tensor | slice, chunk: int = 1 << 22) -> torch.Tensor:
    """||w_rows[k] - w_cols[k]||^2 for each pair k, accumulated in float64 (the difference taken
    in float64, so the result is exact to float64 rounding). ``rows`` and ``cols``: index
    tensors of the same length, or two slices of the same length (no copy of the rows)."""
    if isinstance(rows, slice) and isinstance(cols, slice):
        diff = models[rows].double() - models[cols].double()
        return torch.linalg.vector_norm(diff, dim=1).square()
    assert isinstance(rows, torch.Tensor) and isinstance(cols, torch.Tensor)
    out = torch.empty(len(rows), dtype=torch.float64, device=models.device)
    d = models.shape[1]
    per = max(1, chunk // max(d, 1))  # pairs at a time: at most ``chunk`` float64 values
    for start in range(0, len(rows), per):
        r, c = rows[start:start + per], cols[start:start + per]
        diff = models[r].double() - models[c].double()
        out[start:start + per] = torch.linalg.vector_norm(diff, dim=1).square()
    return out


def _weight_errors(d2: torch.Tensor, bound: torch.Tensor, alpha_k: float, sigma: float,
                   softmax: bool) -> torch.Tensor:
    """How far each weight could be off if each distance is off by at most its ``bound``.

    Eq. 6: w_ij = alpha_k exp(-d_ij / sigma) / sigma, off by at most
    w(d_ij - b_ij) (1 - exp(-2 b_ij / sigma)). With a fixed self weight the
    weights are a row's softmax of -d_ij / sigma, whose log is off by at most its
    own logit's error plus the largest of the row (through the normaliser): a
    weight at most its largest value (its logit at its lowest distance over the
    row's normaliser at every highest distance) times exp(that) - 1.
    """
    low = (d2 - bound).clamp_min(0.0)
    if not softmax:
        return alpha_k / sigma * torch.exp(-low / sigma) * -torch.expm1(-2.0 * bound / sigma)
    off = _off_diagonal(d2.shape[0], d2.device)
    minus_inf = torch.full_like(d2, -math.inf)
    normaliser = torch.logsumexp(torch.where(off, -(d2 + bound) / sigma, minus_inf), dim=1)
    largest = torch.exp(torch.clamp(-low / sigma - normaliser[:, None], max=0.0))
    logit_error = torch.where(off, 2.0 * bound / sigma, torch.zeros_like(d2))
    total = logit_error + logit_error.max(dim=1, keepdim=True).values
    return torch.where(off, largest * torch.expm1(torch.clamp(total, max=700.0)),
                       torch.zeros_like(d2))


class Distances(NamedTuple):
    """FedAMP's squared distances and how they were computed: ``path`` is ``float32`` (with
    ``recomputed`` pairs in float64) or ``float64`` (the whole matrix; ``recomputed`` is the
    pairs float32 would have needed, or -1 when it was not tried)."""

    d2: torch.Tensor
    path: str
    recomputed: int


def fedamp_sq_distances(models: torch.Tensor, alpha_k: float, sigma: float,
                        softmax: bool, try_float32: bool = True) -> Distances:
    """The (m, m) float64 ||w_i - w_j||^2 that FedAMP's weights need, exact where it matters.

    Float32 Gram matrices give every distance at BLAS speed
    (:func:`sq_distances_float32`), with a bound on how far each weight could
    be off (:func:`_weight_errors`). In each row the pairs with the largest
    such errors are recomputed from the models in float64
    (:func:`exact_sq_distances`) until the errors left sum to at most
    :data:`ROW_TOLERANCE` (so every weight, and 1 - the others, is within it;
    with a fixed self weight, every weight on its own). When that is more pairs
    than the float64 Gram matrix costs (:data:`PAIRS_PER_GRAM`: sigma small
    against the rounding of the distances, as with the paper's sigmas and
    trained models), the whole matrix is computed in float64
    (:func:`pairwise_sq_distances`) instead; ``try_float32=False`` goes there
    at once (a caller that saw float32 fail for these models). Four pairs are
    always checked against their float64 values: a float32 result outside its
    bound (rounding errors that do not behave at random) also falls back to
    float64.
    """
    m = models.shape[0]
    if m < 2:
        return Distances(torch.zeros(m, m, dtype=torch.float64, device=models.device), "float64", 0)
    if not try_float32:
        return Distances(pairwise_sq_distances(models), "float64", -1)
    d2, bound = sq_distances_float32(models)
    errors = _weight_errors(d2, bound, alpha_k, sigma, softmax)
    if softmax:  # the self weight is fixed: each weight on its own
        recompute = errors > ROW_TOLERANCE
    else:  # xi_ii = 1 - the others: what a row leaves in float32 adds up
        ordered, order = torch.sort(errors, dim=1)  # in each row, the errors left out grow
        recompute = torch.zeros_like(errors, dtype=torch.bool)
        recompute.scatter_(1, order, ordered.cumsum(dim=1) > ROW_TOLERANCE)
    recompute = torch.triu(recompute | recompute.T, diagonal=1)  # for either weight of a pair
    rows, cols = torch.nonzero(recompute, as_tuple=True)
    if len(rows) > m * m // PAIRS_PER_GRAM:
        return Distances(pairwise_sq_distances(models), "float64", len(rows))
    check = min(4, m - 1)
    exact = exact_sq_distances(models, slice(0, check), slice(1, check + 1))
    at = torch.arange(check, device=models.device)
    if bool(((exact - d2[at, at + 1]).abs() > bound[at, at + 1]).any()):
        return Distances(pairwise_sq_distances(models), "float64", len(rows))
    if len(rows):
        values = exact_sq_distances(models, rows, cols)
        d2[rows, cols] = values
        d2[cols, rows] = values
    return Distances(d2, "float32", len(rows))


def cloud_models(xi: torch.Tensor, models: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """u = xi @ W (paper Eq. 6): the (k, d) cloud models of k rows of weights xi (k, m) over
    the (m, d) models, in the models' dtype, into ``out`` when its shape fits (a buffer
    reused from round to round: writing 100 fresh rows of the CNN costs page faults)."""
    weights = xi.to(models.dtype)
    shape = (weights.shape[0], models.shape[1])
    if out is None or tuple(out.shape) != shape or out.dtype != models.dtype \
            or out.device != models.device:
        out = torch.empty(shape, dtype=models.dtype, device=models.device)
    return torch.mm(weights, models, out=out)


def _off_diagonal(m: int, device: torch.device) -> torch.Tensor:
    return ~torch.eye(m, dtype=torch.bool, device=device)


def fedamp_weights(models: torch.Tensor, alpha_k: float, sigma: float,
                   self_weight: float | torch.Tensor | None = None) -> torch.Tensor:
    """FedAMP message-passing weights (paper Eq. 6 with A'(x) = exp(-x/sigma)/sigma).

    Parameters
    ----------
    models : torch.Tensor
        (m, d) stacked flattened models, one row per client.
    alpha_k : float
        Step size alpha_k of round k (> 0).
    sigma : float
        Scale sigma of the attention-inducing function (> 0).
    self_weight : float | torch.Tensor | None
        None: Eq. 6's own rule, xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) /
        sigma for j != i and xi_ii = 1 - sum_{j != i} xi_ij. A number (or one
        per row, in [0, 1)): xi_ii is fixed (the appendix's 1 / (N_i + 1)) and
        the off-diagonal weights of row i, in the proportions of Eq. 6, sum to
        1 - xi_ii: xi_ij = (1 - xi_ii) softmax_{j != i}(-||w_i - w_j||^2 / sigma).

    Returns
    -------
    torch.Tensor
        (m, m) float64 matrix xi; row i holds the weights of u_i and is a
        convex combination.

    Deviations (numerical safeguards, not in the paper): under Eq. 6's rule,
    where a row's off-diagonal weights sum above 1, xi_ii would be negative;
    they are scaled to sum to 1 and xi_ii is set to 0, with a
    :class:`RowsRescaledWarning`. Where every off-diagonal weight underflows
    to 0 (sigma too small for the distances), FedAMP has become local
    training: a :class:`WeightsUnderflowWarning` gives the distances and
    sigma. With a fixed self weight the proportions are normalised in log
    space (a softmax), which cannot underflow; alpha_k cancels out.
    """
    _check_alpha_sigma(alpha_k, sigma)
    d2 = fedamp_sq_distances(models, alpha_k, sigma, softmax=self_weight is not None).d2
    return fedamp_weights_from_distances(d2, alpha_k, sigma, self_weight)


def _check_alpha_sigma(alpha_k: float, sigma: float) -> None:
    if alpha_k <= 0 or sigma <= 0:
        raise ValueError(f"alpha_k and sigma must be > 0, got alpha_k={alpha_k}, sigma={sigma}")


def fedamp_weights_from_distances(d2: torch.Tensor, alpha_k: float, sigma: float,
                                  self_weight: float | torch.Tensor | None = None
                                  ) -> torch.Tensor:
    """:func:`fedamp_weights` from the (m, m) float64 squared distances ``d2`` (zero
    diagonal), as :func:`fedamp_sq_distances` gives them."""
    _check_alpha_sigma(alpha_k, sigma)
    m = d2.shape[0]
    off = _off_diagonal(m, d2.device)
    if self_weight is not None:
        return _with_self_weight(torch.where(off, -d2 / sigma, torch.full_like(d2, float("-inf"))),
                                 self_weight)
    xi = torch.where(off, alpha_k * torch.exp(-d2 / sigma) / sigma, torch.zeros_like(d2))
    row_sum = xi.sum(dim=1)
    over = row_sum > 1.0
    if bool(over.any()):
        xi[over] = xi[over] / row_sum[over, None]
        warnings.warn(
            f"{int(over.sum())} of {m} rows had off-diagonal weights summing above 1 "
            f"(max {float(row_sum.max()):.3g}); rescaled to 1 with xi_ii = 0",
            RowsRescaledWarning, stacklevel=3,
        )
    if m > 1 and not bool((xi[off] > 0).any()):
        dist = d2[off]
        warnings.warn(
            f"all off-diagonal FedAMP weights underflowed to 0: squared distances "
            f"{float(dist.min()):.4g}..{float(dist.max()):.4g} with sigma={sigma:g} "
            f"(exp(-d/sigma) = 0); every client trains alone. Increase fedamp-sigma.",
            WeightsUnderflowWarning, stacklevel=3,
        )
    xi.diagonal().copy_((1.0 - xi.sum(dim=1)).clamp_min(0.0))
    return xi


def _with_self_weight(logits: torch.Tensor, self_weight: float | torch.Tensor) -> torch.Tensor:
    """xi from off-diagonal ``logits`` (-inf on the diagonal) and a fixed self weight per row:
    xi_ii = s_i, xi_ij = (1 - s_i) softmax_j(logits_ij) (s_i = 1: a client alone in its
    group keeps its own model). One client: xi = [[1]]."""
    m = logits.shape[0]
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64, device=logits.device)
    s = torch.as_tensor(self_weight, dtype=torch.float64, device=logits.device).expand(m)
    if bool(((s < 0) | (s > 1)).any()):
        raise ValueError(f"self weights must be in [0, 1], got {s.tolist()}")
    xi = (1.0 - s)[:, None] * torch.softmax(logits.double(), dim=1)
    xi.diagonal().copy_(s)
    return xi


def heurfedamp_weights(models: torch.Tensor, sigma: float,
                       self_weight: float | torch.Tensor) -> torch.Tensor:
    """HeurFedAMP message-passing weights (paper Eq. 8).

    Parameters
    ----------
    models : torch.Tensor
        (m, d) stacked flattened models, one row per client.
    sigma : float
        Scale of the cosine similarities in the softmax (> 0).
    self_weight : float | torch.Tensor
        xi_ii, in [0, 1) (one number, or one per row).

    Returns
    -------
    torch.Tensor
        (m, m) float64 matrix: xi_ii = self_weight and, for j != i,
        xi_ij = (1 - self_weight) exp(sigma cos(w_i, w_j)) /
        sum_{h != i} exp(sigma cos(w_i, w_h)). With a single client xi = [[1]].
        Cosines come from one Gram matrix accumulated in float64
        (:func:`gram64`); the softmax is taken in float64 (max-subtracted). A
        zero model has cosine 0 with every other.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    m = models.shape[0]
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64, device=models.device)
    gram = gram64(models)
    norms = gram.diagonal().clamp_min(0.0).sqrt().clamp_min(1e-12)
    cos = gram / norms[:, None] / norms[None, :]
    off = _off_diagonal(m, cos.device)
    return _with_self_weight(torch.where(off, sigma * cos, torch.full_like(cos, float("-inf"))),
                             self_weight)


def median_sq_distance(models: torch.Tensor) -> float:
    """The median of the m (m - 1) / 2 squared distances ``||w_i - w_j||^2`` (i < j) between
    the rows of ``models`` (the mean of the two middle ones for an even count), in float64:
    the median heuristic of kernel methods, FedAMP's sigma from the data
    (``fedamp-sigma-rule``). 0 for fewer than two rows."""
    m = models.shape[0]
    if m < 2:
        return 0.0
    d2 = pairwise_sq_distances(models)
    upper = torch.triu_indices(m, m, offset=1, device=d2.device)
    return float(torch.quantile(d2[upper[0], upper[1]].double(), 0.5))



def median_cosine_distance(models: torch.Tensor) -> float:
    """The median of the m (m - 1) / 2 cosine distances ``1 - cos(w_i, w_j)`` (i < j) between
    the rows of ``models``, in float64 (a zero row has cosine 0 with every other). HeurFedAMP's
    weights ``exp(sigma cos) / sum exp(sigma cos)`` equal ``exp(-(1 - cos) / s)`` normalised,
    with s = 1 / sigma: the median heuristic sets s to this median, sigma to its inverse
    (``fedamp-sigma-rule``). 0 for fewer than two rows."""
    m = models.shape[0]
    if m < 2:
        return 0.0
    gram = gram64(models)
    norms = gram.diagonal().clamp_min(0.0).sqrt().clamp_min(1e-12)
    cos = gram / norms[:, None] / norms[None, :]
    upper = torch.triu_indices(m, m, offset=1, device=cos.device)
    return float(torch.quantile(1.0 - cos[upper[0], upper[1]], 0.5))
