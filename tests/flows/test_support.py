"""Flows on the bounded support of a prior: no mass outside, -inf there, bounds read from torch and sbi priors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import distributions as D

import flowkit
from flowkit.bijectors import BoundedSupport, support_bounds
from flowkit.distributions import DiagNormal
from flowkit.embeddings import MLPEmbedding
from flowkit.flows import NSF, EmbeddedFlow, bounded
from flowkit.testing import check_flow


def _box(low: list[float], high: list[float]) -> D.Distribution:
    return D.Independent(D.Uniform(torch.tensor(low), torch.tensor(high)), 1)


def _wide_nsf(features: int, context: int = 0) -> NSF:
    """An NSF with moved weights over a base of scale 30: most of its mass would lie far outside a unit box."""
    torch.manual_seed(0)
    flow = NSF(features, 2, hidden=(16,), coupling=True, context=context, base=DiagNormal(features, scale=30.0))
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return flow


@pytest.mark.slow
def test_a_million_samples_under_a_box_prior_all_lie_inside_it() -> None:
    prior = _box([-1.0, 0.0, 2.0], [1.0, 1e-3, 2.5])
    flow = bounded(_wide_nsf(3), prior)
    with torch.no_grad():
        x = flow.sample((1_000_000,))
    low, high = prior.base_dist.low, prior.base_dist.high
    assert x.dtype == torch.float32
    assert int(((x <= low) | (x >= high)).any(-1).sum()) == 0
    with torch.no_grad():  # every sample has a finite density, also those the float32 sigmoid saturates
        assert bool(torch.isfinite(flow.log_prob(x[:100_000])).all())


def test_log_prob_outside_the_support_is_minus_infinity_and_inside_finite_with_finite_gradients() -> None:
    flow = bounded(_wide_nsf(2), low=[0.0, None], high=[1.0, 0.0])  # a box side and x_2 < 0
    x = torch.tensor([[0.5, -1.0], [1.5, -1.0], [0.5, 2.0], [0.0, -1.0], [1.0, -1.0], [0.5, 0.0]], requires_grad=True)
    log_p = flow.log_prob(x)
    assert bool(torch.isfinite(log_p[0]))
    assert log_p[1:].tolist() == [-math.inf] * 5
    log_p[0].backward()
    assert bool(torch.isfinite(x.grad).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in flow.parameters() if p.grad is not None)


def test_a_bounded_flow_is_a_density_on_its_box() -> None:
    torch.manual_seed(0)
    flow = bounded(NSF(2, transforms=2, hidden=(8,)).double(), low=[-1.0, 0.0], high=[2.0, 0.5])
    report = check_flow(flow)
    assert report.passed, report.failures
    assert any("integrates to 1" in check for check, _, _ in report.results)


def test_positive_and_half_bounded_priors_give_half_lines() -> None:
    prior = D.Independent(D.LogNormal(torch.zeros(2), torch.ones(2)), 1)
    assert support_bounds(prior) == ([0.0, 0.0], [math.inf, math.inf])
    flow = bounded(_wide_nsf(2), prior)
    x = flow.sample((100_000,))
    assert bool((x > 0).all())
    assert flow.log_prob(torch.tensor([[-1e-3, 1.0]])).item() == -math.inf


def test_bounds_from_sbi_priors() -> None:
    from sbi.utils import BoxUniform, MultipleIndependent

    box = BoxUniform(torch.tensor([0.0, -2.0]), torch.tensor([1.0, 3.0]))
    assert support_bounds(box) == ([0.0, -2.0], [1.0, 3.0])
    mixed = MultipleIndependent(
        [D.Uniform(torch.zeros(1), torch.ones(1)), D.HalfNormal(torch.ones(1)), D.Normal(torch.zeros(1), torch.ones(1))]
    )
    assert support_bounds(mixed) == ([0.0, 0.0, -math.inf], [1.0, math.inf, math.inf])


def test_a_prior_without_bounds_is_refused_where_bounds_are_requested() -> None:
    prior = D.MultivariateNormal(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match="no bound on any feature"):
        bounded(NSF(2, transforms=1, hidden=(8,)), prior)
    with pytest.raises(ValueError, match="not both"):
        bounded(NSF(2, transforms=1, hidden=(8,)), _box([0.0, 0.0], [1.0, 1.0]), low=0.0, high=1.0)
    with pytest.raises(ValueError, match="events"):
        bounded(NSF(3, transforms=1, hidden=(8,)), _box([0.0, 0.0], [1.0, 1.0]))
    with pytest.raises(ValueError, match="not below"):
        BoundedSupport([0.0, 1.0], [1.0, 1.0])


def test_a_bounded_conditional_flow_saves_and_loads_and_keeps_its_embedding(tmp_path) -> None:
    flow = bounded(EmbeddedFlow(_wide_nsf(2, context=3), MLPEmbedding(4, 3, hidden=(8,))), low=[0.0, 0.0], high=1.0)
    assert isinstance(flow, EmbeddedFlow)
    y = torch.randn(5, 4)
    x = flow.sample((200,), y)
    assert x.shape == (200, 5, 2) and bool(((x > 0) & (x < 1)).all())
    flowkit.io.save(flow, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    torch.testing.assert_close(loaded.log_prob(x, y), flow.log_prob(x, y))
