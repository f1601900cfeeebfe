"""flowkit.plot's lattice figures: configurations, magnetisation histograms, autocorrelation functions."""

import pytest
import torch
from matplotlib.figure import Figure

from flowkit import plot


def test_lattice_figures(tmp_path):
    x = torch.randn(20, 6, 6)
    fig = plot.lattice_configurations(x, n=3, title="samples")
    assert isinstance(fig, Figure) and len(fig.axes) == 4  # three panels and the colour bar
    fig = plot.magnetization_histogram({"flow": x, "HMC": torch.randn(50, 2, 6, 6)})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["flow", "HMC"]
    fig = plot.autocorrelation({"|M|": torch.randn(200).abs()}, max_lag=10)
    line = fig.axes[0].lines[0]
    assert len(line.get_xdata()) == 11 and line.get_ydata()[0] == pytest.approx(1.0)
    fig.savefig(tmp_path / "acf.png")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plot.lattice_configurations(torch.randn(6, 6)), "(N, L, L)"),
        (lambda: plot.magnetization_histogram({}), "at least one"),
        (lambda: plot.magnetization_histogram({"a": torch.full((3, 4, 4), float("nan"))}), "finite"),
        (lambda: plot.autocorrelation({"a": torch.randn(10)}, max_lag=0), "max_lag"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
