"""Force matching: zero for an exact model, exact double-backward gradients, and the BoltzmannGenerator option."""

import copy
import math

import pytest
import torch

import flowkit
from flowkit.bijectors import Chain, Coupling, Linear
from flowkit.distributions import StandardNormal
from flowkit.nn import MLP
from flowkit.targets import DoubleWell, Energy
from flowkit.testing import randomize
from flowkit.train import BoltzmannGenerator, ForceMatching, MaximumLikelihood
from flowkit.train.force_matching import force_matching_terms, model_forces
from flowkit.transformers import SmoothMixture

F64 = torch.float64


def _gaussian_flow():
    flow = flowkit.Flow(randomize(Linear(3), scale=0.5), StandardNormal(3)).double()
    return flow


def test_force_loss_is_zero_for_an_exact_model_and_positive_otherwise():
    flow = _gaussian_flow()
    exact = copy.deepcopy(flow)
    target = Energy(lambda x: -exact.log_prob(x), 3)
    x = torch.randn(64, 3, dtype=F64)
    nll, force_loss = force_matching_terms(flow, target, x)
    assert float(force_loss.detach()) == 0.0
    # ... so its gradient vanishes too, while the NLL's does not.
    grads = torch.autograd.grad(force_loss, list(flow.parameters()))
    assert all(float(g.abs().max()) == 0.0 for g in grads)
    with torch.no_grad():
        flow.bijector.weight.add_(0.05 * torch.randn(3, 3, dtype=F64))
    _, force_loss = force_matching_terms(flow, target, x)
    assert float(force_loss.detach()) > 1e-4


def test_model_forces_match_finite_differences_of_log_prob():
    flow = _gaussian_flow()
    x = torch.randn(5, 3, dtype=F64)
    log_q, forces = model_forces(flow, x)
    h = 1e-6
    eye = torch.eye(3, dtype=F64)
    fd = torch.stack([(flow.log_prob(x + h * e) - flow.log_prob(x - h * e)) / (2 * h) for e in eye], -1)
    torch.testing.assert_close(forces, fd, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(log_q, flow.log_prob(x))


def test_force_loss_gradient_is_exact_through_a_smooth_flow():
    # A smooth coupling flow on [0, 1]^2: the force loss's gradient (double backward through the
    # root-free forward direction) against central differences along a random direction.
    torch.manual_seed(1)
    t = SmoothMixture(3)
    layer = randomize(Coupling(t, 2, conditioner=MLP(1, t.params_per_element, (8,), "tanh")), scale=0.5)
    flow = flowkit.Flow(Chain(layer), _UnitBase()).double()
    target = Energy(lambda x: 3.0 * torch.cos(2 * math.pi * x).sum(-1), 2)
    x = 0.02 + 0.96 * torch.rand(16, 2, dtype=F64)
    params = list(flow.parameters())
    directions = [torch.randn_like(p) for p in params]
    _, loss = force_matching_terms(flow, target, x)
    grads = torch.autograd.grad(loss, params)
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, directions, strict=True))
    eps = 1e-6
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            for p, d in zip(params, directions, strict=True):
                p.add_(sign * eps * d)
        values.append(float(force_matching_terms(flow, target, x)[1].detach()))
        with torch.no_grad():
            for p, d in zip(params, directions, strict=True):
                p.sub_(sign * eps * d)
    numeric = (values[0] - values[1]) / (2 * eps)
    assert abs(numeric) > 1e-2  # not vacuous
    assert abs(analytic - numeric) <= 1e-6 * max(1.0, abs(numeric))


class _UnitBase(flowkit.distributions.Distribution):
    """Uniform density on [0, 1]^2 (log density 0), for the interval flow above."""

    def __init__(self):
        super().__init__()
        self.event_shape = torch.Size([2])
        self.register_buffer("_anchor", torch.zeros(()))

    def log_prob(self, z):
        return z.new_zeros(z.shape[:-1])

    def rsample(self, shape=()):
        return torch.rand(*torch.Size(shape), 2, dtype=self._anchor.dtype)


def test_objective_and_boltzmann_generator_terms():
    target = DoubleWell()
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,), activation="tanh")
    x = target.sample(128)
    objective = ForceMatching(target, w_force=0.3, w_nll=2.0)
    loss = objective.loss(flow, x)
    metrics = objective.metrics()
    assert set(metrics) == {"nll", "force_loss"}
    assert math.isclose(float(loss.detach()), 2.0 * metrics["nll"] + 0.3 * metrics["force_loss"], rel_tol=1e-6)
    assert math.isclose(metrics["nll"], float(MaximumLikelihood().loss(flow, x).detach()), rel_tol=1e-6)
    # The same terms inside a Boltzmann generator, on its own batch of samples.
    bg = BoltzmannGenerator(target, samples=x, w_ml=1.0, w_kl=0.5, w_force=0.1)
    loss = bg.loss(flow, 64)
    m = bg.metrics()
    assert {"kl", "nll", "force_loss", "ess"} <= set(m)
    assert math.isclose(float(loss.detach()), 0.5 * m["kl"] + m["nll"] + 0.1 * m["force_loss"], rel_tol=1e-5)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in flow.parameters())
    # Force matching alone (no ML weight) is a valid generator objective too.
    assert float(BoltzmannGenerator(target, samples=x, w_ml=0.0, w_kl=0.0, w_force=1.0).loss(flow, 32).detach()) > 0


def test_bad_arguments():
    target = DoubleWell()
    with pytest.raises(ValueError, match="target"):
        ForceMatching(None)
    with pytest.raises(ValueError, match="w_force"):
        ForceMatching(target, w_force=-1.0)
    with pytest.raises(ValueError, match="switched off"):
        ForceMatching(target, w_force=0.0, w_nll=0.0)
    with pytest.raises(ValueError, match="ml_estimator"):
        BoltzmannGenerator(target, samples=target.sample(8), w_force=1.0, ml_estimator="path")
    with pytest.raises(ValueError, match="non-negative"):
        BoltzmannGenerator(target, samples=target.sample(8), w_force=-1.0)
    flow = flowkit.flows.RealNVP(3, transforms=2, hidden=(8,))
    with pytest.raises(ValueError, match="event shape"):
        ForceMatching(target).loss(flow, torch.randn(4, 3))
