"""FAB: its gradient against the alpha-2 divergence's by quadrature, and the rest.

Convergence to an exact answer, the replay buffer's weight adjustment, several targets and flows, evaluation
counts, bad input, and its state through a checkpoint: a killed run resumes bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from cases import MISMATCH, mismatched_free_form
from interruptions import KillAt, Killed, run_killed_by_sigkill

from flowkit.bijectors import Reverse
from flowkit.distributions import DiagNormal, rigid_domain
from flowkit.flows import Flow, LatticeFlow, RealNVP, RigidBodyFlow
from flowkit.targets import DoubleWell, Energy, GaussianMixture, ManyWell, MatrixFisher, Phi4
from flowkit.train import FAB, PrioritisedReplayBuffer, fit
from flowkit.train.checkpoint import load_state, save_state
from flowkit.train.loop import CHECKPOINT_FILE


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


# ---- the state goes through the checkpoint: a killed and resumed run repeats the uninterrupted one bit for bit


def _fab_run(directory: Path | None, buffer: bool, resume: bool = False, kill: int | None = None):
    """10 steps of FAB on a double well, checkpoints every 2 steps; a fresh flow and objective, as a new process."""
    torch.manual_seed(123)  # the fresh flow's initial weights (a resumed run gets the checkpoint's)
    flow = RealNVP(2, transforms=1, hidden=(8,))
    # 48 points after the first step, full (64) at step 4, then first-in-first-out from step 7 (write position 16)
    replay = PrioritisedReplayBuffer(64, updates_per_ais=3, min_fill=48) if buffer else None
    objective = FAB(DoubleWell(), ais_steps=2, n_leapfrog=2, replay_buffer=replay)
    history = fit(flow, objective, steps=10, batch_size=16, lr=1e-2, progress=False, seed=0, checkpoint_every=2,
                  checkpoint_dir=directory, resume=resume, callbacks=[KillAt(kill)] if kill else [])  # fmt: skip
    return flow, objective, history


def _assert_same_fab_run(a, b) -> None:
    (flow_a, fab_a, history_a), (flow_b, fab_b, history_b) = a, b
    for (name, x), y in zip(flow_a.state_dict().items(), flow_b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert torch.equal(fab_a.step_sizes, fab_b.step_sizes)
    assert fab_a.target_evaluations == fab_b.target_evaluations
    if fab_a.buffer is not None:
        assert torch.equal(fab_a.buffer.x, fab_b.buffer.x) and torch.equal(fab_a.buffer.log_w, fab_b.buffer.log_w)
        assert fab_a.buffer.state_dict()["next"] == fab_b.buffer.state_dict()["next"]
    assert history_a.step == history_b.step == list(range(1, 11))
    assert history_a.loss == history_b.loss and history_a.grad_norm == history_b.grad_norm
    assert history_a.metrics == history_b.metrics


@pytest.mark.parametrize("buffer", [True, False], ids=["buffer", "no-buffer"])
def test_a_killed_fab_run_resumes_bit_for_bit(tmp_path: Path, buffer: bool) -> None:
    straight = _fab_run(None, buffer)
    with pytest.raises(Killed):  # killed at step 9: the last checkpoint is step 8's, mid-way between AIS runs
        _fab_run(tmp_path, buffer, kill=9)
    saved = load_state(tmp_path / CHECKPOINT_FILE)
    resumed = _fab_run(tmp_path, buffer, resume=True)
    _assert_same_fab_run(straight, resumed)
    assert saved["step"] == 8 and len(saved["objective"]) == 1  # one process's state
    if buffer:
        assert saved["objective"][0]["buffer"]["next"] == 16 and saved["objective"][0]["pending"] is not None


@pytest.mark.slow
def test_a_fab_run_killed_by_sigkill_resumes_bit_for_bit(tmp_path: Path) -> None:
    run_killed_by_sigkill(__file__, f"_fab_run({str(tmp_path)!r}, True, kill=9)")
    assert load_state(tmp_path / CHECKPOINT_FILE)["step"] == 8
    _assert_same_fab_run(_fab_run(None, True), _fab_run(tmp_path, True, resume=True))


def test_fab_state_round_trips_and_refuses_another_fabs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    flow = RealNVP(2, transforms=1, hidden=(8,))
    objective = FAB(DoubleWell(), ais_steps=2, replay_buffer=PrioritisedReplayBuffer(64, min_fill=32))
    objective.loss(flow, flow.base.sample((16,)))
    save_state(objective.state_dict(), tmp_path / "s.safetensors")  # pickle-free, as in a checkpoint
    other = FAB(DoubleWell(), ais_steps=2, replay_buffer=PrioritisedReplayBuffer(64, min_fill=32))
    other.load_state_dict(load_state(tmp_path / "s.safetensors"))
    assert other.metrics() == objective.metrics() and torch.equal(other.buffer.x, objective.buffer.x)
    state = objective.state_dict()
    with pytest.raises(ValueError, match="written with a replay buffer"):
        FAB(DoubleWell(), ais_steps=2).load_state_dict(state)
    with pytest.raises(ValueError, match="3 numbers"):
        FAB(DoubleWell(), ais_steps=3, replay_buffer=64).load_state_dict(state)
    with pytest.raises(ValueError, match="more than the capacity 16"):
        FAB(DoubleWell(), ais_steps=2, replay_buffer=16).load_state_dict(state)
    del state["calls"]
    with pytest.raises(ValueError, match="missing \\['calls'\\]"):
        FAB(DoubleWell(), ais_steps=2, replay_buffer=64).load_state_dict(state)


def test_a_checkpoint_without_objective_state_still_resumes_with_a_warning(tmp_path: Path) -> None:
    with pytest.raises(Killed):
        _fab_run(tmp_path, True, kill=9)
    saved = load_state(tmp_path / CHECKPOINT_FILE)
    del saved["objective"]  # as written before objectives' state was saved
    save_state(saved, tmp_path / CHECKPOINT_FILE)
    with pytest.warns(RuntimeWarning, match="holds no objective state.*FAB continues from its state as it is"):
        flow, objective, history = _fab_run(tmp_path, True, resume=True)
    assert history.step == list(range(1, 11)) and len(objective.buffer) > 0
