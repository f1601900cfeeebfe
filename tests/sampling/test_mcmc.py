"""flowkit.sampling.mcmc: HMC (jittered), MALA, flow HMC, NeuTra MALA and batched IMH against exact answers."""

import math
import warnings

import pytest
import torch

from flowkit import sampling
from flowkit.bijectors import Chain, Linear, Reshape
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow, LatticeFlow
from flowkit.targets import Energy, Phi4
from flowkit.testing import randomize


def _free_field_phi2(samples):
    """Chain mean of <phi^2> and its standard error from the spread of independent chains' means."""
    per_chain = samples.square().mean((-1, -2)).mean(0)  # (chains,)
    return float(per_chain.mean()), float(per_chain.std() / per_chain.numel() ** 0.5)


# the zero mode of the free field (m2 = 1) has omega = sqrt(2); with 10 leapfrog steps of this size its
# rotation over one trajectory is exactly pi, so without jitter its amplitude never changes
_RESONANT_STEP = math.sqrt(2 * (1 - math.cos(math.pi / 10)) / 2)


@pytest.mark.parametrize("jitter", [0.2, 0.0])
def test_hmc_reproduces_the_free_field_propagator_only_with_jitter(jitter):
    target = Phi4(8, 1.0, 0.0).double()
    exact = float(target.free_propagator()[0, 0])
    run = sampling.hmc(
        target,
        torch.zeros(64, 8, 8, dtype=torch.float64),  # a cold start
        300,
        step_size=_RESONANT_STEP,
        n_leapfrog=10,
        jitter=jitter,
        generator=torch.Generator().manual_seed(0),
    )
    assert run.samples.shape == (300, 64, 8, 8) and 0.5 < run.mean_acceptance < 1
    mean, se = _free_field_phi2(run.samples[100:])
    if jitter:
        assert abs(mean - exact) < 3 * se
    else:  # fixed-length HMC is not ergodic here: the zero mode stays at 0, <phi^2> is low by 1/(2 m2 V)
        assert mean - exact < -10 * se


def test_mala_reproduces_the_free_field_propagator():
    target = Phi4(6, 1.0, 0.0).double()
    run = sampling.mala(target, torch.zeros(32, 6, 6, dtype=torch.float64), 800, 0.25, torch.Generator().manual_seed(1))
    mean, se = _free_field_phi2(run.samples[200:])
    assert abs(mean - float(target.free_propagator()[0, 0])) < 3 * se


def test_neutra_with_the_identity_map_is_mala():
    target = Phi4(4, -1.0, 0.5).double()
    identity = LatticeFlow(4, transforms=2, hidden=(4,)).double()  # a fresh flow is the identity
    x0 = torch.randn(5, 4, 4, dtype=torch.float64)
    plain = sampling.mala(target, x0, 30, 0.3, torch.Generator().manual_seed(3))
    neutra = sampling.neutra_mala(
        identity, target, 30, z0=x0, step_size=0.3, generator=torch.Generator().manual_seed(3)
    )
    torch.testing.assert_close(neutra.samples, plain.samples, rtol=0, atol=1e-12)
    torch.testing.assert_close(neutra.latent, plain.samples, rtol=0, atol=1e-12)
    assert torch.equal(neutra.acceptance, plain.acceptance) and 0 < plain.mean_acceptance < 1


def _latent_setup():
    torch.manual_seed(0)
    # a smooth activation: a kink in the potential's gradient (leaky ReLU) makes the leapfrog error O(eps)
    flow = randomize(LatticeFlow(4, transforms=2, hidden=(4,), activation="tanh"), scale=0.1).double()
    target = Phi4(4, -1.0, 0.5).double()
    return flow, target, sampling.potential(sampling.latent_energy(flow, target))


def test_latent_hmc_is_reversible():
    _, _, potential = _latent_setup()
    z, p = torch.randn(3, 4, 4, dtype=torch.float64), torch.randn(3, 4, 4, dtype=torch.float64)
    z1, p1, _, _ = sampling.leapfrog(z, p, 0.1, 20, potential)
    z2, p2, _, _ = sampling.leapfrog(z1, -p1, 0.1, 20, potential)
    assert not torch.allclose(z1, z)
    torch.testing.assert_close(z2, z, rtol=0, atol=1e-10)
    torch.testing.assert_close(-p2, p, rtol=0, atol=1e-10)


def test_latent_hmc_energy_error_is_second_order():
    _, _, potential = _latent_setup()
    z, p = torch.randn(8, 4, 4, dtype=torch.float64), torch.randn(8, 4, 4, dtype=torch.float64)
    u0, _ = potential(z)
    errors = []
    for eps in (0.04, 0.02, 0.01):
        _, p1, u1, _ = sampling.leapfrog(z, p, eps, round(0.8 / eps), potential)
        dH = (u1 - u0) + 0.5 * (p1.square().sum((-1, -2)) - p.square().sum((-1, -2)))
        errors.append(float(dH.abs().mean()))
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    assert all(3.3 < r < 4.7 for r in ratios), (errors, ratios)


def test_flow_hmc_samples_the_target():
    """Flow HMC with a random (non-trivial) flow on the free field: the latent chain maps to exact <phi^2>."""
    torch.manual_seed(0)
    flow = randomize(LatticeFlow(4, transforms=2, hidden=(4,)), scale=0.05).double()
    target = Phi4(4, 1.0, 0.0).double()
    run = sampling.flow_hmc(
        flow, target, 250, chains=32, step_size=0.3, n_leapfrog=4, generator=torch.Generator().manual_seed(0)
    )
    assert run.latent.shape == run.samples.shape == (250, 32, 4, 4)
    torch.testing.assert_close(flow.bijector.inverse(run.latent[-1])[0], run.samples[-1])
    mean, se = _free_field_phi2(run.samples[30:])
    assert abs(mean - float(target.free_propagator()[0, 0])) < 3 * se


