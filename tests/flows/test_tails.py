"""TailAdaptive (mTAF fix, mTAF, gTAF) and COMET: structure, tails of samples, estimation, training, save/load."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

import flowkit
from flowkit import stats as tails
from flowkit._validation import module_dtype
from flowkit.bijectors import Standardization
from flowkit.flows import COMET, DATA_PRESETS, TailAdaptive, build_data_flow
from flowkit.testing import check_flow, randomize
from flowkit.train import MaximumLikelihood, fit


def _heavy_data(n=5000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, 3, generator=gen)
    chi2 = torch.distributions.Chi2(torch.tensor(2.0)).sample((n,))
    normal[:, 1] = normal[:, 1] / (chi2 / 2).sqrt()  # t2 in the middle feature
    return normal


def test_light_data_features_never_depend_on_heavy_latents():
    flow = randomize(TailAdaptive(5, df=[2.0, None, 3.0, None, None], transforms=3, hidden=(16,)), scale=0.5)
    flow = flow.double()
    z = torch.randn(5, dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(lambda v: flow.bijector.inverse(v[None])[0][0], z)
    # latents are sorted light first: latents 0-2 are features 1, 3, 4; latents 3-4 are features 0 and 2
    assert torch.count_nonzero(jacobian[[1, 3, 4]][:, 3:]) == 0
    assert torch.count_nonzero(jacobian[[0, 2]][:, 3:]) > 0
    fresh = TailAdaptive(5, df=[2.0, None, 3.0, None, None], transforms=1, hidden=(8,))
    torch.testing.assert_close(fresh.df, torch.tensor([2.0, float("inf"), 3.0, float("inf"), float("inf")]))


@pytest.mark.parametrize(
    ("variant", "trained", "heavy"),
    [("mtaf-fix", False, [False, True]), ("mtaf", True, [False, True]), ("gtaf", True, [True, True])],
)
def test_variants_fix_or_train_the_degrees_of_freedom(variant, trained, heavy):
    flow = TailAdaptive(2, df=None if variant == "gtaf" else [None, 2.5], variant=variant, transforms=1, hidden=(8,))
    assert isinstance(flow.base.df_raw, torch.nn.Parameter) is trained
    assert flow.base.heavy.tolist() == heavy


def test_samples_of_an_untrained_flow_have_the_base_tails():
    torch.manual_seed(0)
    flow = TailAdaptive(2, df=[None, 2.0], transforms=2, hidden=(8,))  # layers start at the identity
    x = flow.sample((100_000,))
    light, heavy = tails.estimate_tails(x, bootstraps=30)
    assert not light.heavy and heavy.heavy and abs(heavy.df - 2.0) < 0.5


@pytest.mark.parametrize("variant", ["mtaf", "gtaf", "mtaf-fix"])
def test_parameter_groups_split_layers_and_df_and_adam_moves_df_by_its_own_rate(variant):
    torch.manual_seed(0)
    df = None if variant == "gtaf" else [None, 4.0, 3.0]
    flow = TailAdaptive(3, df=df, variant=variant, transforms=2, hidden=(8,))
    groups = flow.parameter_groups(1e-3, df_lr=0.05)
    ids = [id(p) for group in groups for p in group["params"]]
    assert sorted(ids) == sorted(id(p) for p in flow.parameters()) and len(set(ids)) == len(ids)
    assert len(groups) == (1 if variant == "mtaf-fix" else 2)
    if variant == "mtaf-fix":
        return
    assert groups[1]["params"] == [flow.base.df_raw] and groups[1]["lr"] == 0.05
    before = flow.base.df_raw.detach().clone()
    optimizer = torch.optim.Adam(groups)
    flow.log_prob(torch.distributions.StudentT(2.0).sample((256, 3))).mean().neg().backward()
    optimizer.step()
    moved = (flow.base.df_raw.detach() - before).abs()[flow.base.heavy]
    torch.testing.assert_close(moved, torch.full_like(moved, 0.05), rtol=1e-4, atol=0)  # Adam's first step: lr
    with pytest.raises(ValueError, match="df_lr"):
        flow.parameter_groups(1e-3, df_lr=0.0)


def test_from_data_estimates_the_tails_and_keeps_df_above_the_floor():
    flow = TailAdaptive.from_data(_heavy_data(), transforms=1, hidden=(8,), bootstraps=30)
    df = flow.df
    assert torch.isinf(df[[0, 2]]).all() and 1.4 < float(df[1]) < 2.8
    gtaf = TailAdaptive.from_data(_heavy_data(), "gtaf", transforms=1, hidden=(8,))
    assert torch.isfinite(gtaf.df).all()


def test_from_data_standardises_by_median_and_iqr_and_is_scale_equivariant():
    x = _heavy_data(3000)
    flow = TailAdaptive.from_data(x, transforms=1, hidden=(8,), bootstraps=20)
    first = flow.bijector[0]
    assert isinstance(first, flowkit.bijectors.Standardization)
    lower, median, upper = np.quantile(x.double().numpy(), [0.25, 0.5, 0.75], axis=0)
    np.testing.assert_allclose(first.loc.numpy(), median, rtol=1e-6)
    np.testing.assert_allclose(first.scale.numpy(), (upper - lower) / (2 * stats.norm.ppf(0.75)), rtol=1e-6)
    torch.manual_seed(0)
    flow = TailAdaptive.from_data(x, "mtaf-fix", transforms=1, hidden=(8,), bootstraps=20)
    torch.manual_seed(0)
    scaled = TailAdaptive.from_data(1000 * x, "mtaf-fix", transforms=1, hidden=(8,), bootstraps=20)
    torch.testing.assert_close(scaled.df, flow.df)
    torch.testing.assert_close(scaled.log_prob(1000 * x[:10]), flow.log_prob(x[:10]) - 3 * math.log(1000))
    assert not isinstance(
        TailAdaptive.from_data(x, standardize=False, transforms=1).bijector[0], flowkit.bijectors.Standardization
    )


def test_robust_standardization_matches_numpy_and_the_exact_quartiles():
    torch.manual_seed(1)
    x = torch.cat([torch.randn(100_000, 1), torch.distributions.StudentT(1.5).sample((100_000, 1))], 1)
    x = x.double() * torch.tensor([3.0, 0.5], dtype=torch.float64) + torch.tensor([1.0, -2.0], dtype=torch.float64)
    loc, scale = Standardization.statistics(x, robust=True)
    lower, median, upper = np.quantile(x.numpy(), [0.25, 0.5, 0.75], axis=0)
    np.testing.assert_allclose(loc.numpy(), median, rtol=1e-12)
    np.testing.assert_allclose(scale.numpy(), (upper - lower) / (2 * stats.norm.ppf(0.75)), rtol=1e-12)
    # the exact values: sigma of the Gaussian, and the t1.5 quartile / Phi^-1(3/4) (about 5 sampling SEs)
    np.testing.assert_allclose(loc.numpy(), [1.0, -2.0], atol=0.03)
    np.testing.assert_allclose(scale.numpy(), [3.0, 0.5 * stats.t.ppf(0.75, 1.5) / stats.norm.ppf(0.75)], rtol=0.03)
    # the moments are the wrong scale for t1.5 (no variance): the standard deviation is far larger
    assert Standardization.from_data(x).scale[1] > 2 * Standardization.from_data(x, robust=True).scale[1]
    torch.testing.assert_close(Standardization.statistics(x)[1], x.std(0))


def test_robust_standardization_falls_back_on_ties_and_rejects_bad_data():
    x = torch.zeros(100, 2, dtype=torch.float64)
    x[:10, 0] = torch.arange(1.0, 11.0, dtype=torch.float64)  # 90% zeros: IQR 0
    x[:, 1] = torch.arange(100.0, dtype=torch.float64)
    loc, scale = Standardization.statistics(x, robust=True)
    assert float(loc[0]) == 0.0 and float(scale[0]) == pytest.approx(float(x[:, 0].std()))
    with pytest.warns(RuntimeWarning, match="constant"):
        assert float(Standardization.statistics(torch.ones(5, 1), robust=True)[1][0]) == 1e-6
    for bad in (torch.tensor([[1.0], [float("nan")]]), torch.tensor([[1.0], [float("inf")]])):
        with pytest.raises(ValueError, match="non-finite"):
            Standardization.from_data(bad, robust=True)
    with pytest.raises(ValueError, match="non-finite"):
        TailAdaptive.from_data(torch.tensor([[1.0, 2.0], [float("nan"), 1.0], [0.0, 3.0]]))


@pytest.mark.parametrize("name", [name for name in DATA_PRESETS if name != "mtaf"])  # mtaf = tail-adaptive
def test_data_presets_train_and_save(name, tmp_path):
    torch.manual_seed(0)
    x = _heavy_data(3000)
    flow = build_data_flow(name, x, transforms=2, hidden=(8,), bins=4)
    history = fit(flow, MaximumLikelihood(), x, steps=10, batch_size=256, progress=False, schedule=None)
    assert len(history.loss) == 10 and all(torch.isfinite(torch.tensor(history.loss)))
    loaded = flowkit.io.load(flowkit.io.save(flow, tmp_path / name))
    torch.testing.assert_close(loaded.log_prob(x[:20]), flow.log_prob(x[:20]))
    assert bool(torch.isfinite(flow.sample((50,))).all())


def test_comet_density_integrates_to_one():
    torch.manual_seed(0)
    flow = randomize(COMET(2, transforms=2, hidden=(8,), knots=32), scale=0.2).fit_marginals(_heavy_data()[:, :2])
    report = check_flow(flow.double())
    assert report.passed, str(report)


def test_comet_logit_output_and_marginals():
    x = _heavy_data()
    flow = COMET.from_data(x, transforms=1, hidden=(8,), output="logit")
    assert flow.marginals.output == "logit" and bool(flow.marginals.fitted)
    assert bool(torch.isfinite(flow.log_prob(x[:100])).all())


def test_bad_arguments_are_value_errors():
    for build in (
        lambda: TailAdaptive(3, df=[None, 2.0]),
        lambda: TailAdaptive(2, variant="taf"),
        lambda: TailAdaptive(2, df=[None, 2.0], variant="gtaf"),
        lambda: TailAdaptive(2, df=[None, 0.5]),
        lambda: TailAdaptive.from_data(torch.randn(10)),
        lambda: COMET(0),
        lambda: COMET(1, context=2),
        lambda: COMET.from_data(torch.randn(2000, 1, dtype=torch.complex64)),
        lambda: COMET.from_data(torch.randn(30, 2)),
        lambda: build_data_flow("taf", torch.randn(100, 2)),
    ):
        with pytest.raises(ValueError):
            build()
    with pytest.raises(ValueError, match="not fitted"):
        COMET(2, transforms=1, hidden=(8,)).log_prob(torch.randn(3, 2))


def test_comet_on_one_feature_is_its_fitted_marginal(tmp_path):
    torch.manual_seed(0)
    x = torch.distributions.StudentT(2.0).sample((3000, 1)).double()
    flow = COMET.from_data(x, transforms=2, hidden=(8,), knots=64)
    assert module_dtype(flow) == torch.float64 and len(flow.bijector) == 1
    report = check_flow(flow)
    assert report.passed, str(report)
    # the density is the marginal's: the standard normal at Phi^-1(F(x)) times dF/dx
    z, ladj = flow.marginals.forward(x[:50])
    expected = torch.distributions.Normal(0.0, 1.0).log_prob(z[:, 0]) + ladj
    torch.testing.assert_close(flow.log_prob(x[:50]), expected)
    # the fitted CDF of the flow is the empirical one of its data, to sampling error
    cdf = torch.special.ndtr(flow.marginals.forward(x)[0][:, 0])
    assert stats.kstest(cdf.numpy(), "uniform").pvalue > 1e-3
    loaded = flowkit.io.load(flowkit.io.save(flow, tmp_path / "comet1"))
    torch.testing.assert_close(loaded.log_prob(x[:20]), flow.log_prob(x[:20]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_comet_from_integer_data_builds_in_the_default_dtype(dtype):
    torch.manual_seed(0)
    x = torch.randint(0, 200, (3000, 2)).to(dtype)
    flow = COMET.from_data(x, transforms=1, hidden=(8,), knots=32)
    assert module_dtype(flow) == torch.get_default_dtype()
    reference = COMET.from_data(x.to(torch.get_default_dtype()), transforms=1, hidden=(8,), knots=32)
    torch.testing.assert_close(flow.marginals.state_dict(), reference.marginals.state_dict())
    assert bool(torch.isfinite(flow.log_prob(x[:10].float())).all())


@pytest.mark.parametrize("variant", ["mtaf", "gtaf"])
def test_tail_adaptive_from_data_refuses_a_constant_feature_by_name(variant):
    x = _heavy_data(400)
    x[:, 2] = 1.5
    with pytest.raises(ValueError, match=r"feature\(s\) \[2\] are constant"):
        TailAdaptive.from_data(x, variant, transforms=1, hidden=(8,), bootstraps=10)
    with pytest.raises(ValueError, match=r"\[2\] are constant"):
        TailAdaptive.from_data(x, variant, transforms=1, hidden=(8,), bootstraps=10, standardize=False)


@pytest.mark.parametrize("variant", ["mtaf", "mtaf-fix", "gtaf"])
def test_tail_adaptive_from_data_follows_the_data_dtype(variant):
    x = _heavy_data(400).double() * 3 + 1
    flow = TailAdaptive.from_data(x, variant, transforms=1, hidden=(8,), bootstraps=10)
    assert module_dtype(flow) == torch.float64 and {
        t.dtype for t in flow.state_dict().values() if t.is_floating_point()
    } == {torch.float64}
    lower, median, upper = np.quantile(x.numpy(), [0.25, 0.5, 0.75], axis=0)
    np.testing.assert_allclose(flow.bijector[0].loc.numpy(), median, rtol=1e-15)
    np.testing.assert_allclose(flow.bijector[0].scale.numpy(), (upper - lower) / (2 * stats.norm.ppf(0.75)), rtol=1e-14)
    assert flow.log_prob(x[:5]).dtype == torch.float64
    counts = TailAdaptive.from_data(torch.randint(-1000, 1000, (400, 2)), variant, transforms=1, bootstraps=10)
    assert module_dtype(counts) == torch.get_default_dtype()
