"""Targets against exact answers: quadrature, dense Gaussian algebra, and exact-sample statistics."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from flowkit.targets import DoubleWell, Energy, GaussianMixture, ManyWell, Phi4, Target


def test_double_well_log_Z_matches_scipy_quadrature_and_literature():
    target = DoubleWell()
    z1, _ = integrate.quad(lambda t: math.exp(-(t**4 - 6 * t**2 - 0.5 * t)), -np.inf, np.inf, epsabs=1e-10)
    assert target.log_Z == pytest.approx(math.log(z1) + 0.5 * math.log(2 * math.pi), abs=1e-8)
    assert target.log_Z == pytest.approx(10.2935, abs=1e-4)
    assert math.log(z1) == pytest.approx(math.log(11784.50927), abs=1e-8)


def test_many_well_log_Z_and_energy_decomposition():
    target = ManyWell(32)
    assert target.log_Z == pytest.approx(164.6957, abs=1e-4)
    x = torch.randn(5, 32, dtype=torch.float64)
    pairs = sum(DoubleWell().energy(x[:, 2 * i : 2 * i + 2]) for i in range(16))
    torch.testing.assert_close(target.energy(x), pairs)
    with pytest.raises(ValueError, match="even"):
        ManyWell(7)


def test_double_well_exact_samples_follow_the_density():
    target = DoubleWell()
    x = target.sample(20_000, generator=torch.Generator().manual_seed(1)).double()
    grid = np.linspace(-4, 4, 40_001)
    density = np.exp(-(grid**4 - 6 * grid**2 - 0.5 * grid))
    cdf = integrate.cumulative_trapezoid(density, grid, initial=0.0)
    cdf /= cdf[-1]
    assert stats.kstest(x[:, 0].numpy(), lambda t: np.interp(t, grid, cdf)).pvalue > 1e-3
    assert stats.kstest(x[:, 1].numpy(), "norm").pvalue > 1e-3


def test_many_well_samples_have_independent_wells():
    x = ManyWell(8).sample(4000, generator=torch.Generator().manual_seed(2))
    assert x.shape == (4000, 8)
    right = (x[:, 0::2] > 0).double()
    corr = np.corrcoef(right.T.numpy())
    assert np.abs(corr - np.eye(4)).max() < 0.1


@pytest.mark.parametrize(
    "target",
    [DoubleWell(), ManyWell(6), GaussianMixture(n_modes=5, seed=3, loc_scaling=3.0), Phi4(3, -1.0, 0.5)],
    ids=["DoubleWell", "ManyWell", "GaussianMixture", "Phi4"],
)
def test_force_is_minus_the_energy_gradient(target):
    target = target.double()
    x = torch.randn(7, *target.event_shape, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(target.energy(x).sum(), x)
    torch.testing.assert_close(target.force(x), -grad)
    energy, force = target.energy_and_force(x)
    torch.testing.assert_close(force, -grad)
    assert energy.shape == (7,)


@pytest.mark.slow
def test_gaussian_mixture_is_normalised_by_grid_quadrature():
    target = GaussianMixture().double()
    t = torch.linspace(-50, 50, 1001, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(t, t, indexing="ij"), -1).reshape(-1, 2)
    mass = torch.exp(-target.energy(grid)).sum() * (t[1] - t[0]) ** 2
    assert float(mass) == pytest.approx(1.0, abs=1e-6)
    assert target.log_Z == 0.0


def test_gaussian_mixture_means_are_deterministic_and_saved():
    a, b, c = GaussianMixture(seed=0), GaussianMixture(seed=0), GaussianMixture(seed=1)
    torch.testing.assert_close(a.means, b.means)
    assert not torch.allclose(a.means, c.means)
    assert a.means.shape == (40, 2) and float(a.means.abs().max()) <= 40
    assert "means" in a.state_dict()
    assert a.scale == pytest.approx(math.log1p(math.e), abs=1e-6)  # softplus(1)
    x = a.sample(4000, generator=torch.Generator().manual_seed(0))
    counts = a.mode_counts(x)
    assert int((counts > 0).sum()) == 40 and int(counts.sum()) >= 3990


def _phi4_reference_action(phi, m2, lam):
    """The action written site by site, as in Albergo et al. (2019)."""
    L = phi.shape[-1]
    total = torch.zeros(phi.shape[0], dtype=phi.dtype)
    for i in range(L):
        for j in range(L):
            p = phi[:, i, j]
            neighbours = (
                2 * p
                - phi[:, (i + 1) % L, j]
                - phi[:, (i - 1) % L, j]
                + 2 * p
                - phi[:, i, (j + 1) % L]
                - phi[:, i, (j - 1) % L]
            )
            total = total + p * neighbours + m2 * p**2 + lam * p**4
    return total


def test_phi4_energy_matches_the_site_by_site_action():
    target = Phi4(4, -4.0, 8.0).double()
    phi = torch.randn(6, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(target.energy(phi), _phi4_reference_action(phi, -4.0, 8.0))
    assert target.log_Z is None and not target.has_samples


def test_phi4_free_field_log_Z_and_samples_match_dense_gaussian_algebra():
    L, m2 = 4, 0.7
    target = Phi4(L, m2, 0.0).double()
    hessian = torch.autograd.functional.hessian(
        lambda f: target.energy(f.reshape(1, L, L)).sum(), torch.zeros(L * L, dtype=torch.float64)
    )
    precision = hessian  # S is quadratic: exp(-S) = exp(-phi^T H phi / 2)
    log_Z = 0.5 * L * L * math.log(2 * math.pi) - 0.5 * float(torch.logdet(precision))
    assert target.log_Z == pytest.approx(log_Z, abs=1e-10)
    x = target.sample(40_000, generator=torch.Generator().manual_seed(3)).reshape(-1, L * L)
    covariance = torch.cov(x.T)
    torch.testing.assert_close(covariance, torch.linalg.inv(precision), atol=0.02, rtol=0)
    assert float(Phi4.magnetization(x.reshape(-1, L, L)).mean()) == pytest.approx(0.0, abs=0.02)


def test_phi4_rejects_bad_parameters():
    with pytest.raises(ValueError, match="mass squared"):
        Phi4(4, -1.0, 0.0)
    with pytest.raises(ValueError, match="lam"):
        Phi4(4, 1.0, -0.1)


def test_energy_wrapper():
    target = Energy(lambda x: 0.5 * x.square().sum(-1), 3, log_Z=1.5 * math.log(2 * math.pi))
    assert isinstance(target, Target)
    x = torch.randn(4, 3)
    torch.testing.assert_close(target.force(x), -x)
    torch.testing.assert_close(target.log_prob(x), torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(-1))
    with pytest.raises(ValueError, match="exact samples"):
        target.sample(3)
    with pytest.raises(ValueError, match="one energy per configuration"):
        Energy(lambda x: x, 3).energy(x)
    with pytest.raises(ValueError, match="shape"):
        target.energy(torch.randn(4, 2))
    with pytest.raises(ValueError, match="log Z is not known"):
        Energy(lambda x: x.sum(-1), 3).log_prob(x)
    sampled = Energy(lambda x: x.sum(-1), 2, sampler=lambda n: torch.zeros(n, 2))
    assert sampled.sample((2, 3)).shape == (2, 3, 2)


@pytest.mark.parametrize(
    "target",
    [DoubleWell(), ManyWell(4), GaussianMixture(n_modes=3, seed=0), Phi4(4, 1.0, 0.0)],
    ids=["DoubleWell", "ManyWell", "GaussianMixture", "Phi4"],
)
def test_exact_samples_follow_the_target_dtype_and_device(target):
    assert target.sample(3).dtype == torch.float32
    assert target.double().sample(3).dtype == torch.float64
    x = target.to("meta").sample((2, 3))
    assert x.device.type == "meta" and x.shape == (2, 3, *target.event_shape)


# Finite but absurd points: the energy may be +inf, never NaN, and the force never NaN.
@pytest.mark.parametrize(
    "target,x",
    [
        (DoubleWell(), torch.tensor([[1e19, 0.0], [-1e19, 3.0], [1e20, 1e20], [3e38, 0.0], [-3e38, -3e38]])),
        (ManyWell(4), torch.tensor([[1e19, 0.0, -1e30, 1.0], [0.5, -1e38, 1.0, 2.0]])),
        (Phi4(4), torch.full((2, 4, 4), 1e20)),
        (Phi4(4), torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(0)) * 3e37),
        (Phi4(4, m2=1.0, lam=0.0), torch.full((1, 4, 4), -1e20)),
        (GaussianMixture(), torch.tensor([[1e20, 0.0], [-1e30, 3e38], [0.0, 0.0]])),
    ],
    ids=["double-well", "many-well", "phi4", "phi4-random", "phi4-free", "gmm"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_energy_and_force_at_extreme_points_are_not_nan(target, x, dtype):
    # The points overflow float32's squares; in float64, scaled by 1e140, they overflow float64's.
    target, x = target.to(dtype), x.to(dtype) * (1e140 if dtype == torch.float64 else 1.0)
    energy, force = target.energy(x), target.force(x)
    assert not torch.isnan(energy).any() and not torch.isnan(force).any()
    assert (energy == math.inf).any()  # the far points have infinite energy
    assert energy.dtype == force.dtype == dtype


def test_horner_forms_agree_with_autograd_forces():
    gen = torch.Generator().manual_seed(1)
    for target, x in [
        (DoubleWell(), 2 * torch.randn(6, 2, generator=gen, dtype=torch.float64)),
        (Phi4(4), torch.randn(3, 4, 4, generator=gen, dtype=torch.float64)),
        (GaussianMixture(n_modes=5), 30 * torch.randn(6, 2, generator=gen, dtype=torch.float64)),
    ]:
        target = target.double()
        torch.testing.assert_close(target.force(x), Target._force(target, x))


def test_property_energies_and_forces_are_never_nan_at_finite_points():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    targets = [DoubleWell(), ManyWell(4), Phi4(2), Phi4(2, m2=1.0, lam=0.0), GaussianMixture(n_modes=3)]
    finite = st.floats(allow_nan=False, allow_infinity=False, width=32)

    @hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
    @hypothesis.given(st.sampled_from(range(len(targets))), st.lists(finite, min_size=4, max_size=4))
    def check(index, values):
        target = targets[index]
        x = torch.tensor(values, dtype=torch.float32)[: target.event_shape.numel()].reshape(1, *target.event_shape)
        assert not torch.isnan(target.energy(x)).any() and not torch.isnan(target.force(x)).any()

    check()
