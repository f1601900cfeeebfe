"""Annealed importance sampling: unbiased log Z, equal weights for a perfect flow, evaluation counts, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from cases import MISMATCH, mismatched_free_form

from flowkit.bijectors import Reverse
from flowkit.distributions import DiagNormal, rigid_domain
from flowkit.flows import Flow, RigidBodyFlow
from flowkit.sampling import ais
from flowkit.sampling.ais import TRANSITIONS
from flowkit.targets import Energy, MatrixFisher

D = 2
LOC, SCALE, OFFSET = 1.0, 0.7, 3.0


def _gaussian_target() -> Energy:
    """An unnormalised N(LOC, SCALE^2 I) in D dimensions with log Z = D/2 log(2 pi SCALE^2) - OFFSET."""
    log_Z = 0.5 * D * math.log(2 * math.pi * SCALE**2) - OFFSET
    return Energy(lambda x: 0.5 * (x - LOC).square().sum(-1) / SCALE**2 + OFFSET, D, log_Z=log_Z)


def _gaussian_flow(loc: float, scale: float) -> Flow:
    """N(loc, scale^2 I), built in float64 (log scale not rounded to float32 first)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return Flow(Reverse(D), DiagNormal(D, loc=loc, scale=scale, trainable=False))
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("transition", ["hmc", "metropolis"])
@pytest.mark.parametrize("steps", [1, 10])
def test_ais_log_Z_unbiased_on_a_gaussian(steps: int, transition: str) -> None:
    torch.manual_seed(steps)
    target = _gaussian_target().double()
    flow = _gaussian_flow(0.0, 1.6)  # a mismatched proposal: an ESS well below 1
    # The kernels' generator must not replay the flow's noise (the global generator seeded alike would).
    moves = torch.Generator().manual_seed(12345)
    result = ais(flow, target, steps, 4000, transition=transition, step_size=0.5, generator=moves)
    assert 0.05 < result.ess < 0.95
    assert result.log_Z_error > 0
    assert abs(result.log_Z - target.log_Z) < 3 * result.log_Z_error
    assert result.samples.shape == (4000, D) and result.log_w.dtype == torch.float64


@pytest.mark.parametrize("transition", ["hmc", "metropolis"])
def test_ais_with_an_energy_that_does_not_depend_on_x(transition: str) -> None:
    # Issue 38 (9): a constant energy u = c is a valid target (force 0); HMC raised autograd's "does not
    # require grad". Towards p^a q^(1-a) with q = N(0, s^2 I) the end point is N(0, s^2/(1 - a) I), and
    # log Z = -a c + a D/2 log(2 pi s^2) - D/2 log(1 - a).
    torch.manual_seed(0)
    alpha, c, s = 0.5, 1.5, 1.6
    target = Energy(lambda x: x.new_full(x.shape[:-1], c), D)
    assert torch.equal(target.force(torch.randn(3, D)), torch.zeros(3, D))
    exact = -alpha * c + alpha * D / 2 * math.log(2 * math.pi * s**2) - D / 2 * math.log(1 - alpha)
    moves = torch.Generator().manual_seed(1)
    result = ais(_gaussian_flow(0.0, s), target, 10, 4000, alpha=alpha, transition=transition, generator=moves)
    assert 0 < result.log_Z_error < 0.02
    assert abs(result.log_Z - exact) < 3 * result.log_Z_error


def test_ais_with_more_steps_has_a_smaller_error() -> None:
    torch.manual_seed(0)
    target, flow = _gaussian_target().double(), _gaussian_flow(0.0, 1.6)
    errors = [ais(flow, target, steps, 4000, step_size=0.5).log_Z_error for steps in (1, 10)]
    assert errors[1] < 0.8 * errors[0]  # 0.016 against 0.026 over 30 seeds


@pytest.mark.parametrize("alpha", [1.0, 2.0])
@pytest.mark.parametrize("transition", ["hmc", "metropolis"])
def test_ais_weights_equal_for_a_perfect_flow(transition: str, alpha: float) -> None:
    torch.manual_seed(0)
    target = _gaussian_target().double()
    result = ais(_gaussian_flow(LOC, SCALE), target, 5, 300, transition=transition, alpha=alpha, step_size=0.4)
    # Every pi_j is the target itself: log w = alpha log Z for every sample, whatever the moves did.
    torch.testing.assert_close(result.log_w, torch.full_like(result.log_w, alpha * target.log_Z), rtol=0, atol=1e-10)
    assert result.ess == pytest.approx(1.0)
    assert 0 < float(result.acceptance.min()) and float(result.acceptance.max()) <= 1


def test_ais_on_the_sphere_with_random_walk_moves() -> None:
    """A rigid-body target on S^3 with its exact log Z: Metropolis moves of the sphere's own proposal."""
    torch.manual_seed(0)
    target = MatrixFisher([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.5]]).double()
    flow = RigidBodyFlow(["quaternion"], blocks=1, hidden=(8,)).double()
    domain = rigid_domain(target.segments)
    result = ais(flow, target, 4, 3000, transition="metropolis", step_size=0.3, domain=domain)
    assert torch.allclose(result.samples.norm(dim=-1), torch.ones(3000, dtype=torch.float64))
    assert abs(result.log_Z - target.log_Z) < 3 * result.log_Z_error
    with pytest.raises(ValueError, match="HMC moves on the real line"):
        ais(flow, target, 2, 10, domain=domain)