def test_imh_with_q_equal_to_p_accepts_every_proposal():
    normal = Energy(lambda x: 0.5 * x.square().sum((-1, -2)), (4, 4), log_Z=8 * math.log(2 * math.pi))
    flow = LatticeFlow(4, transforms=2, hidden=(4,))  # the identity over a standard normal: q = p
    run = sampling.independent_metropolis(flow, normal, 200, chains=3, generator=torch.Generator().manual_seed(0))
    assert run.samples.shape == (200, 3, 4, 4)
    assert torch.equal(run.acceptance, torch.ones(3, dtype=torch.float64))


def test_imh_with_a_wrong_proposal_is_still_exact():
    wide = Energy(lambda x: 0.5 * x.square().sum((-1, -2)) / 1.3**2, (2, 2))
    flow = LatticeFlow(2, transforms=1, hidden=(2,))  # proposes N(0, 1): too narrow
    run = sampling.independent_metropolis(flow, wide, 4000, chains=8, generator=torch.Generator().manual_seed(0))
    assert 0.3 < run.mean_acceptance < 0.99
    mean, se = _free_field_phi2(run.samples)
    assert abs(mean - 1.3**2) < 3 * se * 2  # IMH chains are correlated: the spread of chain means is the error


def _gaussian_proposal(L, m2):
    """A flow that samples the free field at another mass exactly: x = R^{-1} z with R^T R its precision."""
    hessian = torch.autograd.functional.hessian(
        lambda v: Phi4(L, m2, 0.0).double().energy(v.reshape(L, L)), torch.zeros(L * L, dtype=torch.float64)
    )
    linear = Linear(L * L, bias=False).double()
    with torch.no_grad():
        linear.weight.copy_(torch.linalg.cholesky(hessian).T)
    return Flow(Chain(Reshape((L, L), (L * L,)), linear), StandardNormal(L * L)).double()


def test_importance_sampling_reproduces_the_free_field_log_Z():
    target = Phi4(8, 1.0, 0.0).double()
    flow = _gaussian_proposal(8, 1.15)  # not the target: the weights vary
    torch.manual_seed(0)
    _, log_w = sampling.importance_sample(flow, target, 20_000)
    assert 0.2 < sampling.ess(log_w) < 0.95
    estimate, error = sampling.log_Z(log_w)
    assert abs(estimate - target.log_Z) < 0.05 and abs(estimate - target.log_Z) < 4 * error + 0.01


def test_autocorrelation_time_of_an_ar1_series():
    generator = torch.Generator().manual_seed(0)
    phi, n = 0.8, 40_000
    noise = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    x = torch.empty_like(noise)
    x[0] = noise[0] / math.sqrt(1 - phi**2)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + noise[t]
    tau = sampling.integrated_autocorrelation_time(x)
    assert tau == pytest.approx((1 + phi) / (2 * (1 - phi)), rel=0.1)
    assert sampling.integrated_autocorrelation_time(noise) == pytest.approx(0.5, abs=0.05)
    rho = sampling.autocorrelation(x[:, 0])
    assert float(rho[0]) == 1 and float(rho[1]) == pytest.approx(phi, abs=0.03)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t: sampling.hmc(t, torch.zeros(2, 4, 4), 10, step_size=0.0), "step_size"),
        (lambda t: sampling.hmc(t, torch.zeros(2, 4, 4), 10, jitter=1.0), "jitter"),
        (lambda t: sampling.hmc(t, torch.zeros(2, 4, 4), 0), "n_steps"),
        (lambda t: sampling.hmc(t, torch.full((2, 4, 4), math.nan), 10), "non-finite"),
        (lambda t: sampling.mala(t, torch.zeros(4, 4, dtype=torch.long), 10), "floating"),
        (lambda t: sampling.independent_metropolis(LatticeFlow(4, 1, (2,)), t, 1), "n_steps"),
        (lambda t: sampling.flow_hmc(LatticeFlow(6, 1, (2,)), t, 5), "event shape"),
        (lambda t: sampling.integrated_autocorrelation_time(torch.ones(1)), "n_steps >= 2"),
    ],
)
def test_bad_arguments_are_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(Phi4(4))


def test_hmc_rejects_diverging_trajectories_and_names_the_step_size():
    # Regression: a step size far too large sent positions to inf, and the target's input check blamed x.
    target = Phi4(4, -4.0, 8.0).double()
    x0 = 0.1 * torch.randn(4, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning, match=r"proposals diverged .* step_size=50 is too large"):
        run = sampling.hmc(target, x0, 5, step_size=50.0, n_leapfrog=20, generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(run.samples).all()
    # Every diverged proposal was rejected: the chains that never accepted are still at their start.
    stuck = run.acceptance == 0
    assert stuck.any() and torch.equal(run.samples[-1][stuck], x0[stuck])
    # A sound step size gives no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sampling.hmc(target, x0, 5, step_size=0.05, generator=torch.Generator().manual_seed(1))


def test_mala_rejects_diverging_proposals_and_names_the_step_size():
    target = Phi4(4, -4.0, 8.0).double()
    x0 = 0.1 * torch.randn(4, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning, match=r"mala: .* proposals diverged .* step_size=1e\+100"):
        run = sampling.mala(target, x0, 5, step_size=1e100, generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(run.samples).all() and (run.acceptance == 0).all()
    assert torch.equal(run.samples[-1], x0)
