"""Diagnostics (flowkit/inference/diagnostics.py) and their plots (flowkit/inference/plots.py), with exact answers."""

import sys
import types

import numpy as np
import pytest
import torch

from flowkit.inference import (
    GaussianLinear,
    TransitSpectrum,
    c2st,
    coverage_error,
    plot_corner,
    plot_coverage,
    plot_predictive,
    plot_sbc,
    posterior_predictive_check,
    posterior_samples,
    sbc_coverage,
    sbc_ranks,
    sbc_uniformity,
    tarp_coverage,
)


@pytest.fixture(scope="module")
def exact_gaussian_linear():
    """The exact posterior's samples (L = 200) for 1000 simulations of a 3-D Gaussian linear task."""
    task = GaussianLinear(dim=3)
    theta, x = task.simulations(1000, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)

    def exact(n, x):
        mean = x / 2  # the analytic posterior N(x / 2, 0.05 I)
        return mean + 0.05**0.5 * torch.randn(n, *x.shape, dtype=x.dtype, generator=generator)

    return theta, x, posterior_samples(exact, 200, x)


@pytest.mark.slow
def test_c2st_is_one_half_for_one_distribution_and_one_for_disjoint_ones():
    rng = np.random.default_rng(0)
    same = c2st(rng.normal(size=(1000, 2)), rng.normal(size=(1000, 2)))
    assert abs(same - 0.5) < 0.05
    assert c2st(rng.normal(size=(500, 2)), rng.normal(size=(500, 2)) + 8) > 0.99
    with pytest.raises(ValueError, match="same number of columns"):
        c2st(np.zeros((10, 2)), np.zeros((10, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        c2st(np.full((10, 2), np.nan), np.zeros((10, 2)))


def test_sbc_ranks_are_uniform_for_the_exact_posterior(exact_gaussian_linear):
    theta, x, samples = exact_gaussian_linear
    ranks = sbc_ranks(samples, theta)
    assert ranks.shape == (1000, 3) and ranks.min() >= 0 and ranks.max() <= 200
    assert sbc_uniformity(ranks, 200).min() > 0.001
    levels, coverage = sbc_coverage(ranks, 200)
    assert coverage_error(levels, coverage) < 0.05
    # a posterior twice too narrow piles the ranks at the ends
    narrow = x / 2 + 0.5 * (samples - x / 2)
    assert sbc_uniformity(sbc_ranks(narrow, theta), 200).max() < 1e-6


def test_tarp_coverage_is_the_diagonal_for_the_exact_posterior_and_off_for_a_biased_one(exact_gaussian_linear):
    theta, x, samples = exact_gaussian_linear
    levels, ecp = tarp_coverage(samples, theta)
    assert coverage_error(levels, ecp) < 0.05
    biased = samples + 0.3  # shifted by 1.3 posterior standard deviations
    assert coverage_error(*tarp_coverage(biased, theta)) > 0.15
    wide = x / 2 + 2 * (samples - x / 2)
    assert coverage_error(*tarp_coverage(wide, theta)) > 0.1


def test_tarp_coverage_matches_the_tarp_package_on_identical_inputs():
    pytest.importorskip("tqdm")
    if "deprecation" not in sys.modules:
        try:
            import deprecation  # noqa: F401
        except ImportError:  # tarp 0.1.1 imports it only to decorate a deprecated alias
            stub = types.ModuleType("deprecation")
            stub.deprecated = lambda **kw: lambda f: f
            sys.modules["deprecation"] = stub
    drp = pytest.importorskip("tarp.drp")
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(300, 3))
    samples = theta[None] + rng.normal(size=(150, 300, 3)) * 0.8 + 0.1
    references = rng.uniform(size=(300, 3))
    for metric in ("euclidean", "manhattan"):
        ecp, alpha = drp._get_tarp_coverage_single(
            samples.copy(), theta.copy(), references=references, metric=metric, norm=True
        )
        # tarp's ECP at its histogram's edges alpha_k is the share of f_i < alpha_k, where an f_i lying on an edge
        # (f takes the values k / 150) may fall on either side by the rounding of np.histogram's bin index
        edges = alpha[1:-1]
        below = tarp_coverage(samples, theta, references=references, levels=edges - 1e-9, metric=metric)[1]
        above = tarp_coverage(samples, theta, references=references, levels=edges + 1e-9, metric=metric)[1]
        inside = tarp_coverage(samples, theta, references=references, levels=edges, metric=metric)[1]
        assert np.all((below <= ecp[1:-1] + 1e-12) & (ecp[1:-1] <= above + 1e-12))
        untied = below == above
        assert untied.mean() > 0.5
        np.testing.assert_allclose(inside[untied], ecp[1:-1][untied])


def test_diagnostics_refuse_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        sbc_ranks(np.zeros((5, 4, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="metric"):
        tarp_coverage(np.zeros((5, 4, 2)), np.zeros((4, 2)), metric="cosine")
    with pytest.raises(ValueError, match=r"shape \(n, B, D\)"):
        posterior_samples(lambda n, x: torch.zeros(n, 2), 3, torch.zeros(4, 2))


def test_posterior_predictive_check_of_the_transit_toy():
    task = TransitSpectrum()
    truth, x = task.observation(0)
    near = truth + 1e-3 * (task.upper - task.lower) * torch.randn(300, 7, dtype=torch.float64)
    good = posterior_predictive_check(task.simulate, near, x)
    assert good.predictive.shape == (300, 52) and good.p_value > 0.01
    far = task.sample_prior(300, torch.Generator().manual_seed(3))
    far[:, 0] = 1.6  # the largest planet: every channel's depth is far above the observation's
    bad = posterior_predictive_check(task.simulate, far, x)
    assert bad.p_value < 0.01 and float(bad.quantiles.max()) < 0.05


def test_plots_draw(exact_gaussian_linear):
    theta, x, samples = exact_gaussian_linear
    ranks = sbc_ranks(samples, theta)
    figures = [
        plot_corner(samples[:, 0], samples[:, 1], truth=theta[0], labels=["a", "b", "c"]),
        plot_coverage({"TARP": tarp_coverage(samples, theta), "SBC": sbc_coverage(ranks, 200)}, n=1000),
        plot_sbc(ranks, 200),
    ]
    task = TransitSpectrum()
    truth, x_o = task.observation(0)
    check = posterior_predictive_check(task.simulate, truth.expand(50, 7), x_o)
    figures.append(plot_predictive(check, x_o, grid=task.wavelength, xlabel="wavelength (µm)"))
    for fig in figures:
        assert fig.axes
    with pytest.raises(ValueError, match="labels must name the 3"):
        plot_corner(samples[:, 0], labels=["a"])
