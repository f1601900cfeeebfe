"""Heavy-tailed data: the mTAF synthetic copula data (marginals, copula, tails) and the arch returns."""

import numpy as np
import pytest
from scipy import special, stats

import flowkit
from flowkit import stats as tails
from flowkit.data import heavy_tailed, mtaf_synthetic, stock_returns


@pytest.fixture(scope="module")
def data():
    return mtaf_synthetic(8, heavy=4, df=2.0, seed=1, sizes=(20_000, 1000, 1000))


def _mixture_cdf(marginal, x, df):
    u = (x[:, None] - np.array(marginal["loc"])) / np.array(marginal["scale"])
    return (special.stdtr(df, u) if marginal["kind"] == "t" else special.ndtr(u)).mean(1)


def test_layout_sizes_and_marginal_kinds(data):
    assert data.train.shape == (20_000, 8) and data.val.shape == data.test.shape == (1000, 8)
    assert data.info["kinds"] == ["normal", "normal", "mix2", "mix3", "t", "t", "t", "t"]
    assert data.info["heavy"] == [4, 5, 6, 7]
    corr = np.array(data.info["correlation"])
    assert (np.abs(corr[np.triu_indices(8, 1)]) > 0).sum() == 8 and np.linalg.eigvalsh(corr).min() > 0
    paper = mtaf_synthetic(8, heavy=1, sizes=None, seed=0)
    assert (len(paper.train), len(paper.val), len(paper.test)) == (15_000, 10_000, 75_000)


def test_marginals_follow_their_mixture_cdfs(data):
    x = data.train.double().numpy()
    for j, marginal in enumerate(data.info["marginals"]):
        assert stats.kstest(x[:, j], lambda v, m=marginal: _mixture_cdf(m, v, 2.0)).pvalue > 1e-3, j


def test_the_copula_is_gaussian_with_the_given_correlation(data):
    x = data.train.double().numpy()
    g = np.stack([special.ndtri(_mixture_cdf(m, x[:, j], 2.0)) for j, m in enumerate(data.info["marginals"])], 1)
    np.testing.assert_allclose(np.corrcoef(g.T), np.array(data.info["correlation"]), atol=0.03)


def test_heavy_marginals_read_as_heavy_with_df_near_2_and_the_rest_light(data):
    estimates = tails.estimate_tails(data.train, bootstraps=30)
    assert [e.heavy for e in estimates] == [False] * 4 + [True] * 4
    assert all(1.5 < e.df < 3.0 for e in estimates[4:])


def test_returns_from_arch_are_heavy_tailed():
    splits = stock_returns(seed=0)
    assert splits.features == 2 and len(splits.train) + len(splits.val) + len(splits.test) == 5030
    assert tails.estimate_tail(splits.train[:, 0], bootstraps=30).heavy
    assert flowkit.data.load("returns").train.shape == splits.train.shape


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="heavy marginals"):
        mtaf_synthetic(8, heavy=5)
    with pytest.raises(ValueError):
        mtaf_synthetic(8, df=0.0)
    with pytest.raises(ValueError, match="unknown heavy-tailed"):
        heavy_tailed("mtaf-9-1")
