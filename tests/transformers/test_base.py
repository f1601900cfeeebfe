"""The transformer interface: closed-form derivatives of the log-derivative against autograd."""

import math

import pytest
import torch
from cases import TRANSFORMERS, missing_cases

from flowkit.train import score_rules
from flowkit.train.score_rules import _with_ladj_derivative, forward_and_ladj_derivative
from flowkit.transformers import CircularSpline, RationalQuadraticSpline, Transformer


def test_every_public_transformer_has_a_case():
    missing = missing_cases(Transformer, TRANSFORMERS)
    assert not missing, f"add a case to tests/cases.py TRANSFORMERS for: {', '.join(missing)}"


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_parameters_broadcast_against_the_points(name):
    # ElementwiseTransformer passes `(D, P)` parameters with points `(..., D)`.
    transformer = TRANSFORMERS[name]()
    x, params = _inputs(transformer, n=12)
    x, params = x.reshape(4, 3).clamp(-3, 3) * (0.3 if isinstance(transformer, CircularSpline) else 1), params[:3]
    for method in (transformer.forward, transformer.inverse):
        y, ladj = method(x, params)
        y_full, ladj_full = method(x, params.expand(4, 3, -1))
        torch.testing.assert_close(y, y_full)
        torch.testing.assert_close(torch.broadcast_to(ladj, y.shape), ladj_full)


def _inputs(transformer, n=400):
    g = torch.Generator().manual_seed(0)
    if isinstance(transformer, CircularSpline):
        x = (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1) * math.pi
    else:
        x = 5.0 * torch.randn(n, generator=g, dtype=torch.float64)  # many beyond a spline's bound
    params = 2.0 * torch.randn(n, transformer.params_per_element, generator=g, dtype=torch.float64)
    return x, params


@pytest.mark.parametrize("name", TRANSFORMERS)
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_ladj_derivative_matches_autograd(name, direction):
    transformer = TRANSFORMERS[name]()
    x, params = _inputs(transformer)
    closed_form = getattr(score_rules, f"{direction}_and_ladj_derivative")(transformer, x, params)
    by_autograd = _with_ladj_derivative(getattr(transformer, direction), x, params)
    assert closed_form[2].grad_fn is None
    for got, expected in zip(closed_form, by_autograd, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    if isinstance(transformer, RationalQuadraticSpline):
        assert float(closed_form[2].abs().max()) > 0.1  # the check is not vacuous


def test_the_default_rule_differentiates_any_transformer():
    class Cubic(Transformer):
        """y = x + a x^3 / 3 with a = e^p: log-derivative log(1 + a x^2), of derivative 2 a x / (1 + a x^2)."""

        params_per_element = 1

        def forward(self, x, params):
            a = params[..., 0].exp()
            return x + a * x**3 / 3, torch.log1p(a * x * x)

    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    params = torch.randn(13, 1, dtype=torch.float64, requires_grad=True)
    y, ladj, derivative = forward_and_ladj_derivative(Cubic(), x, params)
    a = params[..., 0].detach().exp()
    torch.testing.assert_close(derivative, 2 * a * x / (1 + a * x * x))
    assert derivative.grad_fn is None
    # The outputs keep their graph to the parameters.
    (grad,) = torch.autograd.grad(y.sum() + ladj.sum(), params)
    torch.testing.assert_close(grad[..., 0], a * x**3 / 3 + a * x * x / (1 + a * x * x))
