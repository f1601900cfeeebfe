"""TorusDoubleWell: periodic energy, analytic forces, the grid normaliser against the Bessel form, exact samples."""

import math

import pytest
import torch
from scipy.special import i0

from flowkit.targets import TorusDoubleWell
from flowkit.targets.torus import torus_grid

F64 = torch.float64


@pytest.mark.parametrize(("barrier", "tilt", "stiffness", "coupling"), [(3.0, 0.5, 2.0, 1.0), (5.0, -1.0, 4.0, -0.7)])
def test_log_Z_matches_the_bessel_form(barrier, tilt, stiffness, coupling):
    target = TorusDoubleWell(barrier, tilt, stiffness, coupling)
    # Z = 2 pi e^{-k} I0(k) * int exp(-b cos^2 x - tau sin x) dx, the 1-D integral by scipy-free quadrature.
    x = -math.pi + (torch.arange(20_000, dtype=F64) + 0.5) * (2 * math.pi / 20_000)
    z1 = torch.exp(-(barrier * torch.cos(x) ** 2 + tilt * torch.sin(x))).sum() * (2 * math.pi / 20_000)
    expected = math.log(float(z1)) + math.log(2 * math.pi * math.exp(-stiffness) * i0(stiffness))
    assert abs(target.log_Z - expected) < 1e-10
    points, area = torus_grid(64)
    assert abs(float(target.log_prob(points).exp().sum()) * area - 1) < 1e-6


def test_energy_is_periodic_and_forces_are_exact():
    target = TorusDoubleWell()
    x = (torch.rand(50, 2, dtype=F64) * 2 - 1) * math.pi
    shift = 2 * math.pi * torch.tensor([[3.0, -2.0]], dtype=F64)
    torch.testing.assert_close(target.energy(x + shift), target.energy(x), atol=1e-12, rtol=0)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(target.energy(leaf).sum(), leaf)
    torch.testing.assert_close(target.force(x), -grad, atol=1e-12, rtol=0)
    h = 1e-6
    fd = torch.stack(
        [(target.energy(x + h * e) - target.energy(x - h * e)) / (2 * h) for e in torch.eye(2, dtype=F64)], -1
    )
    torch.testing.assert_close(target.force(x), -fd, atol=1e-7, rtol=0)


def test_samples_follow_the_density():
    target = TorusDoubleWell()
    gen = torch.Generator().manual_seed(0)
    x = target.sample(40_000, generator=gen).double()
    assert bool(((x >= -math.pi) & (x < math.pi)).all())
    # Mass of the right well (x1 > 0) and of the upper half (x2 > 0), against quadrature.
    points, area = torus_grid(256)
    p = target.log_prob(points).exp() * area
    for mask_of in (lambda y: y[:, 0] > 0, lambda y: y[:, 1] > 0, lambda y: (y[:, 0] > 0) & (y[:, 1] > 0)):
        expected = float(p[mask_of(points)].sum())
        observed = float(mask_of(x).double().mean())
        assert abs(observed - expected) < 4 * math.sqrt(expected * (1 - expected) / len(x))


def test_bad_arguments():
    with pytest.raises(ValueError, match="barrier"):
        TorusDoubleWell(barrier=-1.0)
    with pytest.raises(ValueError, match="grid"):
        TorusDoubleWell(grid=4)
    with pytest.raises(ValueError, match="n"):
        torus_grid(1)
