"""Free-energy profiles with errors (flowkit.stats.profiles) and systematic resampling (flowkit.sampling.resample)."""

import math

import numpy as np
import pytest
import torch

from flowkit.sampling import resample
from flowkit.stats import FreeEnergyProfile, blocked_mean, free_energy_profile


def test_profile_is_the_weighted_histogram_density():
    # 4 bins of width pi/2 on [-pi, pi); weights 1, 1, 2, 4 in bins 0, 0, 1, 3 (total 8)
    values = np.array([-3.0, -2.0, -1.0, 2.0])
    log_w = np.log([1.0, 1.0, 2.0, 4.0])
    profile = free_energy_profile(values, log_w, bins=4, error=None)
    width = math.pi / 2
    with np.errstate(divide="ignore"):
        expected = -np.log(np.array([2.0, 2.0, 0.0, 4.0]) / (8.0 * width))
    np.testing.assert_allclose(profile.free_energy, expected)
    assert profile.free_energy[2] == math.inf and np.isnan(profile.error).all() and profile.method is None
    np.testing.assert_allclose(profile.centres, [-3 * math.pi / 4, -math.pi / 4, math.pi / 4, 3 * math.pi / 4])
    # weights scale out; -inf log weights are zero weights; values outside the range count in the total
    shifted = free_energy_profile(values, log_w + 700.0, bins=4, error=None)
    np.testing.assert_allclose(shifted.free_energy, expected)
    outside = free_energy_profile(np.append(values, 10.0), np.append(log_w, math.log(8.0)), bins=4, error=None)
    np.testing.assert_allclose(outside.free_energy, expected + math.log(2.0))
    zero = free_energy_profile(np.append(values, 0.5), np.append(log_w, -math.inf), bins=4, error=None)
    np.testing.assert_allclose(zero.free_energy, expected)


def test_reweighted_profile_is_unbiased_and_its_bootstrap_error_is_the_binomial_one():
    # Uniform samples reweighted to p(phi) = exp(cos phi) / (2 pi I0(1)); the exact F per bin is -log of the
    # bin's mean density. The reweighted estimate is within 4 bootstrap errors of it in every bin.
    rng = np.random.default_rng(1)
    n, bins = 20_000, 12
    phi = rng.uniform(-math.pi, math.pi, n)
    profile = free_energy_profile(phi, np.cos(phi), bins=bins, resamples=200, seed=2)
    edges = profile.edges
    mass = np.array([_integral(lambda t: np.exp(np.cos(t)), a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)])
    exact = -np.log(mass / (2 * math.pi * np.i0(1.0)) / np.diff(edges))
    assert np.all(np.abs(profile.free_energy - exact) < 4 * profile.error)
    # Unweighted samples: the bootstrap error of -log p_b is the binomial sqrt((1 - P_b) / (n P_b)).
    plain = free_energy_profile(phi, bins=bins, resamples=400, seed=3)
    binomial = np.sqrt((1 - 1 / bins) / (n / bins))
    assert np.abs(plain.error / binomial - 1).max() < 0.2
    # Blocks of independent samples give the same error, within the noise of 10 blocks (about 25% per bin).
    blocked = free_energy_profile(phi, bins=bins, error="blocks", blocks=10)
    assert blocked.method == "blocks" and abs(np.mean(blocked.error / binomial) - 1) < 0.2


def test_block_errors_see_correlation():
    # 10 blocks of 4 runs of 250 equal values; block b has k_b of its runs at phi = 1 (bin 1), the others at
    # phi = -1 (bin 0): the block error is that of the 10 block fractions, not of 10,000 independent values,
    # and the bootstrap (which assumes independence) is many times smaller.
    k = np.array([1, 2, 3, 1, 2, 2, 3, 1, 3, 2])
    runs = np.concatenate([[1.0] * kb + [-1.0] * (4 - kb) for kb in k])
    series = np.repeat(runs, 250)
    fraction = k / 4
    mean, error = blocked_mean(series > 0, blocks=10)
    assert mean == pytest.approx(fraction.mean())
    assert error == pytest.approx(fraction.std(ddof=1) / math.sqrt(10))
    blocked = free_energy_profile(series, bins=2, error="blocks", blocks=10)
    expected = [(-np.log(f / math.pi)).std(ddof=1) / math.sqrt(10) for f in (1 - fraction, fraction)]
    np.testing.assert_allclose(blocked.error, expected)
    boot = free_energy_profile(series, bins=2, error="bootstrap", resamples=100)
    assert np.all(blocked.error > 5 * boot.error)


