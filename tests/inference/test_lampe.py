"""flowkit flows in lampe: `lampe_flow` as the `build` of lampe's NPE."""

from __future__ import annotations

import pytest
import torch

import flowkit
from flowkit.embeddings import MLPEmbedding
from flowkit.inference import ConditionedFlow, lampe_flow

lampe = pytest.importorskip("lampe")
from lampe.inference import NPE, NPELoss  # noqa: E402


def test_lampe_npe_builds_evaluates_and_trains_a_flowkit_flow() -> None:
    torch.manual_seed(0)
    estimator = NPE(2, 3, build=lampe_flow, preset="nsf", transforms=2, hidden=(16,))
    assert isinstance(estimator.flow, ConditionedFlow)
    theta = torch.rand(512, 2) * 4 - 2
    x = torch.cat([theta, theta.sum(-1, keepdim=True)], -1) + 0.2 * torch.randn(512, 3)
    log_p = estimator(theta, x)
    assert log_p.shape == (512,)
    torch.testing.assert_close(log_p, estimator.flow.log_prob(theta, x))
    distribution = estimator.flow(x[:4])
    assert distribution.sample((10,)).shape == (10, 4, 2)
    torch.testing.assert_close(distribution.log_prob(theta[:4]), log_p[:4])

    loss = NPELoss(estimator)
    optimizer = torch.optim.Adam(estimator.parameters(), lr=3e-3)
    with torch.no_grad():
        start = float(loss(theta, x))
    for _ in range(60):
        optimizer.zero_grad()
        loss(theta, x).backward()
        optimizer.step()
    with torch.no_grad():
        assert float(loss(theta, x)) < start - 0.5


def test_lampe_flow_takes_an_embedding_and_a_prior() -> None:
    prior = torch.distributions.Independent(torch.distributions.Uniform(-torch.ones(2), torch.ones(2)), 1)
    flow = lampe_flow(2, 5, "maf", embedding=MLPEmbedding(5, 3, hidden=(8,)), prior=prior, transforms=1)
    samples = flow(torch.randn(3, 5)).sample((1000,))
    assert samples.shape == (1000, 3, 2) and bool((samples.abs() < 1).all())
    with pytest.raises(ValueError, match="context=4"):
        lampe_flow(2, 4, embedding=MLPEmbedding(5, 3))
    with pytest.raises(ValueError, match="unknown preset"):
        lampe_flow(2, 4, "nope")


def test_a_lampe_flow_saves_and_loads(tmp_path) -> None:

    flow = lampe_flow(2, 3, "realnvp", transforms=2, hidden=(8,))
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn_like(p))
    theta, x = torch.randn(4, 2), torch.randn(4, 3)
    flowkit.io.save(flow, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    assert isinstance(loaded, ConditionedFlow)
    torch.testing.assert_close(loaded(x).log_prob(theta), flow(x).log_prob(theta))
