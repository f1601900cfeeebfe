"""Rigid-body targets: the matrix-Fisher normaliser, the octupole's quadrature, exact samples, dipoles."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from flowkit.distributions import RigidBase, matrix_to_quaternion
from flowkit.targets.rigid import (
    MatrixFisher,
    Octupole,
    RigidDipoles,
    WithAuxiliaries,
    bingham_matrix,
    matrix_fisher_log_normalizer,
)

N_HAAR = 200_000


@pytest.fixture(scope="module")
def haar():
    rotations = torch.from_numpy(Rotation.random(N_HAAR, random_state=7).as_matrix())
    return rotations, matrix_to_quaternion(rotations)


def _mean_and_error(values):
    return values.mean().item(), values.std().item() / math.sqrt(values.numel())


FISHER = [
    np.diag([1.0, 0.5, -0.3]),  # a reflection: the proper SVD flips s3
    np.random.default_rng(0).normal(size=(3, 3)) * 1.5,
    np.diag([3.0, 2.0, 1.0]),
    np.array([[0.0, 2.0, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.5]]),
]


@pytest.mark.parametrize("index", range(len(FISHER)))
def test_matrix_fisher_normaliser_agrees_with_haar_monte_carlo(haar, index):
    rotations, _ = haar
    f = FISHER[index]
    c = math.exp(matrix_fisher_log_normalizer(f))
    mean, err = _mean_and_error(torch.einsum("nij,ij->n", rotations, torch.from_numpy(f)).exp())
    assert abs(mean - c) < 3 * err, (mean, c, err)


def test_matrix_fisher_normaliser_limits():
    assert matrix_fisher_log_normalizer(np.zeros((3, 3))) == pytest.approx(0.0, abs=1e-12)
    # F = s I: c = E[exp(s tr R)], tr R = 1 + 2 cos(angle), angle density (1 - cos)/pi on [0, pi]
    s = 20.0
    angle = np.linspace(0, np.pi, 200_001)
    integrand = np.exp(s * (1 + 2 * np.cos(angle)) - 3 * s) * (1 - np.cos(angle)) / np.pi
    expected = 3 * s + math.log(np.trapezoid(integrand, angle))
    assert matrix_fisher_log_normalizer(s * np.eye(3)) == pytest.approx(expected, abs=1e-6)


def test_trace_is_the_bingham_quadratic_form(haar):
    rotations, q = haar
    f = FISHER[1]
    a = torch.from_numpy(bingham_matrix(f))
    torch.testing.assert_close(
        torch.einsum("ni,ij,nj->n", q, a, q), torch.einsum("nij,ij->n", rotations, torch.from_numpy(f))
    )


def test_matrix_fisher_log_z_on_s3_and_force():
    target = MatrixFisher(FISHER[1].tolist()).double()
    assert target.log_Z == pytest.approx(target.log_normalizer + math.log(2 * math.pi**2))
    q = torch.nn.functional.normalize(torch.randn(8, 4, dtype=torch.float64), dim=-1)
    leaf = q.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(target.energy(leaf).sum(), leaf)
    torch.testing.assert_close(target.force(q), -grad)


@pytest.mark.parametrize(
    "build",
    [
        lambda f: MatrixFisher(f).double(),
        lambda f: MatrixFisher(f).float().double(),  # a round trip through float32 keeps the exact matrix
        lambda f: MatrixFisher(f),  # float32 target, float64 input: the energy in the input's dtype
    ],
)
def test_matrix_fisher_float64_energy_is_exact_against_log_z(haar, build):
    rotations, q = haar
    f = FISHER[1]  # entries that float32 cannot hold
    target = build(f.tolist())
    # log p(q) against the area of S^3: tr(F^T R(q)) - log c(F) - log(2 pi^2), all in float64 from F
    exact = np.einsum("nij,ij->n", rotations.numpy()[:2000], f) - matrix_fisher_log_normalizer(f)
    exact = exact - math.log(2 * math.pi**2)
    log_p = target.log_prob(q[:2000])
    assert log_p.dtype == torch.float64
    np.testing.assert_allclose(log_p.numpy(), exact, rtol=0, atol=1e-12)
    np.testing.assert_allclose(target.force(q[:5]).numpy(), 2 * q[:5].numpy() @ bingham_matrix(f), rtol=0, atol=1e-12)


def test_matrix_fisher_exact_samples_match_importance_weighted_moments():
    target = MatrixFisher([[10.0, 1.0, 0.0], [0.0, 9.0, -1.0], [0.5, 0.0, 11.0]]).double()
    x = target.sample(40_000, generator=torch.Generator().manual_seed(0))
    assert (x.norm(dim=-1) - 1).abs().max() < 1e-12
    u = torch.nn.functional.normalize(torch.randn(400_000, 4, dtype=torch.float64), dim=-1)
    w = torch.softmax(-target.energy(u), 0)
    second = torch.einsum("ni,nj->ij", x, x) / len(x)
    reference = torch.einsum("n,ni,nj->ij", w, u, u)
    torch.testing.assert_close(second, reference, atol=0.01, rtol=0)
    mean_energy, err = _mean_and_error(target.energy(x))
    assert abs(mean_energy - (w * target.energy(u)).sum().item()) < 4 * err + 0.05


@pytest.mark.parametrize("kappa", [1.0, 4.0])
def test_octupole_quadrature_agrees_with_haar_monte_carlo(haar, kappa):
    _, q = haar
    target = Octupole(kappa).double()
    mean, err = _mean_and_error((-target.energy(q)).exp())
    assert abs(mean - math.exp(target.log_normalizer)) < 3 * err


def _euler_zyz_log_integral(kappa, n_beta=48, n_angle=64):
    """Log of the Haar integral of exp(-u) by quadrature over all three ZYZ Euler angles."""
    cos_b, w_b = np.polynomial.legendre.leggauss(n_beta)
    angles = 2 * np.pi * np.arange(n_angle) / n_angle
    a, b, c = np.meshgrid(angles, np.arccos(cos_b), angles, indexing="ij")
    rotations = Rotation.from_euler("ZYZ", np.stack([a.ravel(), b.ravel(), c.ravel()], -1)).as_matrix()
    q = matrix_to_quaternion(torch.from_numpy(rotations))
    values = (-Octupole(kappa, points=16).double().energy(q)).exp().reshape(n_angle, n_beta, n_angle).numpy()
    # Haar: sin(beta) d alpha d beta d gamma / 8 pi^2, and sin(beta) d beta = d cos(beta)
    integral = (values * w_b[None, :, None]).sum() * (2 * np.pi / n_angle) ** 2 / (8 * np.pi**2)
    return math.log(integral)


def test_octupole_quadrature_agrees_with_three_euler_angles_at_kappa_8():
    assert Octupole(8.0).log_normalizer == pytest.approx(_euler_zyz_log_integral(8.0), abs=1e-6)
    assert Octupole(8.0, points=200).log_normalizer == pytest.approx(
        Octupole(8.0, points=400).log_normalizer, abs=1e-10
    )


def test_octupole_has_four_modes_of_equal_mass(haar):
    _, q = haar
    target = Octupole(8.0).double()
    w = torch.softmax(-target.energy(q), 0)
    mass = torch.zeros(4, dtype=torch.float64).index_add_(0, target.mode(q), w)
    ess = 1 / (w.square().sum().item())
    assert torch.allclose(mass, torch.full((4,), 0.25, dtype=torch.float64), atol=4 * math.sqrt(0.25 / ess * 0.75))
    # the lowest energy: one bond along the field, -kappa (1 - 3/27)
    bond_up = torch.tensor(Rotation.align_vectors([[0, 1, 0]], [np.ones(3) / math.sqrt(3)])[0].as_quat())
    q0 = bond_up[[3, 0, 1, 2]].unsqueeze(0)
    assert target.energy(q0).item() == pytest.approx(-8.0 * (1 - 3 / 27))
    assert target.energy(q).min().item() >= -8.0 * (1 - 3 / 27) - 1e-9


def test_energies_are_antipodally_symmetric(haar):
    _, q = haar
    for target in (MatrixFisher(FISHER[1].tolist()).double(), Octupole(3.0).double()):
        torch.testing.assert_close(target.energy(-q[:100]), target.energy(q[:100]))


def test_with_auxiliaries():
    target = MatrixFisher(FISHER[2].tolist()).double()
    joint = WithAuxiliaries(target, 3)
    assert joint.event_shape == (7,) and joint.log_Z == target.log_Z
    x = joint.sample(5)
    expected = target.energy(x[:, :4]) + 0.5 * x[:, 4:].square().sum(-1) + 1.5 * math.log(2 * math.pi)
    torch.testing.assert_close(joint.energy(x), expected)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(joint.energy(leaf).sum(), leaf)
    torch.testing.assert_close(joint.force(x), -grad)


def test_dipoles_symmetries():
    target = RigidDipoles(n=3, box=3.0).double()
    base = RigidBase(target.segments).double()
    x = base.sample((64,))
    u = target.energy(x)
    assert torch.isfinite(u).all()
    rows = x.unflatten(-1, (3, 7))
    flipped = rows.clone()
    flipped[:, 1, :4] *= -1  # q -> -q: the same rotation
    torch.testing.assert_close(target.energy(flipped.flatten(-2)), u)
    shifted = rows.clone()  # translate every body by the same vector, wrapped into the box
    shifted[..., 4:] = (
        torch.remainder(shifted[..., 4:] + torch.tensor([0.7, -2.1, 1.3], dtype=torch.float64) + math.pi, 2 * math.pi)
        - math.pi
    )
    torch.testing.assert_close(target.energy(shifted.flatten(-2)), u)
    swapped = rows[:, [2, 0, 1]]  # identical bodies
    torch.testing.assert_close(target.energy(swapped.flatten(-2)), u)
    one = RigidDipoles(n=1, field=2.0).double()
    up = torch.tensor([[1.0, 0, 0, 0, 0.1, 0.2, 0.3]], dtype=torch.float64)
    assert one.energy(up).item() == pytest.approx(-2.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="3 x 3"):
        MatrixFisher([[1.0, 2.0]])
    with pytest.raises(ValueError, match="axis"):
        Octupole(1.0, axis=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="kappa"):
        Octupole(-1.0)
    with pytest.raises(ValueError, match="box"):
        RigidDipoles(box=0.0)


def test_metropolis_on_s3_matches_exact_matrix_fisher_samples():
    from flowkit.domains import Sphere
    from flowkit.sampling import metropolis

    target = MatrixFisher([[3.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, -1.0]]).double()
    gen = torch.Generator().manual_seed(0)
    x0 = torch.nn.functional.normalize(torch.randn(100, 4, generator=gen, dtype=torch.float64), dim=-1)
    states, acceptance = metropolis(target, x0, 1500, 0.3, Sphere(4), thin=10, generator=gen)
    assert states.shape == (150, 100, 4) and 0.2 < acceptance < 0.9
    chain = states[30:].reshape(-1, 4)
    exact = target.sample(100_000, generator=gen)
    second = torch.einsum("ni,nj->ij", chain, chain) / len(chain)
    torch.testing.assert_close(second, torch.einsum("ni,nj->ij", exact, exact) / len(exact), atol=0.01, rtol=0)


def test_domain_proposals_stay_on_the_domain_and_are_symmetric():
    from flowkit.domains import Circle, Interval, Product, Real, Sphere

    gen = torch.Generator().manual_seed(1)
    body = Product(Sphere(4), Circle(), Circle(), Circle())
    x = body.sample((1000, 14), generator=gen)
    y = body.propose(x, 2.0, gen)
    assert bool(body.contains(y).all())
    z = Interval(0.0, 1.0).propose(torch.full((20_000,), 0.05, dtype=torch.float64), 0.3, gen)
    assert bool(((z >= 0) & (z <= 1)).all())
    # symmetric on the circle: the wrapped step from 0 has a density even in the step
    steps = Circle().propose(torch.zeros(50_000, dtype=torch.float64), 1.0, gen)
    assert abs(steps.mean().item()) < 0.02
    assert Real().propose(torch.zeros(3), 1.0).shape == (3,)


def test_metropolis_on_a_dipole_in_a_field_gives_the_langevin_function():
    """One dipole: E[mu_z] = coth(h) - 1/h, sampled over S^3 x T^3 with the Product domain's moves."""
    from flowkit.distributions import rigid_domain
    from flowkit.sampling import metropolis

    h = 2.0
    target = RigidDipoles(n=1, field=h).double()
    gen = torch.Generator().manual_seed(2)
    x0 = RigidBase(target.segments).double().sample((200,))
    states, _ = metropolis(target, x0, 1000, 0.4, rigid_domain(target.segments), thin=10, generator=gen)
    mu_z = target.dipoles(states[20:].reshape(-1, 7))[..., 0, 2]
    per_chain = mu_z.reshape(-1, 200).mean(0)
    err = per_chain.std().item() / math.sqrt(200)
    assert abs(mu_z.mean().item() - (1 / math.tanh(h) - 1 / h)) < 4 * err
