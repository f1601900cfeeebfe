"""Orientation plots: the equal-area projection and the orientation-marginal figure."""

import numpy as np
import pytest
import torch

from flowkit import plot
from flowkit.targets import MatrixFisher


def test_equal_area_projection_keeps_areas():
    v = torch.nn.functional.normalize(torch.randn(200_000, 3, dtype=torch.float64), dim=-1)
    xy = plot.equal_area(v)
    r = np.linalg.norm(xy, axis=-1)
    assert r.max() <= 2 + 1e-9
    # uniform on the sphere -> uniform on the disc of radius 2: P(r < a) = (a / 2)^2
    for a in (0.5, 1.0, np.sqrt(2), 1.8):
        assert abs((r < a).mean() - (a / 2) ** 2) < 0.005
    np.testing.assert_allclose(plot.equal_area(np.array([0.0, 0.0, 1.0])), [0.0, 0.0])


def test_orientations_figure():
    target = MatrixFisher([[5.0, 0, 0], [0, 4.0, 0], [0, 0, 3.0]])
    q = target.sample(500)
    uniform = torch.nn.functional.normalize(torch.randn(500, 4), dim=-1)
    fig = plot.orientations(
        {"target": q, "uniform (reweighted)": uniform}, {"uniform (reweighted)": -target.energy(uniform)}
    )
    assert len(fig.axes) == 6
    with pytest.raises(ValueError, match="shape"):
        plot.orientations({"bad": torch.zeros(3, 3)})
