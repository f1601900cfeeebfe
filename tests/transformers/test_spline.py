"""Rational-quadratic splines: number-for-number agreement with nflows and zuko, and robustness."""

import math

import pytest
import torch
from nflows.transforms.splines.rational_quadratic import unconstrained_rational_quadratic_spline
from zuko.transforms import MonotonicRQSTransform

from flowkit.transformers import CircularSpline, RationalQuadraticSpline, unconstrained_rqs
from flowkit.transformers.spline import _knots, _linear_tail_derivatives

K, B, M = 8, 3.0, 1e-3


def random_params(n, k=K, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    w, h = (scale * torch.randn(n, k, generator=g, dtype=torch.float64) for _ in range(2))
    d = scale * torch.randn(n, k - 1, generator=g, dtype=torch.float64)
    return w, h, d


def knots_of(w, h, d, bound=B):
    """The knot table (x_k, y_k, delta_k) that unconstrained_rqs builds."""
    positions, derivatives = _knots(torch.stack([w, h], -2), _linear_tail_derivatives(d, M), -bound, bound, M, M)
    return torch.cat([positions, derivatives.unsqueeze(-2)], dim=-2)


@pytest.mark.parametrize("inverse", [False, True])
def test_matches_nflows(inverse):
    w, h, d = random_params(2000)
    x = 4.0 * torch.randn(2000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))  # many in the tails
    expected = unconstrained_rational_quadratic_spline(x, w, h, d, inverse=inverse, tail_bound=B)
    got = unconstrained_rqs(x, w, h, d, B, inverse=inverse)
    assert (x.abs() > B).sum() > 300
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-9, rtol=1e-9)


def zuko_to_nflows(wz, hz, dz, slope=M):
    """Unconstrained nflows parameters that give zuko's spline (zuko: no minimum bin size, derivatives exp(.))."""
    frac_w = torch.softmax(wz / (1 + (2 * wz / math.log(slope)).abs()), -1)
    frac_h = torch.softmax(hz / (1 + (2 * hz / math.log(slope)).abs()), -1)
    deriv = torch.exp(dz / (1 + (dz / math.log(slope)).abs()))
    assert frac_w.min() > M and frac_h.min() > M and deriv.min() > M  # representable with nflows' minimums
    w = torch.log((frac_w - M) / (1 - K * M))
    h = torch.log((frac_h - M) / (1 - K * M))
    d = torch.log(torch.expm1(deriv - M))
    return w, h, d


