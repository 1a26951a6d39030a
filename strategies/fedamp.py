"""FedAMP and HeurFedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on
Non-IID Data", AAAI 2021).

The server keeps every client's latest personalized model w_i. In round k each sampled
client i receives its cloud model u_i = sum_j xi_ij w_j (Eq. 6), a convex combination of
all clients' models, and trains from u_i on F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2
(Eq. 7). The weights xi (Eq. 6, or Eq. 8 for HeurFedAMP) are the pure functions of
:mod:`strategies.fedamp_math`. The distances use the trainable parameters only (the first
``layout.num_params`` entries of the flat vector, :class:`strategies.core.layout.FlatLayout`);
u_i mixes every floating-point tensor, batch-norm statistics included; integer tensors
(batch-norm counters) are the initial model's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO, WARNING

import torch
from flwr.app import ConfigRecord
from flwr.supercore import log

from .core.base import PersonalizedStrategy
from .core.client import ClientJob, ClientUpdate, register_client_update
from .core.protocol import as_float, short_repr
from .core.registry import RunSetup, personal_kwargs, register_strategy
from .core.settings import MOST_ROUNDS, Settings, SettingsContext, bad, integer_in, setting
from .fedamp_math import (
    Flags,
    cloud_models,
    fedamp_weights,
    heurfedamp_weights,
    median_cosine_distance,
    median_sq_distance,
)

OFFLINE_CHOICES = ("exclude", "include")
SIGMA_RULES = ("paper", "data")  # how a sigma = "auto" is chosen (fedamp-sigma-rule)
#: FedAMP's client half, and the one key it reads: lambda / alpha_k, its pull toward u_i
CLOUD_TRAINING, PULL = "fedamp", "fedamp-pull"


@register_client_update
class CloudTraining(ClientUpdate):
    """FedAMP's client half (Eq. 7): from its cloud model u_i it minimizes F_i(w) + pull / 2
    ||w - u_i||^2 (the generic loop's proximal term) and replies w_i; ``fedamp-pull``, a
    finite number >= 0, is lambda / alpha_k."""

    name, train_keys = CLOUD_TRAINING, (PULL,)

    def message_problem(self, config: ConfigRecord, train: bool) -> str | None:
        pull = config.get(PULL, 0.0)
        ok = isinstance(pull, int | float) and not isinstance(pull, bool) and 0 <= pull < math.inf
        return None if ok or not train else \
            f"message key '{PULL}' = {short_repr(pull)} is invalid; allowed: a finite number >= 0"

    def train(self, job: ClientJob) -> tuple[float, dict]:
        return job.fit(proximal_mu=as_float(job.config[PULL], PULL)), {}


class FedAMP(PersonalizedStrategy):
    """FedAMP: attentive message passing between personalized models.

    Client contract: train messages name ``fedamp`` (:class:`CloudTraining`) and carry u_i
    and ``fedamp-pull`` = lambda / alpha_k; the client trains from u_i on Eq. 7 and replies
    w_i.
    Evaluate messages carry the client's stored w_i, tested as received.

    ``settings``: the method's keys (:class:`FedAMPSettings`, :class:`HeurFedAMPSettings`
    for HeurFedAMP; None: their defaults).
    ``sigma``: of A'(x) = exp(-x / sigma) / sigma, resolved for the run's task; None: from
    the data, the median of the squared distances between the models trained in the first
    round with replies (:meth:`data_sigma`), then fixed (``notes``, checkpointed); until
    then every stored model is the initial one and each cloud model is the client's own.
    ``groups``: every client id's group of same-distribution clients, for the self weight
    "paper" (the appendix's xi_ii = 1 / (N_i + 1), N_i the others of i's group in the mix).
    ``kwargs``: :class:`strategies.core.base.PersonalizedStrategy`'s.
    """

    client_update = CLOUD_TRAINING
    # a newcomer's first model (the paper has none): the others' mean (measured against the
    # initial model: docs/federation.md, "Seasons")
    JOINER_FROM_MEAN = True
    method = "fedamp"  # whose keys (sigma, self weight) are this strategy's
    SETTINGS: type[_AMPSettings]  # its settings class (registered with it below)

    def __init__(self, settings: _AMPSettings | None = None, *, sigma: float | None = None,
                 groups: Sequence[int] | None = None, **kwargs) -> None:
        s = self.SETTINGS() if settings is None else settings
        assert s.method == self.method, f"{self.method} takes its own settings"
        super().__init__(**kwargs)
        self.self_weight = s.self_weight()
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
        self._clouds: torch.Tensor | None = None  # reused: a fresh one costs page faults

    def summary(self) -> None:
        super().summary()
        own = {None: "1 - the others (Eq. 6)", "paper": "1 / (N_i + 1) (the appendix)"}.get(
            self.self_weight, f"{self.self_weight}")  # type: ignore[arg-type]
        sigma = "from the data (round 1)" if self.sigma is None else f"{self.sigma:g}"
        log(INFO, "\t└── alpha_k %g (x%g every %d rounds), lambda %g, sigma %s, self weight %s",
            self.alpha_k, self.alpha_decay, self.alpha_decay_every, self.lam, sigma, own)

    def alpha_at(self, server_round: int) -> float:
        """alpha_k of round ``server_round`` (1-based)."""
        return self.alpha_k * self.alpha_decay ** ((server_round - 1) // self.alpha_decay_every)

    def weights(self, server_round: int, params: torch.Tensor,
                self_weight: float | torch.Tensor | None,
                apart: torch.Tensor | None = None) -> tuple[torch.Tensor, Flags]:
        """The (m, m) weights xi of this round (Eq. 6); pairs ``apart`` weigh each other 0."""
        assert self.sigma is not None, "collaboration() needs no weights before sigma"
        return fedamp_weights(params, self.alpha_at(server_round), self.sigma, self_weight, apart)

    def self_weights(self, active: torch.Tensor, apart: torch.Tensor | None
                     ) -> float | torch.Tensor | None:
        """xi_ii of the rows ``active``: the fixed number, or "paper"'s 1 / (N_i + 1), N_i the
        others of i's group among ``active`` not kept ``apart`` from i."""
        if self.self_weight != "paper":
            assert not isinstance(self.self_weight, str), "a number, 'paper' or None"
            return self.self_weight
        assert self.groups is not None  # checked in __init__
        group = self.groups[torch.as_tensor(self.client_ids, dtype=torch.long)[active.cpu()]]
        same = (group[:, None] == group[None, :]) & (True if apart is None else ~apart)
        return 1.0 / same.sum(dim=1).double()

    def personalize(self, server_round: int, rows: torch.Tensor, config: ConfigRecord
                    ) -> tuple[torch.Tensor, ConfigRecord]:
        """Cloud models u_i = sum_j xi_ij w_j of the sampled clients, and lambda / alpha_k."""
        xi = self.mixing_weights = self.collaboration(server_round, rows)
        self.history.record_xi(server_round, self.client_ids, xi)
        self._clouds = cloud_models(xi[rows.to(xi.device)], self.store, self._clouds)
        return self._clouds, ConfigRecord({**config, PULL: self.lam / self.alpha_at(
            server_round)})

    def sent_distances(self, rows: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """``||w - u_i||`` = sqrt(||w||^2 - 2 sum_j xi_ij <w, w_j> + ||u_i||^2), in the
        models' dtype: it feeds only the update-norm bound (``max-update-ratio``)."""
        xi = self.mixing_weights
        assert xi is not None, "personalize() sets this round's xi first"
        xi = xi[rows.to(xi.device)].to(vectors.device, vectors.dtype)
        wu = ((vectors @ self.store.T) * xi).sum(dim=1)
        ww = torch.linalg.vector_norm(vectors, dim=1).square()
        uu = self._sent_norms[rows].to(vectors.device, vectors.dtype).square()
        return (ww - 2.0 * wu + uu).clamp_min(0.0).sqrt()

    def collaboration(self, server_round: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The (n, n) weights xi of this round over all clients: with ``offline_clients`` =
        "exclude" only the clients training this round (``rows``) mix, the paper's
        "collaborations among online clients"; with "include" every training client's latest
        model. Clients outside the mix have identity rows and zero columns elsewhere."""
        n, p = len(self.client_ids), self.flat.num_params
        if self.sigma is None:  # no model trained yet: every client's is the initial one
            return torch.eye(n, dtype=torch.float64, device=self.store.device)
        active = self.training_rows if self.offline_clients == "include" or rows is None else rows
        active = active.to(self.store.device)
        params = self.store[:, :p] if len(active) == n else self.store[active, :p]
        apart = self.apart_mask(active)
        xi_active, flags = self.weights(server_round, params, self.self_weights(active, apart),
                                        apart)
        self._say(server_round, flags)
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
                "rescaled_rounds": list(self._rescaled_rounds)}

    def load_state_dict(self, state: dict, initial_arrays) -> None:
        super().load_state_dict(state, initial_arrays)
        self._underflow_warned = bool(state.get("underflow_warned", False))
        if self.sigma is None and state.get("sigma") is not None:  # chosen from the data
            self.sigma = float(state["sigma"])
        self._rescaled_rounds = [int(r) for r in state.get("rescaled_rounds", [])]

    def _say(self, server_round: int, flags: Flags) -> None:
        """Log what the weights' safeguards did, once per run each: rows rescaled (Eq. 6 at
        alpha_k >> sigma: a client's own model leaves its cloud model; not said for a round
        whose stored models are all one, round 1's initial model, where that changes
        nothing), and underflow. The rounds rescaled are kept in the checkpoint."""
        if flags.rescaled_rows and flags.largest > 0:
            if not self._rescaled_rounds:
                log(INFO, "Round %d: in %d of %d rows the others' Eq. 6 weights summed above 1 "
                    "(max %.3g): the own model counts as one at distance 0 there (xi_ii >= "
                    "1 / %d); a number for %s-self-weight fixes xi_ii (docs/methods.md)",
                    server_round, flags.rescaled_rows, flags.rows, flags.largest_row_sum,
                    flags.rows, self.method)
            if server_round not in self._rescaled_rounds:
                self._rescaled_rounds.append(server_round)
        if flags.underflow and not self._underflow_warned:
            self._underflow_warned = True
            log(WARNING, "Round %d: all off-diagonal FedAMP weights underflowed to 0: squared "
                "distances %.4g..%.4g with sigma=%g (exp(-d/sigma) = 0); every client trains "
                "alone. Increase %s-sigma.", server_round, flags.smallest, flags.largest,
                self.sigma, self.method)


class HeurFedAMP(FedAMP):
    """HeurFedAMP: FedAMP with the cosine-similarity weights of paper Eq. 8. Its arguments
    are :class:`FedAMP`'s; ``sigma`` scales the cosine similarities (paper: MNIST 25, FMNIST
    100, EMNIST 50, CIFAR-100 10); xi_ii is ``heurfedamp-self-weight``'s."""

    method = "heurfedamp"

    DATA_RULE = "the inverse of the median cosine distance between the models the clients trained"

    def data_sigma(self, models: torch.Tensor) -> float:
        """1 / the median of the models' cosine distances 1 - cos (the median heuristic for
        exp(sigma cos) = exp(-(1 - cos) / s) up to a constant, s = 1 / sigma)."""
        median = median_cosine_distance(models)
        return 1.0 / median if median > 0 else 0.0

    def weights(self, server_round: int, params: torch.Tensor,
                self_weight: float | torch.Tensor | None,
                apart: torch.Tensor | None = None) -> tuple[torch.Tensor, Flags]:
        """Eq. 8's weights (HeurFedAMP always has a self weight)."""
        assert self_weight is not None and self.sigma is not None
        return heurfedamp_weights(params, self.sigma, self_weight, apart), Flags()


