"""Importance weights, ESS, log Z, reweighting and IMH against closed forms."""

import math
import warnings

import numpy as np
import pytest
import torch
from cases import MISMATCH, mismatched_free_form

import flowkit
from flowkit.sampling import ess, imh, importance_sample, independent_metropolis, log_weights, log_Z, reweight
from flowkit.targets import Energy

LOG_2PI = math.log(2 * math.pi)


def _gaussian_target(mean: float, std: float, dim: int, scale_Z: float = 0.0) -> Energy:
    """N(mean, std^2 I) with an energy shifted by -scale_Z, so log Z = dim log(std sqrt(2 pi)) + scale_Z."""
    return Energy(
        lambda x: 0.5 * ((x - mean) / std).square().sum(-1) - scale_Z,
        dim,
        log_Z=dim * (math.log(std) + 0.5 * LOG_2PI) + scale_Z,
    )


def test_weights_are_constant_when_the_flow_is_the_target():
    flow = flowkit.flows.RealNVP(3, transforms=2)  # starts as the identity over N(0, I)
    target = _gaussian_target(0.0, 1.0, 3, scale_Z=2.5)
    x, log_w = importance_sample(flow, target, 500, batch_size=128)
    assert x.shape == (500, 3) and log_w.dtype == torch.float64
    torch.testing.assert_close(log_w, torch.full_like(log_w, target.log_Z), atol=1e-5, rtol=0)
    assert ess(log_w) == pytest.approx(1.0, abs=1e-9)
    estimate, error = log_Z(log_w)
    assert estimate == pytest.approx(target.log_Z, abs=1e-5) and error < 1e-6


def test_log_Z_is_within_its_error_for_a_mismatched_proposal():
    flow = flowkit.flows.RealNVP(2, transforms=2)
    target = _gaussian_target(0.3, 1.1, 2, scale_Z=-1.0)
    log_w = log_weights(flow, target, 40_000)
    estimate, error = log_Z(log_w)
    assert 0.0 < error < 0.05
    assert abs(estimate - target.log_Z) < 4 * error
    # ESS in closed form for q = N(0, 1), p = N(mu, s^2), per dimension:
    # 1 / E_q[w^2] = s sqrt(2 - s^2) exp(-mu^2 / (2 - s^2)); s^2 < 4/3 keeps the ESS estimate's variance finite.
    mu, s = 0.3, 1.1
    per_dim = s * math.sqrt(2 - s**2) * math.exp(-(mu**2) / (2 - s**2))
    assert ess(log_w) == pytest.approx(per_dim**2, abs=0.03)


def test_ess_and_log_Z_error_on_hand_weights():
    w = np.array([1.0, 2.0, 3.0, 4.0])
    log_w = torch.tensor(np.log(w))
    assert ess(log_w) == pytest.approx(w.sum() ** 2 / (4 * (w**2).sum()))
    estimate, error = log_Z(log_w)
    assert estimate == pytest.approx(math.log(w.mean()))
    assert error == pytest.approx(w.std(ddof=1) / (math.sqrt(4) * w.mean()))
    with pytest.raises(ValueError, match="NaN"):
        ess(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="1-D"):
        log_Z(torch.zeros(3, 2))


def test_reweight_recovers_target_moments():
    flow = flowkit.flows.RealNVP(2, transforms=2)
    target = _gaussian_target(0.5, 1.0, 2)
    x, log_w = importance_sample(flow, target, 40_000)
    mean, error = reweight(x, log_w)
    assert mean.shape == (2,) and error.shape == (2,)
    assert (mean - 0.5).abs().max() < 4 * error.max()
    second, _ = reweight(x[:, 0] ** 2, log_w)
    assert float(second) == pytest.approx(1.25, abs=0.05)
    with pytest.raises(ValueError, match="one value per weight"):
        reweight(x[:10], log_w)


def test_imh_accepts_everything_when_the_flow_is_the_target():
    flow = flowkit.flows.RealNVP(2, transforms=2)
    run = independent_metropolis(flow, _gaussian_target(0.0, 1.0, 2), 300)
    assert run.samples.shape == (300, 1, 2) and run.mean_acceptance == pytest.approx(1.0)


