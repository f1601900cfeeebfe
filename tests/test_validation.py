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


# Constructor numbers (flowkit._validation.check_number): each bad value is a ValueError naming the argument.
def _constructors():
    from flowkit.bijectors import (
        ActNorm,
        Coupling,
        Linear,
        Logit,
        MaskedAutoregressive,
        Permutation,
        Reshape,
        SmoothLeakyReLU,
        SmoothTanh,
    )
    from flowkit.distributions import DiagNormal, StandardNormal
    from flowkit.flows import MAF, NSF, LangevinBlock
    from flowkit.targets import DoubleWell, GaussianMixture, ManyWell, Phi4
    from flowkit.transformers import Affine, RationalQuadraticSpline

    nan, inf = float("nan"), float("inf")
    return [
        (lambda: AffineCoupling(2, clamp=0), "clamp"),
        (lambda: AffineCoupling(2, clamp=inf), "clamp"),
        (lambda: Affine(clamp=nan), "clamp"),
        (lambda: NSF(2, bound=inf), "bound"),
        (lambda: NSF(2, bound=1e300), "bound"),
        (lambda: NSF(2, bins=2.5), "bins"),
        (lambda: RationalQuadraticSpline(4, bound=-1.0), "bound"),
        (lambda: SmoothTanh(2, scale=inf), "scale"),
        (lambda: SmoothTanh(2, leak=nan), "leak"),
        (lambda: SmoothLeakyReLU(2, alpha=nan), "alpha"),
        (lambda: Logit(2, alpha=nan), "alpha"),
        (lambda: ActNorm([]), "event_shape"),
        (lambda: Linear(0), "features"),
        (lambda: LULinear(2.5), "features"),
        (lambda: Permutation(-1), "features"),
        (lambda: Coupling(flowkit.transformers.Affine(), 4, context=-1), "context"),
        (lambda: MaskedAutoregressive(flowkit.transformers.Affine(), 0), "features"),
        (lambda: Reshape((2, 2), (4.0,)), "shape"),
        (lambda: DiagNormal(2, scale=inf), "scale"),
        (lambda: DiagNormal(2, loc=nan), "loc"),
        (lambda: StandardNormal(2.5), "shape"),
        (lambda: RealNVP(3, transforms=0), "transforms"),
        (lambda: RealNVP(3, transforms=2.5), "transforms"),
        (lambda: RealNVP(3, hidden=(8, 0)), "hidden"),
        (lambda: MAF(3, hidden=(nan,)), "hidden"),
        (lambda: MAF(3, context=-2), "context"),
        (lambda: DoubleWell(c=nan), "quartic coefficient c"),
        (lambda: DoubleWell(a=inf), "a"),
        (lambda: ManyWell(dim=3), "dim"),
        (lambda: ManyWell(dim=4, b=nan), "b"),
        (lambda: GaussianMixture(scale=nan), "scale"),
        (lambda: GaussianMixture(n_modes=2.5), "n_modes"),
        (lambda: GaussianMixture(loc_scaling=inf), "loc_scaling"),
        (lambda: Phi4(m2=nan), "m2"),
        (lambda: Phi4(lam=inf), "lam"),
        (lambda: Phi4(L=4.5), "L"),
        (lambda: LangevinBlock(DoubleWell(), lam=nan), "lam"),
        (lambda: LangevinBlock(DoubleWell(), lam=0.5, step_size=inf), "step_size"),
        (lambda: LangevinBlock(DoubleWell(), lam=0.5, n_steps=2.0), "n_steps"),
    ]


@pytest.mark.parametrize("index", range(len(_constructors())))
def test_constructors_refuse_bad_numbers(index):
    build, name = _constructors()[index]
    with pytest.raises(ValueError, match=name):
        build()


def test_check_number_refuses_booleans_and_non_numbers_and_returns_python_numbers():
    from flowkit._validation import check_number

    for bad in (True, "1", None, [1.0], float("nan"), float("inf")):
        with pytest.raises(ValueError, match="W: x must be"):
            check_number(bad, "x", where="W")
    assert check_number(torch.tensor(0.5), "x", where="W", low=0, below=1) == 0.5
    value = check_number(torch.tensor(3), "n", where="W", integer=True, low=1)
    assert value == 3 and type(value) is int
    with pytest.raises(ValueError, match=r"x must be a number in \[0, 0.5\), got 0.5"):
        check_number(0.5, "x", where="W", low=0, below=0.5)