def test_compare_profiles():
    edges = np.linspace(-math.pi, math.pi, 5)
    ref = FreeEnergyProfile(edges, np.array([1.0, 2.0, 7.0, 1.5]), np.full(4, 0.1), "blocks")
    flow = FreeEnergyProfile(edges, np.array([1.2, 1.4, 0.0, 1.5]), np.full(4, 0.2), "bootstrap")
    out = flow.compare(ref, below=5.0)  # bin 2 is 6 kT above the reference minimum: not compared
    assert out["bins"] == 3 and out["empty_bins"] == 0 and out["bins_within_0.5kT"] == 2
    assert out["max_abs_kT"] == pytest.approx(0.6)
    assert out["rms_kT"] == pytest.approx(math.sqrt((0.04 + 0.36 + 0) / 3))
    assert out["max_abs_over_error"] == pytest.approx(0.6 / math.sqrt(0.05))
    empty = FreeEnergyProfile(edges, np.array([1.0, math.inf, 0.0, 1.5]), np.full(4, 0.2), "bootstrap")
    out = empty.compare(ref)
    assert out["empty_bins"] == 1 and out["max_abs_kT"] is None
    with pytest.raises(ValueError, match="same bins"):
        flow.compare(FreeEnergyProfile(np.linspace(0, 1, 5), ref.free_energy, ref.error, None))


def test_profile_bad_input():
    x = np.zeros(10)
    with pytest.raises(ValueError, match="values"):
        free_energy_profile([0.0, float("nan")])
    with pytest.raises(ValueError, match="log_weights"):
        free_energy_profile(x, np.zeros(9))
    with pytest.raises(ValueError, match="every weight is zero"):
        free_energy_profile(x, np.full(10, -math.inf))
    with pytest.raises(ValueError, match=r"\+inf"):
        free_energy_profile(x, np.append(np.zeros(9), math.inf))
    with pytest.raises(ValueError, match="error"):
        free_energy_profile(x, error="jackknife")
    with pytest.raises(ValueError, match="range"):
        free_energy_profile(x, range=(1.0, 1.0))
    with pytest.raises(ValueError, match="bins"):
        free_energy_profile(x, bins=0)
    with pytest.raises(ValueError, match="blocks"):
        free_energy_profile(x, error="blocks", blocks=11)
    with pytest.raises(ValueError, match="blocks"):
        blocked_mean(x, blocks=1)


def test_systematic_resampling_counts_are_floor_or_ceil_and_unbiased():
    gen = torch.Generator().manual_seed(0)
    log_w = torch.randn(50, dtype=torch.float64, generator=gen) * 2
    log_w[7] = -math.inf
    n = 200
    expected = n * torch.softmax(log_w, 0)
    counts = []
    for _ in range(2000):
        idx = resample(log_w, n, generator=gen)
        assert idx.dtype == torch.int64 and idx.shape == (n,) and bool((idx[1:] >= idx[:-1]).all())
        c = torch.bincount(idx, minlength=50).double()
        assert bool(((c == expected.floor()) | (c == expected.ceil())).all())
        counts.append(c)
    counts = torch.stack(counts)
    assert counts[:, 7].sum() == 0
    # each count is floor or ceil with P(ceil) = frac(n w): the mean is n w within 4 standard errors
    frac = expected - expected.floor()
    se = (frac * (1 - frac) / counts.shape[0]).sqrt()
    assert bool(((counts.mean(0) - expected).abs() <= 4 * se + 1e-12).all())
    assert resample(torch.zeros(5)).tolist() == [0, 1, 2, 3, 4]  # equal weights: each sample once


def test_resample_bad_input():
    with pytest.raises(ValueError, match="n must be"):
        resample(torch.zeros(3), 0)
    with pytest.raises(ValueError, match="NaN"):
        resample(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="every weight is zero"):
        resample(torch.full((3,), -math.inf))


def _integral(f, a, b, n=2001):
    t = np.linspace(a, b, n)
    return float(np.trapezoid(f(t), t))
