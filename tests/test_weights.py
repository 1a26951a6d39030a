"""FedAMP and HeurFedAMP weights against values worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.fedamp_math import (
    Flags,
    fedamp_weights,
    heurfedamp_weights,
    pairwise_sq_distances,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_fedamp_two_clients_by_hand():
    # ||w0 - w1||^2 = 3^2 + 4^2 = 25; sigma = 25, alpha = 2:
    # xi_01 = 2 * exp(-25/25) / 25 = 0.08 / e = 0.029430...
    xi, flags = fedamp_weights(t([[0.0, 0.0], [3.0, 4.0]]), alpha_k=2.0, sigma=25.0)
    assert flags == Flags(rows=2, largest_row_sum=pytest.approx(0.08 / math.e), smallest=25.0,
                          largest=25.0)
    off = 2.0 * math.exp(-1.0) / 25.0
    assert xi.dtype == torch.float64
    assert torch.allclose(xi, t([[1 - off, off], [off, 1 - off]]), atol=1e-15)


def test_fedamp_three_clients_by_hand():
    # points 0, (1,0), (0,2): squared distances 1, 4, 5; alpha = sigma = 1
    xi, _ = fedamp_weights(t([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]), alpha_k=1.0, sigma=1.0)
    e1, e4, e5 = math.exp(-1), math.exp(-4), math.exp(-5)
    expected = t([[1 - e1 - e4, e1, e4], [e1, 1 - e1 - e5, e5], [e4, e5, 1 - e4 - e5]])
    assert torch.allclose(xi, expected, atol=1e-15)
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))


def test_fedamp_rows_above_one_keep_the_own_model_as_one_at_distance_zero():
    # d^2(0,1) = 1, d^2(0,2) = 4, d^2(1,2) = 5; alpha = 10, sigma = 1: row 0's off-diagonals
    # 10 e^-1 = 3.68 and 10 e^-4 = 0.18 sum above 1 -> normalised with its own model counted
    # at distance 0 (10 e^0 = 10): xi_00 = 1 / (1 + e^-1 + e^-4) = 0.7214..., never 0
    models = t([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    xi, flags = fedamp_weights(models, alpha_k=10.0, sigma=1.0)
    a, b, c = math.exp(-1), math.exp(-4), math.exp(-5)
    # rows 0 (10 e^-1 + 10 e^-4 = 3.86) and 1 (10 e^-1 + 10 e^-5) sum above 1, row 2 does not
    assert flags.rescaled_rows == 2 and not flags.underflow
    assert flags.largest_row_sum == pytest.approx(10 * (a + b), abs=1e-12)
    assert xi[0].tolist() == pytest.approx([1 / (1 + a + b), a / (1 + a + b), b / (1 + a + b)],
                                           abs=1e-15)
    assert xi[0, 0].item() == pytest.approx(0.72140, abs=1e-5)
    assert xi[1].tolist() == pytest.approx([a / (1 + a + c), 1 / (1 + a + c), c / (1 + a + c)],
                                           abs=1e-15)
    assert xi[2].tolist() == pytest.approx([10 * b, 10 * c, 1 - 10 * b - 10 * c], abs=1e-15)
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))
    assert (xi.diagonal() > 0).all()


def test_fedamp_far_above_one_the_own_model_weighs_at_least_one_over_m():
    # every model equal: every row's others sum to alpha (m - 1) / sigma >> 1; the own model
    # weighs as one of m equal ones
    xi, flags = fedamp_weights(torch.zeros(4, 3), alpha_k=1e4, sigma=1.0)
    assert flags.rescaled_rows == 4
    assert torch.allclose(xi, torch.full((4, 4), 0.25, dtype=torch.float64), atol=1e-15)


def test_fedamp_underflow_is_flagged_with_the_distances():
    xi, flags = fedamp_weights(t([[0.0], [30.0]]), alpha_k=1e4, sigma=1e-3)
    assert torch.equal(xi, torch.eye(2, dtype=torch.float64))
    assert flags.underflow and flags.rescaled_rows == 0
    assert (flags.smallest, flags.largest) == (900.0, 900.0)


def test_fedamp_single_client_keeps_its_model():
    xi, flags = fedamp_weights(t([[1.0, 2.0]]), 1e4, 1.0)
    assert torch.equal(xi, t([[1.0]])) and flags == Flags(rows=1)


def test_fedamp_rejects_bad_parameters():
    with pytest.raises(ValueError, match="sigma"):
        fedamp_weights(t([[0.0]]), 1.0, 0.0)


def test_heurfedamp_two_clients_gets_all_remaining_weight():
    xi = heurfedamp_weights(t([[1.0, 0.0], [0.0, 1.0]]), sigma=5.0, self_weight=0.3)
    assert torch.allclose(xi, t([[0.3, 0.7], [0.7, 0.3]]), atol=1e-15)


def test_heurfedamp_three_clients_by_hand():
    # w0 = (1,0), w1 = (1,1), w2 = (0,1): cos01 = cos12 = 1/sqrt2, cos02 = 0
    models = t([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    sigma, s = 2.0, 0.25
    xi = heurfedamp_weights(models, sigma=sigma, self_weight=s)
    c = 1 / math.sqrt(2)
    p = math.exp(sigma * c) / (math.exp(sigma * c) + 1.0)  # softmax over {cos c, cos 0}
    expected = t([[s, (1 - s) * p, (1 - s) * (1 - p)],
                  [(1 - s) / 2, s, (1 - s) / 2],
                  [(1 - s) * (1 - p), (1 - s) * p, s]])
    assert torch.allclose(xi, expected, atol=1e-14)


def test_heurfedamp_large_sigma_does_not_overflow():
    xi = heurfedamp_weights(t([[1.0, 0.0], [1.0, 1e-3], [-1.0, 0.0]]), sigma=1e6, self_weight=0.0)
    assert torch.isfinite(xi).all()
    assert xi[0, 1].item() == pytest.approx(1.0)


def test_heurfedamp_single_client_and_bad_parameters():
    assert torch.equal(heurfedamp_weights(t([[3.0]]), 10.0, 0.5), t([[1.0]]))
    with pytest.raises(ValueError, match="self weights must be in"):
        heurfedamp_weights(t([[1.0], [2.0]]), 10.0, 1.5)


def test_gram_distances_match_a_pairwise_loop_in_float32():
    gen = torch.Generator().manual_seed(0)
    models = 5.0 + 0.01 * torch.randn(6, 10_000, generator=gen)  # large norms, close models
    d2 = pairwise_sq_distances(models)
    m64 = models.double()
    loop = torch.tensor([[((a - b) ** 2).sum().item() for b in m64] for a in m64], dtype=torch.float64)
    assert torch.allclose(d2, loop, rtol=1e-4)


def test_fedamp_with_a_fixed_self_weight_by_hand():
    # the appendix's xi_ii = 1 / (N_i + 1): here 0.5 for every row; off-diagonals in Eq. 6's
    # proportions exp(-d/sigma), scaled to sum to 1 - xi_ii (alpha_k cancels)
    models = t([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    xi, flags = fedamp_weights(models, alpha_k=1e4, sigma=1.0, self_weight=0.5)
    assert flags == Flags(rows=3)  # a softmax: nothing to rescale, nothing underflows
    e1, e4, e5 = math.exp(-1), math.exp(-4), math.exp(-5)
    expected = t([[0.5, 0.5 * e1 / (e1 + e4), 0.5 * e4 / (e1 + e4)],
                  [0.5 * e1 / (e1 + e5), 0.5, 0.5 * e5 / (e1 + e5)],
                  [0.5 * e4 / (e4 + e5), 0.5 * e5 / (e4 + e5), 0.5]])
    assert torch.allclose(xi, expected, atol=1e-15)
    # one self weight per row
    per_row, _ = fedamp_weights(models, 1.0, 1.0, self_weight=torch.tensor([0.0, 0.25, 0.5]))
    assert per_row.diagonal().tolist() == [0.0, 0.25, 0.5]
    assert torch.allclose(per_row.sum(1), torch.ones(3, dtype=torch.float64))


def test_a_fixed_self_weight_cannot_underflow():
    # exp(-900 / 1e-3) is 0 in float64; in log space the only other client gets 1 - xi_ii
    xi, flags = fedamp_weights(t([[0.0], [30.0]]), alpha_k=1e4, sigma=1e-3, self_weight=0.25)
    assert not flags.underflow
    assert torch.allclose(xi, t([[0.25, 0.75], [0.75, 0.25]]), atol=1e-15)


def test_heurfedamp_self_weight_per_row():
    xi = heurfedamp_weights(t([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]), sigma=2.0,
                            self_weight=torch.tensor([0.5, 1 / 3, 0.5]))
    assert torch.allclose(xi.diagonal(), t([0.5, 1 / 3, 0.5]))
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))


def test_weights_agree_with_a_float64_reference_for_any_sigma():
    # 20 clients of 300 float32 parameters; with sigma = 1e-3 the weights hang on distance
    # differences of 1e-6: a float32 Gram matrix is off by 1.3e-5 here, this one by 1e-16
    gen = torch.Generator().manual_seed(3)
    models = (1.0 + 0.05 * torch.randn(20, 300, generator=gen)).float()
    ref = models.double()
    d2 = ((ref[:, None, :] - ref[None, :, :]) ** 2).sum(-1)
    off = ~torch.eye(20, dtype=torch.bool)
    minus_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    for sigma in (1e-3, 1e-2, 1.0, 100.0):
        expected = 0.5 * torch.softmax(torch.where(off, -d2 / sigma, minus_inf), 1)
        expected.diagonal().fill_(0.5)
        xi, _ = fedamp_weights(models, alpha_k=1e4, sigma=sigma, self_weight=0.5)
        assert (xi - expected).abs().max() < 1e-6, sigma
        eq6 = torch.where(off, 0.01 * torch.exp(-d2 / sigma) / sigma, torch.zeros_like(d2))
        eq6.diagonal().copy_(1 - eq6.sum(1))
        if (eq6.sum(1) <= 1 + 1e-12).all() and (eq6.diagonal() >= 0).all():
            assert (fedamp_weights(models, 0.01, sigma)[0] - eq6).abs().max() < 1e-6, sigma
    cos = ref @ ref.T / ref.norm(dim=1)[:, None] / ref.norm(dim=1)[None, :]
    expected = 0.9 * torch.softmax(torch.where(off, 50.0 * cos, minus_inf), 1)
    expected.diagonal().fill_(0.1)
    assert (heurfedamp_weights(models, 50.0, 0.1) - expected).abs().max() < 1e-6


def test_blockwise_gram_equals_the_whole():
    from strategies.fedamp_math import gram64

    x = torch.randn(7, 1000, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(gram64(x, block=97), x.double() @ x.double().T, atol=1e-9)
    c = x.double() - x.double()[:1]  # relative to the first model
    assert torch.allclose(gram64(x, centre=True, block=64), c @ c.T, atol=1e-9)


def test_rows_rescaled_is_said_once_a_run_and_not_for_identical_models(caplog):
    import logging

    from strategies.fedamp import FedAMP

    identical = Flags(rows=2, rescaled_rows=2, largest_row_sum=1e4)  # round 1: distances 0
    rescaled = Flags(rows=2, rescaled_rows=2, largest_row_sum=3.5, smallest=0.5, largest=2.0)
    strategy = FedAMP()
    caplog.set_level(logging.INFO, logger="flwr")
    strategy._say(1, identical)  # every stored model is the initial one: nothing changes
    assert not caplog.records and strategy.state_dict()["rescaled_rounds"] == []
    for r in (2, 3):
        strategy._say(r, rescaled)
    strategy._say(3, rescaled)  # a second call in round 3 counts once
    strategy._say(4, Flags(rows=2, smallest=0.5, largest=2.0))
    strategy._say(7, rescaled)  # again, later: not said again
    said = [rec for rec in caplog.records if "summed above 1" in rec.getMessage()]
    assert len(said) == 1 and said[0].getMessage().startswith("Round 2: in 2 of 2 rows")
    assert "fedamp-self-weight" in said[0].getMessage()  # what the user can do about it
    assert said[0].levelno == logging.INFO  # the paper's alpha_k at work, not a fault
    state = strategy.state_dict()  # checkpointed, so a resumed run does not say it again
    assert state["rescaled_rounds"] == [2, 3, 7]
    resumed = FedAMP()
    resumed._rescaled_rounds = list(state["rescaled_rounds"])
    resumed._say(8, rescaled)
    assert sum("summed above 1" in rec.getMessage() for rec in caplog.records) == 1


def test_underflow_is_warned_once_per_run(caplog):
    import logging

    from strategies.fedamp import FedAMP

    strategy = FedAMP(sigma=1e-3)
    caplog.set_level(logging.INFO, logger="flwr")
    for r in (1, 2):
        strategy._say(r, Flags(rows=2, underflow=True, smallest=900.0, largest=900.0))
    warned = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warned) == 1 and "sigma=0.001" in warned[0].getMessage()
    assert strategy.state_dict()["underflow_warned"] is True


APART_01 = torch.tensor([[False, True, False], [True, False, False], [False, False, False]])


def test_fedamp_pairs_kept_apart_weigh_each_other_zero_by_hand():
    # points 0, (1,0), (0,2): squared distances 1, 4, 5; alpha = sigma = 1; 0 and 1 apart
    models = t([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    xi, _ = fedamp_weights(models, alpha_k=1.0, sigma=1.0, apart=APART_01)
    e4, e5 = math.exp(-4), math.exp(-5)
    # Eq. 6: xi_01 = xi_10 = 0, the others as before, xi_ii = 1 - the others
    assert torch.equal(xi, t([[1 - e4, 0.0, e4], [0.0, 1 - e5, e5], [e4, e5, 1 - e4 - e5]]))
    # a fixed self weight: the others' softmax over the allowed only
    fixed, _ = fedamp_weights(models, alpha_k=1.0, sigma=1.0, self_weight=0.5, apart=APART_01)
    assert torch.allclose(fixed, t([[0.5, 0.0, 0.5], [0.0, 0.5, 0.5],
                                    [0.5 * e4 / (e4 + e5), 0.5 * e5 / (e4 + e5), 0.5]]),
                          atol=1e-15)


def test_heurfedamp_pairs_kept_apart_and_a_client_apart_from_all():
    models = t([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    xi = heurfedamp_weights(models, sigma=2.0, self_weight=0.25, apart=APART_01)
    c = 1 / math.sqrt(2)
    q = math.exp(2.0 * c) / (1.0 + math.exp(2.0 * c))  # row 2: softmax over cos 0, cos c
    assert torch.allclose(xi, t([[0.25, 0.0, 0.75], [0.0, 0.25, 0.75],
                                 [0.75 * (1 - q), 0.75 * q, 0.25]]), atol=1e-14)
    alone = torch.tensor([[False, True], [True, False]])  # two clients kept apart
    assert torch.equal(heurfedamp_weights(t([[1.0, 0.0], [0.0, 1.0]]), 2.0, 0.25, alone),
                       torch.eye(2, dtype=torch.float64))
    assert torch.equal(fedamp_weights(t([[0.0], [1.0]]), 1.0, 1.0, apart=alone)[0],
                       torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="apart must be a boolean"):
        fedamp_weights(t([[0.0], [1.0]]), 1.0, 1.0, apart=torch.zeros(3, 3, dtype=torch.bool))
