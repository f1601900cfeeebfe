"""Bad input raises ValueError naming the problem, at the flow and at the bijector."""

import pytest
import torch

import flowkit
from flowkit.bijectors import AffineCoupling, LULinear
from flowkit.flows import RealNVP


@pytest.fixture
def flow():
    return RealNVP(3, transforms=2, hidden=(8,))


@pytest.fixture
def cflow():
    return RealNVP(3, transforms=2, hidden=(8,), context=2)


def test_wrong_event_shape(flow):
    with pytest.raises(ValueError, match=r"shape \(5, 4\).*event shape is \(3\)"):
        flow.log_prob(torch.randn(5, 4))


def test_wrong_dtype(flow):
    with pytest.raises(ValueError, match="dtype torch.float64"):
        flow.log_prob(torch.randn(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="floating dtype"):
        flow.log_prob(torch.ones(5, 3, dtype=torch.long))


def test_not_a_tensor(flow):
    with pytest.raises(ValueError, match="torch.Tensor"):
        flow.log_prob([[0.0, 1.0, 2.0]])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite(flow, bad):
    x = torch.randn(5, 3)
    x[2, 1] = bad
    with pytest.raises(ValueError, match="non-finite"):
        flow.log_prob(x)


def test_context_missing(cflow):
    with pytest.raises(ValueError, match="needs a context with 2"):
        cflow.log_prob(torch.randn(5, 3))
    with pytest.raises(ValueError, match="needs a context"):
        cflow.sample(4)


def test_context_wrong_size(cflow):
    with pytest.raises(ValueError, match="context has shape"):
        cflow.log_prob(torch.randn(5, 3), torch.randn(5, 4))


def test_context_wrong_batch(cflow):
    with pytest.raises(ValueError, match="context batch shape"):
        cflow.log_prob(torch.randn(5, 3), torch.randn(4, 2))


def test_context_given_to_unconditional(flow):
    with pytest.raises(ValueError, match="unconditional"):
        flow.log_prob(torch.randn(5, 3), torch.randn(5, 2))


def test_bijector_entry_points_check_too():
    layer = AffineCoupling(3, hidden=(4,))
    with pytest.raises(ValueError, match="AffineCoupling.forward"):
        layer(torch.randn(2, 5))
    with pytest.raises(ValueError, match="AffineCoupling.inverse.*non-finite"):
        layer.inverse(torch.full((2, 3), float("nan")))
    with pytest.raises(ValueError, match="LULinear.forward"):
        LULinear(3)(torch.randn(2, 3, dtype=torch.float64))


def test_validation_can_be_switched_off(flow):
    flowkit.set_validation(False)
    try:
        out = flow.log_prob(torch.full((1, 3), float("nan")))
        assert torch.isnan(out).all()
    finally:
        flowkit.set_validation(True)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="mask"):
        AffineCoupling(3, mask=[1, 1, 1])
    with pytest.raises(ValueError, match="at least 2"):
        AffineCoupling(1)
    with pytest.raises(ValueError, match="activation"):
        AffineCoupling(3, activation="nope")


def test_conditional_chain_passes_context_through_unconditional_layers():
    # call/inverse_call are entry points too: the inner, unconditional layers must not re-check the context.
    from flowkit.bijectors import Chain, Reverse

    chain = Chain(AffineCoupling(3, hidden=(4,), context=2), Reverse(3), LULinear(3))
    x, c = torch.randn(5, 3), torch.randn(5, 2)
    z = chain.call(x, c)
    torch.testing.assert_close(z, chain(x, c)[0])
    torch.testing.assert_close(chain.inverse_call(z, c), x, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="Chain.call.*needs a context"):
        chain.call(x)
    with pytest.raises(ValueError, match="Chain.inverse_call.*shape"):
        chain.inverse_call(torch.randn(5, 4), c)
