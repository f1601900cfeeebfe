"""Coupling layers with any conditioner, and broadcast_context (the conditioner input), checked element by element."""

import pytest
import torch
from torch import nn

import flowkit
from flowkit._config import registry
from flowkit.bijectors import AffineCoupling, CircularSplineCoupling, Coupling, SplineCoupling
from flowkit.bijectors.coupling import broadcast_context
from flowkit.nn import MLP, Conditioner
from flowkit.testing import check_bijector, randomize
from flowkit.transformers import Affine, CircularSpline, RationalQuadraticSpline


def test_without_context_the_input_is_returned_as_is():
    h = torch.randn(4, 3)
    assert broadcast_context(h, None) is h


def test_equal_batch_shapes_concatenate_along_the_last_dimension():
    h, c = torch.randn(4, 3), torch.randn(4, 2)
    out = broadcast_context(h, c)
    assert out.shape == (4, 5)
    for i in range(4):
        assert torch.equal(out[i, :3], h[i]) and torch.equal(out[i, 3:], c[i])


def test_a_context_without_batch_dimensions_is_repeated_for_every_row():
    h, c = torch.randn(5, 3), torch.randn(2)
    out = broadcast_context(h, c)
    assert out.shape == (5, 5)
    for i in range(5):
        assert torch.equal(out[i], torch.tensor([*h[i].tolist(), *c.tolist()]))


def test_an_input_without_batch_dimensions_is_repeated_for_every_context():
    h, c = torch.randn(3), torch.randn(6, 2)
    out = broadcast_context(h, c)
    assert out.shape == (6, 5)
    for i in range(6):
        assert torch.equal(out[i, :3], h) and torch.equal(out[i, 3:], c[i])


def test_batch_dimensions_broadcast_both_ways():
    h, c = torch.randn(3, 1, 2), torch.randn(4, 5)
    out = broadcast_context(h, c)
    assert out.shape == (3, 4, 7)
    for i in range(3):
        for j in range(4):
            assert torch.equal(out[i, j, :2], h[i, 0]) and torch.equal(out[i, j, 2:], c[j])


def test_an_empty_input_gives_the_context_alone():
    # autoregressive layers condition their first output on the context only
    h, c = torch.zeros(5, 0), torch.randn(5, 3)
    assert torch.equal(broadcast_context(h, c), c)
    assert torch.equal(broadcast_context(torch.zeros(0), c), c)


def test_gradients_reach_both_inputs_once_per_copy():
    h = torch.randn(4, 3, requires_grad=True)
    c = torch.randn(2, requires_grad=True)
    weights = torch.randn(4, 5)
    (broadcast_context(h, c) * weights).sum().backward()
    # h appears once; the context is copied to each of the 4 rows, so its gradient sums them
    assert torch.equal(h.grad, weights[:, :3])
    torch.testing.assert_close(c.grad, weights[:, 3:].sum(0))


# Coupling with any conditioner: the contract of flowkit.nn.Conditioner.


class _Quadratic(Conditioner):
    """A conditioner that is not an MLP: one linear map of `(x, x^2, context)`."""

    def __init__(self, in_features, out_features, context=0):
        super().__init__()
        self.in_features, self.out_features, self.context_features = in_features, out_features, context
        self.linear = nn.Linear(2 * in_features + context, out_features)

    def forward(self, x, context=None):
        return self.linear(broadcast_context(torch.cat([x, x**2], dim=-1), context))

    def zero_last(self, bias=None):
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.copy_(torch.zeros(self.out_features) if bias is None else bias)


def test_broadcast_context_lives_in_nn():
    assert broadcast_context is flowkit.nn.broadcast_context


