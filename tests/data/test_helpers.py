"""The data helpers on their own: split_array, standardize, dequantize, log_prob_batched and evaluate_nll."""

import math

import numpy as np
import pytest
import torch

import flowkit
from flowkit.bijectors import ActNorm, Chain, Permutation, Standardization
from flowkit.data.digits import dequantize
from flowkit.data.evaluation import NLL, evaluate_nll, log_prob_batched
from flowkit.data.splits import split_array
from flowkit.data.standardize import standardize
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.flows import Flow, InjectiveFlow, RealNVP
from flowkit.nn import MLP
from flowkit.testing import randomize

LOG_2PI = math.log(2 * math.pi)


def _rows(n, d=3):
    """An (n, d) array whose first column numbers the rows, so that each row can be traced."""
    rng = np.random.default_rng(1)
    return np.column_stack([np.arange(n, dtype=np.float64), rng.normal(size=(n, d - 1))])


def _gaussian_log_prob(x, loc, scale):
    """Closed-form log density of independent normals, summed over the last axis (numpy, float64)."""
    x, loc, scale = (np.asarray(a, dtype=np.float64) for a in (x, loc, scale))
    return (-0.5 * ((x - loc) / scale) ** 2 - np.log(scale) - 0.5 * LOG_2PI).sum(-1)


# split_array


def test_split_array_partitions_the_rows_with_the_requested_sizes():
    data = _rows(30)
    s = split_array(data, "rows", val=0.2, test=0.1, seed=3)
    assert s.name == "rows" and s.features == 3
    assert (len(s.train), len(s.val), len(s.test)) == (21, 6, 3)
    assert s.train.dtype == s.val.dtype == s.test.dtype == torch.float32
    together = torch.cat([s.train, s.val, s.test]).double().numpy()
    ids = together[:, 0].astype(int)
    assert sorted(ids) == list(range(30))  # every row exactly once
    np.testing.assert_allclose(together, data[ids], rtol=1e-6)  # and unchanged (up to float32)
    assert list(ids) != list(range(30))  # shuffled


def test_split_array_is_reproducible_and_follows_the_seed():
    data = _rows(40)
    a, b, c = (split_array(data, "rows", seed=seed) for seed in (0, 0, 1))
    for part in ("train", "val", "test"):
        assert torch.equal(getattr(a, part), getattr(b, part))
    assert not torch.equal(a.test, c.test)


def test_split_array_without_shuffling_keeps_the_order():
    data = _rows(20)
    s = split_array(data, "rows", val=0.25, test=0.15, shuffle=False)
    np.testing.assert_array_equal(s.train.numpy(), data[:12].astype(np.float32))
    np.testing.assert_array_equal(s.val.numpy(), data[12:17].astype(np.float32))
    np.testing.assert_array_equal(s.test.numpy(), data[17:].astype(np.float32))


def test_split_array_leaves_its_input_alone():
    data = _rows(20).astype(np.float32)
    copy = data.copy()
    s = split_array(data, "rows", shuffle=False)
    s.train.add_(1.0)
    np.testing.assert_array_equal(data, copy)


def test_split_array_rounds_the_fractions_to_whole_rows():
    s = split_array(_rows(6), "rows")  # 10% of 6 rows rounds to 1 validation and 1 test point
    assert (len(s.train), len(s.val), len(s.test)) == (4, 1, 1)
    s = split_array(_rows(37), "rows", val=0.3, test=0.12)  # 11.1 and 4.44 rows
    assert (len(s.train), len(s.val), len(s.test)) == (22, 11, 4)


@pytest.mark.parametrize("n", [0, 3, 4])
def test_split_array_refuses_too_few_rows(n):
    # 10% of 4 rows or fewer rounds to no validation or test point
    with pytest.raises(ValueError, match=f"rows: {n} rows are too few for a train/val/test split"):
        split_array(np.zeros((n, 3)), "rows")


# dequantize


def test_dequantize_adds_noise_in_one_level_and_scales_to_the_unit_interval():
    levels = 17
    counts = np.random.default_rng(0).integers(0, levels, size=(50, 4)).astype(np.float64)
    counts[0] = [0, levels - 1, 0, levels - 1]  # both ends of the range
    out = dequantize(counts, levels, seed=0)
    assert out.shape == counts.shape and out.dtype == np.float64
    assert out.min() >= 0.0 and out.max() < 1.0
    noise = out * levels - counts
    assert noise.min() >= -1e-12 and noise.max() < 1.0


