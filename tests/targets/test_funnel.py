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
