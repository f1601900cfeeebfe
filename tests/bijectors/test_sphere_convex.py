"""Convex combinations of Möbius maps: on S^3 (shared-axis double Möbius maps) and on the circle (Rezende et al.)."""

import math

import pytest
import torch
from manifold_checks import assert_antipodally_equivariant, assert_integrates_to_one

from flowkit.bijectors import Chain, ConvexDoubleMoebius, ConvexMoebius
from flowkit.bijectors.sphere import (
    _convex_circle_inverse,
    _convex_double_moebius_inverse,
    circle_moebius,
    convex_circle_moebius,
    convex_circle_moebius_inverse,
    convex_double_moebius,
    convex_double_moebius_inverse,
    double_moebius,
    double_moebius_inverse,
)
from flowkit.distributions import SphereUniform
from flowkit.domains import Sphere
from flowkit.flows import Flow
from flowkit.targets import MatrixFisher
from flowkit.testing import randomize
from flowkit.train.pathgrad import reverse_kl_loss

F64 = torch.float64


def _unit(n, d=4, seed=0):
    x = torch.randn(n, d, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=-1, keepdim=True)


def _simplex(n, k, seed=0, spread=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(spread * torch.randn(n, k, dtype=F64, generator=g), -1)


def test_one_component_is_the_double_moebius_map_and_its_inverse():
    """One component with beta = log((1 + r^2) / (1 - r^2)) is D_w, w = r * axis; with -beta it is D_w^{-1}."""
    p, axis = _unit(200), _unit(200, seed=1)
    r = 0.95 * torch.rand(200, 1, dtype=F64, generator=torch.Generator().manual_seed(2))
    beta = torch.log((1 + r**2) / (1 - r**2))
    one = torch.ones(200, 1, dtype=F64)
    for sign, reference in ((1, double_moebius), (-1, double_moebius_inverse)):
        y, ladj = convex_double_moebius(p, axis, sign * beta, one)
        y_ref, ladj_ref = reference(p, r * axis)
        torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj, ladj_ref, atol=1e-10, rtol=0)


def test_convex_double_moebius_is_antipodally_equivariant_in_both_directions():
    layer = randomize(ConvexDoubleMoebius(4, components=5, heads=2), scale=1.5).double()
    q = _unit(64)
    for direction in (layer.forward, layer.inverse):
        (z, ladj), (z_neg, ladj_neg) = direction(q), direction(-q)
        torch.testing.assert_close(z_neg, -z, atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj_neg, ladj, atol=1e-12, rtol=0)
    assert (layer(q)[0] - q).abs().max() > 0.1  # not the identity


def test_convex_double_moebius_inverse_round_trips_for_extreme_parameters():
    """Stretches up to e^{+-6}, 8 components, concentrated weights: |p - f^{-1}(f(p))| < 1e-9 in float64."""
    n, k = 20_000, 8
    p, axis = _unit(n), _unit(n, seed=1)
    beta = 6 * torch.tanh(3 * torch.randn(n, k, dtype=F64, generator=torch.Generator().manual_seed(3)))
    weights = _simplex(n, k, seed=4, spread=3.0)
    y, ladj = convex_double_moebius(p, axis, beta, weights)
    p_back, ladj_back = convex_double_moebius_inverse(y, axis, beta, weights)
    assert (p_back - p).abs().max() < 1e-9
    assert (ladj_back + ladj).abs().max() < 1e-9
    assert ((y.norm(dim=-1) - 1).abs().max()) < 1e-12


def test_the_combination_sets_the_density_at_the_poles_and_the_equator():
    r"""The density relative to the base: (sum rho e^beta)^-3 at the poles, (sum rho e^-beta)^-1 on the equator.

    (For the combination in the sampling direction.) A single map has q_pole^{1/3} q_equator = 1;
    the combination has it below 1 (light tails).
    """
    axis = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=F64)
    beta = torch.tensor([[-4.0, -1.0, 0.5]], dtype=F64)
    weights = torch.tensor([[0.6, 0.3, 0.1]], dtype=F64)
    pole = torch.tensor([[1e-7, 0.0, 1.0, 0.0]], dtype=F64)
    equator = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64)
    pole = pole / pole.norm()
    # log q(x) - log q0 = ladj of the normalizing direction = -(ladj of the sampling map at z)
    log_ratio_pole = convex_double_moebius_inverse(pole, axis, beta, weights)[1]
    log_ratio_equator = convex_double_moebius_inverse(equator, axis, beta, weights)[1]
    expected_pole = -3 * torch.log((weights * beta.exp()).sum())
    expected_equator = -torch.log((weights * (-beta).exp()).sum())
    torch.testing.assert_close(log_ratio_pole[0], expected_pole, atol=1e-9, rtol=0)
    torch.testing.assert_close(log_ratio_equator[0], expected_equator, atol=1e-12, rtol=0)
    assert log_ratio_pole[0] / 3 + log_ratio_equator[0] < -1  # far below the single-map value 0


