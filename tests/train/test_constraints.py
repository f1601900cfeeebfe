"""MDMM (`Constrained`): the textbook optimum and multiplier, slack and active inequalities, and more.

A cross-check against the `mdmm` package step by step, a constrained maximum likelihood with an analytic answer,
the history, bad input, and the multipliers through a checkpoint: a killed run resumes bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from interruptions import KillAt, Killed, run_killed_by_sigkill

from flowkit.bijectors import Reverse
from flowkit.distributions import DiagNormal
from flowkit.flows import Flow, RealNVP
from flowkit.train import AtLeast, AtMost, Constrained, Equality, MaximumLikelihood, Objective, fit
from flowkit.train.checkpoint import load_state
from flowkit.train.loop import CHECKPOINT_FILE

F64 = torch.float64


class Point(torch.nn.Module):
    """A point x in R^1 as a module: the 'flow' of the textbook problems."""

    def __init__(self, x: float) -> None:
        super().__init__()
        self.x = torch.nn.Parameter(torch.tensor([x], dtype=F64))


class Quadratic(Objective):
    """f(x) = (x - centre)^2, whatever the batch."""

    def __init__(self, centre: float = 0.0) -> None:
        self.centre = centre

    def loss(self, flow: Point, batch) -> torch.Tensor:
        return (flow.x - self.centre).square().sum()


def x_of(flow: Point, batch) -> torch.Tensor:
    return flow.x.sum()


def _solve(objective: Constrained, start: float = -0.5, steps: int = 1000, lr: float = 0.1) -> Point:
    point = Point(start)
    fit(point, objective, torch.zeros(4, 1, dtype=F64), steps=steps, batch_size=4, lr=lr, optimizer="sgd",
        schedule=None, progress=False)  # fmt: skip
    return point


@pytest.mark.slow
@pytest.mark.parametrize("damping", [0.0, 1.0, 10.0])
def test_minimising_x_squared_subject_to_x_equal_one_ends_at_one_with_multiplier_minus_two(damping: float) -> None:
    # L = x^2 + lam (x - 1) + d/2 (x - 1)^2: stationary at x = 1, lam = -2 (grad f = -lam grad g).
    objective = Constrained(Quadratic(), [Equality("x", x_of, value=1.0, damping=damping)], lr=0.1)
    point = _solve(objective, steps=1500)
    assert abs(point.x.item() - 1.0) < 1e-3
    assert abs(objective.multipliers.item() + 2.0) < 1e-3


@pytest.mark.slow
def test_the_same_problem_written_as_one_minus_x_has_multiplier_two() -> None:
    objective = Constrained(Quadratic(), [Equality("x", lambda f, b: 1.0 - f.x.sum(), value=0.0)], lr=0.1)
    point = _solve(objective)
    assert abs(point.x.item() - 1.0) < 1e-3 and abs(objective.multipliers.item() - 2.0) < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(
    "constraint",
    [AtMost("x", x_of, 1.0), AtLeast("x", x_of, -1.0), AtMost("x", x_of, 1.0, form="max")],
    ids=["at-most", "at-least", "max-form"],
)
def test_a_slack_inequality_leaves_the_unconstrained_optimum_unchanged(constraint) -> None:
    objective = Constrained(Quadratic(centre=0.3), [constraint], lr=0.1)
    point = _solve(objective, start=0.9)
    assert abs(point.x.item() - 0.3) < 1e-3
    assert abs(objective.multipliers.item()) < 1e-3  # no force from an inactive constraint


@pytest.mark.slow
@pytest.mark.parametrize("form", ["slack", "max"])
def test_an_active_inequality_behaves_like_the_equality(form: str) -> None:
    # x^2 subject to x >= 1: the optimum of the equality, with the KKT multiplier +2 >= 0.
    objective = Constrained(Quadratic(), [AtLeast("x", x_of, 1.0, form=form)], lr=0.1)
    point = _solve(objective)
    assert abs(point.x.item() - 1.0) < 1e-3 and abs(objective.multipliers.item() - 2.0) < 1e-3
    # and from a feasible start, with an upper bound below the free optimum
    objective = Constrained(Quadratic(centre=3.0), [AtMost("x", x_of, 1.0, form=form)], lr=0.1)
    point = _solve(objective, start=0.0)
    assert abs(point.x.item() - 1.0) < 1e-3 and abs(objective.multipliers.item() - 4.0) < 1e-3


def test_each_step_matches_the_mdmm_package() -> None:
    """Simultaneous SGD steps on x and lam, as mdmm takes them (its infeasibility is value - fn: lam_mdmm = -lam)."""
    mdmm = pytest.importorskip("mdmm")
    damping, lr, steps = 2.0, 0.05, 40
    ours = Constrained(Quadratic(), [Equality("x", x_of, value=1.0, damping=damping)], lr=lr)
    point = Point(-0.5)
    history = fit(point, ours, torch.zeros(4, 1, dtype=F64), steps=steps, batch_size=4, lr=lr, optimizer="sgd",
                  schedule=None, progress=False)  # fmt: skip

    x = torch.nn.Parameter(torch.tensor([-0.5], dtype=F64))
    constraint = mdmm.EqConstraint(lambda: x.sum(), 1.0, damping=damping).double()
    theirs = mdmm.MDMM([constraint])
    optimizer = theirs.make_optimizer([x], optimizer=torch.optim.SGD, lr=lr)
    trajectory = []
    for _ in range(steps):
        trajectory.append(-constraint.lmbda.item())
        result = theirs(x.square().sum())
        optimizer.zero_grad()
        result.value.backward()
        optimizer.step()
    assert history.metrics["multiplier_x"] == pytest.approx(trajectory, abs=1e-12)
    assert point.x.item() == pytest.approx(x.item(), abs=1e-12)
    assert ours.multipliers.item() == pytest.approx(-constraint.lmbda.item(), abs=1e-12)


@pytest.mark.slow
def test_constrained_maximum_likelihood_of_a_gaussian_matches_the_analytic_optimum() -> None:
    """Max likelihood of N(mu, s^2) on data of mean 0 and variance 1, subject to mu = 0.5: s^2 = 1.25, lam = -0.4."""
    x = torch.randn(512, 1, dtype=F64, generator=torch.Generator().manual_seed(0))
    x = (x - x.mean()) / x.std(correction=0)
    flow = Flow(Reverse(1), DiagNormal(1, trainable=True)).double()
    objective = Constrained(MaximumLikelihood(), [Equality("mu", lambda f, b: f.base.loc.sum(), value=0.5)], lr=0.2)
    fit(flow, objective, x, steps=1500, batch_size=512, lr=0.05, optimizer="sgd", schedule=None, progress=False)
    assert flow.base.loc.item() == pytest.approx(0.5, abs=1e-3)
    assert flow.base.log_scale.exp().item() ** 2 == pytest.approx(1.25, abs=1e-3)
    # d NLL / d mu = -(mean(x) - mu) / s^2 = 0.4, and grad f = -lam grad g
    assert objective.multipliers.item() == pytest.approx(-0.4, abs=1e-3)


def test_the_history_logs_the_objective_the_constraint_values_and_the_multipliers() -> None:
    objective = Constrained(Quadratic(), [Equality("x", x_of, 1.0), AtMost("y", lambda f, b: 2 * f.x.sum(), 5.0)])
    point = Point(0.25)
    history = fit(point, objective, torch.zeros(4, 1, dtype=F64), steps=3, batch_size=4, lr=0.1, optimizer="sgd",
                  schedule=None, progress=False)  # fmt: skip
    assert set(history.metrics) == {"objective", "constraint_x", "multiplier_x", "constraint_y", "multiplier_y"}
    assert history.metrics["constraint_x"][0] == 0.25 and history.metrics["constraint_y"][0] == 0.5
    assert history.metrics["objective"][0] == 0.0625 and history.metrics["multiplier_x"][0] == 0.0
    # the first step's multiplier step: lam_x = 0.01 * (0.25 - 1); lam_y = 0.01 * max(0.5 - 5, -0 / 1) = 0
    assert history.metrics["multiplier_x"][1] == pytest.approx(-0.0075)
    assert history.metrics["multiplier_y"][1] == 0.0


def test_validation_does_not_move_the_multipliers() -> None:
    objective = Constrained(Quadratic(), [Equality("x", x_of, 1.0)])
    point = Point(0.0)
    before = objective.multipliers.clone()
    objective.validation_loss(point, torch.zeros(2, 1))
    assert torch.equal(objective.multipliers, before)
    objective.loss(point, torch.zeros(2, 1))
    assert not torch.equal(objective.multipliers, before)


def test_bad_constraints_are_refused() -> None:
    with pytest.raises(ValueError, match="name"):
        Equality("a b", x_of)
    with pytest.raises(ValueError, match="callable"):
        Equality("x", 3.0)
    with pytest.raises(ValueError, match="damping"):
        AtMost("x", x_of, 1.0, damping=0.0)
    with pytest.raises(ValueError, match="form"):
        AtMost("x", x_of, 1.0, form="hinge")
    with pytest.raises(ValueError, match="damping"):
        Equality("x", x_of, damping=-1.0)
    with pytest.raises(ValueError, match="distinct"):
        Constrained(Quadratic(), [Equality("x", x_of), AtMost("x", x_of, 1.0)])
    with pytest.raises(ValueError, match="non-empty"):
        Constrained(Quadratic(), [])
    with pytest.raises(ValueError, match="lr"):
        Constrained(Quadratic(), [Equality("x", x_of)], lr=0.0)
    with pytest.raises(ValueError, match="multipliers"):
        Constrained(Quadratic(), [Equality("x", x_of)], multipliers=[1.0, 2.0])
    with pytest.raises(ValueError, match="loss"):
        Constrained(object(), [Equality("x", x_of)])
    objective = Constrained(Quadratic(), [Equality("v", lambda f, b: f.x.repeat(2))])
    with pytest.raises(ValueError, match="'v' must return a scalar tensor, got \\(2,\\)"):
        objective.loss(Point(0.0), None)


def test_a_state_of_another_objective_is_refused() -> None:
    objective = Constrained(Quadratic(), [Equality("x", x_of)])
    state = objective.state_dict()
    objective.load_state_dict({"multipliers": torch.tensor([1.5], dtype=F64), "objective": {}})
    assert objective.multipliers.item() == 1.5 and state["multipliers"].item() == 0.0  # the state was a copy
    with pytest.raises(ValueError, match="2 constraints"):
        Constrained(Quadratic(), [Equality("x", x_of), Equality("y", x_of)]).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        objective.load_state_dict({"multipliers": torch.zeros(1)})


# ---- the multipliers go through the checkpoint: a killed and resumed run repeats the uninterrupted one bit for bit


def _constrained_run(directory: Path | None, resume: bool = False, kill: int | None = None):
    """12 steps of maximum likelihood of a RealNVP under a constraint on its samples' mean; checkpoints every 4."""
    torch.manual_seed(7)  # the fresh flow's initial weights (a resumed run gets the checkpoint's)
    flow = RealNVP(2, transforms=1, hidden=(8,))
    x = torch.randn(96, 2, generator=torch.Generator().manual_seed(1)) + 1.0
    mean = AtMost("mean", lambda f, b: f.rsample((32,)).mean(), 0.5, damping=2.0)  # uses the RNG: replayed on resume
    objective = Constrained(MaximumLikelihood(), [mean, Equality("spread", lambda f, b: f.rsample((32,)).std(), 1.0)])
    history = fit(flow, objective, x, steps=12, batch_size=16, lr=1e-2, progress=False, seed=0, checkpoint_every=4,
                  checkpoint_dir=directory, resume=resume, callbacks=[KillAt(kill)] if kill else [])  # fmt: skip
    return flow, objective, history


