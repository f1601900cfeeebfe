"""Phi4 and Phi4Hopping: the two parametrisations give equal actions; the free field's exact log Z and propagator."""

import math

import pytest
import torch

from flowkit.targets import Phi4, Phi4Hopping


@pytest.mark.parametrize("L, m2, lam", [(8, -4.0, 8.0), (6, -4.0, 6.975), (5, 0.5, 0.0), (4, -1.0, 0.3)])
def test_the_two_parametrisations_give_equal_actions(L, m2, lam):
    mass = Phi4(L, m2, lam).double()
    kappa, lam_h = mass.hopping()
    hopping = Phi4Hopping(L, kappa, lam_h).double()
    back = hopping.mass_form()
    assert back.m2 == pytest.approx(m2, abs=1e-12) and back.lam == pytest.approx(lam, abs=1e-12)
    phi_t = 2 * torch.randn(7, L, L, dtype=torch.float64)
    torch.testing.assert_close(hopping.energy(phi_t), mass.energy(math.sqrt(kappa) * phi_t), rtol=1e-12, atol=1e-10)
    # the forces (autograd for the hopping form, closed form for the mass form) agree through the chain rule
    torch.testing.assert_close(hopping.force(phi_t), math.sqrt(kappa) * mass.force(math.sqrt(kappa) * phi_t))


def test_tutorial_point_in_hopping_form():
    assert Phi4(8, -4.0, 8.0).hopping() == pytest.approx((0.25, 0.5))


@pytest.mark.parametrize("L", [2, 3, 8])
def test_free_field_log_Z_is_the_dense_gaussian_integral(L):
    target = Phi4(L, 0.7, 0.0).double()
    V = L * L
    # dense precision matrix of the action: S = x^T A x / 2 with A = hessian
    hessian = torch.autograd.functional.hessian(lambda v: target.energy(v.reshape(L, L)), torch.zeros(V).double())
    exact = 0.5 * V * math.log(2 * math.pi) - 0.5 * float(torch.linalg.slogdet(hessian)[1])
    assert target.log_Z == pytest.approx(exact, abs=1e-9)
    # the hopping form's log Z carries the Jacobian of phi = sqrt(kappa) phi_t
    kappa, lam = target.hopping()
    assert Phi4Hopping(L, kappa, lam).log_Z == pytest.approx(exact - 0.5 * V * math.log(kappa), abs=1e-9)
    # the propagator is the inverse of that precision
    G = target.free_propagator()
    torch.testing.assert_close(G.flatten(), torch.linalg.inv(hessian)[0], rtol=1e-10, atol=1e-12)
    assert float(G.sum()) == pytest.approx(1 / (2 * 0.7))


def test_hopping_samples_are_the_rescaled_mass_samples():
    hopping = Phi4Hopping(4, 0.2, 0.0)
    x = hopping.sample(4000, generator=torch.Generator().manual_seed(1)).double()
    expected = float(hopping.mass_form().free_propagator()[0, 0]) / 0.2
    assert float(x.square().mean()) == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Phi4Hopping(4, 0.0, 0.5), "kappa"),
        (lambda: Phi4Hopping(4, -0.1, 0.5), "kappa"),
        (lambda: Phi4Hopping(4, 0.3, -1.0), "lam"),
        (lambda: Phi4Hopping(4, 0.3, 0.0), "mass squared"),  # kappa > 1/4 at lam = 0: m2 < 0, no density
        (lambda: Phi4(4, -1.0, 1.0).free_propagator(), "free field"),
    ],
)
def test_bad_couplings_are_errors(build, message):
    with pytest.raises(ValueError, match=message):
        build()
