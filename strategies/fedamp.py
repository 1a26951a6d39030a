"""FedAMP and HeurFedAMP (Huang et al., "Personalized Cross-Silo Federated
Learning on Non-IID Data", AAAI 2021).

The server keeps every client's latest personalized model w_i. In round k each
sampled client i receives its cloud model

    u_i = sum_j xi_ij w_j                                   (paper Eq. 6)

a convex combination of all clients' models, and trains from u_i on
F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2               (paper Eq. 7)

The weights are pure functions on a stacked (m, d) tensor of flattened models,
tested on their own, in :mod:`strategies.fedamp_math`: :func:`fedamp_weights`
(Eq. 6 with the attention-inducing function A(x) = 1 - exp(-x / sigma)) and
:func:`heurfedamp_weights` (Eq. 8).

Which tensors the distances use: the trainable parameters only (the first
``layout.num_params`` entries of the flat vector, see
:class:`strategies.core.layout.FlatLayout`); the mix u_i covers every floating-point
tensor of the state dict, batch-norm running statistics included. Integer
tensors (batch-norm counters) are taken from the initial model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO, WARNING

import torch
from flwr.app import ConfigRecord
from flwr.supercore import log

from .core.base import PersonalizedStrategy
from .core.registry import RunSetup, personal_kwargs, register_strategy
from .core.settings import (
    MOST_ROUNDS,
    Settings,
    SettingsContext,
    bad,
    integer_in,
    setting,
)
from .fedamp_math import (
    FLOAT32_RETRY_ROUNDS,
    RowsRescaledWarning,
    WeightsUnderflowWarning,
    cloud_models,
    fedamp_sq_distances,
    fedamp_weights_from_distances,
    heurfedamp_weights,
    median_cosine_distance,
    median_sq_distance,
)
from .flower import PROXIMAL, PROXIMAL_MU

OFFLINE_CHOICES = ("exclude", "include")
#: how fedamp-sigma and heurfedamp-sigma = "auto" are chosen: the paper's value where it
#: has one, else from the data ("paper"); from the data always ("data")
SIGMA_RULES = ("paper", "data")


class FedAMP(PersonalizedStrategy):
    """FedAMP: attentive message passing between personalized models.

    Client contract: train messages name ``proximal`` (the client half of
    FedProx, :class:`strategies.flower.ProximalTraining`) and carry the cloud
    model u_i and ``proximal-mu`` = lambda / alpha_k; the client trains from
    u_i with that proximal term and replies its model w_i. Evaluate messages
    carry the client's stored w_i, tested as received.

    Parameters
    ----------
    settings : FedAMPSettings | None
        The method's keys (alpha_k and its decay, lambda, ``fedamp-offline-clients``:
        "exclude", only this round's training clients collaborate, "include", every
        training client's latest model (see :meth:`collaboration`); the self weight
        of :attr:`method`); None: their declared defaults.
    sigma : float | None (default: None)
        sigma of A'(x) = exp(-x / sigma) / sigma, resolved from the settings for
        the run's task (paper: MNIST 100, FMNIST 10, EMNIST 10, CIFAR-100 1e6). None:
        from the data, the median of the squared distances between the models the
        clients trained in the first round with replies
        (:func:`strategies.fedamp_math.median_sq_distance`), fixed for the run
        (recorded in the history's ``notes``, checkpointed); until then every
        stored model is the initial one and each client's cloud model is its own.
        The self weight (``fedamp-self-weight``): None, Eq. 6's
        xi_ii = 1 - sum_j xi_ij; a number in [0, 1): that xi_ii, the off-diagonal
        weights scaled to 1 - xi_ii; "paper": the appendix's xi_ii = 1 / (N_i + 1),
        N_i the other clients of i's group (``groups``) in the round's mix.
    groups : Sequence[int] | None
        Group of every client id (same-distribution clients), for "paper".
    **kwargs
        Passed to :class:`strategies.core.base.PersonalizedStrategy` (fraction_train,
        param_keys, device, seed).
    """

    client_update = PROXIMAL
    method = "fedamp"  # whose keys (sigma, self weight) are this strategy's

    def __init__(self, settings: FedAMPSettings | None = None, *, sigma: float | None = None,
                 groups: Sequence[int] | None = None, **kwargs) -> None:
        s = FedAMPSettings() if settings is None else settings
        super().__init__(**kwargs)
        self.self_weight = s.self_weight(self.method)
        if self.self_weight == "paper" and groups is None:  # the run config's check needs groups
            raise ValueError('self weight "paper" (1 / (N_i + 1)) needs the clients\' groups')
        self.groups = None if groups is None else torch.as_tensor(list(groups), dtype=torch.long)
        self.alpha_k = s.fedamp_alpha_k
        self.alpha_decay = s.fedamp_alpha_decay
        self.alpha_decay_every = s.fedamp_alpha_decay_every
        self.lam = s.fedamp_lambda
        self.sigma = sigma
        self.offline_clients = s.fedamp_offline_clients
        self._underflow_warned = False
        self._rescaled_rounds: list[int] = []  # rounds whose rows were rescaled
        self._rescaling = False  # the last round's rows were rescaled
        self._round_xi: torch.Tensor | None = None
        self._clouds: torch.Tensor | None = None  # reused: a fresh one costs page faults
        self._float32_from = 1  # the first round whose distances try float32 (weights())

    def summary(self) -> None:
        super().summary()
        own = ("1 - the others (Eq. 6)" if self.self_weight is None else
               "1 / (N_i + 1) (the appendix)" if self.self_weight == "paper" else
               f"{self.self_weight:g}")
        sigma = "from the data (round 1)" if self.sigma is None else f"{self.sigma:g}"
        log(INFO, "\t└── alpha_k %g (x%g every %d rounds), lambda %g, sigma %s, self weight %s",
            self.alpha_k, self.alpha_decay, self.alpha_decay_every, self.lam, sigma, own)

    def alpha_at(self, server_round: int) -> float:
        """alpha_k of round ``server_round`` (1-based)."""
        return self.alpha_k * self.alpha_decay ** ((server_round - 1) // self.alpha_decay_every)

    def weights(self, server_round: int, params: torch.Tensor,
                self_weight: float | torch.Tensor | None) -> torch.Tensor:
        """The (m, m) weights xi of this round from the clients' parameters.

        Where float32 distances could not give exact weights (too many pairs to
        recompute: sigma small against the distances), the next
        :data:`FLOAT32_RETRY_ROUNDS` rounds go to float64 at once instead of
        trying float32 first; the weights are exact either way.
        """
        if self.sigma is None:  # no model trained yet: every client's is the initial one
            return torch.eye(params.shape[0], dtype=torch.float64, device=params.device)
        alpha = self.alpha_at(server_round)
        dist = fedamp_sq_distances(params, alpha, self.sigma, softmax=self_weight is not None,
                                   try_float32=server_round >= self._float32_from)
        if dist.path == "float64" and dist.recomputed >= 0:  # float32 tried, not enough
            self._float32_from = server_round + FLOAT32_RETRY_ROUNDS
        return fedamp_weights_from_distances(dist.d2, alpha, self.sigma, self_weight)

    def self_weights(self, active: torch.Tensor) -> float | torch.Tensor | None:
        """xi_ii of the clients in rows ``active``: the fixed number, or "paper"'s
        1 / (N_i + 1), N_i the other clients of i's group among ``active``."""
        if self.self_weight != "paper":
            assert not isinstance(self.self_weight, str), "a number, 'paper' or None"
            return self.self_weight
        assert self.groups is not None  # checked in __init__
        ids = torch.as_tensor(self.client_ids, dtype=torch.long)[active.cpu()]
        group = self.groups[ids]
        return 1.0 / torch.bincount(group)[group].double()

    def personalize(self, server_round: int, rows: torch.Tensor, config: ConfigRecord
                    ) -> tuple[torch.Tensor, ConfigRecord]:
        """Cloud models u_i = sum_j xi_ij w_j of the sampled clients, and lambda / alpha_k."""
        xi = self.collaboration(server_round, rows)
        self.history.record_xi(server_round, self.client_ids, xi)
        self._round_xi = xi
        self._clouds = cloud_models(xi[rows.to(xi.device)], self.store, self._clouds)
        clouds = self._clouds
        cfg = ConfigRecord(dict(config))
        cfg[PROXIMAL_MU] = self.lam / self.alpha_at(server_round)
        return clouds, cfg

    def new_client_model(self) -> torch.Tensor:
        """A client that joins after the start (a new member) starts from the mean of the
        training clients' models, so that its first cloud model u_i comes from the others
        (the paper has no late joiners; with the initial model, far from every trained one,
        Eq. 6 would give it weight 1 on itself)."""
        return self.store[self.training_rows.to(self.store.device)].mean(dim=0)

    def sent_distances(self, rows: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """``||w - u_i||`` from this round's xi and the store (the cloud models are not kept):
        ``||w||^2 - 2 sum_j xi_ij <w, w_j> + ||u_i||^2``.

        In the models' dtype (one matrix product; float32 for the CNN): the result only
        feeds the update-norm bound (``max-update-ratio``, 100x by default), where a
        relative error of 1e-3 in a small distance does not matter.
        """
        assert self._round_xi is not None, "personalize() sets this round's xi first"
        xi = self._round_xi[rows.to(self._round_xi.device)].to(vectors.device, vectors.dtype)
        wu = ((vectors @ self.store.T) * xi).sum(dim=1)
        ww = torch.linalg.vector_norm(vectors, dim=1).square()
        uu = self._sent_norms[rows].to(vectors.device, vectors.dtype).square()
        return (ww - 2.0 * wu + uu).clamp_min(0.0).sqrt()

    def collaboration(self, server_round: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The (n, n) weights xi of this round over all clients.

        With ``offline_clients`` = "exclude" only the clients that train in
        this round (``rows``: sampled, connected, not dropped out) collaborate,
        the paper's "collaborations among online clients" (its dropped-clients
        experiment); with "include" every training client's latest model takes
        part. Clients outside the mix (novel clients, which never train, and
        excluded ones) have identity rows and zero columns in the other rows,
        so their models never enter a cloud model.
        """
        n, p = len(self.client_ids), self.flat.num_params
        active = self.training_rows if self.offline_clients == "include" or rows is None else rows
        active = active.to(self.store.device)
        params = self.store[:, :p] if len(active) == n else self.store[active, :p]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xi_active = self.weights(server_round, params, self.self_weights(active))
        self._log_warnings(server_round, caught)
        if len(active) == n:
            return xi_active
        xi = torch.eye(n, dtype=xi_active.dtype, device=xi_active.device)
        xi[active[:, None], active[None, :]] = xi_active
        return xi

    def update(self, server_round: int, rows: torch.Tensor, vectors: torch.Tensor) -> None:
        """Store the replies (:meth:`PersonalizedStrategy.update`); without a sigma, choose
        it now from the models just trained (at least two, not all the same)."""
        super().update(server_round, rows, vectors)
        if self.sigma is not None or len(rows) < 2:
            return
        sigma = self.data_sigma(self.store[rows.to(self.store.device), :self.flat.num_params])
        if not sigma > 0 or not math.isfinite(sigma):
            return
        self.sigma = sigma
        note = {"value": sigma, "round": server_round, "clients": len(rows),
                "rule": self.DATA_RULE + " (fedamp-sigma-rule)"}
        self.history.notes[f"{self.method}_sigma"] = note
        log(INFO, "%s-sigma from the data: %.6g, %s, over the %d pairs of the %d models trained "
            "in round %d; fixed for the run", self.method, sigma, self.DATA_RULE,
            len(rows) * (len(rows) - 1) // 2, len(rows), server_round)

    DATA_RULE = "the median of the squared distances between the models the clients trained"

    def data_sigma(self, models: torch.Tensor) -> float:
        """sigma from the models the clients trained (the median heuristic of kernel methods):
        the median of their squared distances, the scale of exp(-d / sigma)."""
        return median_sq_distance(models)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sigma": self.sigma,
                "underflow_warned": self._underflow_warned,
                "rescaled_rounds": list(self._rescaled_rounds),
                "rescaling": self._rescaling, "float32_from": self._float32_from}

    def load_state_dict(self, state: dict, initial_arrays) -> None:
        super().load_state_dict(state, initial_arrays)
        self._underflow_warned = bool(state.get("underflow_warned", False))
        if self.sigma is None and state.get("sigma") is not None:  # chosen from the data
            self.sigma = float(state["sigma"])
        self._rescaled_rounds = [int(r) for r in state.get("rescaled_rounds", [])]
        self._rescaling = bool(state.get("rescaling", False))
        # a resumed run computes its distances the way the uninterrupted one would have
        self._float32_from = int(state.get("float32_from", 1))

    def _log_warnings(self, server_round: int, caught: Sequence[warnings.WarningMessage]) -> None:
        """Log the weights' warnings: underflow once; rows rescaled when it starts (with the
        count) and, in the round it stops, how many rounds it lasted."""
        rescaled = False
        for w in caught:
            if issubclass(w.category, RowsRescaledWarning):
                rescaled = True
                if not self._rescaling:  # Eq. 6 at alpha_k >> sigma, as designed: no alarm
                    log(INFO, "Round %d: %s: those clients' cloud models mix the others in "
                        "Eq. 6's proportions, as fedamp-self-weight = 0 would (docs/methods.md; "
                        "said once: the round in which it stops is logged)", server_round,
                        w.message)
                continue
            if issubclass(w.category, WeightsUnderflowWarning):
                if self._underflow_warned:
                    continue
                self._underflow_warned = True
            log(WARNING, "Round %d: %s", server_round, w.message)
        if rescaled:
            self._rescaling = True
            if server_round not in self._rescaled_rounds:
                self._rescaled_rounds.append(server_round)
        elif self._rescaling and server_round not in self._rescaled_rounds:
            self._rescaling = False
            log(INFO, "Round %d: no rows rescaled any more (rescaled in %d round(s) before)",
                server_round, len(self._rescaled_rounds))


class HeurFedAMP(FedAMP):
    """HeurFedAMP: FedAMP with the cosine-similarity weights of paper Eq. 8.

    Its arguments are :class:`FedAMP`'s; ``sigma`` is the scale of the cosine
    similarities (paper: MNIST 25, FMNIST 100, EMNIST 50, CIFAR-100 10), and the self
    weight is ``heurfedamp-self-weight``'s: xi_ii in [0, 1), or "paper": 1 / (N_i + 1).
    """

    method = "heurfedamp"

    DATA_RULE = "the inverse of the median cosine distance between the models the clients trained"

    def data_sigma(self, models: torch.Tensor) -> float:
        """1 / the median of the models' cosine distances 1 - cos (the median heuristic for
        exp(sigma cos) = exp(-(1 - cos) / s) up to a constant, s = 1 / sigma)."""
        median = median_cosine_distance(models)
        return 1.0 / median if median > 0 else 0.0

    def weights(self, server_round: int, params: torch.Tensor,
                self_weight: float | torch.Tensor | None) -> torch.Tensor:
        """Eq. 8's weights (HeurFedAMP always has a self weight)."""
        assert self_weight is not None  # HeurFedAMP's is given
        if self.sigma is None:  # no model trained yet: every client's is the initial one
            return torch.eye(params.shape[0], dtype=torch.float64, device=params.device)
        return heurfedamp_weights(params, self.sigma, self_weight)