def test_dequantize_noise_depends_on_the_seed_only():
    counts = np.arange(12, dtype=np.float64).reshape(3, 4)
    a, b, c = dequantize(counts, 256, 5), dequantize(counts, 256, 5), dequantize(counts, 256, 6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # the same seed gives the same noise whatever the counts
    np.testing.assert_allclose(a - dequantize(np.zeros_like(counts), 256, 5), counts / 256, atol=1e-15)
    # and a fresh draw per element
    assert len(np.unique(a * 256 - counts)) == counts.size


def test_dequantize_noise_is_uniform():
    noise = dequantize(np.zeros((100, 200)), 1, seed=0).ravel()
    n = noise.size
    # U[0, 1): mean 1/2 and variance 1/12; bounds at 6 standard errors
    assert abs(noise.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)
    assert abs(noise.var() - 1 / 12) < 6 * math.sqrt(1 / 180 / n)
    counts, _ = np.histogram(noise, bins=10, range=(0.0, 1.0))
    assert np.abs(counts - n / 10).max() < 6 * math.sqrt(n * 0.1 * 0.9)


# standardize


def _data(n=40):
    return torch.randn(n, 2) * torch.tensor([3.0, 0.5]) + torch.tensor([1.0, -2.0])


def test_standardize_prepends_the_data_mean_and_standard_deviation():
    flow = Flow(Permutation(2, seed=0), StandardNormal(2))
    x = _data()
    out = standardize(flow, x)
    assert isinstance(out.bijector, Chain) and len(out.bijector) == 2
    scaling = out.bijector[0]
    assert isinstance(scaling, Standardization)
    assert out.bijector[1] is flow.bijector and out.base is flow.base
    x64 = x.double().numpy()
    np.testing.assert_allclose(scaling.loc.numpy(), x64.mean(0), rtol=1e-6)
    np.testing.assert_allclose(scaling.scale.numpy(), x64.std(0, ddof=1), rtol=1e-6)


def test_standardize_robust_uses_the_median_and_the_interquartile_range():
    x = _data(101)
    scaling = standardize(Flow(Permutation(2, seed=0), StandardNormal(2)), x, robust=True).bijector[0]
    x64 = x.double().numpy()
    q1, q3 = np.percentile(x64, [25, 75], axis=0)
    np.testing.assert_allclose(scaling.loc.numpy(), np.median(x64, 0), rtol=1e-6)
    np.testing.assert_allclose(scaling.scale.numpy(), (q3 - q1) / (2 * 0.6744897501960817), rtol=1e-6)


def test_standardized_log_prob_is_the_density_in_data_units():
    # a standard normal after standardisation is the normal with the data's mean and std
    x = _data()
    out = standardize(Flow(Permutation(2, seed=0), StandardNormal(2)), x)
    y = torch.randn(7, 2) * 2
    x64 = x.double().numpy()
    expected = _gaussian_log_prob(y.double().numpy(), x64.mean(0), x64.std(0, ddof=1))
    np.testing.assert_allclose(out.log_prob(y).detach().numpy(), expected, rtol=1e-5)


def test_standardized_flow_evaluates_the_original_flow_on_standardised_data():
    flow = randomize(RealNVP(2, transforms=2, hidden=(8,), context=1))
    x = _data()
    out = standardize(flow, x)
    y, c = torch.randn(5, 2), torch.randn(5, 1)
    m, s = x.double().mean(0), x.double().std(0)
    expected = flow.log_prob(((y.double() - m) / s).float(), c).double() - s.log().sum()
    torch.testing.assert_close(out.log_prob(y, c).double(), expected, rtol=1e-5, atol=1e-5)


def test_standardize_clamps_a_constant_feature():
    x = torch.stack([torch.full((10,), 4.0), torch.arange(10.0)], dim=1)
    with pytest.warns(RuntimeWarning, match=r"feature\(s\) \[0\] are constant"):
        scaling = standardize(Flow(Permutation(2, seed=0), StandardNormal(2)), x).bijector[0]
    assert scaling.loc.tolist()[0] == 4.0 and scaling.scale.tolist()[0] == pytest.approx(1e-6)


def test_standardized_flow_survives_save_and_load(tmp_path):
    out = standardize(randomize(RealNVP(2, transforms=1, hidden=(4,))), _data().float())
    flowkit.io.save(out, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    y = torch.randn(6, 2)
    assert torch.equal(loaded.log_prob(y), out.log_prob(y))


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(5), "standardize: data of shape \\(5,\\) do not fit a flow on events of shape \\(2,\\)"),
        (torch.randn(5, 3), "standardize: data of shape \\(5, 3\\) do not fit"),
        (torch.randn(5, 2, 1), "standardize: data of shape \\(5, 2, 1\\) do not fit"),
        (torch.randn(1, 2), "N >= 2"),
        (torch.tensor([[float("nan"), 1.0], [2.0, 3.0], [1.0, 1.0]]), "non-finite values"),
        (torch.tensor([[float("inf"), 1.0], [2.0, 3.0], [1.0, 1.0]]), "non-finite values"),
    ],
)
def test_standardize_refuses_data_that_do_not_fit(x, match):
    with pytest.raises(ValueError, match=match):
        standardize(Flow(Permutation(2, seed=0), StandardNormal(2)), x)


