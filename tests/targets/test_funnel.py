"""Neal's funnel and the two-mode Gaussian: densities against scipy, exact samples, bad arguments."""

import math

import pytest
import torch
from scipy.stats import norm

from flowkit.targets import BimodalGaussian, NealFunnel


def test_funnel_density_matches_its_hierarchical_definition():
    target = NealFunnel(4, scale=2.0).double()
    x = target.sample(50, generator=torch.Generator().manual_seed(0))
    v = x[:, 0].numpy()
    expected = norm.logpdf(v, scale=2.0) + norm.logpdf(x[:, 1:].numpy(), scale=(math.e ** (0.5 * v))[:, None]).sum(1)
    torch.testing.assert_close(target.log_prob(x), torch.from_numpy(expected))
    (grad,) = torch.autograd.grad(target.energy(x.requires_grad_()).sum(), x)
    torch.testing.assert_close(target.force(x.detach()), -grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_funnel_energy_and_force_are_never_nan_at_absurd_points(dtype):
    target = NealFunnel(4).to(dtype)
    x = torch.tensor(
        [[-1e38, 0, 0, 0], [-1e38, 1, 0, 0], [1e38, 1, 0, 0], [-200, 0, 0, 0], [-200, 1e-3, 0, 0], [-3e38, 0, 0, 0]],
        dtype=dtype,
    )
    u, force = target.energy(x), target.force(x)
    assert not torch.isnan(u).any() and not torch.isnan(force).any()
    assert (u > 0).all()  # +inf where the density underflows to 0, never -inf
    # The neck with x = 0 is representable in both dtypes: u = v^2 / 18 + 3 v / 2 + log 3 + 2 log(2 pi).
    v = -200.0
    expected = v * v / 18 + 1.5 * v + math.log(3) + 2 * math.log(2 * math.pi)
    assert math.isclose(float(u[3]), expected, rel_tol=1e-6)
    assert math.isclose(float(-force[3, 0]), v / 9 + 1.5, rel_tol=1e-6) and (force[3, 1:] == 0).all()
    points = x[u.isfinite()].clone().requires_grad_()
    (grad,) = torch.autograd.grad(target.energy(points).sum(), points)  # the graph NeuTra differentiates
    torch.testing.assert_close(-grad, target.force(points.detach()))


def test_funnel_samples_have_the_neck_distribution():
    x = NealFunnel(3).sample(40000, generator=torch.Generator().manual_seed(1))
    assert abs(float(x[:, 0].std()) - 3.0) < 0.05 and abs(float(x[:, 0].mean())) < 0.05


def test_bimodal_density_weights_and_samples():
    target = BimodalGaussian(3, separation=2.0, weight=0.3).double()
    x = target.sample(40000, generator=torch.Generator().manual_seed(2))
    mu = 2.0 / math.sqrt(3)
    plus = norm.logpdf(x.numpy() - mu).sum(1) + math.log(0.3)
    minus = norm.logpdf(x.numpy() + mu).sum(1) + math.log(0.7)
    expected = torch.logaddexp(torch.from_numpy(plus), torch.from_numpy(minus))
    torch.testing.assert_close(target.log_prob(x), expected)
    # The side of the sum's sign: the mode weight up to the overlap, Phi(-2) ~ 0.023 of each mode across.
    side = float(target.mode_of(x).double().mean())
    assert abs(side - (0.3 * norm.cdf(2.0) + 0.7 * norm.cdf(-2.0))) < 0.01


def test_bad_arguments():
    with pytest.raises(ValueError, match="dim"):
        NealFunnel(1)
    with pytest.raises(ValueError, match="weight"):
        BimodalGaussian(2, weight=1.0)
    with pytest.raises(ValueError, match="separation"):
        BimodalGaussian(2, separation=0.0)
