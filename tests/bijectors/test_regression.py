"""RegressionWhitening: the whitened residual of a linear regression on the context."""

from __future__ import annotations

import math

import pytest
import torch

from flowkit.bijectors import Chain, RegressionWhitening
from flowkit.io import load, save
from flowkit.testing import check_bijector

DTYPE = torch.float64


def _linear_gaussian(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs theta ~ N(0, I_3), x = M theta + 0.1 noise (M fixed, 5 x 3); the posterior's gain and covariance."""
    m = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    gen = torch.Generator().manual_seed(1 + seed)
    theta = torch.randn(n, 3, generator=gen, dtype=DTYPE)
    x = theta @ m.T + 0.1 * torch.randn(n, 5, generator=gen, dtype=DTYPE)
    cov = torch.linalg.inv(torch.eye(3, dtype=DTYPE) + m.T @ m / 0.01)
    gain = cov @ m.T / 0.01
    return theta, x, gain, cov


def test_regression_whitening_recovers_the_linear_gaussian_posterior():
    theta, x, gain, cov = _linear_gaussian(200_000)
    layer = RegressionWhitening.from_data(theta, x).double()
    # the regression is the posterior mean's matrix, L L^T the posterior covariance (within sampling error)
    assert torch.allclose(layer.matrix, gain, atol=5e-3)
    assert torch.allclose(layer.offset, torch.zeros(3, dtype=DTYPE), atol=5e-3)
    relative = (layer.cholesky @ layer.cholesky.T - cov) / cov.diagonal().sqrt().outer(cov.diagonal().sqrt())
    assert relative.abs().max() < 0.02
    # so z given x is a standard normal: the log-density of N(0, I) through the layer is the exact posterior's
    theta_new, x_new, _, _ = _linear_gaussian(1000, seed=1)
    z, ladj = layer(theta_new, x_new)
    mine = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1) + ladj
    exact = torch.distributions.MultivariateNormal(x_new @ gain.T, cov).log_prob(theta_new)
    # 21 statistics each off by about 1/sqrt(n) = 0.002 in whitened units: a few 0.01 nats per point
    assert (mine - exact).abs().mean() < 0.03 and (mine - exact).abs().max() < 0.15


def test_regression_whitening_is_a_bijection_with_its_log_determinant():
    gen = torch.Generator().manual_seed(3)
    context = torch.randn(80, 4, generator=gen, dtype=DTYPE)
    theta = context[:, :2] @ torch.randn(2, 3, generator=gen, dtype=DTYPE)
    theta = theta + torch.randn(80, 3, generator=gen, dtype=DTYPE)
    layer = RegressionWhitening.from_data(theta, context)
    report = check_bijector(layer, torch.randn(6, 3, generator=gen) * 3, torch.randn(6, 4, generator=gen))
    assert report.passed
    # batched samples (n, B, D) against contexts (B, C), as a conditional flow samples them
    z = torch.randn(7, 2, 3, dtype=DTYPE)
    back, ladj = layer.double().inverse(z, context[:2])
    assert back.shape == (7, 2, 3) and ladj.shape == (7, 2)
    assert torch.allclose(layer.double()(back, context[:2])[0], z, atol=1e-10)
    assert math.isclose(float(ladj[0, 0]), float(layer.cholesky.diagonal().log().sum()), rel_tol=1e-12)


def test_regression_whitening_saves_and_loads(tmp_path):
    theta, x, _, _ = _linear_gaussian(500)
    chain = Chain(RegressionWhitening.from_data(theta, x))
    save(chain, tmp_path / "layer")
    loaded = load(tmp_path / "layer")
    assert torch.equal(chain(theta[:4].float(), x[:4].float())[0], loaded(theta[:4].float(), x[:4].float())[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(matrix=[[1.0]], offset=[0.0, 0.0], cholesky=[[1.0, 0.0], [0.0, 1.0]]), "matrix must be 2 rows"),
        (dict(matrix=[[1.0], [1.0]], offset=[0.0, 0.0], cholesky=[[1.0]]), "cholesky must be 2 x 2"),
        (dict(matrix=[[1.0], [1.0]], offset=[0.0, 0.0], cholesky=[[1.0, 0.0], [0.0, 0.0]]), "must be positive"),
        (dict(matrix=[[math.nan], [1.0]], offset=[0.0, 0.0], cholesky=[[1.0, 0.0], [0.0, 1.0]]), "non-finite"),
    ],
)
def test_regression_whitening_refuses_bad_statistics(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RegressionWhitening(**kwargs)


def test_regression_whitening_refuses_bad_data_and_a_missing_context():
    with pytest.raises(ValueError, match="cannot fit a regression"):
        RegressionWhitening.from_data(torch.randn(4, 2), torch.randn(4, 3))
    with pytest.raises(ValueError, match="rows"):
        RegressionWhitening.from_data(torch.randn(40, 2), torch.randn(30, 3))
    with pytest.raises(ValueError, match="finite"):
        RegressionWhitening.from_data(torch.full((40, 2), math.nan), torch.randn(40, 3))
    layer = RegressionWhitening.from_data(torch.randn(40, 2), torch.randn(40, 3))
    with pytest.raises(ValueError, match="context"):
        layer(torch.randn(3, 2))