def test_matches_zuko_both_directions():
    wz, hz, dz = random_params(2000, scale=1.0, seed=3)
    x = 4.0 * torch.randn(2000, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    zuko = MonotonicRQSTransform(wz, hz, dz, bound=B, slope=M)
    w, h, d = zuko_to_nflows(wz, hz, dz)
    # Same knots ...
    table = knots_of(w, h, d)
    torch.testing.assert_close(table[..., 0, :], zuko.horizontal, atol=1e-12, rtol=0)
    torch.testing.assert_close(table[..., 1, :], zuko.vertical, atol=1e-12, rtol=0)
    torch.testing.assert_close(table[..., 2, :], zuko.derivatives, atol=1e-12, rtol=1e-12)
    # ... and the same map, log-derivative and inverse.
    y_zuko, ladj_zuko = zuko.call_and_ladj(x)
    y, ladj = unconstrained_rqs(x, w, h, d, B)
    torch.testing.assert_close(y, y_zuko, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(ladj, ladj_zuko, atol=1e-9, rtol=1e-9)
    x_back, ladj_inv = unconstrained_rqs(y_zuko, w, h, d, B, inverse=True)
    torch.testing.assert_close(x_back, zuko.inv(y_zuko), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(ladj_inv, -ladj_zuko, atol=1e-9, rtol=1e-9)


def test_round_trip_and_autograd_derivative():
    w, h, d = random_params(500, scale=1.0)
    x = (4.0 * torch.randn(500, dtype=torch.float64)).requires_grad_(True)
    y, ladj = unconstrained_rqs(x, w, h, d, B)
    (dydx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(ladj, dydx.log(), atol=1e-10, rtol=0)
    x_back, ladj_inv = unconstrained_rqs(y.detach(), w, h, d, B, inverse=True)
    torch.testing.assert_close(x_back, x.detach(), atol=1e-10, rtol=0)
    torch.testing.assert_close(ladj_inv, -ladj.detach(), atol=1e-10, rtol=0)


def test_continuity_across_knots_and_derivative_at_knots():
    w, h, d = random_params(300, scale=1.0, seed=5)
    table = knots_of(w, h, d)
    xk, dk = table[:, 0, :], table[:, 2, :]
    params = [p[:, None].expand(-1, K + 1, -1) for p in (w, h, d)]
    eps = 1e-12
    y_lo, l_lo = unconstrained_rqs(xk - eps, *params, B)
    y_hi, l_hi = unconstrained_rqs(xk + eps, *params, B)
    y_at, l_at = unconstrained_rqs(xk, *params, B)
    assert (y_hi - y_lo).abs().max() < 1e-6
    assert (l_hi.exp() - l_lo.exp()).abs().max() < 1e-6  # C1 at every knot, the ends (tails) included
    # At the knots the spline passes through (x_k, y_k) with slope delta_k >= the minimum derivative.
    torch.testing.assert_close(y_at, table[:, 1, :], atol=1e-12, rtol=0)
    torch.testing.assert_close(l_at.exp(), dk, atol=1e-10, rtol=1e-10)
    assert dk.min() >= M


def test_derivative_positive_everywhere_and_min_derivative_is_a_knot_bound_only():
    w, h, d = random_params(400, scale=3.0, seed=6)
    x = torch.linspace(-B, B, 401, dtype=torch.float64)[:, None].expand(-1, 400)
    _, ladj = unconstrained_rqs(x, w.expand(401, -1, -1), h.expand(401, -1, -1), d.expand(401, -1, -1), B)
    assert torch.isfinite(ladj).all() and (ladj.exp() > 0).all()
    # Between knots the slope may fall below m_d: over an interior bin of slope s
    # whose two knot derivatives both equal d, the slope at mid-bin is 2 s^2 / (s + d).
    wide = torch.tensor([[0.0, 10.0] + [0.0] * (K - 2)], dtype=torch.float64)  # bin 1 is wide ...
    flat = torch.tensor([[0.0, -10.0] + [0.0] * (K - 2)], dtype=torch.float64)  # ... and low
    steep = torch.full((1, K - 1), 5.0, dtype=torch.float64)
    table = knots_of(wide, flat, steep)[0]
    mid = (table[0, 1] + table[0, 2]) / 2
    _, ladj_mid = unconstrained_rqs(mid.reshape(1), wide, flat, steep, B)
    s = (table[1, 2] - table[1, 1]) / (table[0, 2] - table[0, 1])
    torch.testing.assert_close(ladj_mid.exp()[0], 2 * s**2 / (s + table[2, 1]))
    assert ladj_mid.exp()[0] < M


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("inverse", [False, True])
def test_finite_values_and_gradients_at_bounds_knots_and_far_out(dtype, inverse):
    w, h, d = (t.to(dtype) for t in random_params(6, scale=1.0, seed=7))
    table = knots_of(w, h, d)
    axis = 1 if inverse else 0
    special = torch.cat(
        [
            table[:, axis, :],
            torch.tensor([[B, -B, 1e4, -1e4, B + 1e-6, -B - 1e-6, 0.0, 50.0, -50.0]], dtype=dtype).expand(6, -1),
        ],
        dim=1,
    )
    n = special.shape[1]
    params = [p[:, None].expand(-1, n, -1).clone().requires_grad_(True) for p in (w, h, d)]
    x = special.clone().requires_grad_(True)
    y, ladj = unconstrained_rqs(x, *params, B, inverse=inverse)
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all()
    (y.sum() + ladj.sum()).backward()
    for g in [x.grad] + [p.grad for p in params]:
        assert torch.isfinite(g).all()
    outside = special.abs() > B
    torch.testing.assert_close(y[outside], special[outside])
    assert (ladj[outside] == 0).all()


def test_extreme_parameters_stay_finite():
    g = torch.Generator().manual_seed(8)
    w, h, d = (50 * torch.randn(200, k, generator=g) for k in (K, K, K - 1))
    x = (3 * torch.randn(200, generator=g)).requires_grad_(True)
    y, ladj = unconstrained_rqs(x, w, h, d, B)
    x_back, _ = unconstrained_rqs(y, w, h, d, B, inverse=True)
    (y.sum() + ladj.sum() + x_back.sum()).backward()
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all() and torch.isfinite(x.grad).all()


def test_transformer_layout_and_identity():
    spline = RationalQuadraticSpline(bins=K, bound=B)
    assert spline.params_per_element == 3 * K - 1
    w, h, d = random_params(50, scale=1.0)
    x = 4 * torch.randn(50, dtype=torch.float64)
    y, ladj = spline(x, torch.cat([w, h, d], -1))
    torch.testing.assert_close((y, ladj), unconstrained_rqs(x, w, h, d, B))
    # identity_params are float32: the boundary derivative 1 is exact to ~1e-7.
    y0, l0 = spline(x, spline.identity_params().double().expand(50, -1))
    torch.testing.assert_close(y0, x, atol=1e-6, rtol=0)
    torch.testing.assert_close(l0, torch.zeros_like(x), atol=1e-6, rtol=0)


def test_bad_arguments_raise():
    w, h, d = random_params(3)
    with pytest.raises(ValueError, match="K - 1 derivatives"):
        unconstrained_rqs(torch.zeros(3), w, h, d[:, :-1], B)
    with pytest.raises(ValueError, match="min_bin_width"):
        RationalQuadraticSpline(bins=8, min_bin_width=0.2)
    with pytest.raises(ValueError, match="min_bin_height"):
        RationalQuadraticSpline(bins=8, min_bin_height=0.0)
    with pytest.raises(ValueError, match="min_bin_width"):
        unconstrained_rqs(
            torch.zeros(1), torch.zeros(1, 4), torch.zeros(1, 4), torch.zeros(1, 3), 2.0, min_bin_width=0.0
        )
    with pytest.raises(ValueError, match="bound"):
        RationalQuadraticSpline(bound=0.0)
    with pytest.raises(ValueError, match="min_derivative"):
        CircularSpline(min_derivative=0.0)


def test_circular_spline_is_a_smooth_circle_map():
    spline = CircularSpline(bins=6).double()
    assert spline.params_per_element == 3 * 6 + 1
    g = torch.Generator().manual_seed(9)
    n = 200
    params = torch.randn(n, spline.params_per_element, generator=g, dtype=torch.float64)
    x = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * math.pi
    x.requires_grad_(True)
    y, ladj = spline(x, params)
    assert ((y >= -math.pi) & (y < math.pi)).all()
    (dydx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(ladj, dydx.log(), atol=1e-10, rtol=0)
    x_back, ladj_inv = spline.inverse(y.detach(), params)
    torch.testing.assert_close(x_back, x.detach(), atol=1e-10, rtol=0)
    torch.testing.assert_close(ladj_inv, -ladj.detach(), atol=1e-10, rtol=0)
    # Periodic: value (mod 2 pi) and slope agree at -pi and pi.
    ends = torch.tensor([-math.pi, math.pi], dtype=torch.float64)[:, None].expand(-1, n)
    y_ends, l_ends = spline(ends, params.expand(2, -1, -1))
    gap = torch.remainder(y_ends[1] - y_ends[0] + math.pi, 2 * math.pi) - math.pi
    assert gap.abs().max() < 1e-12
    torch.testing.assert_close(l_ends[0], l_ends[1], atol=1e-10, rtol=0)
    # Identity parameters give the identity.
    y0, l0 = spline(x.detach(), spline.identity_params().double().expand(n, -1))
    torch.testing.assert_close(y0, x.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(l0, torch.zeros_like(l0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("inverse", [False, True])
def test_hand_written_bin_gradients_match_finite_differences_to_second_order(inverse):
    from flowkit.transformers.spline import _RationalQuadraticBin

    g = torch.Generator().manual_seed(3)
    n = 9
    x0, y0 = torch.randn(2, n, generator=g, dtype=torch.float64)
    width, height = 0.5 + torch.rand(2, n, generator=g, dtype=torch.float64)
    d0, d1 = 0.2 + 2 * torch.rand(2, n, generator=g, dtype=torch.float64)
    point = x0 + (0.05 + 0.9 * torch.rand(n, generator=g, dtype=torch.float64)) * width
    knots = (x0, x0 + width, y0, y0 + height, d0, d1)
    if inverse:
        point = _RationalQuadraticBin.apply(point, *knots, False, False)[0]
    inputs = [t.clone().requires_grad_(True) for t in (point, *knots)]

    def bin_(*args):
        return _RationalQuadraticBin.apply(*args, inverse, False)[:2]

    assert torch.autograd.gradcheck(bin_, inputs)
    assert torch.autograd.gradgradcheck(bin_, inputs)


@pytest.mark.parametrize("inverse", [False, True])
def test_torch_func_transforms_agree_with_autograd(inverse):
    from torch.func import jacfwd, jacrev, vmap

    spline = RationalQuadraticSpline(bins=4, bound=2.0).double()
    g = torch.Generator().manual_seed(4)
    x = 2.0 * torch.randn(6, generator=g, dtype=torch.float64)  # some in the tails
    params = torch.randn(6, spline.params_per_element, generator=g, dtype=torch.float64)
    transform = spline.inverse if inverse else spline.forward

    def both(x, params):
        return torch.cat(transform(x, params))

    expected = torch.autograd.functional.jacobian(both, (x, params))
    for jacobian in (jacrev, jacfwd):
        for got, want in zip(jacobian(both, argnums=(0, 1))(x, params), expected, strict=True):
            torch.testing.assert_close(got, want)
    batched = vmap(lambda xi, pi: torch.stack(transform(xi, pi)))(x[:, None], params[:, None])
    torch.testing.assert_close(batched.squeeze(-1), torch.stack(transform(x, params), dim=1))


@pytest.mark.parametrize("inverse", [False, True])
def test_matches_nflows_with_unequal_minimum_bin_sizes(inverse):
    w, h, d = random_params(500, seed=7)
    x = 4.0 * torch.randn(500, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    sizes = dict(min_bin_width=1e-2, min_bin_height=3e-3, min_derivative=1e-2)
    expected = unconstrained_rational_quadratic_spline(x, w, h, d, inverse=inverse, tail_bound=B, **sizes)
    got = unconstrained_rqs(x, w, h, d, B, inverse=inverse, **sizes)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-9, rtol=1e-9)
