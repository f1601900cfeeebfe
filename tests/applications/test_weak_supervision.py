"""Label learning flows: the weak signals of the digits task, the penalties, the objective, majority vote."""

import pytest
import torch

from flowkit.applications.weak_supervision import (
    LabelLearningFlow,
    LabelLearningObjective,
    constraint_penalties,
    digits_weak_signals,
    expected_errors,
    majority_vote,
)
from flowkit.train import Constrained, fit


def test_digits_signals_are_probabilities_with_bounds_in_the_unit_interval():
    task = digits_weak_signals(signals=4, seed=1)
    assert task.signals.shape == (1797 - 70, 4) and task.features.shape == (1797 - 70, 64)
    assert bool(((task.signals >= 0) & (task.signals <= 1)).all())
    assert bool(((task.bounds >= 0) & (task.bounds <= 1)).all())
    accuracy = ((task.signals > 0.5).long() == task.labels[:, None]).float().mean(0)
    assert bool((accuracy > 0.5).all())  # weak, but better than chance


def test_expected_errors_and_penalties_vanish_on_consistent_labels():
    signals = torch.tensor([[0.9, 0.2], [0.1, 0.4], [0.8, 0.9]])
    labels = torch.tensor([1.0, 0.0, 1.0])
    expected = torch.tensor([(0.1 + 0.1 + 0.2) / 3, (0.8 + 0.4 + 0.1) / 3])
    torch.testing.assert_close(expected_errors(labels, signals), expected)
    y = torch.stack([1 - labels, labels], -1)
    penalties = constraint_penalties(y, signals, expected + 0.01)
    assert all(float(v) == 0.0 for v in penalties.values())
    bad = constraint_penalties(torch.tensor([[1.5, -0.25]]), signals[:1], torch.tensor([0.0, 0.0]))
    assert float(bad["below_zero"]) == 0.0625 and float(bad["above_one"]) == 0.25
    assert float(bad["simplex"]) == pytest.approx(0.0625)
    assert float(bad["error_bounds"]) > 0


def test_majority_vote_and_bad_bounds():
    assert majority_vote(torch.tensor([[0.9, 0.8, 0.1], [0.2, 0.3, 0.9], [0.6, 0.4, 0.5]])).tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LabelLearningObjective(torch.tensor([0.2, 1.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LabelLearningObjective(torch.tensor([-0.1]))


def test_objective_trains_the_flow_on_its_own_samples():
    torch.manual_seed(0)
    flow = LabelLearningFlow(3, transforms=2, hidden=(8,))
    objective = LabelLearningObjective(torch.tensor([0.3, 0.3]))
    rows = torch.cat([torch.randn(16, 3), torch.rand(16, 2)], 1)
    loss = objective.loss(flow, rows)
    loss.backward()
    assert all(p.grad is not None for p in flow.parameters())
    assert set(objective.metrics()) == {"nll", "penalty", "below_zero", "above_one", "simplex", "error_bounds"}
    p = flow.predict_proba(rows[:, :3], samples=4)
    assert p.shape == (16,) and bool(((p >= 0) & (p <= 1)).all())


def test_oracle_bounds_are_the_expected_errors_of_the_true_labels():
    task = digits_weak_signals(signals=3, seed=2, oracle_bounds=True)
    torch.testing.assert_close(task.bounds, expected_errors(task.labels.float(), task.signals))
    truth = torch.stack([1 - task.labels.float(), task.labels.float()], -1)
    assert all(float(v) == 0.0 for v in constraint_penalties(truth, task.signals, task.bounds + 1e-6).values())


def test_own_sample_likelihood_lowers_the_entropy_of_the_labels():
    # -log q of reparameterised samples has the entropy of q as its mean: minimising it contracts the samples
    torch.manual_seed(0)
    flow = LabelLearningFlow(3, transforms=2, hidden=(8,))
    x = torch.randn(128, 3)
    rows = torch.cat([x, torch.rand(128, 2)], 1)
    before = flow.sample((64,), context=x).std(0).mean()
    fit(
        flow,
        LabelLearningObjective(torch.tensor([0.5, 0.5]), weight=0.0),
        rows,
        steps=100,
        batch_size=128,
        lr=1e-2,
        progress=False,
        seed=0,
    )
    assert flow.sample((64,), context=x).std(0).mean() < before / 5


def test_constraints_read_the_objectives_samples():
    torch.manual_seed(0)
    flow = LabelLearningFlow(3, transforms=2, hidden=(8,))
    bounds = torch.tensor([0.3, 0.4])
    objective = LabelLearningObjective(bounds, weight=0.0)
    constraints = objective.constraints(damping=2.0)
    assert [c.name for c in constraints] == ["below_zero", "above_one", "simplex", "error_0", "error_1"]
    assert [c.damping for c in constraints] == [2.0] * 5
    assert [c.bound for c in constraints[3:]] == pytest.approx([0.3, 0.4])
    rows = torch.cat([torch.randn(16, 3), torch.rand(16, 2)], 1)
    with pytest.raises(ValueError, match="same batch"):
        constraints[0].fn(flow, rows)
    objective.loss(flow, rows)
    y = objective._latest[1]
    torch.testing.assert_close(constraints[4].fn(flow, rows), expected_errors(y[:, 1], rows[:, 3:])[1])
    penalties = constraint_penalties(y, rows[:, 3:], bounds)
    for c in constraints[:3]:
        torch.testing.assert_close(c.fn(flow, rows), penalties[c.name])
    with pytest.raises(ValueError, match="same batch"):
        constraints[3].fn(flow, rows.clone())
    constrained = Constrained(objective, constraints, lr=1.0)
    constrained.loss(flow, rows).backward()
    assert all(p.grad is not None for p in flow.parameters())


@pytest.mark.slow
def test_constrained_label_learning_flow_meets_the_bounds_and_beats_majority_vote():
    task = digits_weak_signals(seed=0, oracle_bounds=True)
    torch.manual_seed(0)
    flow = LabelLearningFlow(task.features.shape[1])
    objective = LabelLearningObjective(task.bounds, weight=0.0)
    rows = torch.cat([task.features, task.signals], 1)
    constrained = Constrained(objective, objective.constraints(damping=10.0), lr=100.0)
    fit(flow, constrained, rows, steps=1000, batch_size=len(rows), lr=1e-3, progress=False, seed=0)
    with torch.no_grad():
        y = flow.sample((1,), context=task.features)[0]
    penalties = constraint_penalties(y, task.signals, task.bounds)
    assert float(penalties["error_bounds"]) < 1e-4
    assert all(float(penalties[k]) < 1e-3 for k in ("below_zero", "above_one", "simplex"))
    accuracy = float(((flow.predict_proba(task.features) > 0.5).long() == task.labels).float().mean())
    assert accuracy > float((majority_vote(task.signals) == task.labels).float().mean())
