"""The Gaussianization transformer: its formula, log-space tails, the inverse within its stated tolerance, bad input."""

import math

import numpy as np
import pytest
import torch
from scipy.special import expit, ndtri, ndtri_exp

from flowkit.bijectors import ElementwiseTransformer
from flowkit.root_finding import ConvergenceError
from flowkit.transformers import Gaussianization
from flowkit.transformers.gaussianization import normal_quantile_from_log

#: The stated round-trip tolerance in float64, relative to max(1, |x|), for parameters and inputs of unit scale.
TOL = 1e-9


def _inputs(t, n=2000, scale=1.0, spread=3.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = spread * torch.randn(n, generator=g, dtype=torch.float64)
    params = scale * torch.randn(n, t.params_per_element, generator=g, dtype=torch.float64)
    return x.to(dtype), params.to(dtype)


def test_matches_the_mixture_formula():
    t = Gaussianization(3)
    x, params = _inputs(t, n=200)
    y, _ = t(x, params)
    logits, mu, raw = params.numpy().reshape(-1, 3, 3).transpose(1, 0, 2)
    w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    s = 1e-3 + np.log1p(np.exp(raw))
    cdf = (w * expit((x.numpy()[:, None] - mu) / s)).sum(-1)
    np.testing.assert_allclose(y.numpy(), ndtri(cdf), rtol=1e-9, atol=1e-9)


def test_one_normal_component_is_affine():
    t = Gaussianization(1, kernel="normal")
    x, params = _inputs(t, spread=10.0)  # far into the tails, where the CDF underflows
    y, ladj = t(x, params)
    s = 1e-3 + torch.nn.functional.softplus(params[:, 2])
    torch.testing.assert_close(y, (x - params[:, 1]) / s, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ladj, -torch.log(s), rtol=1e-9, atol=1e-9)


def test_normal_quantile_from_log_probabilities():
    log_p = -np.geomspace(math.log(2), 1e5, 60)  # the domain: probabilities up to 1/2
    got = normal_quantile_from_log(torch.from_numpy(log_p))
    np.testing.assert_allclose(got.numpy(), ndtri_exp(log_p), rtol=1e-12, atol=1e-12)
    got32 = normal_quantile_from_log(torch.from_numpy(log_p).float())
    np.testing.assert_allclose(got32.numpy(), ndtri_exp(log_p), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernel", ["logistic", "normal"])
def test_value_alone_equals_forward_including_the_tails(kernel, dtype):
    t = Gaussianization(5, kernel=kernel)
    x, params = _inputs(t, n=3000, spread=4.0, dtype=dtype)
    x = torch.cat([x, torch.tensor([-1e4, -300.0, -40.0, -9.0, 9.0, 40.0, 300.0, 1e4], dtype=dtype)])
    params = torch.cat([params, params[:8]])
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(t.value(x, params), t(x, params)[0], rtol=tol, atol=tol)
    layer = ElementwiseTransformer(t, 3).to(dtype)  # the layer's call goes through value, shared parameters
    points = 3 * torch.randn(50, 3, dtype=dtype)
    torch.testing.assert_close(layer.call(points), layer(points)[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernel", ["logistic", "normal"])
def test_far_tails_stay_finite_with_finite_gradients(kernel, dtype):
    t = Gaussianization(4, kernel=kernel)
    _, params = _inputs(t, n=6, scale=2.0, dtype=dtype)
    x = torch.tensor([-1e4, -300.0, -40.0, 40.0, 300.0, 1e4], dtype=dtype, requires_grad=True)
    y, ladj = t(x, params)
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all()
    assert (y.diff() > 0).all()
    (grad,) = torch.autograd.grad(y.sum() + ladj.sum(), x)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("kernel", ["logistic", "normal"])
def test_inverse_within_the_stated_tolerance(kernel):
    t = Gaussianization(6, kernel=kernel)
    x, params = _inputs(t)
    with torch.no_grad():
        y, ladj = t(x, params)
        back, ladj_inv = t.inverse(y, params)
    assert float(((back - x).abs() / x.abs().clamp_min(1)).max()) <= TOL
    assert float((ladj + ladj_inv).abs().max()) <= 100 * TOL
    # y -> x -> y for targets of the whole range, tails included.
    targets = 4 * torch.randn(2000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        again, _ = t(t.inverse(targets, params)[0], params)
    assert float(((again - targets).abs() / targets.abs().clamp_min(1)).max()) <= TOL


def test_inverse_gradients_are_the_implicit_ones():
    t = Gaussianization(3)
    _, params = _inputs(t, n=8)
    y = torch.randn(8, dtype=torch.float64, requires_grad=True)
    x, ladj_inv = t.inverse(y, params)
    (dx_dy,) = torch.autograd.grad(x.sum(), y)
    torch.testing.assert_close(dx_dy.log(), ladj_inv, rtol=1e-9, atol=1e-9)


def test_an_unfinished_inverse_raises():
    t = Gaussianization(6, iterations=1)
    _, params = _inputs(t, n=50, scale=2.0)
    with pytest.raises(ConvergenceError, match="Gaussianization.inverse"):
        t.inverse(torch.linspace(-3, 3, 50, dtype=torch.float64), params)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"components": 0}, "components must be"), ({"kernel": "cauchy"}, "kernel must be one of logistic, normal")],
)
def test_bad_input_is_a_value_error(arguments, message):
    with pytest.raises(ValueError, match=message):
        Gaussianization(**arguments)
