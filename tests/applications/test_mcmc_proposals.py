"""The IMH bound against the exact total variation of a Gaussian chain, and IMH's mode weights on two modes."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from flowkit.applications.mcmc_proposals import (
    FunnelTransport,
    adapted_neutra_mala,
    chain_mean,
    ess_per_evaluation,
    imh_tv_bound,
    imh_tv_by_quadrature,
)
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow, RealNVP
from flowkit.sampling import independent_metropolis, latent_energy
from flowkit.targets import BimodalGaussian, NealFunnel
from flowkit.train import MaximumLikelihood, fit


def _gaussian_tv(inflation: float, start: float, n_steps: int = 20, points: int = 2401) -> np.ndarray:
    scale = 1.0 + inflation
    grid = np.linspace(-12 * scale, 12 * scale, points)
    return imh_tv_by_quadrature(norm.logpdf, lambda x: norm.logpdf(x, scale=scale), start, n_steps, grid)


@pytest.mark.parametrize("inflation", [0.25, 1.0, 2.0])
@pytest.mark.parametrize("start", [0.0, 0.7, 3.0])
def test_exact_tv_of_the_gaussian_imh_chain_is_below_the_bound(inflation, start):
    # Target N(0, 1), proposal N(0, (1 + l)^2): w = pi / q peaks at 0 with W = 1 + l.
    tv = _gaussian_tv(inflation, start)
    bound = np.array([imh_tv_bound(1.0 + inflation, n) for n in range(1, 21)])
    assert (tv <= bound + 1e-12).all()
    if start == 0.0:  # from the top of w the chain stays with probability exactly 1 - 1/W: the bound is attained
        np.testing.assert_allclose(tv, bound, rtol=1e-6, atol=1e-12)
    else:  # elsewhere it leaves faster
        assert (tv[:5] < 0.99 * bound[:5]).all()


def test_quadrature_converges_with_the_grid_and_keeps_the_mass():
    coarse, fine = _gaussian_tv(1.0, 0.7, 10, 801), _gaussian_tv(1.0, 0.7, 10, 3201)
    np.testing.assert_allclose(coarse, fine, atol=1e-4)
    # A proposal equal to the target accepts everything: one step reaches the target exactly.
    grid = np.linspace(-10, 10, 801)
    np.testing.assert_allclose(imh_tv_by_quadrature(norm.logpdf, norm.logpdf, 1.0, 3, grid), 0.0, atol=1e-9)


def test_bound_and_quadrature_reject_bad_input():
    assert imh_tv_bound(1.0, 5) == 0.0 and imh_tv_bound(3.0, 0) == 1.0
    with pytest.raises(ValueError, match="max_weight_ratio"):
        imh_tv_bound(0.5, 3)
    with pytest.raises(ValueError, match="n_steps"):
        imh_tv_bound(2.0, -1)
    with pytest.raises(ValueError, match="evenly spaced"):
        imh_tv_by_quadrature(norm.logpdf, norm.logpdf, 0.0, 2, np.array([0.0, 1.0, 3.0]))
    with pytest.raises(ValueError, match="finite"):
        imh_tv_by_quadrature(norm.logpdf, lambda x: np.where(x > 0, -np.inf, 0.0), 0.0, 2, np.linspace(-1, 1, 5))


def test_chain_mean_and_ess_per_evaluation():
    values = torch.tensor([[0.0, 1.0, 1.0, 0.0]]).repeat(10, 1)
    mean, se = chain_mean(values)
    assert mean == 0.5 and se == pytest.approx(float(torch.tensor([0.0, 1.0, 1.0, 0.0]).std()) / 2)
    white = torch.randn(4000, 4, generator=torch.Generator().manual_seed(0))
    assert ess_per_evaluation(white, 2.0) == pytest.approx(0.5, rel=0.15)  # independent draws, two evaluations each
    sticky = white.cumsum(0) / 50  # a random walk: strongly autocorrelated
    assert ess_per_evaluation(sticky) < 0.05
    assert ess_per_evaluation(torch.zeros(100, 2)) == 0.0 or math.isnan(ess_per_evaluation(torch.ones(100, 2)))
    with pytest.raises(ValueError, match="chains"):
        chain_mean(torch.zeros(10, 1))


@pytest.mark.slow
@pytest.mark.parametrize("dim", [2, 4, 8, 16])
def test_imh_with_a_fitted_flow_recovers_the_mode_weights(dim):
    # Grenioux et al.: a flow proposal handles multimodality in moderate dimension.
    target = BimodalGaussian(dim, separation=4.0, weight=2 / 3)
    torch.manual_seed(0)
    x = target.sample(5000, generator=torch.Generator().manual_seed(1)).float()
    flow = RealNVP(dim, transforms=6, hidden=(64, 64))
    fit(flow, MaximumLikelihood(), x, steps=300, batch_size=256, lr=3e-3, progress=False, seed=0)
    run = independent_metropolis(flow, target, 800, chains=64, generator=torch.Generator().manual_seed(2))
    weight, se = chain_mean(target.mode_of(run.samples).double(), burn_in=100)
    assert abs(weight - 2 / 3) < 3 * se and se < 0.02


@pytest.mark.parametrize("beta", [0.2, 1.0, 5.0])
def test_funnel_transport_is_exact_at_beta_one_and_pulls_the_funnel_back_to_a_gaussian(beta):
    target = NealFunnel(5, scale=math.sqrt(3.0)).double()
    flow = Flow(FunnelTransport(5, math.sqrt(3.0), beta), StandardNormal(5)).double()
    x = target.sample(200, generator=torch.Generator().manual_seed(0))
    if beta == 1.0:  # the flow's density is the funnel's
        torch.testing.assert_close(flow.log_prob(x), target.log_prob(x))
    # Pulled back, the funnel is N(0, diag(1, beta, ..., beta)) up to log Z = 0, whatever beta.
    z = torch.randn(100, 5, dtype=torch.float64)
    variances = torch.tensor([1.0] + [beta] * 4, dtype=torch.float64)
    gaussian = 0.5 * (z.square() / variances).sum(-1) + 0.5 * torch.log(2 * math.pi * variances).sum()
    torch.testing.assert_close(latent_energy(flow, target)(z), gaussian)
    with pytest.raises(ValueError, match="beta"):
        FunnelTransport(3, beta=0.0)


def test_adapted_neutra_reaches_the_acceptance_and_counts_the_warmups_divergences():
    flow = Flow(FunnelTransport(8), StandardNormal(8))  # exact: the latent target is N(0, I)
    target = NealFunnel(8, scale=math.sqrt(3.0))
    g = torch.Generator().manual_seed(0)
    run, step, diverged = adapted_neutra_mala(
        flow, target, 400, torch.zeros(64, 8), warmup=600, step_size=1e3, generator=g
    )
    assert diverged > 0  # the first trial steps of 1e3 overflow the funnel's widths in float32
    assert 0.6 < run.mean_acceptance < 0.9 and 0.1 < step < 3.0
    assert run.samples.shape == (400, 64, 8)
    with pytest.raises(ValueError, match="target_acceptance"):
        adapted_neutra_mala(flow, target, 10, torch.zeros(2, 8), target_acceptance=1.0)


def test_latent_energy_is_inf_where_the_map_overflows_a_finite_latent_point():
    flow = Flow(FunnelTransport(3), StandardNormal(3))
    target = NealFunnel(3, scale=math.sqrt(3.0))
    z = torch.tensor([[200.0, 1.0, 1.0], [0.5, 1.0, -1.0]])  # v = 346: e^{v/2} overflows float32
    u = latent_energy(flow, target)(z)
    assert math.isinf(float(u[0])) and u[0] > 0 and math.isfinite(float(u[1]))
