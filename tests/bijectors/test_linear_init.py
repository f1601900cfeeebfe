"""LULinear's initialisation: the LU factors of a random rotation, so a fresh layer is orthogonal."""

import pytest
import torch

from flowkit.bijectors import Conv1x1, LULinear


@pytest.mark.parametrize("features", [3, 8, 33])
def test_lulinear_starts_orthogonal_with_a_positive_u_diagonal(features):
    torch.manual_seed(features)
    layer = LULinear(features).double()
    w = layer.weight.detach()
    eye = torch.eye(features, dtype=torch.float64)
    torch.testing.assert_close(w @ w.T, eye, atol=1e-5, rtol=0)  # drawn in float32
    lower, upper = layer._factors()
    torch.testing.assert_close(torch.diagonal(lower), torch.ones(features, dtype=torch.float64))
    assert (torch.diagonal(upper) > 0).all()
    assert abs(float(layer.log_abs_det())) < 1e-5


def test_conv1x1_starts_orthogonal():
    torch.manual_seed(0)
    w = Conv1x1((6, 2, 2)).weight.detach().double()
    torch.testing.assert_close(w @ w.T, torch.eye(6, dtype=torch.float64), atol=1e-5, rtol=0)
