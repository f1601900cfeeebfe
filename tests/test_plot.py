import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from scipy.stats import multivariate_normal

import flowkit.plot as fplot
from flowkit.bijectors import Standardization
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow, RealNVP


def _gaussian_flow():
    # N(loc, diag(scale^2)) as a flow: a Standardization over a standard normal
    return Flow(Standardization([0.5, -1.0], [1.0, 2.0]), StandardNormal(2))


def test_density_heatmap_shows_the_flow_density(tmp_path):
    data = torch.randn(300, 2)
    fig = fplot.density(_gaussian_flow(), data, bounds=[(-3, 4), (-6, 4)], resolution=50)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    mesh = ax.collections[0]
    xs, ys = np.linspace(-3, 4, 50), np.linspace(-6, 4, 50)
    grid = np.stack(np.meshgrid(xs, ys, indexing="xy"), -1)
    expected = multivariate_normal([0.5, -1.0], np.diag([1.0, 4.0])).pdf(grid)
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(50, 50), expected, rtol=1e-5, atol=1e-7)
    assert len(ax.collections) == 2  # heatmap and data overlay
    fig.savefig(tmp_path / "d.png")
    assert (tmp_path / "d.png").stat().st_size > 1000


def test_samples_vs_data_and_pairwise():
    flow = RealNVP(2, transforms=2, hidden=(8,))
    data = torch.randn(500, 2)
    fig = fplot.samples_vs_data(flow, data, n=300)
    assert len(fig.axes) == 2 and all(len(ax.collections[0].get_offsets()) == 300 for ax in fig.axes)
    x5 = np.random.default_rng(0).normal(size=(400, 5))
    fig = fplot.pairwise(x5, x5 + 1, max_dims=4, n=100)
    assert len(fig.axes) == 16
    assert len(fplot.pairwise(x5, dims=[0, 3]).axes) == 4
    assert isinstance(fplot.samples_vs_data(x5[:50], x5, dims=(1, 4)), Figure)


def test_training_curves_from_a_mapping():
    history = {
        "step": [1, 2, 3, 4],
        "loss": [3.0, 2.0, float("nan"), 1.0],
        "val_loss": [None, 2.5, None, 1.5],
        "lr": [1e-3] * 4,
    }
    fig = fplot.training_curves(history, smooth=2)
    loss_ax, lr_ax = fig.axes
    train_line = loss_ax.get_lines()[0]
    assert list(train_line.get_xdata()) == [1, 2, 4]  # the non-finite step is left out
    assert list(loss_ax.get_lines()[-1].get_ydata()) == [2.5, 1.5]
    assert len(lr_ax.get_lines()) == 1


def test_training_curves_from_a_fit_history():
    from flowkit.train import MaximumLikelihood, fit

    flow = RealNVP(2, transforms=1, hidden=(4,))
    x = torch.randn(200, 2)
    history = fit(flow, MaximumLikelihood(), x, steps=10, batch_size=50, val_data=x[:50], val_every=5, progress=False)
    loss_ax, _ = fplot.training_curves(history).axes
    assert list(loss_ax.get_lines()[0].get_xdata()) == list(range(1, 11))
    assert list(loss_ax.get_lines()[-1].get_xdata()) == history.val_step == [5, 10]