def _assert_same_run(a, b) -> None:
    (flow_a, objective_a, history_a), (flow_b, objective_b, history_b) = a, b
    for (name, x), y in zip(flow_a.state_dict().items(), flow_b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(objective_a.multipliers, torch.zeros(2, dtype=F64))
    assert torch.equal(objective_a.multipliers, objective_b.multipliers)
    assert history_a.step == history_b.step == list(range(1, 13))
    assert history_a.loss == history_b.loss and history_a.grad_norm == history_b.grad_norm
    assert history_a.metrics == history_b.metrics


def test_a_killed_constrained_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    straight = _constrained_run(None)
    with pytest.raises(Killed):  # killed at step 10: the last checkpoint is step 8's
        _constrained_run(tmp_path, kill=10)
    saved = load_state(tmp_path / CHECKPOINT_FILE)
    assert saved["step"] == 8 and saved["objective"][0]["multipliers"].shape == (2,)
    _assert_same_run(straight, _constrained_run(tmp_path, resume=True))


@pytest.mark.slow
def test_a_constrained_run_killed_by_sigkill_resumes_bit_for_bit(tmp_path: Path) -> None:
    run_killed_by_sigkill(__file__, f"_constrained_run({str(tmp_path)!r}, kill=10)")
    assert load_state(tmp_path / CHECKPOINT_FILE)["step"] == 8
    _assert_same_run(_constrained_run(None), _constrained_run(tmp_path, resume=True))
