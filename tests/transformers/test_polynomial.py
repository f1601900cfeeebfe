"""Polynomial transformers (Bernstein, sum of squares): monotone, formulas, tails, inverse tolerance, bad input."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.special import comb

from flowkit.root_finding import ConvergenceError
from flowkit.transformers import Bernstein, SumOfSquares

TRANSFORMERS = {
    "Bernstein": lambda: Bernstein(degree=12, bound=3.0),
    "Bernstein(degree 3)": lambda: Bernstein(degree=3, bound=2.0),
    "SumOfSquares": lambda: SumOfSquares(degree=4, polynomials=3, bound=3.0),
}


def _params(t, n, scale, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(n, t.params_per_element, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_monotone_for_random_coefficients_at_1e5_points(name):
    # 100 random coefficient sets (scale 3: some increments near the floor), 1000 sorted points each, 4 B wide.
    t = TRANSFORMERS[name]()
    params = _params(t, 100, 3.0).unsqueeze(1)
    x = torch.linspace(-2 * t.bound, 2 * t.bound, 1000, dtype=torch.float64).expand(100, -1)
    y, ladj = t(x, params)
    assert x.numel() == 10**5
    assert (y.diff(dim=-1) > 0).all()
    assert torch.isfinite(ladj).all()
    assert (ladj.exp() >= t.min_slope * (1 - 1e-12)).all()


def test_bernstein_matches_its_basis_inside_and_is_linear_outside():
    t = Bernstein(degree=7, bound=2.0)
    params = _params(t, 1, 1.5)[0]
    theta, _ = t._constrain(params)
    x = np.linspace(-2, 2, 41)
    u = (x + 2) / 4
    basis = np.stack([comb(7, k) * u**k * (1 - u) ** (7 - k) for k in range(8)], axis=-1)
    y, ladj = t(torch.from_numpy(x), params)
    np.testing.assert_allclose(y.numpy(), basis @ theta.numpy(), rtol=1e-12, atol=1e-12)
    # Ends: f(-B) = theta_0, f(B) = theta_M; outside the tangent at the bound.
    far = torch.tensor([-5.0, 7.0], dtype=torch.float64)
    y_far, ladj_far = t(far, params)
    y_end, ladj_end = t(torch.tensor([-2.0, 2.0], dtype=torch.float64), params)
    torch.testing.assert_close(y_end, theta[[0, -1]])
    torch.testing.assert_close(ladj_far, ladj_end)
    torch.testing.assert_close(y_far, y_end + ladj_end.exp() * torch.tensor([-3.0, 5.0], dtype=torch.float64))


def test_bernstein_has_no_curvature_at_the_bound_so_the_extrapolation_is_smooth():
    # f''(+-B) = 0 (the tied end increments): the log-slope is flat at both ends, from inside.
    t = Bernstein(degree=9, bound=2.0)
    params = _params(t, 8, 2.0)
    x = torch.tensor([-2.0, 2.0], dtype=torch.float64).expand(8, 2).clone().requires_grad_(True)
    _, ladj = t(x, params.unsqueeze(1))
    (curvature,) = torch.autograd.grad(ladj.sum(), x)
    assert float(curvature.abs().max()) < 1e-10
    x_in = torch.tensor([-1.0, 1.0], dtype=torch.float64).expand(8, 2).clone().requires_grad_(True)
    (inside,) = torch.autograd.grad(t(x_in, params.unsqueeze(1))[1].sum(), x_in)
    assert float(inside.abs().max()) > 1e-3  # the check is not vacuous


def test_sum_of_squares_integral_matches_quadrature():
    t = SumOfSquares(degree=3, polynomials=2, bound=2.0, min_slope=0.01)
    params = _params(t, 1, 1.0)[0]
    offset, a = float(params[0]), params[1:].reshape(2, 4).numpy()

    def slope(s):
        p = np.polynomial.polynomial.polyval(s / 2.0, a.T)
        return 0.01 + np.mean(p**2)

    for x in (-1.7, -0.3, 0.0, 0.9, 2.0):
        expected = offset + integrate.quad(slope, 0.0, x, epsabs=1e-13, epsrel=1e-13)[0]
        y, ladj = t(torch.tensor(x, dtype=torch.float64), params)
        assert abs(float(y) - expected) < 1e-11
        assert abs(float(ladj) - math.log(slope(x))) < 1e-12


@pytest.mark.parametrize("t", [Bernstein(degree=10), SumOfSquares(degree=3, polynomials=2)])
def test_identity_parameters_give_the_identity(t):
    x = torch.linspace(-9, 9, 37, dtype=torch.float64)
    y, ladj = t(x, t.identity_params().double())
    torch.testing.assert_close(y, x, rtol=0, atol=1e-6)  # identity_params are float32
    assert float(ladj.abs().max()) < 1e-6


@pytest.mark.parametrize("name", TRANSFORMERS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_round_trip_within_tolerance_in_both_directions(name, dtype):
    t = TRANSFORMERS[name]()
    params = _params(t, 2000, 1.0, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    x = (3 * t.bound * torch.randn(2000, generator=g, dtype=torch.float64)).to(dtype)
    with torch.no_grad():
        y, ladj = t(x, params)
        back, ladj_inv = t.inverse(y, params)
        y_back, _ = t(t.inverse(x, params)[0], params)  # y -> x -> y, targets beyond the ends included
    tol = 1e-10 if dtype == torch.float64 else 1e-3
    # The forward error of the solve is its residual over the slope (root_finding's backward-error test).
    assert float(((back - x).abs() * ladj.exp().clamp(max=1) / x.abs().clamp_min(1)).max()) <= tol
    assert float(((y_back - x).abs() / x.abs().clamp_min(1)).max()) <= tol
    assert float((ladj + ladj_inv).abs().max()) <= (1e-8 if dtype == torch.float64 else 1e-2)


@pytest.mark.parametrize("t", [Bernstein(degree=12, iterations=1), SumOfSquares(iterations=1)])
def test_an_unfinished_inverse_raises(t):
    params = _params(t, 50, 2.0)
    y = torch.linspace(-2, 2, 50, dtype=torch.float64)
    with pytest.raises(ConvergenceError, match="did not converge"):
        t.inverse(y, params)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Bernstein(degree=0), "degree must be"),
        (lambda: Bernstein(degree=2.5), "degree must be"),
        (lambda: Bernstein(bound=0.0), "bound must be"),
        (lambda: Bernstein(min_slope=1.0), "min_slope must be"),
        (lambda: SumOfSquares(degree=0), "degree must be"),
        (lambda: SumOfSquares(polynomials=0), "polynomials must be"),
        (lambda: SumOfSquares(iterations=0), "iterations must be"),
    ],
)
def test_bad_input_is_a_value_error(build, message):
    with pytest.raises(ValueError, match=message):
        build()
