"""Tail estimators on draws with known tails (t2, t3, Gaussian, Pareto) and the tail metrics against closed forms."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from flowkit import stats as tails
from flowkit.data import mtaf_synthetic


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_t3_gives_df_between_2_and_4_on_1e5_draws():
    estimate = tails.estimate_tail(_rng(1).standard_t(3, 100_000), bootstraps=50)
    assert estimate.heavy and 2 <= estimate.df <= 4, estimate


def test_gaussian_draws_read_as_light():
    estimate = tails.estimate_tail(_rng(2).standard_normal(100_000), bootstraps=50)
    assert not estimate.heavy and estimate.df is None, estimate
    assert estimate.moments <= 0.1 and estimate.kernel <= 0.1


def test_t2_reads_as_heavy_with_df_near_2():
    estimate = tails.estimate_tail(_rng(3).standard_t(2, 30_000), bootstraps=50)
    assert estimate.heavy and 1.5 <= estimate.df <= 2.5, estimate


@pytest.mark.parametrize("xi", [0.3, 0.5, 1.0])
def test_every_estimator_is_within_0_1_of_xi_on_pareto_draws(xi):
    x = _rng(4).pareto(1 / xi, 30_000) + 1  # P(X > t) = t^(-1/xi)
    estimate = tails.estimate_tail(x, bootstraps=50)
    assert estimate.heavy
    for value in (estimate.hill, estimate.moments, estimate.kernel):
        assert abs(value - xi) < 0.1, estimate


def test_bounded_and_exponential_tails_are_light():
    assert not tails.estimate_tail(_rng(5).random(20_000), bootstraps=30).heavy
    assert not tails.estimate_tail(_rng(6).exponential(size=20_000), bootstraps=30).heavy


def test_hill_and_moments_at_a_given_k_match_their_definitions():
    x = _rng(7).standard_t(3, 500)
    desc = np.sort(np.abs(x))[::-1]
    for k in (2, 10, 100, 499):  # k = 1 has M_2 = M_1^2: the moments estimator is undefined
        logs = np.log(desc[:k]) - np.log(desc[k])
        m1, m2 = logs.mean(), (logs**2).mean()
        assert tails.hill(x, k=k) == pytest.approx(m1, rel=1e-10)
        assert tails.moments(x, k=k) == pytest.approx(m1 + 1 - 0.5 / (1 - m1**2 / m2), rel=1e-8)
    with pytest.raises(ValueError, match="at most 499"):
        tails.hill(x, k=500)


def test_double_bootstrap_threshold_is_in_range_and_seeded():
    x = _rng(8).standard_t(3, 5000)
    k = tails.double_bootstrap(x, bootstraps=20, seed=3)
    assert 2 <= k < 5000 and k == tails.double_bootstrap(x, bootstraps=20, seed=3)


def test_double_bootstrap_keeps_k_in_the_searched_range_on_a_t2_mixture():
    # mTAF's D = 50 data, seed 1, feature 49: two shifted, scaled t2 components. The first stage's AMSE
    # is least at the edge of its range (k1 = 8838 of 35355) and the second's at k2 = 667, so k1^2 / k2
    # exceeded n; k* was then n - 2 and Hill averaged log|x| over every point: xi 8.97, df 0.11.
    x = mtaf_synthetic(50, 10, seed=1, sizes=(50_000, 1, 1)).train[:, 49].double().numpy()  # the same 50k
    k = tails.double_bootstrap(x, bootstraps=100, seed=0)
    assert 2 <= k <= 0.25 * x.size
    estimate = tails.estimate_tail(x, bootstraps=100)
    assert estimate.heavy and 1.5 < estimate.df < 3.5  # generating df 2 (Hill on the 75k test points: 2.46)


def test_estimate_tails_reads_each_column():
    rng = _rng(9)
    x = np.stack([rng.standard_normal(20_000), rng.standard_t(2, 20_000)], 1)
    light, heavy = tails.estimate_tails(torch.from_numpy(x), bootstraps=30)
    assert not light.heavy and heavy.heavy


@pytest.mark.parametrize(
    "call",
    [
        lambda: tails.estimate_tail(np.r_[np.ones(100), np.nan]),
        lambda: tails.estimate_tail(np.ones(tails.MIN_POINTS - 1)),
        lambda: tails.estimate_tail(np.r_[np.zeros(1000), np.ones(10)]),
        lambda: tails.estimate_tails(np.ones(100)),
        lambda: tails.double_bootstrap(np.ones(100), "pickands"),
        lambda: tails.double_bootstrap(np.ones(100), bootstraps=1),
        lambda: tails.kernel(np.ones(100), h=0.0),
        lambda: tails.quantile_coverage(np.ones((10, 2)), np.ones((10, 3))),
        lambda: tails.quantile_coverage(np.ones((10, 2)), np.ones((10, 2)), levels=(1.0,)),
        lambda: tails.tail_value_at_risk(np.ones(10), level=1.5),
        lambda: tails.tail_value_at_risk(np.ones(10), side="left"),
        lambda: tails.loglog_tail_distance(np.ones((10, 1)), np.r_[np.inf, np.ones(9)][:, None]),
    ],
)
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_quantile_coverage_of_a_calibrated_model_is_nominal():
    rng = _rng(10)
    model, data = rng.standard_t(3, (400_000, 2)), rng.standard_t(3, (200_000, 2))
    coverage = tails.quantile_coverage(model, data)
    levels = np.array([0.001, 0.01, 0.99, 0.999])[:, None]
    assert coverage.shape == (4, 2)
    error = 4 * np.sqrt(levels * (1 - levels) / 1e5)  # four standard errors of the data's and the model's quantiles
    assert (np.abs(coverage - levels) < error).all(), coverage


@pytest.mark.parametrize("level", [0.95, 0.99])
def test_tail_value_at_risk_matches_closed_forms(level):
    rng = _rng(11)
    z = rng.standard_normal(1_000_000)
    normal = stats.norm.pdf(stats.norm.ppf(level)) / (1 - level)
    assert tails.tail_value_at_risk(z, level)[0] == pytest.approx(normal, rel=0.01)
    assert tails.tail_value_at_risk(-z, level, side="lower")[0] == pytest.approx(normal, rel=0.01)
    nu = 3.0  # E[T | T > q] = (nu + q^2) / (nu - 1) t_nu(q) / (1 - level)
    q = stats.t.ppf(level, nu)
    student = (nu + q**2) / (nu - 1) * stats.t.pdf(q, nu) / (1 - level)
    t = rng.standard_t(nu, 1_000_000)
    assert tails.tail_value_at_risk(t, level)[0] == pytest.approx(student, rel=0.03)
    wide = (1 + level) / 2  # |T| beyond its level quantile is T beyond its (1 + level) / 2 quantile
    q = stats.t.ppf(wide, nu)
    absolute = (nu + q**2) / (nu - 1) * stats.t.pdf(q, nu) / (1 - wide)
    assert tails.tail_value_at_risk(t, level, side="abs")[0] == pytest.approx(absolute, rel=0.03)


def test_loglog_distance_is_zero_for_the_data_and_grows_with_a_wrong_tail():
    rng = _rng(12)
    data = rng.standard_t(2, (50_000, 1))
    assert tails.loglog_tail_distance(data, data)[0] == 0
    same = tails.loglog_tail_distance(rng.standard_t(2, (50_000, 1)), data)[0]
    gaussian = tails.loglog_tail_distance(rng.standard_normal((50_000, 1)) * data.std(), data)[0]
    wrong_df = tails.loglog_tail_distance(rng.standard_t(4, (50_000, 1)), data)[0]
    assert 5 * same < min(gaussian, wrong_df)
    # A power law is a line of slope xi in (s, log Q): the gap to the data's grows like |xi - 1/2| s^2 / 2.
    s_max = math.log(50_000)
    pareto = rng.pareto(1.0, (50_000, 1)) + 1  # xi = 1
    exact = 0.5 * 0.5 * (s_max**2 - math.log(10) ** 2)
    assert tails.loglog_tail_distance(pareto, rng.pareto(2.0, (50_000, 1)) + 1)[0] == pytest.approx(exact, rel=0.2)
