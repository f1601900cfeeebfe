import math

import pytest
import torch

import flowkit
from flowkit.bijectors import AffineCoupling, Chain, LULinear
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.flows import Flow, RealNVP
from flowkit.testing import check_flow, randomize


def _flow(features=2, **kw):
    flow = RealNVP(features, transforms=4, hidden=(16, 16), **kw)
    return randomize(flow, scale=0.2)


def test_density_integrates_to_one_by_quadrature():
    report = check_flow(_flow(), mass_tol=1e-2)
    assert report.passed, str(report)
    mass = [d for c, _, d in report.results if c == "density integrates to 1"]
    assert mass, "the quadrature check did not run"


def test_one_dimensional_flow_integrates_to_one():
    flow = Flow(Chain(randomize(LULinear(1))), DiagNormal(1, loc=0.5, scale=2.0))
    assert check_flow(flow).passed


@pytest.mark.slow
def test_quadrature_by_hand_in_2d():
    # Independent of flowkit.testing: a plain uniform grid on a mildly perturbed flow.
    flow = randomize(RealNVP(2, transforms=4, hidden=(16, 16)), scale=0.1).double()
    g = torch.linspace(-20, 20, 1201, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    with torch.no_grad():
        mass = flow.log_prob(grid).exp().sum() * (g[1] - g[0]) ** 2
    assert abs(mass.item() - 1) < 1e-2


def test_log_prob_matches_base_plus_ladj():
    flow = _flow(3)
    x = torch.randn(7, 3)
    z, ladj = flow.bijector(x)
    torch.testing.assert_close(flow.log_prob(x), flow.base.log_prob(z) + ladj)


def test_sample_shapes_and_rsample_gradients():
    flow = _flow(3)
    assert flow.sample((4, 5)).shape == (4, 5, 3)
    assert flow.sample(6).shape == (6, 3)
    x, log_q = flow.rsample_and_log_prob((8,))
    (x.sum() + log_q.sum()).backward()
    assert all(p.grad is not None for p in flow.parameters())
    torch.testing.assert_close(flow.log_prob(x.detach()), log_q.detach(), atol=1e-4, rtol=1e-4)


def test_conditional_flow_sampling_and_log_prob():
    flow = _flow(2, context=3)
    c = torch.randn(5, 3)
    x = flow.sample((), c)
    assert x.shape == (5, 2)
    assert flow.sample((4,), c).shape == (4, 5, 2)
    assert flow.log_prob(x, c).shape == (5,)
    single = flow.sample((10,), c[0])
    assert single.shape == (10, 2)
    # context changes the density
    assert not torch.allclose(flow.log_prob(x, c), flow.log_prob(x, torch.randn(5, 3)))


def test_torch_distribution_adapter():
    flow = _flow(2)
    dist = flow.to_distribution()
    assert isinstance(dist, torch.distributions.Distribution)
    x = dist.sample((4,))
    assert x.shape == (4, 2)
    torch.testing.assert_close(dist.log_prob(x), flow.log_prob(x))
    assert dist.rsample((3,)).requires_grad


def test_float64_and_to():
    flow = _flow(2).double()
    x = flow.sample(3)
    assert x.dtype == torch.float64
    assert flow.log_prob(x).dtype == torch.float64


def test_standard_and_diag_normal_log_prob_match_torch():
    x = torch.randn(5, 3)
    ref = torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(-1)
    torch.testing.assert_close(StandardNormal(3).log_prob(x), ref)
    d = DiagNormal(3, loc=1.0, scale=2.0)
    ref = torch.distributions.Normal(1.0, 2.0).log_prob(x).sum(-1)
    torch.testing.assert_close(d.log_prob(x), ref)
    assert d.rsample((2,)).requires_grad


def test_flow_on_lattice_events_with_reshape():
    from flowkit.bijectors import Reshape

    bij = Chain(Reshape((3, 3), (9,)), randomize(AffineCoupling(9, hidden=(8,))), Reshape((9,), (3, 3)))
    flow = Flow(bij, StandardNormal((3, 3)))
    x = flow.sample(4)
    assert x.shape == (4, 3, 3)
    assert flow.log_prob(x).shape == (4,)


def test_gaussian_flow_log_prob_is_exact():
    # A single LU-linear layer over N(0, I) is N(W^{-1}(-b), (W^T W)^{-1}): compare with torch.
    layer = randomize(LULinear(3)).double()
    flow = Flow(layer, StandardNormal(3)).double()
    w, b = layer.weight.detach(), layer.bias.detach()
    cov = torch.linalg.inv(w.T @ w)
    mean = -torch.linalg.solve(w, b)
    ref = torch.distributions.MultivariateNormal(mean, cov)
    x = torch.randn(6, 3, dtype=torch.float64)
    torch.testing.assert_close(flow.log_prob(x), ref.log_prob(x))
    assert math.isclose(flow.base.log_prob(torch.zeros(3, dtype=torch.float64)).item(), -1.5 * math.log(2 * math.pi))


def test_base_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="event shape"):
        Flow(LULinear(3), StandardNormal(2))