# log_prob_batched and evaluate_nll

LOC, SCALE = [1.0, -2.0], [2.0, 0.5]


def _known_flow():
    """A flow with a closed-form density, N(LOC, diag(SCALE^2)), in float64 (the base's parameters stay at N(0, 1))."""
    return Flow(Standardization(LOC, SCALE), DiagNormal(2)).double()


@pytest.mark.parametrize("batch_size", [1, 3, 7, 4096])
def test_log_prob_batched_is_the_exact_log_density(batch_size):
    x = torch.randn(7, 2, dtype=torch.float64) * 2
    out = log_prob_batched(_known_flow(), x, batch_size)
    assert out.shape == (7,) and out.dtype == torch.float64 and not out.requires_grad
    np.testing.assert_allclose(out.numpy(), _gaussian_log_prob(x.numpy(), LOC, SCALE), rtol=1e-12)


def test_log_prob_batched_calls_the_flow_batch_by_batch():
    flow = _known_flow()
    sizes = []
    log_prob = flow.log_prob
    flow.log_prob = lambda b: (sizes.append(len(b)), log_prob(b))[1]
    log_prob_batched(flow, torch.randn(7, 2, dtype=torch.float64), batch_size=3)
    assert sizes == [3, 3, 1]


def test_log_prob_batched_keeps_extra_batch_dimensions():
    x = torch.randn(4, 3, 2, dtype=torch.float64)
    out = log_prob_batched(_known_flow(), x, batch_size=3)
    assert out.shape == (4, 3)
    np.testing.assert_allclose(out.numpy(), _gaussian_log_prob(x.numpy(), LOC, SCALE), rtol=1e-12)


def test_log_prob_batched_converts_data_to_the_flow_dtype():
    x = torch.randn(5, 2)
    out = log_prob_batched(_known_flow(), x)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), _gaussian_log_prob(x.double().numpy(), LOC, SCALE), rtol=1e-12)


def test_log_prob_batched_runs_in_eval_mode_without_gradients_and_restores_the_mode():
    flow = Flow(ActNorm(2), StandardNormal(2))
    x = torch.randn(6, 2) * 5 + 3
    assert flow.training
    out = log_prob_batched(flow, x)
    # in training mode ActNorm would have initialised itself on x
    assert flow.training and not bool(flow.bijector.initialized)
    assert not out.requires_grad
    torch.testing.assert_close(out, (-0.5 * x.square() - 0.5 * LOG_2PI).sum(-1))
    flow.eval()
    log_prob_batched(flow, x)
    assert not flow.training


def test_log_prob_batched_restores_the_mode_when_the_flow_raises():
    flow = Flow(ActNorm(2), StandardNormal(2))
    with pytest.raises(ValueError, match="event shape"):
        log_prob_batched(flow, torch.randn(4, 3))
    assert flow.training


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(2, 3, dtype=torch.float64), "x has shape \\(2, 3\\) but the event shape is \\(2\\)"),
        (torch.tensor([[0.0, float("nan")], [1.0, 1.0]], dtype=torch.float64), "1 non-finite value"),
    ],
)
def test_log_prob_batched_and_evaluate_nll_refuse_bad_data(x, match):
    for function in (log_prob_batched, evaluate_nll):
        with pytest.raises(ValueError, match=match):
            function(_known_flow(), x, 3)


def test_evaluate_nll_is_the_mean_with_two_standard_errors():
    x = torch.randn(9, 2, dtype=torch.float64) * 3
    nll = -_gaussian_log_prob(x.numpy(), LOC, SCALE)
    result = evaluate_nll(_known_flow(), x, batch_size=4)
    assert isinstance(result, NLL) and result.n == 9
    assert result.mean == pytest.approx(nll.mean(), rel=1e-12)
    assert result.two_se == pytest.approx(2 * nll.std(ddof=1) / 3, rel=1e-10)


def test_evaluate_nll_of_one_point_has_no_error_bar():
    x = torch.tensor([[0.5, -1.0]], dtype=torch.float64)
    result = evaluate_nll(_known_flow(), x)
    assert result.n == 1 and math.isnan(result.two_se)
    assert result.mean == pytest.approx(-float(_gaussian_log_prob(x.numpy(), LOC, SCALE)[0]), rel=1e-12)