def test_imh_chain_targets_the_energy():
    flow = flowkit.flows.RealNVP(1 + 1, transforms=2)
    target = _gaussian_target(0.7, 0.8, 2)
    run = independent_metropolis(flow, target, 20_000, generator=torch.Generator().manual_seed(0))
    chain, acceptance = run.samples[:, 0], run.mean_acceptance
    assert 0.3 < acceptance < 0.95
    assert chain[:, 0].mean().item() == pytest.approx(0.7, abs=0.05)
    assert chain[:, 1].var().item() == pytest.approx(0.64, abs=0.06)
    # A rejected proposal repeats the state.
    repeats = (chain[1:] == chain[:-1]).all(-1).double().mean().item()
    assert repeats == pytest.approx(1 - acceptance, abs=1e-9)


class _StochasticStub(torch.nn.Module):
    """Stands in for a stochastic flow: its latent-to-data map gives the end points and their path density."""

    event_shape = torch.Size([2])
    context_features = 0
    samples_match_density = True  # the flow contract: its weights are those of its own samples
    base = flowkit.distributions.StandardNormal(2)

    def latent_to_data(self, z, context=None):
        return torch.zeros_like(z), torch.full(z.shape[:-1], -3.0)


def test_stochastic_flows_give_their_path_weights():
    x, log_w = importance_sample(_StochasticStub(), _gaussian_target(0.0, 1.0, 2, scale_Z=1.0), 25, batch_size=10)
    assert x.shape == (25, 2)
    torch.testing.assert_close(log_w, torch.full((25,), 4.0, dtype=torch.float64))  # -u(0) - log q = 1 + 3


def test_log_weights_at_are_minus_the_energy_and_the_log_density_of_the_latent_images():
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(2, transforms=2).double()
    flowkit.testing.randomize(flow, scale=0.5)
    target = _gaussian_target(0.5, 2.0, 2, scale_Z=1.0)
    z = torch.randn(7, 2, dtype=torch.float64)
    x, log_w = flowkit.sampling.log_weights_at(flow, z, target)
    torch.testing.assert_close(flow.bijector(x)[0], z)  # x is the sampler's image of z
    torch.testing.assert_close(log_w, -target.energy(x) - flow.log_prob(x))


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="event shape"):
        log_weights(flowkit.flows.RealNVP(3, transforms=1), _gaussian_target(0.0, 1.0, 2), 10)


def test_reweight_averages_indicators_and_counts_in_float64():
    log_w = torch.zeros(4, dtype=torch.float64)
    estimate, error = reweight(torch.tensor([True, False, True, True]), log_w)
    assert estimate.dtype == torch.float64 and float(estimate) == pytest.approx(0.75)
    assert float(error) == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    estimate, _ = reweight(torch.tensor([0, 1, 2, 3]), log_w)
    assert float(estimate) == pytest.approx(1.5)


def test_reweight_refuses_complex_and_non_finite_observables():
    log_w = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="real"):
        reweight(torch.ones(2, dtype=torch.complex64), log_w)
    with pytest.raises(ValueError, match="non-finite"):
        reweight(torch.tensor([1.0, float("nan")]), torch.tensor([0.0, -math.inf]))


def test_nan_energies_are_an_error_not_a_frozen_chain():
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    target = Energy(lambda x: -torch.log(x[..., 0]) + x.square().sum(-1), 2)  # NaN for x0 < 0
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        importance_sample(flow, target, 100)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        independent_metropolis(flow, target, 100)


def test_imh_starts_at_the_first_proposal_of_non_zero_weight():
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    wall = Energy(
        lambda x: torch.where(x[..., 0] > 0, 0.5 * x.square().sum(-1), math.inf), 2
    )  # zero density for x0 <= 0
    torch.manual_seed(0)
    run = independent_metropolis(flow, wall, 400)
    assert bool((run.samples[..., 0] > 0).all())  # no state of zero density, the first included
    assert 0 < run.mean_acceptance <= 1


