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
