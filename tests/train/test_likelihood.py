"""Maximum likelihood: the loss is the mean NLL (path NLL for stochastic flows), and fitting finds a known density."""

from __future__ import annotations

import math

import pytest
import torch

import flowkit
from flowkit.bijectors import AffineCoupling
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.flows import LangevinBlock, StochasticFlow
from flowkit.targets import DoubleWell
from flowkit.train import ForwardKLPathGradient, MaximumLikelihood, fit


def test_loss_is_the_mean_negative_log_likelihood_with_context():
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(3, transforms=2, hidden=(16,), context=2)
    x, c = torch.randn(10, 3), torch.randn(10, 2)
    objective = MaximumLikelihood()
    loss = objective.loss(flow, (x, c))
    assert torch.equal(loss, -flow.log_prob(x, c).mean())
    assert loss.requires_grad
    value = objective.validation_loss(flow, (x, c))
    assert not value.requires_grad and torch.equal(value, loss.detach())
    unconditional = flowkit.flows.RealNVP(3, transforms=2, hidden=(16,))
    assert torch.equal(objective.loss(unconditional, x), -unconditional.log_prob(x).mean())


def test_stochastic_flow_uses_the_path_log_likelihood():
    torch.manual_seed(0)
    target = DoubleWell()
    layers = [AffineCoupling(2, parity=0, hidden=(16,)), LangevinBlock(target, lam=0.5, n_steps=2)]
    flow = StochasticFlow(layers, StandardNormal(2))
    x = torch.randn(16, 2)
    torch.manual_seed(1)
    loss = MaximumLikelihood().loss(flow, x)
    torch.manual_seed(1)
    assert torch.equal(loss, -flow.path_log_likelihood(x).mean())
    history = fit(flow, MaximumLikelihood(), x, steps=3, batch_size=8, progress=False)
    assert all(math.isfinite(v) for v in history.loss) and not history.skipped


def test_target_selects_the_forward_kl_path_gradient():
    torch.manual_seed(0)
    target = DoubleWell()
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,)).double()
    x = torch.randn(32, 2, dtype=torch.float64)

    def grads(objective):
        flow.zero_grad()
        loss = objective.loss(flow, x)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in flow.parameters()]

    loss, g = grads(MaximumLikelihood(target))
    reference_loss, reference = grads(ForwardKLPathGradient(target))
    assert torch.equal(loss, reference_loss)
    for a, b in zip(g, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    _, plain = grads(MaximumLikelihood())
    assert not all(
        torch.allclose(a, b) for a, b in zip(g, plain, strict=True)
    )  # a different estimator of the same gradient


def test_target_path_gradient_checks_target_flow_and_batch():
    target = DoubleWell()
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
    with pytest.raises(ValueError, match="must be a flowkit.targets.Target"):
        MaximumLikelihood(target=lambda x: x)
    objective = MaximumLikelihood(target)
    with pytest.raises(ValueError, match="non-finite"):
        objective.loss(flow, torch.full((4, 2), float("nan")))
    with pytest.raises(ValueError, match="shape"):
        objective.loss(flow, torch.randn(4, 3))
    with pytest.raises(ValueError, match="dtype"):
        objective.loss(flow, torch.randn(4, 2, dtype=torch.float64))
    trainable_base = flowkit.Flow(flow.bijector, DiagNormal(2))
    with pytest.raises(ValueError, match="trainable parameters"):
        objective.loss(trainable_base, torch.randn(4, 2))
    stochastic = StochasticFlow([flow.bijector, LangevinBlock(target, lam=0.5, n_steps=1)], StandardNormal(2))
    with pytest.raises(ValueError, match="stochastic"):
        objective.loss(stochastic, torch.randn(4, 2))


def test_fit_recovers_a_correlated_gaussian():
    torch.manual_seed(0)
    scale_tril = torch.tensor([[1.0, 0.0], [0.8, 0.5]])
    true = torch.distributions.MultivariateNormal(torch.tensor([1.0, -2.0]), scale_tril=scale_tril)
    train, test = true.sample((4096,)), true.sample((4096,))
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
    history = fit(
        flow,
        MaximumLikelihood(),
        train,
        steps=200,
        batch_size=256,
        lr=1e-2,
        val_data=test,
        val_every=100,
        progress=False,
        seed=0,
    )
    with torch.no_grad():
        nll = float(-flow.log_prob(test).mean())
        true_nll = float(-true.log_prob(test).mean())
    # the best diagonal Gaussian is 0.5 log(det diag(S) / det S) = 0.63 nats worse than the truth
    assert nll - true_nll < 0.03
    assert history.val_step == [100, 200] and abs(history.val_loss[-1] - nll) < 1e-5  # batched in float32
