"""zuko and nflows transforms as flowkit bijectors, flowkit flows as zuko lazy distributions: against both libraries."""

import pytest
import torch
import zuko
from nflows.flows import MaskedAutoregressiveFlow
from nflows.transforms import (
    CompositeTransform,
    MaskedPiecewiseRationalQuadraticAutoregressiveTransform,
    ReversePermutation,
)

import flowkit
from flowkit.bijectors import Chain, LULinear
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow
from flowkit.interop import NflowsBijector, ZukoBijector, ZukoStyleFlow, to_zuko
from flowkit.testing import check_bijector, randomize
from flowkit.train import BoltzmannGenerator, MaximumLikelihood, PathGradientVI, ScoreMatching, fit


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _zuko_maf(context=0):
    return zuko.flows.MAF(3, context, transforms=2, hidden_features=(16,))


def _nflows_nsf():
    spline = MaskedPiecewiseRationalQuadraticAutoregressiveTransform(
        3, 8, num_bins=4, tails="linear", context_features=2
    )
    return CompositeTransform([spline, ReversePermutation(3)])


def test_a_zuko_lazy_flow_has_zukos_density_and_samples_on_identical_inputs():
    maf = _zuko_maf(context=2).double()  # float64: the two sums of the same terms agree to rounding
    randomize(maf, scale=0.5)
    flow = Flow(ZukoBijector(maf.transform, (3,), context_features=2), StandardNormal((3,))).double()
    x, c = torch.randn(64, 3, dtype=torch.float64), torch.randn(64, 2, dtype=torch.float64)
    torch.testing.assert_close(flow.log_prob(x, c), maf(c).log_prob(x), rtol=1e-12, atol=1e-12)
    z = torch.randn(64, 3, dtype=torch.float64)
    x_flowkit, ladj = flow.bijector.inverse(z, c)
    transform = maf(c).transform
    torch.testing.assert_close(x_flowkit, transform.inv(z))
    torch.testing.assert_close(ladj, transform.inv.log_abs_det_jacobian(z, x_flowkit))


def test_an_nflows_transform_has_nflows_density_on_identical_inputs():
    nf = MaskedAutoregressiveFlow(features=3, hidden_features=8, num_layers=2, num_blocks_per_layer=1).double()
    randomize(nf, scale=0.5)
    flow = Flow(NflowsBijector(nf._transform, (3,)), StandardNormal((3,))).double()
    x = torch.randn(64, 3, dtype=torch.float64)
    torch.testing.assert_close(flow.log_prob(x), nf.log_prob(x), rtol=1e-12, atol=1e-12)
    x = x.float()
    conditional = _nflows_nsf()
    bijector = NflowsBijector(conditional, (3,), context_features=2)
    c = torch.randn(64, 2)
    z, ladj = bijector(x, c)
    z_nflows, ladj_nflows = conditional(x, context=c)
    torch.testing.assert_close(z, z_nflows)
    torch.testing.assert_close(ladj, ladj_nflows)
    # Batch shapes other than (N,) are flattened for nflows and restored.
    z2, ladj2 = bijector(x.reshape(8, 8, 3), c.reshape(8, 8, 2))
    torch.testing.assert_close(z2, z.reshape(8, 8, 3))
    torch.testing.assert_close(ladj2, ladj.reshape(8, 8))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: ZukoBijector(_zuko_maf(2).transform, (3,), context_features=2), id="zuko-lazy-maf"),
        pytest.param(
            lambda: ZukoBijector(zuko.flows.NSF(3, transforms=1, hidden_features=(8,)).transform, 3), id="zuko-lazy-nsf"
        ),  # fmt: skip
        pytest.param(lambda: ZukoBijector(zuko.transforms.SoftclipTransform(3.0), (3,)), id="zuko-elementwise"),
        pytest.param(lambda: NflowsBijector(_nflows_nsf(), (3,), context_features=2), id="nflows-nsf"),
    ],
)
def test_wrapped_transforms_pass_check_bijector(make):
    bijector = make()
    randomize(bijector, scale=0.3)
    report = check_bijector(bijector, raise_on_failure=False)
    assert report.passed, str(report)


def test_a_wrong_log_determinant_is_caught_by_check_bijector():
    class Wrong(zuko.transforms.SoftclipTransform):
        def call_and_ladj(self, x):
            y, ladj = super().call_and_ladj(x)
            return y, 2 * ladj

    report = check_bijector(ZukoBijector(Wrong(3.0), (3,)), raise_on_failure=False)
    assert not report.passed and any("autograd Jacobian" in f for f in report.failures)