def test_plot_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"needs 2-D points of shape \(N, 2\)"):
        fplot.density(_gaussian_flow(), torch.randn(10, 3))
    with pytest.raises(ValueError, match=r"events have shape \(3,\)"):
        fplot.density(RealNVP(3, transforms=1, hidden=(4,)))
    with pytest.raises(ValueError, match="samples have shape"):
        fplot.samples_vs_data(np.zeros((5, 3)), np.zeros((5, 2)))
    with pytest.raises(ValueError, match="dims must index"):
        fplot.pairwise(np.zeros((5, 3)), dims=[3])
    with pytest.raises(ValueError, match="no training loss"):
        fplot.training_curves({"lr": [1.0]})


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: fplot.density(_gaussian_flow(), torch.tensor([[0.0, float("nan")], [1.0, 1.0]])), "non-finite"),
        (lambda: fplot.density(_gaussian_flow(), torch.zeros(0, 2)), "at least one point"),
        (lambda: fplot.density(_gaussian_flow(), resolution=-3), "resolution"),
        (lambda: fplot.density(_gaussian_flow(), resolution=0), "resolution"),
        (lambda: fplot.density(_gaussian_flow(), bounds=[(0, 1)]), "bounds"),
        (lambda: fplot.density(_gaussian_flow(), bounds=[(1, 0), (0, 1)]), "bounds"),
        (lambda: fplot.density(_gaussian_flow(), max_points=-1), "max_points"),
        (lambda: fplot.density(object()), "log_prob"),
        (lambda: fplot.samples_vs_data(np.zeros((5, 3)), np.zeros((0, 3))), "at least one point"),
        (lambda: fplot.samples_vs_data(np.zeros((5, 3)), np.zeros((5, 3)), dims=(0, 5)), "dims must be two indices"),
        (lambda: fplot.samples_vs_data(np.zeros((5, 3)), np.zeros((5, 3)), dims=(-1, 0)), "dims must be two indices"),
        (lambda: fplot.samples_vs_data(np.zeros((5, 3)), np.zeros((5, 3)), n=0), "n must be"),
        (lambda: fplot.samples_vs_data(np.full((5, 2), np.inf), np.zeros((5, 2))), "samples contain"),
        (lambda: fplot.pairwise(np.zeros((0, 3))), "at least one point"),
        (lambda: fplot.pairwise(np.full((5, 3), np.nan)), "non-finite"),
        (lambda: fplot.pairwise(np.zeros((5, 3)), bins=0), "bins"),
    ],
)
def test_bad_plot_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_ramachandran_raw_reweighted_and_reference_panels():
    rng = np.random.default_rng(0)
    phi, psi = rng.uniform(-np.pi, np.pi, (2, 4000))
    log_w = np.where(phi > 0, np.log(3.0), 0.0)  # the phi > 0 half reweighted 3:1
    fig = fplot.ramachandran(phi, psi, log_w, bins=2, raw=True, reference=(phi[:100], psi[:100]))
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["raw", "reweighted", "reference"]
    raw, reweighted = (np.asarray(ax.collections[0].get_array()).reshape(2, 2) for ax in panels[:2])
    # free energies relative to the lowest bin (the mesh is psi x phi): raw about 0 everywhere, reweighted
    # phi < 0 at log 3
    assert np.abs(raw).max() < 0.15
    np.testing.assert_allclose(reweighted[:, 0], np.log(3.0), atol=0.15)
    np.testing.assert_allclose(reweighted[:, 1], 0.0, atol=0.15)
    with pytest.raises(ValueError, match="titles"):
        fplot.ramachandran(phi, psi, log_w, raw=True, titles=("a", "b"), reference=(phi, psi))


def test_free_energy_profiles_draws_each_profile_with_its_errors():
    from flowkit.stats import free_energy_profile

    rng = np.random.default_rng(1)
    flow = free_energy_profile(rng.vonmises(0.0, 1.0, 3000), bins=12, resamples=20)
    md = free_energy_profile(rng.vonmises(0.0, 1.0, 3000), bins=12, error="blocks")
    fig = fplot.free_energy_profiles({"flow": flow, "MD": md}, title="F(phi)")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["flow (bootstrap errors)", "MD (block errors)"]
    x, y = ax.lines[0].get_data()
    keep = np.isfinite(flow.free_energy)
    np.testing.assert_allclose(x, flow.centres[keep])
    np.testing.assert_allclose(y, flow.free_energy[keep])
    with pytest.raises(ValueError, match="at least one"):
        fplot.free_energy_profiles({})
