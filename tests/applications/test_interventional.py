"""Interventional flows: the SCM's exact density, the AIPTW weights and objective, the W1 helper."""

import numpy as np
import pytest
import torch
from scipy.stats import norm

from flowkit.applications.interventional import (
    AIPTWCrossEntropy,
    ConditionalOutcomeFlow,
    GridAIPTWCrossEntropy,
    OutcomeFlow,
    PolynomialNormalSCM,
    PropensityHead,
    PropensityLikelihood,
    aiptw_weights,
    wasserstein1_on_grid,
)
from flowkit.train import fit


@pytest.mark.parametrize("treatment", [0, 1])
def test_exact_interventional_density_is_normalised_and_matches_draws(treatment):
    scm = PolynomialNormalSCM(shift=3.0)
    y = np.linspace(-40, 40, 16001)  # P(Y[0] < -15) = P(X < -5) = 3e-7: the grid must reach far
    density = scm.interventional_density(y, treatment)
    assert np.trapezoid(density, y) == pytest.approx(1.0, abs=1e-8)
    mean = 0.5 if treatment == 1 else -0.5  # E[+-x^2 / 2] = +-1/2, E[x] = 0
    assert np.trapezoid(y * density, y) == pytest.approx(mean, abs=1e-8)
    draws = scm.interventional_sample(200_000, treatment, seed=1)
    cdf = np.cumsum(density) * (y[1] - y[0])
    for q in (-1.0, 0.0, 1.5):
        assert np.mean(draws <= q) == pytest.approx(np.interp(q, y, cdf), abs=0.005)


def test_covariate_shift_moves_the_treated_units():
    x, a, _ = PolynomialNormalSCM(shift=4.0).sample(20_000, seed=0)
    assert x[a == 1].mean() > 0.5 and x[a == 0].mean() < -0.5
    x, a, _ = PolynomialNormalSCM(shift=0.0).sample(20_000, seed=0)
    assert abs(a.mean() - 0.5) < 0.02 and abs(x[a == 1].mean()) < 0.05


def test_aiptw_weights_clip_and_refuse_infinite_weights():
    a = torch.tensor([1.0, 1.0, 0.0, 0.0])
    pi = torch.tensor([0.5, 0.0, 1.0, 0.2])
    torch.testing.assert_close(aiptw_weights(a, pi, 1, clip=0.1), torch.tensor([2.0, 10.0, 0.0, 0.0]))
    torch.testing.assert_close(aiptw_weights(a, pi, 0, clip=0.1), torch.tensor([0.0, 0.0, 10.0, 1.25]))
    with pytest.raises(ValueError, match="positivity fails"):
        aiptw_weights(a, pi, 1, clip=0.0)
    with pytest.raises(ValueError, match="positivity fails"):
        aiptw_weights(a, pi, 0, clip=0.0)
    torch.testing.assert_close(aiptw_weights(a[:1], pi[:1], 1, clip=0.0), torch.tensor([2.0]))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        aiptw_weights(a, pi + 0.9, 1)
    with pytest.raises(ValueError, match="clip"):
        aiptw_weights(a, pi, 1, clip=0.5)
    with pytest.raises(ValueError, match="treatment"):
        aiptw_weights(a, pi, 2)


def test_wasserstein1_of_shifted_and_scaled_normals():
    y = np.linspace(-20, 20, 8001)
    assert wasserstein1_on_grid(y, norm.pdf(y), norm.pdf(y, loc=1.3)) == pytest.approx(1.3, abs=1e-4)
    # W1 of N(0, 1) and N(0, 4): E|Z| (2 - 1) = sqrt(2 / pi)
    assert wasserstein1_on_grid(y, norm.pdf(y), norm.pdf(y, scale=2.0)) == pytest.approx(np.sqrt(2 / np.pi), abs=1e-4)
    with pytest.raises(ValueError, match="increasing"):
        wasserstein1_on_grid(y[::-1], norm.pdf(y), norm.pdf(y))


def test_aiptw_objective_is_the_plug_in_plus_the_weighted_correction():
    torch.manual_seed(0)
    nuisance, target = ConditionalOutcomeFlow(2, hidden=(8,)), OutcomeFlow()
    rows = torch.randn(64, 4)
    rows[:, 1] = (rows[:, 1] > 0).float()
    rows[:, 3] = 0.0  # no weights: the correction vanishes
    objective = AIPTWCrossEntropy(nuisance, 1, samples=4)
    torch.manual_seed(1)
    corrected = objective.loss(target, rows)
    torch.manual_seed(1)
    plug_in = AIPTWCrossEntropy(nuisance, 1, samples=4, corrected=False).loss(target, rows)
    torch.testing.assert_close(corrected, plug_in)
    rows[:, 3] = 2.0 * rows[:, 1]
    torch.manual_seed(1)
    with_weights = objective.loss(target, rows)
    torch.manual_seed(1)
    draws = nuisance.sample((4,), context=torch.cat([rows[:, :1], torch.ones(64, 1)], -1)).reshape(-1, 1)
    ce_i = -target.log_prob(draws).reshape(4, -1).mean(0)
    expected = ce_i.mean() + (rows[:, 3] * (-target.log_prob(rows[:, 2:3]) - ce_i)).mean()
    torch.testing.assert_close(with_weights, expected)
    with_weights.backward()
    assert all(p.grad is None for p in nuisance.parameters())  # the nuisance is held fixed
    assert set(objective.metrics()) == {"plug_in", "correction"}


