"""Noise-augmented likelihood and FlowBack's feature alignment."""

import pytest
import torch
from torch import nn

from flowkit.flows import TarFlow
from flowkit.train import FeatureAlignment, NoisyMaximumLikelihood, fit


def _flow(**options) -> TarFlow:
    return TarFlow((1, 4, 4), patch=2, blocks=2, width=8, layers=2, heads=2, alpha=None, **options)


def test_noisy_likelihood_is_the_likelihood_of_noisy_points():
    flow = _flow(noise=0.3)
    x = torch.rand(7, 1, 4, 4)
    torch.manual_seed(3)
    loss = NoisyMaximumLikelihood(0.3).loss(flow, x)
    torch.manual_seed(3)
    y = x + 0.3 * torch.randn_like(x)
    assert torch.allclose(loss, -flow.log_prob(y).mean())
    with pytest.raises(ValueError, match="declares noise=0.3 but the objective adds sigma=0.1"):
        NoisyMaximumLikelihood(0.1).loss(flow, x)


def test_feature_alignment_adds_the_weighted_cosine_loss_and_trains_the_projection():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(16, 5))
    flow = _flow(features=5)
    x = torch.rand(256, 1, 4, 4)
    objective = FeatureAlignment(teacher, weight=2.0, block=1, layer=2)
    torch.manual_seed(1)
    total = objective.loss(flow, x[:32])
    metrics = objective.metrics()
    assert total.item() == pytest.approx(metrics["nll"] + 2.0 * metrics["alignment"], rel=1e-5)
    assert 0 <= metrics["alignment"] <= 2
    before = metrics["alignment"]
    fit(flow, objective, x, steps=60, batch_size=64, lr=3e-3, progress=False, seed=0)
    objective.loss(flow, x[:32])
    assert objective.metrics()["alignment"] < before - 0.2  # the projected features turn towards the teacher's
    assert all(not p.requires_grad or p.grad is None for p in teacher.parameters())  # the teacher is not trained


def test_feature_alignment_bad_input():
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(16, 5))
    x = torch.rand(4, 1, 4, 4)
    with pytest.raises(ValueError, match="projection head"):
        FeatureAlignment(teacher).loss(_flow(), x)
    with pytest.raises(ValueError, match="block 2 is not among the flow's 2 blocks"):
        FeatureAlignment(teacher, block=2).loss(_flow(features=5), x)
    with pytest.raises(ValueError, match="layer 3 is not among the block's 2 layers"):
        FeatureAlignment(teacher, layer=3).loss(_flow(features=5), x)
    with pytest.raises(ValueError, match="teacher must be a torch module"):
        FeatureAlignment(lambda v: v)