# ActNorm's data-dependent initialisation.
def test_actnorm_refuses_an_empty_first_batch():
    from flowkit.bijectors import ActNorm

    layer = ActNorm(3)
    with pytest.raises(ValueError, match="empty batch"):
        layer(torch.zeros(0, 3))
    z, ladj = layer(torch.randn(8, 3))  # still uninitialised, so the next batch initialises it
    assert torch.isfinite(z).all() and torch.isfinite(ladj).all()


def test_actnorm_warns_on_a_constant_feature_and_keeps_its_scale():
    from flowkit.bijectors import ActNorm

    layer = ActNorm(3)
    x = torch.randn(16, 3)
    x[:, 1] = 2.5
    with pytest.warns(RuntimeWarning, match=r"feature\(s\) \[1\] are constant"):
        z, ladj = layer(x)
    assert float(layer.log_scale[1]) == 0.0 and torch.isfinite(ladj).all()
    torch.testing.assert_close(z[:, 1], torch.zeros(16))
    images = ActNorm((2, 3, 3))
    y = torch.randn(4, 2, 3, 3)
    y[:, 0] = -1.0
    with pytest.warns(RuntimeWarning, match=r"\[0\]"):
        images(y)
    assert float(images.log_scale[0]) == 0.0


# Bounded domains: the entry point checks that x lies in the (closed) domain.
def test_logit_refuses_inputs_outside_the_unit_interval():
    from flowkit.bijectors import Logit

    layer = Logit(2)
    for bad in (1.5, -0.2):
        with pytest.raises(ValueError, match=r"Logit.forward: x has 1 value\(s\) outside Interval\(-0.0555"):
            layer(torch.tensor([[0.5, bad]]))
    z, ladj = layer(torch.tensor([[0.0, 1.0]]))  # the end points of the data are fine
    assert torch.isfinite(z).all() and torch.isfinite(ladj).all()
    flow = flowkit.Flow(Logit(2), flowkit.distributions.StandardNormal(2))
    with pytest.raises(ValueError, match="outside"):
        flow.log_prob(torch.tensor([[0.5, 2.0]]))
    flowkit.set_validation(False)
    try:
        assert torch.isnan(layer(torch.tensor([[0.5, 1.5]]))[0]).any()
    finally:
        flowkit.set_validation(True)


def test_circle_inputs_at_plus_and_minus_pi_are_admitted():
    import math

    from flowkit.bijectors import CircularSplineCoupling

    layer = CircularSplineCoupling(2, hidden=(4,))
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([[math.pi, -math.pi], [0.0, math.pi]], dtype=dtype)
        z, ladj = layer.to(dtype)(x)
        assert torch.isfinite(z).all() and torch.isfinite(ladj).all()
    with pytest.raises(ValueError, match="outside Circle"):
        layer(torch.tensor([[0.0, 3.2]], dtype=torch.float64))


# Base distributions check their input at the outermost call.
@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(5, 3), r"StandardNormal.log_prob: x has shape \(5, 3\) but the event shape is \(2\)"),
        (torch.ones(5, 2, dtype=torch.long), "floating dtype"),
        (torch.tensor([[0.0, float("nan")]]), "non-finite"),
        (torch.randn(5, 2, dtype=torch.float64), "dtype torch.float64"),
    ],
)
def test_base_distributions_check_log_prob_inputs(x, match):
    from flowkit.distributions import DiagNormal, StandardNormal

    with pytest.raises(ValueError, match=match):
        StandardNormal(2).log_prob(x)
    with pytest.raises(ValueError, match=match.replace("StandardNormal", "DiagNormal")):
        DiagNormal(2).log_prob(x)


@pytest.mark.parametrize("shape", [2.5, (2, 1.5), True, "3"])
def test_a_non_integer_sample_shape_is_a_value_error(shape):
    from flowkit.distributions import StandardNormal

    with pytest.raises(ValueError, match="sequence of integers"):
        StandardNormal(2).sample(shape)
    with pytest.raises(ValueError, match="sequence of integers"):
        RealNVP(2, transforms=1, hidden=(4,)).sample(shape)