def test_deprecated_imh_is_one_chain_of_the_batched_sampler_and_every_chain_starts_at_non_zero_weight():
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    wall = Energy(lambda x: torch.where(x[..., 0] > 0, 0.5 * x.square().sum(-1), math.inf), 2)
    torch.manual_seed(1)
    with pytest.warns(DeprecationWarning, match="imh is deprecated: use independent_metropolis"):
        chain, acceptance = imh(flow, wall, 300, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(1)
    run = independent_metropolis(flow, wall, 300, chains=1, generator=torch.Generator().manual_seed(2))
    assert torch.equal(chain, run.samples[:, 0]) and acceptance == float(run.acceptance[0])
    run = independent_metropolis(flow, wall, 50, chains=16, generator=torch.Generator().manual_seed(3))
    assert bool((run.samples[..., 0] > 0).all())  # about half the proposals have zero weight; no state does
    assert bool(((run.acceptance > 0) & (run.acceptance <= 1)).all())
    nowhere = Energy(lambda x: torch.full(x.shape[:-1], math.inf, dtype=x.dtype), 2)
    with pytest.raises(ValueError, match="zero weight"):
        independent_metropolis(flow, nowhere, 10, chains=2)


def test_log_Z_warns_when_a_few_weights_dominate():
    with pytest.warns(RuntimeWarning, match="fewer than 10 effective samples"):
        estimate, error = log_Z(torch.tensor([1000.0, 0.0, 0.0], dtype=torch.float64))
    assert error <= 1.0
    with pytest.raises(ValueError, match="floating dtype"):
        log_Z(torch.tensor([True, False]))


@pytest.mark.parametrize(
    "values",
    [[1e308, 0.0], [1e308, 1e308, 1e308], [-1e308, 1e308, 1.0], [-1.7e308, 1.7e308]],
)
def test_ess_and_log_Z_at_huge_log_weights(values):
    log_w = torch.tensor(values, dtype=torch.float64)
    share = torch.softmax(log_w - log_w.max(), 0)
    assert ess(log_w) == pytest.approx(float(1 / (len(values) * share.square().sum())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a few weights dominate
        estimate, error = log_Z(log_w)
    assert estimate == pytest.approx(max(values)) and math.isfinite(error)
    assert 0 < ess(log_w) <= 1


def test_potential_of_an_energy_that_does_not_depend_on_x():
    # Issue 38 (9): a constant energy has gradient 0 (autograd raised "does not require grad").
    x = torch.randn(4, 3)
    u, grad = flowkit.sampling.potential(lambda y: y.new_full(y.shape[:-1], 2.0))(x)
    assert torch.equal(u, torch.full((4,), 2.0)) and torch.equal(grad, torch.zeros(4, 3))


def test_importance_weighting_refuses_a_flow_whose_samples_do_not_follow_its_density():
    # Issue 38 (3): importance_sample crashed with AttributeError on a FreeFormFlow; IMH and NeuTra with it too.
    model, target = mismatched_free_form()
    sampling = flowkit.sampling
    calls = [
        ("importance_sample", lambda: importance_sample(model, target, 10)),
        ("importance_sample", lambda: log_weights(model, target, 10)),
        ("independent_metropolis", lambda: sampling.independent_metropolis(model, target, 10, chains=2)),
        ("flow_hmc", lambda: sampling.flow_hmc(model, target, 2)),
        ("neutra_mala", lambda: sampling.neutra_mala(model, target, 2)),
        ("latent_energy", lambda: sampling.latent_energy(model, target)),
    ]
    for where, call in calls:
        with pytest.raises(ValueError, match=f"{where}: {MISMATCH}"):
            call()
    injective = flowkit.flows.InjectiveFlow(
        flowkit.nn.MLP(3, 2, (4,)), flowkit.nn.MLP(2, 3, (4,)), features=3, latent_features=2
    )
    with pytest.raises(ValueError, match="InjectiveFlow's samples do not come from the density.*manifold"):
        importance_sample(injective, Energy(lambda x: x.square().sum(-1), 3), 10)


def test_importance_weighting_refuses_a_random_log_density():
    # A CNF with Hutchinson's trace has an unbiased log-density estimate: fine for training, but exp of it is not
    # an exact importance weight, so log Z would be biased without a sign. AIS refused it; the rest now does too.
    flow = flowkit.flows.CNF(2, hidden=(8,), trace="hutchinson")
    target = Energy(lambda x: x.square().sum(-1) / 2, 2)
    assert not flow.exact_log_prob and not flow.samples_match_density
    with pytest.raises(ValueError, match="random estimate.*hutchinson"):
        importance_sample(flow, target, 10)
    with pytest.raises(ValueError, match="random estimate.*hutchinson"):
        flowkit.sampling.ais(flow, target, steps=2, n=8)
    assert flowkit.flows.CNF(2, hidden=(8,)).samples_match_density