def test_propensity_head_learns_the_treatment_logit():
    torch.manual_seed(0)
    x, a, _ = PolynomialNormalSCM(shift=2.0).sample(4000, seed=0)
    rows = torch.tensor(np.stack([x, a], 1), dtype=torch.float32)
    head = PropensityHead(1, hidden=(16,))
    fit(head, PropensityLikelihood(), rows, steps=300, batch_size=256, lr=1e-2, progress=False, seed=0)
    grid = torch.linspace(-1.5, 1.5, 7)[:, None]
    truth = torch.sigmoid(2.0 * grid[:, 0])
    assert (head.propensity(grid).detach() - truth).abs().max() < 0.08


def _units(n=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, generator=generator)
    a = (torch.rand(n, generator=generator) < 0.5).float()
    y = torch.randn(n, generator=generator)
    return x, a, y, 2.0 * a


@pytest.mark.slow
def test_grid_objective_is_the_sampled_objective_by_quadrature():
    torch.manual_seed(0)
    nuisance, target = ConditionalOutcomeFlow(2, hidden=(8,)), OutcomeFlow()
    x, a, y, w = _units()
    grid = torch.linspace(-12, 12, 2401, dtype=torch.float64)
    nuisance, target = nuisance.double(), target.double()
    x, a, y, w = x.double(), a.double(), y.double(), w.double()
    rows = torch.cat([x, a[:, None], y[:, None], w[:, None]], -1)
    for corrected in (False, True):
        exact = GridAIPTWCrossEntropy(nuisance, 1, x, w, grid, corrected=corrected)
        assert exact.plug_in_mass == pytest.approx(1.0, abs=1e-6)
        value = exact.loss(target, torch.stack([y, w], -1))
        sampled = AIPTWCrossEntropy(nuisance, 1, samples=20_000, corrected=corrected)
        estimate = float(sampled.loss(target, rows).detach())
        # the sampled loss's standard error: that of 20,000 x 64 draws of -log g, about 1e-3 here
        assert float(value.detach()) == pytest.approx(estimate, abs=0.01)
    value.backward()
    assert all(p.grad is None for p in nuisance.parameters())


def test_grid_objective_without_weights_is_the_plug_in_and_refuses_bad_input():
    torch.manual_seed(0)
    nuisance, target = ConditionalOutcomeFlow(2, hidden=(8,)), OutcomeFlow()
    x, _, y, w = _units()
    grid = torch.linspace(-10, 10, 801)
    plug_in = GridAIPTWCrossEntropy(nuisance, 1, x, w, grid, corrected=False)
    zero = GridAIPTWCrossEntropy(nuisance, 1, x, torch.zeros_like(w), grid)
    torch.testing.assert_close(
        plug_in.loss(target, torch.stack([y, w], -1)), zero.loss(target, torch.stack([y, 0 * w], -1))
    )
    assert set(zero.metrics()) == {"grid_term", "observed_term"}
    with pytest.raises(ValueError, match="increasing"):
        GridAIPTWCrossEntropy(nuisance, 1, x, w, grid.flip(0))
    with pytest.raises(ValueError, match="non-negative"):
        GridAIPTWCrossEntropy(nuisance, 1, x, -w, grid)
    with pytest.raises(ValueError, match="units"):
        GridAIPTWCrossEntropy(nuisance, 1, x, w[:10], grid)
    with pytest.raises(ValueError, match="treatment"):
        GridAIPTWCrossEntropy(nuisance, 2, x, w, grid)


@pytest.mark.slow
def test_correction_with_true_propensities_repairs_a_wrong_nuisance():
    # With the true propensities the one-step cross-entropy is unbiased whatever the nuisance (doubly robust):
    # an untrained nuisance (a wrong p(y | x, a)) gives a wrong plug-in, and the corrected target recovers p_1.
    scm = PolynomialNormalSCM(shift=1.0)
    x, a, y = scm.sample(4000, seed=0)
    X, A, Y = (torch.tensor(v, dtype=torch.float32) for v in (x, a, y))
    weights = aiptw_weights(A, torch.tensor(scm.propensity(x), dtype=torch.float32), 1, clip=0.0)
    torch.manual_seed(0)
    nuisance = ConditionalOutcomeFlow(2, hidden=(8,))
    grid = torch.linspace(-8, 14, 441)
    dense = np.linspace(-8, 14, 2201)
    exact = scm.interventional_density(dense, 1)
    distances = {}
    for corrected in (False, True):
        torch.manual_seed(0)
        target = OutcomeFlow()
        objective = GridAIPTWCrossEntropy(nuisance, 1, X[:, None], weights, grid, corrected=corrected)
        fit(target, objective, torch.stack([Y, weights], -1), steps=400, batch_size=4000, lr=1e-2, progress=False)
        with torch.no_grad():
            density = target.log_prob(torch.tensor(dense, dtype=torch.float32)[:, None]).double().exp().numpy()
        distances[corrected] = wasserstein1_on_grid(dense, density, exact)
    assert distances[False] > 0.3  # the untrained nuisance is far from p_1
    assert distances[True] < 0.1 and distances[True] < distances[False] / 4