# Bad input to the data helpers: each gives a ValueError naming the problem.
@pytest.mark.parametrize(
    "val,test", [(-0.1, 0.1), (0.0, 0.1), (1.5, 0.1), (0.6, 0.6), (float("nan"), 0.1), (float("inf"), 0.1)]
)
def test_split_array_refuses_bad_fractions(val, test):
    with pytest.raises(ValueError, match="fraction|leaves no training data"):
        split_array(np.zeros((50, 2)), "d", val=val, test=test)


@pytest.mark.parametrize("shape", [(20,), (20, 2, 2)])
def test_split_array_refuses_data_that_are_not_a_table(shape):
    with pytest.raises(ValueError, match="shape"):
        split_array(np.zeros(shape), "d")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_split_array_refuses_non_finite_data(bad):
    data = np.zeros((20, 2))
    data[3, 1] = bad
    with pytest.raises(ValueError, match="non-finite"):
        split_array(data, "d")


@pytest.mark.parametrize("data", [np.array([["a", "b"]] * 20), np.ones((20, 2), dtype=complex)])
def test_split_array_refuses_non_real_data(data):
    with pytest.raises(ValueError, match="dtype"):
        split_array(data, "d")


@pytest.mark.parametrize("counts", [[[-1.0, 2.0]], [[17.0, 2.0]], [[1.5, 2.0]], [[np.nan, 2.0]]])
def test_dequantize_refuses_counts_outside_the_levels(counts):
    with pytest.raises(ValueError, match="integers in"):
        dequantize(np.array(counts), 17, 0)


@pytest.mark.parametrize("levels", [0, -3, 2.5])
def test_dequantize_refuses_bad_levels(levels):
    with pytest.raises(ValueError, match="levels"):
        dequantize(np.zeros((2, 2)), levels, 0)


def test_standardize_of_float64_data_keeps_float64_precision():
    x = torch.randn(40, 2, dtype=torch.float64) * 3 + 1e6
    out = standardize(Flow(Permutation(2, seed=0), StandardNormal(2)).double(), x)
    assert torch.equal(out.bijector[0].loc, x.mean(0))
    assert torch.equal(out.bijector[0].scale, x.std(0))
    # converting a float32 model to float64 later also gives the exact statistics
    late = standardize(Flow(Permutation(2, seed=0), StandardNormal(2)), x).double()
    assert torch.equal(late.bijector[0].loc, x.mean(0))


def test_standardize_takes_the_flows_dtype_whatever_the_datas():
    x = torch.randn(40, 2, dtype=torch.float64)
    out = standardize(RealNVP(2, transforms=1, hidden=(4,)), x)
    assert out.bijector[0].loc.dtype == torch.float32
    assert torch.isfinite(out.log_prob(x[:3].float())).all()


@pytest.mark.parametrize("x", [np.zeros((5, 2)), torch.ones(5, 2, dtype=torch.long)])
def test_standardize_refuses_data_that_are_not_a_float_tensor(x):
    with pytest.raises(ValueError, match="floating-point torch.Tensor"):
        standardize(Flow(Permutation(2, seed=0), StandardNormal(2)), x)


def test_standardize_refuses_a_non_flow():
    with pytest.raises(ValueError, match="Flow"):
        standardize(torch.nn.Linear(2, 2), torch.randn(5, 2))
    injective = InjectiveFlow(MLP(3, 2, (4,)), MLP(2, 3, (4,)), 3, 2)  # a flow model that has no standardisation
    with pytest.raises(ValueError, match="InjectiveFlow cannot put a standardisation first"):
        standardize(injective, torch.randn(5, 3))


@pytest.mark.parametrize("batch_size", [0, -1, 2.5])
def test_log_prob_batched_refuses_bad_batch_sizes(batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        log_prob_batched(Flow(Permutation(2, seed=0), StandardNormal(2)), torch.randn(5, 2), batch_size)


def test_evaluate_nll_refuses_no_points():
    with pytest.raises(ValueError, match="at least one point"):
        evaluate_nll(Flow(Permutation(2, seed=0), StandardNormal(2)), torch.zeros(0, 2))


def test_log_prob_batched_converts_data_for_a_flow_without_parameters():
    flow = Flow(Standardization([1.0, 2.0], [2.0, 0.5]), StandardNormal(2)).double()
    x = torch.randn(5, 2)
    torch.testing.assert_close(log_prob_batched(flow, x), flow.log_prob(x.double()))