def test_flowkit_namespace():
    assert flowkit.Flow is Flow


def test_a_chain_gives_the_context_only_to_its_conditional_layers():
    from flowkit.bijectors import AffineCoupling, Chain, CircularSplineCoupling, LULinear
    from flowkit.testing import check_bijector, randomize
    from flowkit.train.score_rules import forward_with_score, generic_forward_with_score

    torch.manual_seed(0)
    chain = Chain(
        randomize(AffineCoupling(3, hidden=(8,), context=2)), LULinear(3), randomize(AffineCoupling(3, hidden=(8,)))
    )
    x, context = torch.randn(5, 3), torch.randn(5, 2)
    z, ladj = chain(x, context)  # the unconditional coupling used to receive the context and fail
    torch.testing.assert_close(chain.inverse(z, context)[0], x, atol=1e-5, rtol=1e-5)
    check_bijector(chain, x.double(), context.double())
    score = torch.randn(5, 3)
    torch.testing.assert_close(
        forward_with_score(chain, x, score, context)[2], generic_forward_with_score(chain, x, score, context)[2]
    )
    circle = Chain(CircularSplineCoupling(3, hidden=(6,), context=2), CircularSplineCoupling(3, parity=1, hidden=(6,)))
    assert circle(torch.rand(4, 3), torch.randn(4, 2))[0].shape == (4, 3)


def test_every_model_implements_the_flow_contract():
    import flowkit.flows.images as images
    from flowkit.flows import FlowModel, MetropolisBlock, StochasticFlow, require_exact_weights

    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(4,))
    target = flowkit.targets.DoubleWell()
    stochastic = StochasticFlow([flowkit.bijectors.AffineCoupling(2, hidden=(4,)), MetropolisBlock(target, lam=0.5)],
                                flowkit.distributions.StandardNormal(2))  # fmt: skip
    glow = flowkit.flows.Glow((1, 4, 4), levels=1, steps=1, hidden=(4,))
    dequantized = images.Dequantized(glow, levels=4)
    x = torch.randn(3, 2)
    for model, exact, matched in ((flow, True, True), (stochastic, False, True), (dequantized, False, False)):
        assert isinstance(model, FlowModel) and model.exact_log_prob is exact
        assert model.samples_match_density is matched
        assert model.context_features == 0
        assert model.sample((2,)).shape == (2, *model.event_shape)
        assert model.auxiliary_loss() is None or torch.isfinite(model.auxiliary_loss())
    assert torch.equal(flow.path_log_likelihood(x), flow.log_prob(x))
    with pytest.raises(ValueError, match="path_log_likelihood"):
        stochastic.log_prob(x)
    with pytest.raises(TypeError, match="abstract"):
        FlowModel()
    # one question for every importance-weighting path: samples from the density (and, for AIS, an exact one)
    require_exact_weights(flow, "here", density=True)
    require_exact_weights(stochastic, "here")  # path weights
    with pytest.raises(ValueError, match="here: needs a flow with an exact density.*StochasticFlow.log_prob"):
        require_exact_weights(stochastic, "here", density=True)
    with pytest.raises(ValueError, match="here: Dequantized's samples do not come from the density.*lower bound"):
        require_exact_weights(dequantized, "here")
    with pytest.raises(ValueError, match="here: object's samples .*does not declare samples_match_density"):
        require_exact_weights(object(), "here")