@pytest.mark.parametrize("transformer", [Affine(), RationalQuadraticSpline(5, 2.0)], ids=["affine", "spline"])
def test_a_custom_conditioner_plugs_into_coupling(transformer):
    n_out = 2 * transformer.params_per_element
    layer = Coupling(transformer, 5, mask=[1, 0, 0, 1, 0], context=2, conditioner=_Quadratic(3, n_out, context=2))
    x, context = torch.randn(6, 5), torch.randn(6, 2)
    z, ladj = layer(x, context)  # starts as the identity
    torch.testing.assert_close(z, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(ladj, torch.zeros(6), atol=1e-5, rtol=0)
    report = check_bijector(randomize(layer, 0.2), 1.5 * x, context)
    assert report.passed, str(report)


def test_an_explicit_mlp_conditioner_keeps_the_state_dict_keys_and_saves(tmp_path):
    default = AffineCoupling(4, hidden=(8,), context=1)
    explicit = Coupling(Affine(), 4, context=1, conditioner=MLP(2, 4, hidden=(8,), activation="tanh", context=1))
    assert list(explicit.state_dict()) == list(default.state_dict())
    assert list(explicit.state_dict())[:2] == ["conditioner.0.weight", "conditioner.0.bias"]
    flow = randomize(flowkit.Flow(explicit, flowkit.distributions.StandardNormal(4)))
    loaded = flowkit.io.load(flowkit.io.save(flow, tmp_path / "m"))
    assert isinstance(loaded.bijector.conditioner, MLP) and isinstance(loaded.bijector.conditioner[1], nn.Tanh)
    x, c = torch.randn(5, 4), torch.randn(5, 1)
    assert torch.equal(loaded.log_prob(x, c), flow.log_prob(x, c))


def test_a_custom_conditioner_saves_when_registered(tmp_path, monkeypatch):
    monkeypatch.setitem(registry, "_Quadratic", _Quadratic)
    flow = randomize(
        flowkit.Flow(Coupling(Affine(), 3, conditioner=_Quadratic(1, 4)), flowkit.distributions.DiagNormal(3))
    )
    loaded = flowkit.io.load(flowkit.io.save(flow, tmp_path / "m"))
    assert type(loaded.bijector.conditioner) is _Quadratic
    x = torch.randn(5, 3)
    assert torch.equal(loaded.log_prob(x), flow.log_prob(x))


def test_conditioners_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="out_features=6, the layer needs 4"):
        Coupling(Affine(), 4, conditioner=MLP(2, 6))
    with pytest.raises(ValueError, match="in_features=3, the layer needs 2"):
        Coupling(Affine(), 4, conditioner=MLP(3, 4))
    with pytest.raises(ValueError, match="context_features=0, the layer needs 2"):
        Coupling(Affine(), 4, context=2, conditioner=MLP(2, 4))
    with pytest.raises(ValueError, match="zero_last"):
        Coupling(Affine(), 4, conditioner=nn.Linear(2, 4))
    with pytest.raises(ValueError, match="hidden sizes"):
        MLP(2, 4, hidden=(8, 0))


def test_the_periodic_mlp_is_periodic_and_circular_couplings_use_it():
    net = randomize(MLP(3, 5, hidden=(8,), context=2, periodic=True)).double()
    x, c = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    shift = torch.tensor([2 * torch.pi, -4 * torch.pi, 0.0], dtype=torch.float64)
    torch.testing.assert_close(net(x + shift, c), net(x, c), atol=1e-12, rtol=0)
    assert net[0].in_features == 2 * 3 + 2
    layer = CircularSplineCoupling(4, bins=4, hidden=(8,), context=2)
    assert isinstance(layer.transformer, CircularSpline) and layer.conditioner.periodic
    assert layer.conditioner.in_features == 2 and layer.conditioner.context_features == 2


def test_the_factories_build_couplings_with_their_names():
    layers = {
        "AffineCoupling": AffineCoupling(4, None, 1, (8,), 0, "relu", 3.0),  # the old positional order
        "SplineCoupling": SplineCoupling(4, 6, 2.0, None, 1, (8,)),
        "CircularSplineCoupling": CircularSplineCoupling(4, 6, None, 1, (8,)),
    }
    for name, layer in layers.items():
        assert type(layer) is Coupling and layer._get_name() == name and repr(layer).startswith(name)
    assert layers["AffineCoupling"].transformer.clamp == 3.0 and layers["SplineCoupling"].transformer.bins == 6
    custom = AffineCoupling(4, conditioner=MLP(2, 4, hidden=(3,)))
    assert custom.conditioner[0].out_features == 3
