"""SmoothMixture: exact ends, monotone, periodic, the root-finding inverse and its gradients, smooth forces."""

import math

import pytest
import torch

import flowkit
from flowkit.bijectors import Chain, Coupling, MaskedAutoregressive
from flowkit.distributions import RigidBase
from flowkit.nn import MLP
from flowkit.targets.torus import torus_grid
from flowkit.testing import check_bijector, randomize
from flowkit.transformers import RationalQuadraticSpline, SmoothMixture
from flowkit.transformers.smooth import _Inverse, bump_cdf

F64 = torch.float64


def _params(t, n, scale=2.0, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, t.params_per_element, generator=g, dtype=F64).to(dtype)


def _wrapped(d):
    return torch.remainder(d + math.pi, 2 * math.pi) - math.pi


def test_bump_cdf_ends_and_derivative():
    t = torch.linspace(-0.5, 1.5, 401, dtype=F64, requires_grad=True)
    cdf, log_pdf = bump_cdf(t, torch.tensor(1.3, dtype=F64), power=2)
    assert cdf[t <= 0].eq(0).all() and cdf[t >= 1].eq(1).all()
    (grad,) = torch.autograd.grad(cdf.sum(), t)
    # Where the sigmoid is not saturated, autograd's derivative is exp(log_pdf); the log form
    # stays finite (the density positive) all the way to the ends.
    unsaturated = (cdf > 1e-8) & (cdf < 1 - 1e-8)
    assert int(unsaturated.sum()) > 50
    torch.testing.assert_close(grad[unsaturated], log_pdf.exp().detach()[unsaturated], rtol=1e-8, atol=0)
    assert bool(torch.isfinite(log_pdf).all()) and bool((cdf[1:] >= cdf[:-1]).all())


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(("low", "high"), [(0.0, 1.0), (-2.0, 3.0)])
def test_interval_ends_exact_and_monotone(dtype, low, high):
    t = SmoothMixture(5, low=low, high=high)
    n = 64
    params = _params(t, n, dtype=dtype)
    ends = torch.tensor([low, high], dtype=dtype).expand(n, 2).T
    y, _ = t(ends, params.expand(2, n, -1))
    assert y[0].eq(low).all() and y[1].eq(high).all()
    x = torch.linspace(low, high, 501, dtype=dtype).unsqueeze(-1).expand(501, n)
    y, ladj = t(x, params.expand(501, n, -1))
    assert bool((y[1:] >= y[:-1]).all()) and bool(torch.isfinite(ladj).all())
    assert float(ladj.min()) >= math.log(t.min_density) - 1e-5  # f' >= c_min