#: The paper's sigma (Huang et al., Tables 4-6) per dataset, data setting and method: what
#: ``fedamp-sigma`` / ``heurfedamp-sigma`` = "auto" gives. Only the cells this project has
#: are here. The synthetic task's values are not from the paper: chosen for its MLP on
#: validation rows at the default run's size (docs/methods.md, "sigma = auto").
PAPER_SIGMA: dict[str, dict[str, dict[str, float]]] = {
    "synthetic": {p: {"fedamp": 0.1, "heurfedamp": 300.0}
                  for p in ("practical", "iid", "pathological", "dirichlet", "blocks")},
    "mnist": {"practical": {"fedamp": 100.0, "heurfedamp": 25.0}},
    "fmnist": {"practical": {"fedamp": 10.0, "heurfedamp": 100.0}},
    "emnist": {"practical": {"fedamp": 10.0, "heurfedamp": 50.0}},
    "cifar100": {"practical": {"fedamp": 1e6, "heurfedamp": 10.0}},
}


@dataclass(frozen=True)
class _AMPSettings(Settings):
    """The keys FedAMP and HeurFedAMP share; each adds its own sigma and self weight."""

    method = "fedamp"  # whose sigma and self weight (``<method>-sigma``)
    fedamp_alpha_k: float = setting(1e4, "alpha_k of round 1 (the paper's 1e4)",
                                    ok=lambda v: v > 0, allowed="a number > 0")
    fedamp_alpha_decay: float = setting(0.1, "alpha_k is multiplied by this every "
                                        "fedamp-alpha-decay-every rounds",
                                        ok=lambda v: 0 < v <= 1, allowed="a number in (0, 1]")
    fedamp_alpha_decay_every: int = setting(30, "rounds between two decays of alpha_k",
                                            **integer_in(1, MOST_ROUNDS))
    fedamp_lambda: float = setting(1.0, "lambda: clients train with the proximal term "
                                   "lambda / alpha_k", ok=lambda v: v >= 0, allowed="a number >= 0")
    fedamp_sigma_rule: str = setting(
        "paper", 'how fedamp-sigma and heurfedamp-sigma = "auto" are chosen: the paper\'s '
        "table where it has the setting, else from the data (paper), or always from the data "
        "(data)",
        ok=lambda v: v in SIGMA_RULES, allowed=", ".join(SIGMA_RULES))
    fedamp_offline_clients: str = setting(
        "exclude", "exclude: only the round's training clients mix; include: every training "
        "client's latest model", ok=lambda v: v in OFFLINE_CHOICES,
        allowed=", ".join(OFFLINE_CHOICES))

    def check(self, run: SettingsContext) -> None:
        """What only the run can rule out: "paper" self weights without groups."""
        if run.strategy == self.method and self.self_weight() == "paper" and not run.has_groups:
            raise bad(f"{self.method}-self-weight", "paper", f'a number in [0, 1): "paper" (1 / '
                      f"(N_i + 1), N_i the clients of i's group) needs a data setting with "
                      f"groups of clients of one distribution (practical, iid, blocks), not "
                      f"{run.data_label}")

    SERVER_HOLDS = "every client's model, its cloud model and its reply"

    def server_floats(self, num_params: int, num_clients: int) -> int:
        """FedAMP's server: every client's stored model, its cloud model u_i and its reply
        (3 n P), and the (n, n) distances and weights in float64."""
        return 3 * num_clients * num_params + 4 * num_clients * num_clients

    def sigma(self, dataset: str, setting: str) -> float | None:
        """The method's sigma; "auto" = the paper's for the data setting, or None: from the
        data (``fedamp-sigma-rule`` = "data", or "paper" where the paper gives none;
        :meth:`FedAMP.data_sigma`)."""
        value = getattr(self, f"{self.method}_sigma")
        if value == "auto":
            if self.fedamp_sigma_rule == "data":
                return None
            value = PAPER_SIGMA.get(dataset, {}).get(setting, {}).get(self.method)
        return None if value is None else float(value)

    def self_weight(self) -> float | str | None:
        """The method's self weight: a number, "paper" or None (Eq. 6's rule, ``eq6``)."""
        value = getattr(self, f"{self.method}_self_weight")
        return None if value == "eq6" else value

    def record(self, run: SettingsContext) -> dict:
        """metrics.json's ``sigma``: the method's ("auto" resolved; None: from the data)."""
        return {"sigma": {self.method: self.sigma(run.dataset, run.data_setting)}}