def _target():
    return flowkit.targets.DoubleWell()


@pytest.mark.parametrize(
    ("objective", "needs_data"),
    [
        (MaximumLikelihood(), True),
        (ScoreMatching(), True),
        (BoltzmannGenerator(_target(), w_ml=0.0), False),
        (PathGradientVI(_target()), False),
    ],  # fmt: skip
    ids=["ml", "ssm", "reverse-kl", "path-gradient"],
)
def test_wrapped_transforms_train_in_a_chain_with_every_kind_of_objective(objective, needs_data):
    zuko_maf = zuko.flows.MAF(2, transforms=1, hidden_features=(8,))
    nflows_layer = MaskedAutoregressiveFlow(features=2, hidden_features=8, num_layers=1, num_blocks_per_layer=1)
    chain = Chain(ZukoBijector(zuko_maf.transform, (2,)), LULinear(2), NflowsBijector(nflows_layer._transform, (2,)))
    flow = Flow(chain, StandardNormal((2,)))
    before = {name: p.detach().clone() for name, p in flow.named_parameters()}
    data = torch.randn(64, 2) if needs_data else None
    history = fit(flow, objective, data, steps=3, batch_size=32, progress=False, seed=0)
    assert history.steps_run == 3 and not history.skipped
    moved = {name for name, p in flow.named_parameters() if not torch.equal(p, before[name])}
    assert any(n.startswith("bijector.layers.0.transform") for n in moved)  # zuko's weights train
    assert any(n.startswith("bijector.layers.2.transform") for n in moved)  # nflows' weights train


def test_a_flowkit_flow_as_a_zuko_lazy_distribution_behaves_like_a_zuko_flow():
    flow = flowkit.flows.NSF(3, context=2, transforms=2, hidden=(16,))
    randomize(flow, scale=0.3)
    lazy = to_zuko(flow)
    assert isinstance(lazy, ZukoStyleFlow) and set(lazy.parameters()) == set(flow.parameters())
    c = torch.randn(5, 2)
    distribution = lazy(c)
    assert distribution.batch_shape == (5,) and distribution.event_shape == (3,)
    x = distribution.sample((4,))
    assert x.shape == (4, 5, 3)
    expected = flow.log_prob(x, c.expand(4, 5, 2))
    torch.testing.assert_close(distribution.log_prob(x), expected)  # the context broadcast to the samples
    x, log_p = distribution.rsample_and_log_prob((4,))
    torch.testing.assert_close(log_p, flow.log_prob(x, c.expand(4, 5, 2)), rtol=1e-4, atol=1e-4)
    # A zuko flow and the exported flowkit flow of its transform: the same density through zuko's interface.
    maf = _zuko_maf(context=2)
    exported = to_zuko(Flow(ZukoBijector(maf.transform, (3,), context_features=2), StandardNormal((3,))))
    y = torch.randn(10, 3)
    torch.testing.assert_close(exported(c[:1]).log_prob(y), maf(c[:1]).log_prob(y), rtol=1e-6, atol=1e-5)
    # Trained as zuko flows are: the loss is -lazy(c).log_prob(x).mean().
    loss = -lazy(c).log_prob(torch.randn(5, 3)).mean()
    loss.backward()
    assert all(p.grad is not None for p in flow.parameters() if p.requires_grad)


def test_bad_arguments_are_value_errors_and_wrapped_flows_are_not_saved(tmp_path):
    with pytest.raises(ValueError, match="must be a zuko"):
        ZukoBijector(object(), (3,))
    with pytest.raises(ValueError, match="a fixed transform takes no context"):
        ZukoBijector(zuko.transforms.SoftclipTransform(), (3,), context_features=2)
    with pytest.raises(ValueError, match="event_shape must be a positive integer"):
        ZukoBijector(zuko.transforms.SoftclipTransform(), (0,))
    with pytest.raises(ValueError, match="must be an nflows Transform"):
        NflowsBijector(torch.nn.Linear(3, 3), (3,))
    with pytest.raises(ValueError, match="must be a flowkit Flow"):
        to_zuko(zuko.flows.MAF(3))
    flow = Flow(ZukoBijector(_zuko_maf().transform, (3,)), StandardNormal((3,)))
    with pytest.raises(TypeError, match="ZukoBijector is not a model class"):
        flowkit.io.save(flow, tmp_path / "model")
