"""Masked autoregressive layers and the MADE conditioner."""

import pytest
import torch

from flowkit.bijectors import MaskedAffineAutoregressive, MaskedAutoregressive, MaskedSplineAutoregressive
from flowkit.nn import MADE, MLP, Conditioner, MaskedLinear, broadcast_context
from flowkit.testing import check_bijector, randomize
from flowkit.transformers import Affine, RationalQuadraticSpline


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
    layer = randomize(
        MaskedSplineAutoregressive(4, bins=4, bound=2.0, hidden=(16, 16), order=[3, 1, 0, 2]), 0.2
    ).double()
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


@pytest.mark.parametrize(
    "hidden, context, residual", [((16, 16), 2, True), ((16, 16), 0, True), ((7, 12, 5), 0, False), ((3,), 1, False)]
)
def test_made_fast_inverse_equals_the_generic_fallback(hidden, context, residual):
    # the fast inverse evaluates, for each feature, only the hidden units of lower degree (a prefix once sorted)
    made = randomize(MADE(5, 3, hidden=hidden, context=context, residual=residual, order=[3, 0, 4, 1, 2])).double()
    z = torch.randn(7, 5, dtype=torch.float64)
    context = torch.randn(7, context, dtype=torch.float64) if context else None
    calls = []

    def solve(i, params):  # any map from a feature's parameters to the feature
        calls.append(i)
        return z[..., i] * torch.exp(0.3 * params[..., 0]) + torch.tanh(params[..., 1:]).sum(-1)

    fast = made.invert(solve, z, context)
    assert calls == made.order
    slow = Conditioner.invert(made, solve, z, context)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)
    with torch.no_grad():  # sampling (no graph) gives the same numbers
        torch.testing.assert_close(made.invert(solve, z, context), fast, atol=0, rtol=0)
    single = None if context is None else context[0]  # a context broadcast over the batch
    with torch.no_grad():
        in_place = made.invert(solve, z, single)
    torch.testing.assert_close(in_place, made.invert(solve, z, single), atol=0, rtol=0)


class _LinearAutoregressive(Conditioner):
    """A conditioner that is not a MADE: one masked linear map of `(tanh x, context)`, in reverse order."""

    def __init__(self, features, params_per_feature, context=0):
        super().__init__()
        self.in_features, self.out_features, self.context_features = features, features * params_per_feature, context
        self.order = list(reversed(range(features)))
        rank = torch.arange(features, 0, -1)  # feature i has rank D - i
        sees = rank.repeat_interleave(params_per_feature)[:, None] > rank[None, :]
        self.linear = MaskedLinear(torch.cat([sees, torch.ones(len(sees), context, dtype=torch.bool)], dim=1))

    def forward(self, x, context=None):
        return self.linear(broadcast_context(torch.tanh(x), context))

    def zero_last(self, bias=None):
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.copy_(bias)


@pytest.mark.parametrize("transformer", [Affine(), RationalQuadraticSpline(4, 2.0)], ids=["affine", "spline"])
def test_a_custom_autoregressive_conditioner_plugs_in_with_the_generic_inverse(transformer):
    conditioner = _LinearAutoregressive(4, transformer.params_per_element, context=2)
    layer = MaskedAutoregressive(transformer, 4, context=2, conditioner=conditioner)
    x, context = torch.randn(6, 4), torch.randn(6, 2)
    torch.testing.assert_close(layer(x, context)[0], x, atol=1e-5, rtol=0)  # starts as the identity
    report = check_bijector(randomize(layer, 0.3), 1.5 * x, context)
    assert report.passed, str(report)


def test_an_explicit_made_and_the_factories():
    layer = MaskedAffineAutoregressive(3, conditioner=MADE(3, 2, hidden=(8,), order=[1, 2, 0]))
    assert type(layer) is MaskedAutoregressive and layer.conditioner.order == [1, 2, 0]
    assert layer._get_name() == "MaskedAffineAutoregressive"
    spline = MaskedSplineAutoregressive(3, 5, 2.0, (8,), 0, True, "tanh", [2, 1, 0])  # the old positional order
    assert type(spline) is MaskedAutoregressive and spline._get_name() == "MaskedSplineAutoregressive"
    assert spline.transformer.bins == 5 and spline.conditioner.residual_blocks is not None
    assert spline.conditioner.order == [2, 1, 0]
    z = torch.randn(5, 3)
    torch.testing.assert_close(layer(layer.inverse(z)[0])[0], z, atol=1e-5, rtol=0)


def test_inverse_broadcasts_the_context():
    layer = randomize(MaskedAffineAutoregressive(3, hidden=(8,), context=2)).double()
    z = torch.randn(5, 3, dtype=torch.float64)
    c = torch.randn(2, 2, dtype=torch.float64)
    x, ladj = layer.inverse(z[:, None], c[None])  # batch (5, 1) x (1, 2) -> (5, 2)
    assert x.shape == (5, 2, 3) and ladj.shape == (5, 2)
    x0, ladj0 = layer.inverse(z, c[0].expand(5, 2))
    torch.testing.assert_close(x[:, 0], x0)
    torch.testing.assert_close(ladj[:, 0], ladj0)


def test_conditioners_that_are_not_autoregressive_or_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="must be autoregressive"):
        MaskedAutoregressive(Affine(), 3, conditioner=MLP(3, 6))
    with pytest.raises(ValueError, match="out_features=9, the layer needs 6"):
        MaskedAutoregressive(Affine(), 3, conditioner=MADE(3, 3))
    with pytest.raises(ValueError, match="context_features=0, the layer needs 1"):
        MaskedAutoregressive(Affine(), 3, context=1, conditioner=MADE(3, 2))
    with pytest.raises(ValueError, match="order"):
        MaskedAutoregressive(Affine(), 3, order=[0, 1, 2], conditioner=MADE(3, 2, order=[2, 1, 0]))
    with pytest.raises(ValueError, match="not an autoregressive conditioner"):
        Conditioner.invert(MLP(3, 6), lambda i, p: p[..., 0], torch.zeros(2, 3))


def test_masked_out_weights_get_zero_gradient_even_when_the_dense_gradient_overflows():
    # float32, an input of 1e30 and an upstream gradient of 1e10: the dense weight gradient is inf;
    # a product with the mask turned the masked-out entries into inf * 0 = nan (NSF at inputs of 1e30).
    from flowkit.nn import MaskedLinear

    layer = MaskedLinear(torch.tensor([[True, False]]))
    x = torch.tensor([[1e30, 1e30]])
    (layer(x) * 1e10).sum().backward()
    assert layer.weight.grad[0, 1] == 0
    assert torch.isinf(layer.weight.grad[0, 0])  # the genuine overflow stays visible


def test_made_inverse_without_its_context_is_refused():
    made = MADE(3, 2, hidden=(8,), context=2)
    with pytest.raises(ValueError, match="context of 2 features"):
        made.invert(lambda i, params: params[..., 0], torch.zeros(4, 3))
