"""Masked autoregressive layers and the MADE conditioner."""

import pytest
import torch

from flowkit.bijectors import MaskedAffineAutoregressive, MaskedAutoregressive, MaskedSplineAutoregressive
from flowkit.nn import MADE
from flowkit.testing import randomize
from flowkit.transformers import RationalQuadraticSpline


def input_output_jacobian(f, x):
    return torch.autograd.functional.jacobian(f, x)


@pytest.mark.parametrize("residual", [False, True])
def test_made_connectivity_is_exactly_autoregressive(residual):
    order = [2, 0, 3, 1]
    made = randomize(MADE(4, 3, hidden=(20, 20), context=2, residual=residual, order=order)).double()
    x = torch.randn(6, dtype=torch.float64)
    jac = input_output_jacobian(made, x).reshape(4, 3, 6)  # (feature, param, input)
    rank = {feature: r for r, feature in enumerate(order)}
    for i in range(4):
        for j in range(4):
            allowed = rank[j] < rank[i]
            dependence = jac[i, :, j].abs().max()
            assert (dependence > 0) == allowed, (i, j, dependence)
        assert (jac[i, :, 4:].abs().max(dim=0).values > 0).all()  # every output sees the context


def test_layer_jacobian_is_triangular_in_its_order():
    layer = randomize(MaskedSplineAutoregressive(4, bins=4, bound=2.0, hidden=(16, 16), order=[3, 1, 0, 2]), 0.2).double()
    x = torch.randn(4, dtype=torch.float64)
    jac = input_output_jacobian(lambda v: layer(v)[0], x)
    perm = [3, 1, 0, 2]
    permuted = jac[perm][:, perm]
    assert torch.equal(permuted, permuted.tril())
    assert (permuted.diagonal() > 0).all()


def naive_inverse(layer, z, context=None):
    """The textbook inverse: D full passes of the conditioner, each fixing one more feature."""
    x = torch.zeros_like(z)
    for _ in range(z.shape[-1]):
        params = layer.conditioner(torch.cat([x, context], -1) if context is not None else x)
        x = layer.transformer.inverse(z, params.unflatten(-1, (-1, layer._n_params)))[0]
    return x


@pytest.mark.parametrize(
    "layer",
    [
        MaskedAffineAutoregressive(5, hidden=(16, 16), context=3),
        MaskedSplineAutoregressive(5, bins=5, bound=2.0, hidden=(16,), context=3, residual=True, order=[4, 2, 0, 1, 3]),
    ],
    ids=["affine", "spline-residual"],
)
def test_incremental_inverse_matches_naive_inverse(layer):
    layer = randomize(layer, 0.2).double()
    z = torch.randn(7, 5, dtype=torch.float64)
    context = torch.randn(7, 3, dtype=torch.float64)
    x, ladj = layer.inverse(z, context)
    torch.testing.assert_close(x, naive_inverse(layer, z, context), atol=1e-10, rtol=0)
    z_back, ladj_forward = layer(x, context)
    torch.testing.assert_close(z_back, z, atol=1e-10, rtol=0)
    torch.testing.assert_close(ladj, -ladj_forward, atol=1e-10, rtol=0)


def test_context_broadcasts_and_matters():
    layer = randomize(MaskedAffineAutoregressive(3, hidden=(8,), context=2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    c1, c2 = torch.randn(2, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    z1, _ = layer(x, c1.expand(5, 2))
    z2, _ = layer(x, c2.expand(5, 2))
    assert (z1 - z2).abs().max() > 1e-3
    zb, lb = layer(x[:, None], torch.stack([c1, c2])[None])  # batch (5, 1) x (1, 2) -> (5, 2)
    assert zb.shape == (5, 2, 3) and lb.shape == (5, 2)
    torch.testing.assert_close(zb[:, 0], z1)


def test_starts_as_identity_and_bad_arguments():
    layer = MaskedAutoregressive(RationalQuadraticSpline(8, 3.0), 4, hidden=(8,))
    x = torch.randn(10, 4)
    z, ladj = layer(x)
    torch.testing.assert_close(z, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(ladj, torch.zeros(10), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="permutation"):
        MADE(3, 2, order=[0, 0, 1])
    with pytest.raises(ValueError, match="hidden"):
        MADE(3, 2, hidden=())