def test_circle_is_periodic_and_smooth_at_the_seam():
    t = SmoothMixture(4, circular=True)
    n = 200
    params = _params(t, n)
    x = (2 * torch.rand(n, dtype=F64) - 1) * math.pi
    y, ladj = t(x, params)
    assert bool(((y >= -math.pi) & (y < math.pi)).all())
    for k in (-3, 1, 2):
        y_k, ladj_k = t(x + 2 * math.pi * k, params)
        torch.testing.assert_close(_wrapped(y_k - y), torch.zeros_like(y), atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj_k, ladj, atol=1e-11, rtol=0)
    # The lift is a degree-one circle map: one turn in, one turn out (f(x + 2 pi) = f(x) + 2 pi).
    u = torch.stack([torch.zeros(n, dtype=F64), torch.ones(n, dtype=F64)])
    f, _ = t._unit_map(u, params.expand(2, n, -1))
    torch.testing.assert_close(f[1] - f[0], torch.ones(n, dtype=F64), atol=1e-13, rtol=0)
    # The log-derivative and its first two derivatives match across -pi = pi.
    seam = torch.tensor([-math.pi, math.pi], dtype=F64).unsqueeze(-1).expand(2, n).clone().requires_grad_(True)
    ladj = t(seam, params.expand(2, n, -1))[1]
    (d1,) = torch.autograd.grad(ladj.sum(), seam, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), seam)
    for value in (ladj, d1, d2):
        torch.testing.assert_close(value[0], value[1], atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize(("dtype", "tol"), [(F64, 1e-8), (torch.float32, 1e-5)])
def test_inverse_round_trip(circular, dtype, tol):
    t = SmoothMixture(6, circular=circular)
    n = 3000
    params = _params(t, n, dtype=dtype)
    x = t.domain.sample((n,), dtype=dtype)
    y, ladj = t(x, params)
    x_back, ladj_inv = t.inverse(y, params)
    error = x_back - x
    if circular:
        error = _wrapped(error)
    width = t.high - t.low
    # In float32 the output's own rounding moves the root by ulp(y) / f'(x): scale the
    # error by min(1, f'(x)) (as the spline property tests do); float64 is held to the raw error.
    slope = ladj.exp().clamp(max=1) if dtype == torch.float32 else 1.0
    assert float((error.abs() * slope).max()) <= tol * width
    assert float((ladj + ladj_inv).abs().max()) <= (1e-9 if dtype == F64 else 1e-3)
    # Also the plain error where the map is not flat.
    if dtype == torch.float32:
        steep = ladj > math.log(0.1)
        assert float(error[steep].abs().max()) <= 10 * tol * width


@pytest.mark.parametrize("circular", [False, True])
def test_inverse_gradcheck_and_gradgradcheck(circular):
    t = SmoothMixture(2, circular=circular)
    n = 3
    params = _params(t, n, scale=1.0).requires_grad_(True)
    v = torch.rand(n, dtype=F64)
    if circular:
        v = v + t._unit_map(torch.zeros(n, dtype=F64), params)[0].detach()
    v.requires_grad_(True)

    def root(v, params):
        return _Inverse.apply(v, params, t)

    assert torch.autograd.gradcheck(root, (v, params), fast_mode=True)
    assert torch.autograd.gradgradcheck(root, (v, params), fast_mode=True)
    # The whole inverse with its log-derivative (differentiated through the root).
    y = t.domain.sample((n,), dtype=F64).requires_grad_(True)
    assert torch.autograd.gradgradcheck(t.inverse, (y, params), fast_mode=True)


def test_inverse_gradient_is_the_inverse_function_theorem():
    t = SmoothMixture(3)
    params = _params(t, 50).requires_grad_(True)
    x = t.domain.sample((50,), dtype=F64)
    y, ladj = t(x, params)
    (df_dtheta,) = torch.autograd.grad(y.sum(), params)
    y = y.detach().requires_grad_(True)
    x_back, _ = t.inverse(y, params)
    dx_dy, dx_dtheta = torch.autograd.grad(x_back.sum(), (y, params))
    torch.testing.assert_close(dx_dy, torch.exp(-ladj.detach()), rtol=1e-9, atol=0)
    torch.testing.assert_close(dx_dtheta, -df_dtheta * torch.exp(-ladj.detach()).unsqueeze(-1), rtol=1e-8, atol=1e-12)


def _force_and_its_derivative(transformer, x, params):
    """Force `F = d/dx log q` of `log q(x) = -f(x)^2 / 2 + log f'(x)` and `dF/dx`, both by autograd."""
    x = x.clone().requires_grad_(True)
    y, ladj = transformer(x, params)
    log_q = -0.5 * y * y + ladj
    (force,) = torch.autograd.grad(log_q.sum(), x, create_graph=True)
    (d_force,) = torch.autograd.grad(force.sum(), x)
    return force.detach(), d_force


def _finite_difference_mismatch(transformer, x, params, h):
    """`max |(F(x + h) - F(x - h)) / 2h - dF/dx(x)|` relative to `max |dF/dx|`."""
    f_plus, _ = _force_and_its_derivative(transformer, x + h, params)
    f_minus, _ = _force_and_its_derivative(transformer, x - h, params)
    _, d_force = _force_and_its_derivative(transformer, x, params)
    fd = (f_plus - f_minus) / (2 * h)
    return float((fd - d_force).abs().max() / d_force.abs().max().clamp_min(1.0))


def test_second_derivative_of_log_q_is_continuous_where_a_splines_is_not():
    n = 400
    smooth = SmoothMixture(4)
    params = _params(smooth, 1, scale=1.0).expand(n, -1)
    x = torch.linspace(0.02, 0.98, n, dtype=F64)
    assert _finite_difference_mismatch(smooth, x, params, 1e-5) < 1e-4
    spline = RationalQuadraticSpline(bins=6, bound=1.0)
    spline_params = _params(spline, 1, scale=1.0).expand(5, -1)
    knots = spline.knots(spline_params[:1])[0][0, 0, 1:-1]  # the interior knots on the x axis
    assert _finite_difference_mismatch(spline, knots, spline_params, 1e-5) > 1.0
    # Control: halfway between its knots the spline agrees too (so the check is not just noisy).
    edges = spline.knots(spline_params[:1])[0][0, 0]
    middles = 0.5 * (edges[1:] + edges[:-1])
    assert _finite_difference_mismatch(spline, middles, spline_params[:1].expand(6, -1), 1e-5) < 1e-4


def test_identity_params_are_close_to_the_identity():
    for circular in (False, True):
        t = SmoothMixture(8, circular=circular)
        x = t.domain.sample((500,), dtype=F64)
        y, ladj = t(x, t.identity_params().double().expand(500, -1))
        d = _wrapped(y - x) if circular else y - x
        assert float(d.abs().max()) < 2e-3 * (t.high - t.low)
        assert float(ladj.abs().max()) < 2e-2


@pytest.mark.parametrize("circular", [False, True])
def test_plugs_into_coupling_and_masked_autoregressive(circular):
    t = SmoothMixture(3, circular=circular)
    conditioner = MLP(2, 2 * t.params_per_element, (16,), "tanh", periodic=circular)
    coupling = randomize(Coupling(t, 4, conditioner=conditioner), scale=0.3)
    assert check_bijector(coupling, t.domain.sample((6, 4))).passed
    made = randomize(MaskedAutoregressive(SmoothMixture(3, circular=circular), 3, hidden=(16,), activation="tanh"))
    assert check_bijector(made, t.domain.sample((6, 3))).passed


def test_bad_arguments():
    with pytest.raises(ValueError, match="components"):
        SmoothMixture(0)
    with pytest.raises(ValueError, match="low and high"):
        SmoothMixture(circular=True, low=0.0)
    with pytest.raises(ValueError, match="low < high"):
        SmoothMixture(low=1.0, high=1.0)
    with pytest.raises(ValueError, match="power"):
        SmoothMixture(power=3)
    with pytest.raises(ValueError, match="min_density"):
        SmoothMixture(min_density=0.0)
    with pytest.raises(ValueError, match="min_scale"):
        SmoothMixture(circular=True, min_scale=0.5)


def _torus_flow():
    blocks = []
    for parity in (0, 1):
        t = SmoothMixture(3, circular=True)
        net = MLP(1, t.params_per_element, (8,), "tanh", periodic=True)
        blocks.append(Coupling(t, 2, parity=parity, conditioner=net))
    return randomize(flowkit.Flow(Chain(*blocks), RigidBase(["angle", "angle"])), scale=0.5).double()


def test_torus_flow_density_integrates_to_one_and_saves(tmp_path):
    flow = _torus_flow()
    points, area = torus_grid(128)
    with torch.no_grad():
        log_q = flow.log_prob(points)
    assert abs(float(log_q.exp().sum()) * area - 1) < 1e-4  # the periodic trapezoid rule (1.4e-6 measured)
    flowkit.io.save(flow, tmp_path / "model")
    loaded = flowkit.io.load(tmp_path / "model")
    with torch.no_grad():
        torch.testing.assert_close(loaded.log_prob(points[:50]), log_q[:50], rtol=0, atol=1e-12)


@pytest.mark.parametrize("circular", [False, True])
def test_inverse_is_exact_where_the_root_is_a_grid_node_or_a_bisection_point(circular):
    # Dyadic points (0.5, 0.75, 17/32, ...) are hit exactly by the bracketing; the Newton steps
    # then land just outside the bracket and were replaced by midpoints (errors of 5e-7).
    t = SmoothMixture(circular=circular).double()
    u = torch.tensor([0.25, 0.5, 0.75, 17 / 32, 0.3], dtype=torch.float64)
    x = t._from_unit(u)
    g = torch.Generator().manual_seed(8)
    params = 0.1 * torch.randn(1, t.params_per_element, generator=g, dtype=torch.float64) + t.identity_params()
    params = params.double().expand(len(u), -1)
    y, _ = t(x, params)
    back, _ = t.inverse(y, params)
    torch.testing.assert_close(back, x, atol=1e-12, rtol=0)
