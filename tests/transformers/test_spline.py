"""Rational-quadratic splines: number-for-number agreement with nflows and zuko, and robustness."""

import math

import pytest
import torch
from nflows.transforms.splines.rational_quadratic import unconstrained_rational_quadratic_spline
from zuko.transforms import MonotonicRQSTransform

from flowkit.transformers import CircularSpline, RationalQuadraticSpline, unconstrained_rqs
from flowkit.transformers.rational_quadratic import spline_through_knots

# Every test on both kernels of the fused spline node (`spline_kernel` in conftest.py).
pytestmark = pytest.mark.usefixtures("spline_kernel")

K, B, M = 8, 3.0, 1e-3


def random_params(n, k=K, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    w, h = (scale * torch.randn(n, k, generator=g, dtype=torch.float64) for _ in range(2))
    d = scale * torch.randn(n, k - 1, generator=g, dtype=torch.float64)
    return w, h, d


def knots_of(w, h, d, bound=B):
    """The knot table (x_k, y_k, delta_k) that unconstrained_rqs builds."""
    positions, derivatives = RationalQuadraticSpline(w.shape[-1], bound, M, M, M).knots(torch.cat([w, h, d], -1))
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
    # One bin per row, through the fixed-knots entry (its bin search has no interior knot to search).
    g = torch.Generator().manual_seed(3)
    n = 9
    x0, y0 = torch.randn(2, n, 1, generator=g, dtype=torch.float64)
    width, height = 0.5 + torch.rand(2, n, 1, generator=g, dtype=torch.float64)
    derivatives = 0.2 + 2 * torch.rand(n, 2, generator=g, dtype=torch.float64)
    point = x0 + (0.05 + 0.9 * torch.rand(n, 1, generator=g, dtype=torch.float64)) * width
    knots = torch.stack([torch.cat([x0, x0 + width], -1), torch.cat([y0, y0 + height], -1)], -2)  # (n, 2, 2)
    if inverse:
        point = spline_through_knots(point, knots, derivatives)[0]
    inputs = [t.clone().requires_grad_(True) for t in (point, knots, derivatives)]

    def bin_(*args):
        return spline_through_knots(*args, inverse)[:2]

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


def test_float32_inverse_at_a_knot_is_finite_and_gives_the_knot_derivative():
    # Regression: the bin search picks the bin left of the knot, where rounding
    # put the solved root above 1 and the log-derivative was log(negative) = NaN.
    w = torch.tensor([0.62, 1.48, 2.9, 8.2, 2.24, -3.13])
    h = torch.tensor([2.8, 1.23, 0.02, -3.16, -0.59, -2.25])
    d = torch.tensor([-1.98, 0.95, 2.99, -0.67, 0.2])
    spline = RationalQuadraticSpline(6, 2.0)
    positions, derivatives = spline.knots(torch.cat([w, h, d]))
    x, ladj = unconstrained_rqs(positions[1, 1], w, h, d, 2.0, inverse=True)
    assert x == positions[0, 1]
    torch.testing.assert_close(ladj, -derivatives[1].log())
    # Every knot, +-2 ulp, with gradients.
    y = positions[1]
    y = torch.cat([y, *(torch.nextafter(y, torch.tensor(v)) for v in (-math.inf, math.inf))])
    y = torch.cat([y, torch.nextafter(y, torch.tensor(math.inf)), torch.nextafter(y, torch.tensor(-math.inf))])
    params = torch.cat([w, h, d]).expand(len(y), -1).clone().requires_grad_(True)
    y.requires_grad_(True)
    x, ladj = spline.inverse(y, params)
    assert torch.isfinite(x).all() and torch.isfinite(ladj).all()
    for g in torch.autograd.grad(x.sum() + ladj.sum(), (y, params)):
        assert torch.isfinite(g).all()


def test_float32_inverse_at_the_bound_with_huge_logits():
    # Regression: with logits ~1e7 the root formula cancelled to 0 / 0 at y = B (x inf, ladj NaN).
    p = torch.tensor([1983989.0, -11051798.0, -20371150.0, 21287674.0, -2044570.0, 4684641.0])
    p = torch.cat([p, torch.tensor([12036285.0, 3135388.0, 15853344.0, 8790557.0, 27500116.0])])
    spline = RationalQuadraticSpline(4, 2.0)
    y = torch.tensor([2.0, -2.0, 1.9999999, -1.9999999, 0.0, 1e6, -1e30]).requires_grad_(True)
    params = p.expand(len(y), -1).clone().requires_grad_(True)
    x, ladj = spline.inverse(y, params)
    assert torch.isfinite(x).all() and torch.isfinite(ladj).all()
    assert x[0] == 2.0 and x[1] == -2.0
    for g in torch.autograd.grad(x.sum() + ladj.sum(), (y, params)):
        assert torch.isfinite(g).all()
    # Next to the bounds the solved points map back onto y (the round trip in y; x itself is
    # ill-conditioned here, and inside, where the slope reaches 1e7, so is y).
    y_back, _ = spline(x[:4].detach(), params[:4].detach())
    torch.testing.assert_close(y_back, y[:4].detach(), atol=1e-6, rtol=1e-6)


def test_inverse_root_has_no_cancellation_in_steep_bins():
    # b < 0 in a steep bin: the one-formula root 2c / (-b - sqrt(b^2 - 4ac)) lost all digits, in float64 too.
    g = torch.Generator().manual_seed(11)
    spline = RationalQuadraticSpline(4, 2.0).double()
    params = (1e7 * torch.randn(20000, spline.params_per_element, generator=g, dtype=torch.float64)).round()
    positions, _ = spline.knots(params)
    y = torch.nextafter(positions[:, 1, :], torch.tensor(math.inf, dtype=torch.float64)).clamp(max=2.0)
    params = params[:, None].expand(-1, y.shape[1], -1)
    x, ladj = spline.inverse(y, params)
    assert torch.isfinite(x).all() and torch.isfinite(ladj).all()
    # The solved points map back onto y to 1e-9 (the old root: 1.5e-8, at 663 of these points above 1e-9).
    torch.testing.assert_close(spline(x, params)[0], y, atol=1e-9, rtol=0)


@pytest.mark.parametrize("inverse", [False, True])
def test_float32_circular_spline_next_to_pi(inverse):
    # Regression: the last knot fell just below pi and an angle in that gap gave NaN.
    spline = CircularSpline(4)
    params = torch.tensor([4.94, -2.38, -2.29, -1.83, 0.39, -0.49, -1.02, 0.53, 4.74, -3.23, 0.57, -5.35, 0.0])
    x = torch.tensor([3.1415925, math.pi, -math.pi, 3.1415923, -3.1415925]).requires_grad_(True)
    p = params.expand(len(x), -1).clone().requires_grad_(True)
    y, ladj = (spline.inverse if inverse else spline.forward)(x, p)
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all()
    for grad in torch.autograd.grad(y.sum() + ladj.sum(), (x, p)):
        assert torch.isfinite(grad).all()
    # The round trip closes on the circle.
    back, _ = (spline.forward if inverse else spline.inverse)(y.detach(), p.detach())
    gap = torch.remainder(back - x.detach() + math.pi, 2 * math.pi) - math.pi
    assert gap.abs().max() < 1e-5


def test_spline_coupling_inverse_gradients_are_finite_far_outside():
    # Regression: NaN gradients in SplineCoupling.inverse at |z| ~ 1e6 (float32).
    from flowkit.bijectors import MaskedSplineAutoregressive, SplineCoupling
    from flowkit.testing import randomize

    bad = 0
    for seed in range(10):
        torch.manual_seed(seed)
        for cls in (SplineCoupling, MaskedSplineAutoregressive):
            layer = randomize(cls(4, bins=6, bound=3.0, hidden=(16,)), scale=3.0)
            z = torch.randn(8, 4) * 1e6
            z[::2] = torch.randn(4, 4)
            z.requires_grad_(True)
            x, ladj = layer.inverse(z)
            grads = torch.autograd.grad(x.sum() + ladj.sum(), [z, *layer.parameters()], allow_unused=True)
            bad += sum(int((~torch.isfinite(t)).sum()) for t in (x, ladj, *grads) if t is not None)
    assert bad == 0


@pytest.mark.parametrize("inverse", [False, True])
def test_float32_overflowing_conditioner_outputs_stay_finite(inverse):
    # Regression (found by bench/fuzz.py): a conditioner fed 1e30 outputs parameters ~1e32;
    # the derivatives' squares overflowed float32 and the ladj was -inf. Derivatives are capped.
    g = torch.Generator().manual_seed(12)
    spline = RationalQuadraticSpline(8, 5.0)
    params = (1e32 * torch.randn(50, spline.params_per_element, generator=g)).requires_grad_(True)
    x = (4 * torch.rand(50, generator=g) - 2).requires_grad_(True)
    y, ladj = (spline.inverse if inverse else spline.forward)(x, params)
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all()
    for grad in torch.autograd.grad(y.sum() + ladj.sum(), (x, params)):
        assert torch.isfinite(grad).all()