def test_randomised_convex_flows_integrate_to_one_on_s3():
    """2 pi^2 E_{U(S^3)}[p] = 1 within 3 standard errors."""
    torch.manual_seed(0)
    chain = Chain(*[randomize(ConvexDoubleMoebius(4, components=3), scale=1.0, seed=i) for i in range(2)])
    assert_integrates_to_one(Flow(chain, SphereUniform(4)).double(), Sphere(4), 100_000, 5, max_err=0.05)


def test_one_circle_component_is_a_moebius_map_fixing_minus_pi():
    """m_w followed by the rotation taking m_w(-1) to -1 is t -> e^a t + b on t = tan(theta / 2)."""
    w = torch.tensor([0.5, -0.3], dtype=F64)
    theta = torch.linspace(-math.pi, math.pi, 401, dtype=F64)[:-1]
    m, log_m = circle_moebius(theta, w.expand(400, 2))
    minus_pi = circle_moebius(torch.tensor([-math.pi], dtype=F64), w.expand(1, 2))[0]
    lifted = torch.remainder(m - minus_pi, 2 * math.pi) - math.pi
    at_zero, log_slope = circle_moebius(torch.zeros(1, dtype=F64), w.expand(1, 2))
    b = torch.tan(0.5 * (torch.remainder(at_zero - minus_pi, 2 * math.pi) - math.pi))  # h(0) = 2 atan(b)
    a = log_slope + torch.log1p(b**2)  # h'(0) = e^a / (1 + b^2)
    h, log_h = convex_circle_moebius(theta, a.expand(400, 1), b.expand(400, 1), torch.ones(400, 1, dtype=F64))
    torch.testing.assert_close(h, lifted, atol=1e-12, rtol=0)
    torch.testing.assert_close(log_h, log_m, atol=1e-12, rtol=0)


def test_convex_circle_map_has_degree_one_and_round_trips():
    """The derivative integrates to 2 pi over the circle (trapezoid rule: exact for smooth periodic maps)."""
    k, grid = 6, 4096
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(k, dtype=F64, generator=gen), torch.randn(k, dtype=F64, generator=gen)
    weights = torch.softmax(torch.randn(k, dtype=F64, generator=gen), -1)
    theta = torch.linspace(-math.pi, math.pi, grid + 1, dtype=F64)[:-1]
    shift = torch.full((grid,), 0.7, dtype=F64)
    args = (a.expand(grid, k), b.expand(grid, k), weights.expand(grid, k), shift)
    y, ladj = convex_circle_moebius(theta, *args)
    assert abs(ladj.exp().mean().item() - 1) < 1e-10
    assert bool(((y >= -math.pi) & (y < math.pi)).all())
    back, ladj_back = convex_circle_moebius_inverse(y, *args)
    wrapped = torch.remainder(back - theta + math.pi, 2 * math.pi) - math.pi
    assert wrapped.abs().max() < 1e-9
    assert (ladj_back + ladj).abs().max() < 1e-9


def test_the_inverses_have_the_implicit_derivatives():
    """Gradients through the root finding (one Newton step with the graph at the root) pass gradcheck."""
    y, axis = _unit(4, seed=6), _unit(4, seed=7)
    beta = (2 * torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(8))).requires_grad_()
    log_weights = torch.log(_simplex(4, 3, seed=9)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda b, lw, v: _convex_double_moebius_inverse(v, axis, b, lw), (beta, log_weights, y.requires_grad_())
    )
    theta = torch.tensor([-2.0, 0.3, 2.9], dtype=F64, requires_grad=True)
    a = torch.randn(3, 2, dtype=F64, generator=torch.Generator().manual_seed(10)).requires_grad_()
    b = torch.randn(3, 2, dtype=F64, generator=torch.Generator().manual_seed(11)).requires_grad_()
    lw = torch.log(_simplex(3, 2, seed=12))
    shift = torch.tensor([0.1, -0.5, 1.0], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, a_, b_, s: _convex_circle_inverse(t, a_, b_, lw, s), (theta, a, b, shift))


