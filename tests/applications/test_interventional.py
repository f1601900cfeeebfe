"""Interventional flows: the SCM's exact density, the AIPTW weights and objective, the W1 helper."""

import numpy as np
import pytest
import torch
from scipy.stats import norm

from flowkit.applications.interventional import (
    AIPTWCrossEntropy,
    ConditionalOutcomeFlow,
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