#: The paper's sigma (Huang et al., Tables 4-6) per dataset, data setting and method: what
#: ``fedamp-sigma`` / ``heurfedamp-sigma`` = "auto" gives. Only the cells this project has
#: are here. The synthetic task's values are not from the paper: chosen for its MLP (docs).
PAPER_SIGMA: dict[str, dict[str, dict[str, float]]] = {
    "synthetic": {p: {"fedamp": 1.0, "heurfedamp": 25.0}
                  for p in ("practical", "iid", "pathological", "dirichlet", "blocks")},
    "mnist": {"practical": {"fedamp": 100.0, "heurfedamp": 25.0}},
    "fmnist": {"practical": {"fedamp": 10.0, "heurfedamp": 100.0}},
    "emnist": {"practical": {"fedamp": 10.0, "heurfedamp": 50.0}},
    "cifar100": {"practical": {"fedamp": 1e6, "heurfedamp": 10.0}},
}


@dataclass(frozen=True)
class FedAMPSettings(Settings):
    """FedAMP's and HeurFedAMP's keys (the ``fedamp-`` and ``heurfedamp-`` run-config keys).

    ``fedamp-alpha-k`` (alpha_k of round 1, paper 1e4), ``fedamp-alpha-decay`` and
    ``-decay-every`` (alpha_k times the decay every so many rounds), ``fedamp-lambda``
    (clients' proximal coefficient lambda / alpha_k), ``fedamp-sigma`` and
    ``heurfedamp-sigma`` ("auto": the paper's, :data:`PAPER_SIGMA`, where it has the
    setting and ``fedamp-sigma-rule`` = "paper", else from the data), the self weights
    (``eq6``: Eq. 6's 1 - the others; ``paper``: the appendix's 1 / (N_i + 1); a
    number in [0, 1)), ``fedamp-offline-clients`` (``exclude``: only this round's
    training clients mix; ``include``: every training client's latest model).
    """

    WORDS = {"fedamp-sigma": ("auto",), "heurfedamp-sigma": ("auto",),
             "fedamp-self-weight": ("eq6", "paper"), "heurfedamp-self-weight": ("paper",)}

    fedamp_alpha_k: float = setting(1e4, "alpha_k of round 1 (the paper's 1e4)",
                                    ok=lambda v: v > 0, allowed="a number > 0")
    fedamp_alpha_decay: float = setting(0.1, "alpha_k is multiplied by this every "
                                        "fedamp-alpha-decay-every rounds",
                                        ok=lambda v: 0 < v <= 1, allowed="a number in (0, 1]")
    fedamp_alpha_decay_every: int = setting(30, "rounds between two decays of alpha_k",
                                            **integer_in(1, MOST_ROUNDS))
    fedamp_lambda: float = setting(1.0, "lambda: clients train with the proximal term "
                                   "lambda / alpha_k", ok=lambda v: v >= 0, allowed="a number >= 0")
    fedamp_sigma: float | str = setting(
        "auto", 'FedAMP\'s sigma in exp(-d / sigma); "auto": by fedamp-sigma-rule',
        ok=lambda v: 0 < v < math.inf, allowed='"auto" or a finite number > 0')
    fedamp_sigma_rule: str = setting(
        "paper", 'how fedamp-sigma and heurfedamp-sigma = "auto" are chosen: the paper\'s '
        "table where it has the setting, else from the data (paper), or always from the data "
        "(data)",
        ok=lambda v: v in SIGMA_RULES, allowed=", ".join(SIGMA_RULES))
    heurfedamp_sigma: float | str = setting(
        "auto", 'HeurFedAMP\'s sigma in exp(sigma cos); "auto": by fedamp-sigma-rule',
        ok=lambda v: 0 < v < math.inf, allowed='"auto" or a finite number > 0')
    fedamp_self_weight: float | str = setting(
        "eq6", "FedAMP's xi_ii: eq6 (1 - the others), paper (1 / (N_i + 1)) or a number",
        ok=lambda v: 0 <= v < 1, allowed='"eq6" or "paper" or a number in [0, 1)')
    heurfedamp_self_weight: float | str = setting(
        0.1, "HeurFedAMP's xi_ii: paper (1 / (N_i + 1)) or a number",
        ok=lambda v: 0 <= v < 1, allowed='"paper" or a number in [0, 1)')
    fedamp_offline_clients: str = setting(
        "exclude", "exclude: only the round's training clients mix; include: every training "
        "client's latest model", ok=lambda v: v in OFFLINE_CHOICES,
        allowed=", ".join(OFFLINE_CHOICES))

    def check(self, run: SettingsContext) -> None:
        """What only the run can rule out: "paper" self weights without groups, HeurFedAMP
        without the paper's sigma for the setting."""
        for method in ("fedamp", "heurfedamp"):
            key = f"{method}-self-weight"
            weight = getattr(self, f"{method}_self_weight")
            if run.strategy != method:
                continue
            if weight == "paper" and not run.has_groups:
                raise bad(key, weight, f'a number in [0, 1): "paper" (1 / (N_i + 1), N_i the '
                          f"clients of i's group) needs a data setting with groups of clients "
                          f"of one distribution (practical, iid, blocks), not {run.data_label}")

    SERVER_HOLDS = "every client's model, its cloud model and its reply"

    def server_floats(self, num_params: int, num_clients: int) -> int:
        """FedAMP's server: every client's stored model, its cloud model u_i and its reply
        (3 n P), and the (n, n) distances and weights in float64."""
        return 3 * num_clients * num_params + 4 * num_clients * num_clients

    def sigma(self, method: str, dataset: str, setting: str) -> float | None:
        """sigma of ``method`` ("fedamp"/"heurfedamp"); "auto" = the paper's for the data
        setting, or None: from the data (``fedamp-sigma-rule`` = "data", or "paper" where
        the paper gives none; :meth:`FedAMP.data_sigma`)."""
        value = getattr(self, f"{method}_sigma")
        if value == "auto":
            if self.fedamp_sigma_rule == "data":
                return None
            value = PAPER_SIGMA.get(dataset, {}).get(setting, {}).get(method)
        return None if value is None else float(value)

    def self_weight(self, method: str) -> float | str | None:
        """The self weight of ``method``: a number, "paper" or None (Eq. 6's rule, ``eq6``)."""
        value = getattr(self, f"{method}_self_weight")
        return None if value == "eq6" else value

    def record(self, run: SettingsContext) -> dict:
        """metrics.json's ``sigma``: the sigma of both methods (their "auto" resolved)."""
        return {"sigma": {m: self.sigma(m, run.dataset, run.data_setting)
                          for m in ("fedamp", "heurfedamp")}}


def _sigma(settings: FedAMPSettings, method: str, run: RunSetup) -> float | None:
    return settings.sigma(method, run.dataset, run.data_setting)  # None: from the data


@register_strategy("fedamp", settings=FedAMPSettings)
def _fedamp(settings: FedAMPSettings, run: RunSetup) -> FedAMP:
    return FedAMP(settings, sigma=_sigma(settings, "fedamp", run), groups=run.groups,
                  **personal_kwargs(run))


@register_strategy("heurfedamp", settings=FedAMPSettings)
def _heurfedamp(settings: FedAMPSettings, run: RunSetup) -> HeurFedAMP:
    return HeurFedAMP(settings, sigma=_sigma(settings, "heurfedamp", run), groups=run.groups,
                      **personal_kwargs(run))
