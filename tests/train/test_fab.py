"""FAB: its gradient against the alpha-2 divergence's by quadrature, and the rest.

Convergence to an exact answer, the replay buffer's weight adjustment, several targets and flows, evaluation
counts and bad input.
"""

from __future__ import annotations

import math

import pytest
import torch
from cases import MISMATCH, mismatched_free_form

from flowkit.bijectors import Reverse
from flowkit.distributions import DiagNormal, rigid_domain
from flowkit.flows import Flow, LatticeFlow, RealNVP, RigidBodyFlow
from flowkit.targets import DoubleWell, Energy, GaussianMixture, ManyWell, MatrixFisher, Phi4
from flowkit.train import FAB, PrioritisedReplayBuffer, fit


def _gaussian_flow(dim: int, loc: float, scale: float) -> Flow:
    """A trainable diagonal Gaussian in float64."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return Flow(Reverse(dim), DiagNormal(dim, loc=loc, scale=scale, trainable=True))
    finally:
        torch.set_default_dtype(default)


def _mixture() -> GaussianMixture:
    """A normalised 1-D mixture of three Gaussians of width 1.31 with means in [-3, 3]."""
    return GaussianMixture(n_modes=3, dim=1, seed=1, loc_scaling=3.0).double()


def _quadrature_gradient(flow: Flow, target: GaussianMixture) -> torch.Tensor:
    """grad_theta log int p^2 / q_theta on a fine grid: the direction FAB's gradient estimates."""
    grid = torch.linspace(-25.0, 25.0, 40_001, dtype=torch.float64)[:, None]
    log_integrand = 2 * (-target.energy(grid)) - flow.log_prob(grid)
    log_integral = torch.logsumexp(log_integrand, 0) + math.log(float(grid[1, 0] - grid[0, 0]))
    return torch.cat(torch.autograd.grad(log_integral, list(flow.parameters())))


def _fab_gradient(flow: Flow, objective: FAB, n: int) -> torch.Tensor:
    flow.zero_grad()
    objective.loss(flow, flow.base.sample((n,))).backward()
    return torch.cat([p.grad.flatten() for p in flow.parameters()])


@pytest.mark.parametrize("buffer", [False, True])
def test_fab_gradient_matches_the_alpha_2_divergence_by_quadrature(buffer: bool) -> None:
    torch.manual_seed(0)
    target = _mixture()
    flow = _gaussian_flow(1, loc=0.8, scale=3.0)  # wider than the mixture (bounded weights) and off-centre
    exact = _quadrature_gradient(flow, target)
    repeats = 24
    estimates = []
    for _ in range(repeats):
        # A fresh objective per repeat: independent AIS runs (and a fresh buffer of them).
        replay = PrioritisedReplayBuffer(4000, min_fill=2000) if buffer else None
        objective = FAB(target, ais_steps=4, step_size=0.8, replay_buffer=replay, adapt=False)
        estimates.append(_fab_gradient(flow, objective, 1000))
    estimates = torch.stack(estimates)
    mean, se = estimates.mean(0), estimates.std(0) / math.sqrt(repeats)
    assert bool((exact.abs() > 6 * se).all()), (exact, se)  # the test can tell a wrong gradient
    assert bool(((mean - exact).abs() < 3 * se).all()), (mean, exact, se)


def test_fab_trains_a_gaussian_flow_to_a_gaussian_target() -> None:
    """Among Gaussians, the alpha-2 divergence to a Gaussian is minimal at the target itself."""
    torch.manual_seed(0)
    loc, scale = 1.5, 0.6
    target = Energy(lambda x: 0.5 * (x - loc).square().sum(-1) / scale**2, 2).double()
    flow = _gaussian_flow(2, loc=-1.0, scale=2.0)
    objective = FAB(target, ais_steps=2, step_size=0.3)
    fit(flow, objective, steps=150, batch_size=128, lr=0.05, progress=False, seed=0)
    torch.testing.assert_close(flow.base.loc, torch.full((2,), loc, dtype=torch.float64), atol=0.05, rtol=0)
    scales = flow.base.log_scale.exp()
    torch.testing.assert_close(scales, torch.full((2,), scale, dtype=torch.float64), atol=0, rtol=0.05)