@pytest.mark.parametrize(("transition", "per_step"), [("hmc", 3 * 2), ("metropolis", 2)])
def test_ais_counts_target_evaluations(transition: str, per_step: int) -> None:
    target, flow = _gaussian_target().double(), _gaussian_flow(0.0, 1.0)
    result = ais(flow, target, 4, 50, transition=transition, n_leapfrog=3, mcmc_steps=2)
    assert result.target_evaluations == 50 * (1 + 4 * per_step)


def test_ais_from_latent_points_and_step_size_adaptation() -> None:
    torch.manual_seed(0)
    target, flow = _gaussian_target().double(), _gaussian_flow(0.0, 1.0)
    z = flow.base.sample((200,))
    huge = ais(flow, target, 3, z=z, step_size=torch.tensor([20.0, 20.0, 20.0]), adapt=True)
    assert torch.allclose(huge.step_sizes, torch.full((3,), 20.0 / 1.05, dtype=torch.float64))
    tiny = ais(flow, target, 3, z=z, step_size=1e-4, adapt=True)
    assert torch.allclose(tiny.step_sizes, torch.full((3,), 1.05e-4, dtype=torch.float64))
    fixed = ais(flow, target, 3, z=z, step_size=1e-4)
    assert torch.equal(fixed.step_sizes, torch.full((3,), 1e-4, dtype=torch.float64))


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -0.1])
def test_ais_refuses_bad_step_sizes(bad: float) -> None:
    target, flow = _gaussian_target().double(), _gaussian_flow(0.0, 1.0)
    with pytest.raises(ValueError, match="step sizes must be finite and positive"):
        ais(flow, target, 2, 10, step_size=bad)
    with pytest.raises(ValueError, match="step sizes must be finite and positive"):
        ais(flow, target, 2, 10, step_size=torch.tensor([0.1, bad]))


def test_ais_refuses_bad_input() -> None:
    target, flow = _gaussian_target().double(), _gaussian_flow(0.0, 1.0)
    with pytest.raises(ValueError, match="steps must be"):
        ais(flow, target, 0, 10)
    with pytest.raises(ValueError, match="unknown transition"):
        ais(flow, target, 2, 10, transition="langevin")
    with pytest.raises(ValueError, match="one of them"):
        ais(flow, target, 2)
    with pytest.raises(ValueError, match="betas must increase"):
        ais(flow, target, 2, 10, betas=torch.tensor([0.0, 0.7, 0.3, 1.0]))
    nan_energy = Energy(lambda x: x.sum(-1) * math.nan, D).double()
    with pytest.raises(ValueError, match="NaN at every one of the 10 flow samples"):
        ais(flow, nan_energy, 2, 10)
    nowhere = Energy(lambda x: x.square().sum(-1) * math.inf, D).double()
    with pytest.raises(ValueError, match="every one of the 10 AIS weights is zero"):
        ais(flow, nowhere, 2, 10, transition="metropolis")


def test_ais_runs_the_flow_in_eval_mode_and_refuses_a_random_density() -> None:
    # a residual flow with the Russian-roulette log-det is a random estimate in training mode: AIS must use the
    # exact (eval-mode) density, and give the flow back in the mode it was in
    from flowkit.bijectors import ContinuousFlow
    from flowkit.flows import ResidualFlow
    from flowkit.nn import VectorField

    torch.manual_seed(0)
    flow = ResidualFlow(D, transforms=1, hidden=(8,), logdet="series").double().train()
    target = _gaussian_target().double()
    seen = []
    log_prob = flow.log_prob

    def recording(x: torch.Tensor) -> torch.Tensor:
        seen.append(flow.training)
        return log_prob(x)

    flow.log_prob = recording
    ais(flow, target, 2, 16, transition="metropolis", step_size=0.3)
    assert seen and not any(seen)
    assert flow.training
    field = VectorField(D, hidden=(8,))
    cnf = Flow(ContinuousFlow(field, (D,), trace="hutchinson"), DiagNormal(D))
    with pytest.raises(ValueError, match="hutchinson"):
        ais(cnf, target.float(), 2, 16)


def test_ais_refuses_a_flow_whose_samples_do_not_follow_its_density() -> None:
    # Issue 38 (3): a FreeFormFlow inherited exact_log_prob, and AIS from its decoder's samples weighted by its
    # encoder's density returned log Z = 15.8 +- 0.8 for a target with log Z = 3.224.
    model, target = mismatched_free_form()
    for transition in TRANSITIONS:
        with pytest.raises(ValueError, match=f"ais: {MISMATCH}"):
            ais(model, target, 5, 100, transition=transition)
