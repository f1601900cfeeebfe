"""The simulators and their reference posteriors (flowkit/inference/tasks.py)."""

import math

import pytest
import torch

from flowkit.inference import SLCP, TASKS, GaussianLinear, LinearTransitSpectrum, TransitSpectrum, TwoMoons, get_task
from flowkit.inference.tasks import drop_invalid_simulations


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_simulates_observes_and_checks_its_inputs(name):
    task = get_task(name)
    theta, x = task.simulations(50, _generator())
    assert theta.shape == (50, task.theta_dim) and x.shape == (50, task.x_dim)
    assert theta.dtype == torch.float64 and bool(torch.isfinite(x).all())
    assert bool(task.in_prior_support(theta).all()) and bool(torch.isfinite(task.prior_log_prob(theta)).all())
    truth, observed = task.observation(3)
    again = task.observation(3)
    assert torch.equal(truth, again[0]) and torch.equal(observed, again[1])
    with pytest.raises(ValueError, match="shape"):
        task.simulate(torch.zeros(4, task.theta_dim + 1))
    with pytest.raises(ValueError, match="non-finite"):
        task.simulate(torch.full((2, task.theta_dim), math.nan))
    with pytest.raises(ValueError, match="shape"):
        task.reference_posterior(torch.zeros(task.x_dim + 1), 10)
    with pytest.raises(ValueError, match="one observation"):
        task.reference_posterior(x[:2], 10)


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="unknown task 'moons'"):
        get_task("moons")


def test_gaussian_linear_posterior_is_the_conjugate_one():
    task = GaussianLinear()
    x = torch.linspace(-1, 1, 10, dtype=torch.float64)
    mean, cov = task.posterior(x)
    torch.testing.assert_close(mean, x / 2)
    torch.testing.assert_close(cov, 0.05 * torch.eye(10, dtype=torch.float64))
    samples = task.reference_posterior(x, 40_000, _generator())
    torch.testing.assert_close(samples.mean(0), mean, atol=5 * math.sqrt(0.05 / 40_000), rtol=0)


def test_linear_transit_posterior_has_the_score_of_prior_times_likelihood():
    # log N(theta; m, S) and log prior + log likelihood differ by a constant: their gradients agree everywhere.
    task = LinearTransitSpectrum()
    truth, x = task.observation(0)
    mean, cov = task.posterior(x)
    theta = (
        mean + torch.randn(6, 7, dtype=torch.float64, generator=_generator()) @ cov.diag().sqrt().diag()
    ).requires_grad_()
    (task.prior_log_prob(theta) + task.log_likelihood(theta, x)).sum().backward()
    expected = -torch.linalg.solve(cov, (theta - mean).detach().T).T
    torch.testing.assert_close(theta.grad, expected, rtol=1e-6, atol=1e-6 * float(expected.abs().max()))


def test_linear_transit_is_the_first_order_expansion_of_the_transit_toy():
    linear, nonlinear = LinearTransitSpectrum(), TransitSpectrum()
    centre = linear.prior_loc
    step = 1e-4 * (nonlinear.upper - nonlinear.lower)
    for j in range(7):
        e = torch.zeros(7, dtype=torch.float64)
        e[j] = step[j]
        slope = (nonlinear.depth((centre + e)[None]) - nonlinear.depth((centre - e)[None]))[0] / (2 * step[j])
        torch.testing.assert_close(linear.matrix[:, j], slope, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(linear.mean(centre[None])[0], nonlinear.depth(centre[None])[0])


def test_two_moons_reference_reproduces_the_observation():
    task = TwoMoons()
    truth, x = task.observation(1)
    samples = task.reference_posterior(x, 5000, _generator())
    assert bool(task.in_prior_support(samples).all())
    again = task.simulate(samples, _generator(2))
    # x is drawn from the predictive of its own posterior: the predictive mean is close to it
    assert float((again.mean(0) - x).abs().max()) < 0.05
    # both moons (the sign of theta_1 + theta_2 is free) are populated
    side = (samples.sum(1) > 0).double().mean()
    assert 0.2 < float(side) < 0.8


def test_two_moons_observation_outside_the_support_is_refused():
    with pytest.raises(ValueError, match="outside the support"):
        TwoMoons().reference_posterior(torch.tensor([3.0, 0.0]), 10)


def test_transit_observation_outside_the_support_is_refused():
    with pytest.raises(ValueError, match="outside the support"):
        TransitSpectrum().reference_posterior(torch.full((52,), -5.0e4), 10)


@pytest.mark.slow
def test_slcp_mcmc_reference_agrees_with_importance_sampling():
    torch.set_num_threads(1)
    task = SLCP()
    truth, x = task.observation(0)
    samples = task.reference_posterior(x, 4000, _generator())
    theta = task.sample_prior(1_000_000, _generator(3))
    w = torch.softmax(task.log_likelihood(theta, x), 0)
    ess = 1 / float((w**2).sum())
    assert ess > 200
    for statistic in (lambda t: t[:, :2], lambda t: t[:, 2:4].abs(), lambda t: t[:, 4:]):
        mcmc, weighted = statistic(samples), statistic(theta)
        is_mean = (w[:, None] * weighted).sum(0)
        sd = weighted.std(0)
        # MCMC states are correlated: allow a few times the i.i.d. error of either estimate
        tolerance = 4 * sd * (1 / math.sqrt(ess) + 5 / math.sqrt(len(samples)))
        assert bool(((mcmc.mean(0) - is_mean).abs() < tolerance).all()), (mcmc.mean(0), is_mean)


def test_nan_simulations_are_dropped_with_a_count():
    theta = torch.zeros(5, 2)
    x = torch.ones(5, 3)
    x[1, 0] = math.nan
    x[3, 2] = math.inf
    with pytest.warns(RuntimeWarning, match="dropped 2 of 5 simulations"):
        kept_theta, kept_x = drop_invalid_simulations(theta, x)
    assert kept_theta.shape == (3, 2) and bool(torch.isfinite(kept_x).all())
    with pytest.raises(ValueError, match="all 5 simulations"):
        drop_invalid_simulations(theta, torch.full((5, 3), math.nan))
    with pytest.raises(ValueError, match="one x per theta"):
        drop_invalid_simulations(theta, x[:4])
