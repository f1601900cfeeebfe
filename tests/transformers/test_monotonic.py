"""Monotonic-network transformers (NAF's deep sigmoidal flows, UMNN).

Exact special cases, the quadrature against an adaptive integrator, the numerical inverses at their
stated tolerance, and implicit gradients.
"""

import math

import numpy as np
import pytest
import torch
from scipy import integrate

from flowkit.bijectors import Coupling, MaskedAutoregressive
from flowkit.transformers import MonotonicMLP, UnconstrainedMonotonic

#: The stated round-trip tolerances, relative to `max(1, |x|)` (module docstring).
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _inputs(t, n=500, scale=1.0, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(n, generator=g, dtype=torch.float64)
    params = scale * torch.randn(n, t.params_per_element, generator=g, dtype=torch.float64)
    return x.to(dtype), params.to(dtype)


def test_one_sigmoidal_unit_is_affine():
    # logit(sigmoid(a x + b)) = a x + b exactly, with a = 1e-3 + softplus(raw).
    t = MonotonicMLP(hidden=1)
    x, params = _inputs(t)
    y, ladj = t(x, params)
    a = 1e-3 + torch.nn.functional.softplus(params[:, 0])
    torch.testing.assert_close(y, a * x + params[:, 1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ladj, a.log(), rtol=1e-12, atol=1e-12)


def test_sigmoidal_flow_matches_its_formula_and_has_linear_tails():
    t = MonotonicMLP(hidden=3)
    x, params = _inputs(t, n=50)
    y, ladj = t(x, params)
    raw_a, b, raw_w = params.unflatten(-1, (3, 3)).unbind(-2)
    a, w = 1e-3 + torch.nn.functional.softplus(raw_a), torch.softmax(raw_w, -1)
    p = (w * torch.sigmoid(a * x[:, None] + b)).sum(-1)
    torch.testing.assert_close(y, torch.log(p / (1 - p)), rtol=1e-9, atol=1e-9)
    # Far out the slope tends to the smallest a_j (log space keeps the tail exact).
    far = torch.full((50,), 1e5, dtype=torch.float64)
    _, ladj_far = t(far, params)
    torch.testing.assert_close(ladj_far.exp(), a.min(-1).values, rtol=1e-3, atol=0)


@pytest.mark.parametrize("transformer", [MonotonicMLP(5, layers=3), UnconstrainedMonotonic(6, nodes=32)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_round_trip_within_the_stated_tolerance(transformer, dtype):
    x, params = _inputs(transformer, scale=1.0, dtype=dtype)
    with torch.no_grad():
        y, ladj = transformer(x, params)
        back, ladj_inv = transformer.inverse(y, params)
    err = (back - x).abs() / x.abs().clamp_min(1)
    assert float(err.max()) <= TOL[dtype]
    assert float((ladj + ladj_inv).abs().max()) <= 50 * TOL[dtype]


def test_deep_sigmoidal_log_derivative_matches_autograd():
    t = MonotonicMLP(4, layers=2)
    x, params = _inputs(t, scale=2.0)
    x.requires_grad_(True)
    y, ladj = t(x, params)
    (slope,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(slope.log(), ladj, rtol=1e-10, atol=1e-10)


def test_unconstrained_monotonic_integral_against_adaptive_quadrature():
    t = UnconstrainedMonotonic(4, nodes=32, bound=4.0)
    x, params = _inputs(t, n=12, scale=0.7)
    x = x.clamp(-6, 6)
    y, ladj = t(x, params)
    w, c, v, d, beta = (params[:, :4], params[:, 4:8], params[:, 8:12], params[:, 12], params[:, 13])
    for i in range(len(x)):

        def g(s, i=i):
            s = min(max(s, -4.0), 4.0)  # the map is linear outside [-B, B]
            inner = float(d[i]) + float((v[i] * torch.tanh(w[i] * s + c[i])).sum())
            return math.exp(7.0 * math.tanh(inner / 7.0))

        exact, _ = integrate.quad(g, 0.0, float(x[i]), epsabs=1e-13, epsrel=1e-13, limit=200, points=[-4.0, 4.0])
        assert abs(float(y[i]) - float(beta[i]) - exact) <= 1e-9 * max(1.0, abs(exact))
        assert abs(float(ladj[i]) - math.log(g(float(x[i])))) <= 1e-12


def test_unconstrained_monotonic_constant_integrand_is_affine():
    # Zero output weights: g = exp(L tanh(d / L)) is constant and the rule is exact at any node count.
    t = UnconstrainedMonotonic(3, nodes=1, clamp=5.0)
    x, params = _inputs(t)
    params[:, 6:9] = 0.0
    y, ladj = t(x, params)
    slope = torch.exp(5.0 * torch.tanh(params[:, 9] / 5.0))
    torch.testing.assert_close(y, params[:, 10] + slope * x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ladj, slope.log(), rtol=1e-12, atol=1e-12)


def test_identity_parameters():
    x = torch.linspace(-4, 4, 41, dtype=torch.float64)
    t = UnconstrainedMonotonic(5)
    y, ladj = t(x, t.identity_params().double().expand(41, -1))
    torch.testing.assert_close(y, x, rtol=0, atol=1e-12)
    assert float(ladj.abs().max()) == 0.0
    m = MonotonicMLP(1, layers=2)  # one unit per layer: the identity exactly
    y, ladj = m(x, m.identity_params().double().expand(41, -1))
    torch.testing.assert_close(y, x, rtol=0, atol=1e-6)
    m = MonotonicMLP(6)  # spread offsets: close to the identity, units apart
    params = m.identity_params()
    assert len(set(params[6:12].tolist())) == 6
    y, _ = m(x, params.double().expand(41, -1))
    assert float((y - x).abs().max()) < 0.5


@pytest.mark.parametrize("transformer", [MonotonicMLP(3, iterations=80), UnconstrainedMonotonic(3, nodes=8)], ids=type)
def test_inverse_gradients_are_the_implicit_ones(transformer):
    x, params = _inputs(transformer, n=4, scale=0.5)
    y = transformer(x, params)[0].detach().requires_grad_(True)
    params = params.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda y, p: transformer.inverse(y, p), (y, params), atol=1e-6)


@pytest.mark.parametrize("transformer", [MonotonicMLP(3), UnconstrainedMonotonic(3)], ids=type)
def test_plugs_into_coupling_and_autoregressive_layers(transformer):
    for layer in (Coupling(transformer, 3, hidden=(8,)), MaskedAutoregressive(transformer, 3, hidden=(8,))):
        x = torch.randn(7, 3)
        z, ladj = layer(x)
        back, ladj_inv = layer.inverse(z)
        assert z.shape == (7, 3) and ladj.shape == (7,)
        torch.testing.assert_close(back, x, atol=1e-5, rtol=0)
        torch.testing.assert_close(ladj_inv, -ladj, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: MonotonicMLP(hidden=0), "hidden"),
        (lambda: MonotonicMLP(layers=0), "layers"),
        (lambda: MonotonicMLP(iterations=0), "iterations"),
        (lambda: UnconstrainedMonotonic(hidden=0), "hidden"),
        (lambda: UnconstrainedMonotonic(nodes=0), "nodes"),
        (lambda: UnconstrainedMonotonic(bound=float("nan")), "bound"),
        (lambda: UnconstrainedMonotonic(bound=-1.0), "bound"),
        (lambda: UnconstrainedMonotonic(clamp=float("inf")), "clamp"),
        (lambda: UnconstrainedMonotonic(iterations=2.5), "iterations"),
    ],
)
def test_bad_arguments_are_value_errors(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_gauss_legendre_rule_is_exact_for_polynomials():
    # The rule of `nodes` points on [0, 1] integrates t^k exactly for k <= 2 nodes - 1.
    t = UnconstrainedMonotonic(1, nodes=4)
    points, weights = t._points.numpy(), t._weights.numpy()
    for k in range(8):
        assert abs(float(np.sum(weights * points**k)) - 1 / (k + 1)) < 1e-14
