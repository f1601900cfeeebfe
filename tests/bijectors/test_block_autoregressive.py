"""BlockNeuralAutoregressive (BNAF): triangular Jacobian, exact log-det, weight normalisation, numerical inverse."""

import math

import pytest
import torch

from flowkit.bijectors import BlockNeuralAutoregressive
from flowkit.bijectors.block_autoregressive import _leaky_tanh
from flowkit.testing import randomize


def _layer(context=0, hidden=(5, 4), seed=0):
    torch.manual_seed(seed)
    return randomize(BlockNeuralAutoregressive(3, hidden=hidden, context=context), scale=0.5, seed=seed).double()


def test_jacobian_is_lower_triangular_with_the_log_diagonal_it_reports():
    layer = _layer()
    x = torch.randn(4, 3, dtype=torch.float64)
    for point in x:
        jac = torch.autograd.functional.jacobian(lambda v: layer(v[None])[0][0], point)
        assert float(jac.triu(1).abs().max()) == 0.0  # z_d depends on x_{<=d} only
        assert bool((jac.diagonal() > 0).all())
        _, log_diag = layer._network(point[None], None)
        torch.testing.assert_close(log_diag[0], jac.diagonal().log(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer(point[None])[1][0], torch.linalg.slogdet(jac)[1], rtol=1e-12, atol=1e-12)


@torch.no_grad()
def test_rows_are_weight_normalised():
    layer = _layer()
    for k in range(len(layer.weights)):
        weight, _ = layer._layer_weights(k)
        torch.testing.assert_close(weight.norm(dim=1), layer.log_gains[k].exp(), rtol=1e-12, atol=0)
        assert float(weight[getattr(layer, f"_diag{k}")].min()) > 0  # positive diagonal blocks
        upper = ~(getattr(layer, f"_diag{k}") | getattr(layer, f"_lower{k}"))
        assert float(weight[upper].abs().max()) == 0.0


def test_starts_with_unit_slopes_at_the_origin():
    layer = BlockNeuralAutoregressive(4, hidden=(8, 8)).double()
    _, log_diag = layer._network(torch.zeros(1, 4, dtype=torch.float64), None)
    assert float(log_diag.abs().max()) < 1e-6


@pytest.mark.parametrize("context", [0, 2])
def test_round_trip_within_1e_8_far_out(context):
    layer = _layer(context)
    x = 5 * torch.randn(200, 3, dtype=torch.float64)
    ctx = torch.randn(200, context, dtype=torch.float64) if context else None
    with torch.no_grad():
        z, ladj = layer(x, ctx)
        back, ladj_inv = layer.inverse(z, ctx)
    assert float(((back - x).abs() / x.abs().clamp_min(1)).max()) <= 1e-8
    assert float((ladj + ladj_inv).abs().max()) <= 1e-8


@pytest.mark.slow
def test_inverse_gradients_are_the_implicit_ones():
    layer = BlockNeuralAutoregressive(2, hidden=(3,), iterations=80).double()
    z = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: layer.inverse(z), (z,), atol=1e-6)


def test_leaky_tanh_log_derivative_is_finite_and_exact():
    u = torch.tensor([-1e4, -30.0, -1.0, 0.0, 0.5, 30.0, 1e4], dtype=torch.float64, requires_grad=True)
    value, log_slope = _leaky_tanh(u, 0.01)
    (slope,) = torch.autograd.grad(value.sum(), u)
    torch.testing.assert_close(log_slope, slope.log(), rtol=1e-12, atol=1e-12)
    assert abs(float(log_slope[0]) - math.log(0.01)) < 1e-12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"features": 0}, "features"),
        ({"hidden": (0,)}, "hidden"),
        ({"hidden": 8}, "hidden"),
        ({"leak": 0.0}, "leak"),
        ({"leak": float("inf")}, "leak"),
        ({"iterations": 0}, "iterations"),
        ({"expansions": float("nan")}, "expansions"),
        ({"context": -1}, "context"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockNeuralAutoregressive(**{"features": 2, **kwargs})