@pytest.mark.parametrize("alpha", [2.0, 1.0, 3.0])
def test_replay_buffer_adjusts_the_drawn_weights_to_the_updated_flow(alpha: float) -> None:
    # the points target p^alpha q^(1 - alpha): moving them to the new flow adds (alpha - 1)(log q_old - log q_new)
    torch.manual_seed(0)
    target = _mixture()
    flow = _gaussian_flow(1, loc=0.0, scale=2.0)
    buffer = PrioritisedReplayBuffer(300, updates_per_ais=100, min_fill=200)
    objective = FAB(target, ais_steps=2, alpha=alpha, replay_buffer=buffer)
    optimizer = torch.optim.SGD(flow.parameters(), lr=0.1)
    objective.loss(flow, flow.base.sample((100,))).backward()
    buffer = objective.buffer
    before = buffer.log_w.clone()
    index, log_q_old = objective._pending
    optimizer.step()
    with torch.no_grad():
        log_q_new = flow.log_prob(buffer.x)
    objective.loss(flow, flow.base.sample((100,)))  # adjusts first; no AIS run at this step (updates_per_ais=100)
    assert len(buffer) == 200
    drawn = torch.zeros(200, dtype=torch.bool)
    drawn[index] = True
    expected = before.clone()
    log_q_at_draw = torch.empty(200, dtype=torch.float64)
    log_q_at_draw[index] = log_q_old
    expected[drawn] = before[drawn] + (alpha - 1) * (log_q_at_draw[drawn] - log_q_new[drawn])
    torch.testing.assert_close(buffer.log_w, expected, rtol=0, atol=1e-12)
    assert torch.equal(buffer.log_w[drawn], before[drawn]) == (alpha == 1.0)


def test_replay_buffer_is_first_in_first_out() -> None:
    buffer = PrioritisedReplayBuffer(5)
    buffer.add(torch.arange(4.0)[:, None], torch.zeros(4, dtype=torch.float64))
    buffer.add(torch.arange(4.0, 7.0)[:, None], torch.tensor([0.0, -math.inf, 0.0], dtype=torch.float64))
    # 6 points of non-zero weight: the oldest (0) was replaced by the last (6).
    assert sorted(buffer.x.flatten().tolist()) == [1.0, 2.0, 3.0, 4.0, 6.0]
    assert len(buffer) == 5


def _targets_and_flows() -> list[tuple[str, object, object, dict]]:
    torch.manual_seed(0)
    fisher = MatrixFisher([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    return [
        ("double-well", DoubleWell(), RealNVP(2, transforms=2, hidden=(16,)), {}),
        ("many-well", ManyWell(4), RealNVP(4, transforms=2, hidden=(16,)), {}),
        ("gmm", GaussianMixture(n_modes=5, loc_scaling=5.0), RealNVP(2, transforms=2, hidden=(16,)), {}),
        ("phi4", Phi4(4, -4.0, 8.0), LatticeFlow((4, 4), transforms=2, hidden=(4,)), {}),
        (
            "matrix-fisher",
            fisher,
            RigidBodyFlow(["quaternion"], blocks=1, hidden=(8,)),
            {"transition": "metropolis", "domain": rigid_domain(fisher.segments)},
        ),
    ]


@pytest.mark.parametrize("buffer", [None, 128])
def test_fab_trains_on_several_targets_and_counts_evaluations(buffer: int | None) -> None:
    for name, target, flow, options in _targets_and_flows():
        objective = FAB(target, ais_steps=2, n_leapfrog=3, replay_buffer=buffer, step_size=0.05, **options)
        history = fit(flow, objective, steps=5, batch_size=32, lr=1e-3, progress=False, seed=0)
        assert len(history.skipped) == 0, name
        per_point = 1 + 2 * (3 if objective.transition == "hmc" else 1)
        # Without a buffer one AIS run per step; with it one per 4 steps plus the first fill to min_fill (128//10 < 32).
        runs = 5 if buffer is None else 2
        assert objective.target_evaluations == runs * 32 * per_point, name
        metrics = objective.metrics()
        assert 0 < metrics["ais_ess"] <= 1 and 0 <= metrics["ais_acceptance"] <= 1, name


def test_fab_refuses_bad_input() -> None:
    target = DoubleWell()
    flow = RealNVP(2, transforms=2, hidden=(8,))
    with pytest.raises(ValueError, match="ais_steps must be"):
        FAB(target, ais_steps=0)
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="step sizes must be finite and positive"):
            FAB(target, step_size=bad)
    with pytest.raises(ValueError, match="unknown transition"):
        FAB(target, transition="gibbs")
    with pytest.raises(ValueError, match="replay_buffer must be"):
        FAB(target, replay_buffer=1.5)
    with pytest.raises(ValueError, match="holds 16 points, fewer than a batch of 32"):
        FAB(target, replay_buffer=16).loss(flow, flow.base.sample((32,)))
    with pytest.raises(ValueError, match="min_fill 20 is smaller than a batch of 32"):
        FAB(target, replay_buffer=PrioritisedReplayBuffer(100, min_fill=20)).loss(flow, flow.base.sample((32,)))
    nan_energy = Energy(lambda x: x.sum(-1) * math.nan, 2)
    with pytest.raises(ValueError, match="NaN at every one of the 32 flow samples"):
        FAB(nan_energy).loss(flow, flow.base.sample((32,)))


def test_fab_refuses_a_flow_whose_samples_do_not_follow_its_density() -> None:
    # Issue 38 (3): FAB asks the flow contract as AIS does (it refused a FreeFormFlow only for lacking a bijector).
    model, target = mismatched_free_form()
    with pytest.raises(ValueError, match=f"FAB: {MISMATCH}"):
        FAB(target).loss(model, 16)
