"""FedAMP and HeurFedAMP weights against values worked by hand."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from strategies.fedamp_math import (
    RowsRescaledWarning,
    WeightsUnderflowWarning,
    fedamp_weights,
    heurfedamp_weights,
    pairwise_sq_distances,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_fedamp_two_clients_by_hand():
    # ||w0 - w1||^2 = 3^2 + 4^2 = 25; sigma = 25, alpha = 2:
    # xi_01 = 2 * exp(-25/25) / 25 = 0.08 / e = 0.029430...
    xi = fedamp_weights(t([[0.0, 0.0], [3.0, 4.0]]), alpha_k=2.0, sigma=25.0)
    off = 2.0 * math.exp(-1.0) / 25.0
    assert xi.dtype == torch.float64
    assert torch.allclose(xi, t([[1 - off, off], [off, 1 - off]]), atol=1e-15)


def test_fedamp_three_clients_by_hand():
    # points 0, (1,0), (0,2): squared distances 1, 4, 5; alpha = sigma = 1
    xi = fedamp_weights(t([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]), alpha_k=1.0, sigma=1.0)
    e1, e4, e5 = math.exp(-1), math.exp(-4), math.exp(-5)
    expected = t([[1 - e1 - e4, e1, e4], [e1, 1 - e1 - e5, e5], [e4, e5, 1 - e4 - e5]])
    assert torch.allclose(xi, expected, atol=1e-15)
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))


def test_fedamp_rows_above_one_are_rescaled_with_zero_self_weight():
    # d^2(0,1) = 1, d^2(0,2) = 4; alpha = 10, sigma = 1: row 0 off-diagonals
    # 10 e^-1 = 3.68 and 10 e^-4 = 0.18 sum above 1 -> scaled, xi_00 = 0
    models = t([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    with pytest.warns(RowsRescaledWarning):
        xi = fedamp_weights(models, alpha_k=10.0, sigma=1.0)
    a, b = math.exp(-1), math.exp(-4)
    assert xi[0, 0] == 0.0
    assert xi[0, 1].item() == pytest.approx(a / (a + b), abs=1e-15)
    assert xi[0, 2].item() == pytest.approx(b / (a + b), abs=1e-15)
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))
    assert (xi >= 0).all()


def test_fedamp_underflow_warns_with_distances_and_sigma():
    with pytest.warns(WeightsUnderflowWarning, match=r"sigma=0\.001"):
        xi = fedamp_weights(t([[0.0], [30.0]]), alpha_k=1e4, sigma=1e-3)
    assert torch.equal(xi, torch.eye(2, dtype=torch.float64))


def test_fedamp_single_client_keeps_its_model():
    assert torch.equal(fedamp_weights(t([[1.0, 2.0]]), 1e4, 1.0), t([[1.0]]))


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
    xi = fedamp_weights(models, alpha_k=1e4, sigma=1.0, self_weight=0.5)
    e1, e4, e5 = math.exp(-1), math.exp(-4), math.exp(-5)
    expected = t([[0.5, 0.5 * e1 / (e1 + e4), 0.5 * e4 / (e1 + e4)],
                  [0.5 * e1 / (e1 + e5), 0.5, 0.5 * e5 / (e1 + e5)],
                  [0.5 * e4 / (e4 + e5), 0.5 * e5 / (e4 + e5), 0.5]])
    assert torch.allclose(xi, expected, atol=1e-15)
    # one self weight per row
    per_row = fedamp_weights(models, 1.0, 1.0, self_weight=torch.tensor([0.0, 0.25, 0.5]))
    assert per_row.diagonal().tolist() == [0.0, 0.25, 0.5]
    assert torch.allclose(per_row.sum(1), torch.ones(3, dtype=torch.float64))


def test_a_fixed_self_weight_cannot_underflow():
    # exp(-900 / 1e-3) is 0 in float64; in log space the only other client gets 1 - xi_ii
    xi = fedamp_weights(t([[0.0], [30.0]]), alpha_k=1e4, sigma=1e-3, self_weight=0.25)
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
        xi = fedamp_weights(models, alpha_k=1e4, sigma=sigma, self_weight=0.5)
        assert (xi - expected).abs().max() < 1e-6, sigma
        eq6 = torch.where(off, 0.01 * torch.exp(-d2 / sigma) / sigma, torch.zeros_like(d2))
        eq6.diagonal().copy_(1 - eq6.sum(1))
        if (eq6.sum(1) <= 1 + 1e-12).all() and (eq6.diagonal() >= 0).all():
            assert (fedamp_weights(models, 0.01, sigma) - eq6).abs().max() < 1e-6, sigma
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


def test_rows_rescaled_is_said_once_and_when_it_stops(caplog):
    import logging
    import warnings as w

    from strategies.fedamp import FedAMP
    from strategies.fedamp_math import RowsRescaledWarning

    def rescaled():
        return [w.WarningMessage(RowsRescaledWarning("2 of 2 rows had ..."), RowsRescaledWarning,
                                 "f", 1)]

    strategy = FedAMP()
    caplog.set_level(logging.INFO, logger="flwr")
    for r in (1, 2, 3):
        strategy._log_warnings(r, rescaled())
    strategy._log_warnings(3, [])  # a second call in round 3 is not a stop
    strategy._log_warnings(4, [])
    strategy._log_warnings(5, [])
    lines = [rec.getMessage() for rec in caplog.records]
    said = [rec for rec in caplog.records if "rows had" in rec.getMessage()]
    assert [rec.getMessage() for rec in said] == [
        "Round 1: 2 of 2 rows had ...: those clients' cloud models mix the others in Eq. 6's "
        "proportions, as fedamp-self-weight = 0 would (docs/methods.md; said once: the round "
        "in which it stops is logged)"]
    assert said[0].levelno == logging.INFO  # the paper's alpha_k at work, not a fault
    assert [line for line in lines if "any more" in line] == [
        "Round 4: no rows rescaled any more (rescaled in 3 round(s) before)"]
    state = strategy.state_dict()  # checkpointed, so a resumed run does not say it again
    assert state["rescaled_rounds"] == [1, 2, 3] and state["rescaling"] is False


@pytest.mark.parametrize("sigma, self_weight, path", [
    (1e6, None, "float32"), (1e4, 0.2, "float32"), (100.0, None, None), (1.0, 0.2, None),
    (1e-2, 0.2, None), (30.0, 0.2, None)])
def test_float32_distances_with_float64_corrections_stay_exact(sigma, self_weight, path):
    """Models that share a mean (trained from one start), 40 clients of 20,000 parameters:
    the float32 Gram with float64 corrections of the pairs that matter gives the weights of
    the float64 reference within 1e-6 for every sigma; where sigma is large against the
    rounding of the distances, most pairs stay in float32."""
    from strategies.fedamp_math import fedamp_sq_distances

    gen = torch.Generator().manual_seed(5)
    base = torch.randn(20_000, generator=gen)
    models = (base + 0.02 * torch.randn(40, 20_000, generator=gen)).float()
    models[1] = models[0] + 1e-4 * torch.randn(20_000, generator=gen)  # a near twin
    ref = models.double()
    d2 = ((ref[:, None, :] - ref[None, :, :]) ** 2).sum(-1)
    got = fedamp_sq_distances(models, 10.0, sigma, softmax=self_weight is not None)
    off = ~torch.eye(40, dtype=torch.bool)
    if self_weight is None:
        expected = torch.where(off, 10.0 * torch.exp(-d2 / sigma) / sigma, torch.zeros_like(d2))
        over = expected.sum(1) > 1
        expected[over] = expected[over] / expected.sum(1)[over, None]
        expected.diagonal().copy_((1 - expected.sum(1)).clamp_min(0))
    else:
        minus_inf = torch.tensor(float("-inf"), dtype=torch.float64)
        expected = (1 - self_weight) * torch.softmax(torch.where(off, -d2 / sigma, minus_inf), 1)
        expected.diagonal().fill_(self_weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xi = fedamp_weights(models, 10.0, sigma, self_weight)
    assert (xi - expected).abs().max() < 1e-6
    if path is not None:
        assert got.path == path and got.recomputed < 40 * 39 / 2 / 8, got.recomputed


def test_fedamp_skips_float32_for_a_while_after_it_could_not_give_exact_weights(monkeypatch):
    """With sigma small against the distances (the paper's sigmas and trained models), float32
    distances would need most pairs in float64: the next rounds compute them in float64 at
    once (cheaper: no wasted float32 pass), with the same weights, and try float32 again
    after FLOAT32_RETRY_ROUNDS; the round to try again is checkpointed."""
    import strategies.fedamp_math as fedamp_module
    from strategies.fedamp import FedAMP
    from strategies.fedamp_math import FLOAT32_RETRY_ROUNDS

    gen = torch.Generator().manual_seed(2)
    models = (torch.randn(3_000, generator=gen) + 0.05 * torch.randn(12, 3_000, generator=gen))
    tried = []
    real = fedamp_module.sq_distances_float32
    monkeypatch.setattr(fedamp_module, "sq_distances_float32",
                        lambda m, *a: tried.append(True) or real(m, *a))
    strategy = FedAMP(sigma=1.0)
    xis = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for server_round in range(1, FLOAT32_RETRY_ROUNDS + 3):
            tried.clear()
            xis.append(strategy.weights(server_round, models, None))
            assert bool(tried) == (server_round in (1, FLOAT32_RETRY_ROUNDS + 1)), server_round
        reference = fedamp_weights(models, 1e4, 1.0)
    for xi in xis:
        assert (xi - reference).abs().max() < 1e-6
    assert strategy.state_dict()["float32_from"] == 2 * FLOAT32_RETRY_ROUNDS + 1