@dataclass(frozen=True)
class FedAMPSettings(_AMPSettings):
    """FedAMP's keys (``fedamp-``), each with its doc."""

    WORDS = {"fedamp-sigma": ("auto",), "fedamp-self-weight": ("eq6", "paper")}
    fedamp_sigma: float | str = setting(
        "auto", 'FedAMP\'s sigma in exp(-d / sigma); "auto": by fedamp-sigma-rule',
        ok=lambda v: 0 < v < math.inf, allowed='"auto" or a finite number > 0')
    fedamp_self_weight: float | str = setting(
        "eq6", "FedAMP's xi_ii: eq6 (1 - the others), paper (1 / (N_i + 1)) or a number",
        ok=lambda v: 0 <= v < 1, allowed='"eq6" or "paper" or a number in [0, 1)')


@dataclass(frozen=True)
class HeurFedAMPSettings(_AMPSettings):
    """HeurFedAMP's keys: FedAMP's shared ones (``fedamp-``) and its own (``heurfedamp-``)."""

    method = "heurfedamp"
    WORDS = {"heurfedamp-sigma": ("auto",), "heurfedamp-self-weight": ("paper",)}
    heurfedamp_sigma: float | str = setting(
        "auto", 'HeurFedAMP\'s sigma in exp(sigma cos); "auto": by fedamp-sigma-rule',
        ok=lambda v: 0 < v < math.inf, allowed='"auto" or a finite number > 0')
    heurfedamp_self_weight: float | str = setting(
        0.1, "HeurFedAMP's xi_ii: paper (1 / (N_i + 1)) or a number",
        ok=lambda v: 0 <= v < 1, allowed='"paper" or a number in [0, 1)')


def _factory(cls: type[FedAMP], settings: type[_AMPSettings]):
    cls.SETTINGS = settings

    def build(own: _AMPSettings, run: RunSetup) -> FedAMP:
        sigma = own.sigma(run.dataset, run.data_setting)  # None: from the data
        return cls(own, sigma=sigma, groups=run.groups, **personal_kwargs(run))
    return register_strategy(cls.method, settings=settings, keeps_apart=True)(build)


_factory(FedAMP, FedAMPSettings)
_factory(HeurFedAMP, HeurFedAMPSettings)