def test_fast_path_gradient_agrees_with_the_standard_one_on_a_convex_sphere_flow():
    """The fast score recursion (through the solved direction) against autograd through log_prob."""
    torch.manual_seed(0)
    target = MatrixFisher([[3.0, 1.0, 0.0], [0.0, 2.0, 0.5], [0.0, 0.0, 4.0]]).double()
    chain = Chain(*[randomize(ConvexDoubleMoebius(4, components=3), scale=0.5, seed=i) for i in range(2)])
    flow = Flow(chain, SphereUniform(4)).double()
    z = flow.base.sample((64,))
    grads = []
    for estimator in ("fast", "standard"):
        flow.zero_grad()
        loss, _ = reverse_kl_loss(flow, target, z, estimator)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in flow.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-8, rtol=1e-6)
    assert grads[0].abs().max() > 1e-3


def test_convex_moebius_layer_on_a_torus_round_trips_and_batch_matches_context():
    layer = randomize(ConvexMoebius(3, components=4, heads=2, context=2, hidden=(8,)), scale=0.5).double()
    theta = (torch.rand(32, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) * 2 - 1) * math.pi
    ctx = torch.randn(32, 2, dtype=F64)
    x, ladj = layer.inverse(theta, ctx)
    back, ladj_back = layer(x, ctx)
    assert (torch.remainder(back - theta + math.pi, 2 * math.pi) - math.pi).abs().max() < 1e-9
    assert (ladj + ladj_back).abs().max() < 1e-9


def _convex_rigid_flow(seed=0):
    from flowkit.bijectors import RigidCoupling
    from flowkit.distributions import RigidBase

    torch.manual_seed(seed)
    segments = ["quaternion", "angle", "angle", "angle"] * 2
    layers = [
        RigidCoupling(segments, [0], heads=2, hidden=(16,), components=3),
        RigidCoupling(segments, [1, 2, 3, 5, 6, 7], hidden=(16,), components=3),
        RigidCoupling(segments, [4], heads=2, hidden=(16,), components=3),
    ]
    layers = [randomize(b, scale=0.3, seed=seed + i) for i, b in enumerate(layers)]
    return Flow(Chain(*layers), RigidBase(segments)).double()


@pytest.mark.slow
def test_convex_rigid_flow_is_equivariant_in_each_quaternion_and_integrates_to_one():
    from flowkit.domains import Circle, Product

    flow = _convex_rigid_flow()
    assert_antipodally_equivariant(flow.bijector, flow.sample((32,)), (slice(0, 4), slice(7, 11)))
    assert_integrates_to_one(flow, Product(Sphere(4), Circle(), Circle(), Circle()), 30_000, 3, max_err=0.1)


def test_a_lone_quaternion_layout_is_a_stack_of_sphere_maps_that_integrates_to_one():
    from flowkit.bijectors import DoubleMoebius
    from flowkit.flows import RigidBodyFlow

    single = RigidBodyFlow(["quaternion"], blocks=2, heads=2)
    assert [type(b) for b in single.bijector] == [DoubleMoebius, DoubleMoebius]
    flow = RigidBodyFlow(["quaternion"], blocks=2, components=3)
    assert [type(b) for b in flow.bijector] == [ConvexDoubleMoebius, ConvexDoubleMoebius]
    flow = Flow(randomize(flow.bijector, scale=1.0, seed=2), flow.base).double()
    x = flow.sample((16,))
    torch.testing.assert_close(flow.log_prob(-x), flow.log_prob(x), atol=1e-10, rtol=0)  # a density on SO(3)
    assert_integrates_to_one(flow, Sphere(4), 100_000, 7, max_err=0.05)


def test_the_inverse_has_finite_gradients_on_the_equator_of_its_axis():
    # On the equator v0 = log|cot| is about -708: the near-pole branch of the residual overflowed there,
    # and its NaN gradient leaked through the branch selection (the beta gradient was NaN).
    for dtype in (torch.float64, torch.float32):
        y = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=dtype)
        axis = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=dtype)
        beta = torch.tensor([[1.5, -0.7, 0.3]], dtype=dtype, requires_grad=True)
        weights = torch.softmax(torch.tensor([[0.2, 0.1, -0.3]], dtype=dtype), -1)
        p, ladj = convex_double_moebius_inverse(y, axis, beta, weights)
        (grad,) = torch.autograd.grad(p.sum() + ladj.sum(), beta)
        assert torch.isfinite(grad).all(), grad
        torch.testing.assert_close(p, y)  # the equator is fixed: g(pi / 2) = pi / 2 for every component
