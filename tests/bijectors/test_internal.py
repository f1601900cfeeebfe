"""Z-matrix internal coordinates: round trip, exact log-Jacobian, rigid invariance, dihedral convention, chirality."""

import math

import pytest
import torch

from flowkit.bijectors import InternalCoordinates
from flowkit.bijectors.internal import bond_angle, dihedral, same_chirality
from flowkit.targets.alanine import (
    ALANINE_ANCHORS,
    ALANINE_CHIRAL_CENTRES,
    ALANINE_CIRCULAR,
    ALANINE_Z_MATRIX,
    PHI_ATOMS,
    alanine_dipeptide_positions,
    alanine_internal_coordinates,
)
from flowkit.testing import check_bijector


def _random_rotation(gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


def _frames(n: int, scale: float = 0.01, seed: int = 0) -> torch.Tensor:
    """Perturbed shipped frames, each rotated and translated at random."""
    gen = torch.Generator().manual_seed(seed)
    ref = alanine_dipeptide_positions()
    x = ref + scale * torch.randn(n, 66, generator=gen, dtype=torch.float64)
    out = []
    for frame in x:
        rot = _random_rotation(gen)
        shift = torch.randn(3, generator=gen, dtype=torch.float64)
        out.append((frame.reshape(22, 3) @ rot.T + shift).reshape(-1))
    return torch.stack(out)


@pytest.fixture(scope="module")
def ic():
    # built in float64, so that its reference frame is not rounded to float32 first
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return alanine_internal_coordinates(alanine_dipeptide_positions())
    finally:
        torch.set_default_dtype(default)


def test_shapes_and_circular_indices(ic):
    assert ic.event_shape == (66,) and ic.latent_shape == (60,)
    assert len(ic.circular_idx) == len(ALANINE_CIRCULAR) == 10
    assert ic.circular_idx == [41 + k for k in ALANINE_CIRCULAR]
    z, _ = ic(ic.reference[None])
    assert float(z.abs().max()) < 1e-12  # the reference frame is the latent origin


def test_round_trip_and_rigid_invariance(ic):
    x = _frames(16, scale=0.02)
    z, ladj = ic(x)
    x_back, ladj_inv = ic.inverse(z)
    # the inverse builds the molecule in the anchored frame: the same molecule moved rigidly
    torch.testing.assert_close(x_back, ic.domain.to_frame(x), atol=1e-10, rtol=0)
    torch.testing.assert_close(ladj_inv, -ladj, atol=1e-10, rtol=0)
    z_back, _ = ic(x_back)
    torch.testing.assert_close(z_back, z, atol=1e-10, rtol=0)
    # pairwise distances are kept
    d = torch.cdist(x.reshape(-1, 22, 3), x.reshape(-1, 22, 3))
    d_back = torch.cdist(x_back.reshape(-1, 22, 3), x_back.reshape(-1, 22, 3))
    torch.testing.assert_close(d_back, d, atol=1e-10, rtol=0)


def test_round_trip_from_the_latent_side(ic):
    gen = torch.Generator().manual_seed(3)
    z = 0.5 * torch.randn(8, 60, generator=gen, dtype=torch.float64)
    z[:, ic.circular_idx] = (torch.rand(8, 10, generator=gen, dtype=torch.float64) * 2 - 1) * math.pi
    x, _ = ic.inverse(z)
    torch.testing.assert_close(ic(x)[0], z, atol=1e-10, rtol=0)


def test_ladj_is_the_jacobian_on_the_free_coordinates(ic):
    x = ic.domain.to_frame(_frames(3, scale=0.03, seed=1))
    report = check_bijector(ic, x, atol=1e-10)
    assert report.passed, str(report)
    # and explicitly: the inverse Jacobian restricted to the 60 free coordinates of the frame
    free = ic.domain.free
    assert len(free) == 60
    for z in ic(x)[0]:
        jac = torch.autograd.functional.jacobian(lambda v: ic.inverse(v[None])[0][0][free], z)
        expected = torch.linalg.slogdet(jac)[1]
        torch.testing.assert_close(ic.inverse(z[None])[1][0], expected, atol=1e-9, rtol=0)


def test_dihedral_convention_matches_openmm():
    mm = pytest.importorskip("openmm")
    x = _frames(4, scale=0.05, seed=2)
    system = mm.System()
    for _ in range(22):
        system.addParticle(1.0)
    force = mm.CustomTorsionForce("theta")
    force.addTorsion(*PHI_ATOMS, [])
    system.addForce(force)
    context = mm.Context(system, mm.VerletIntegrator(0.001), mm.Platform.getPlatformByName("Reference"))
    for frame in x:
        context.setPositions(frame.reshape(22, 3).numpy())
        theta = context.getState(getEnergy=True).getPotentialEnergy()._value
        pos = frame.reshape(22, 3)
        ours = float(dihedral(*(pos[i] for i in PHI_ATOMS)))
        assert ours == pytest.approx(theta, abs=1e-6)
    p0, p1, p2 = torch.tensor([1.0, 0, 0]), torch.zeros(3), torch.tensor([0.0, 2.0, 0])
    assert float(bond_angle(p0, p1, p2)) == pytest.approx(math.pi / 2)


def test_chirality_check_catches_a_mirror_image(ic):
    x = _frames(6, scale=0.01)
    mirror = x.reshape(-1, 22, 3) * torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)
    mirror = mirror.reshape(-1, 66)
    ref = ic.reference
    assert bool(same_chirality(x, ref, ALANINE_CHIRAL_CENTRES).all())
    assert not bool(same_chirality(mirror, ref, ALANINE_CHIRAL_CENTRES).any())
    both = torch.cat([x, mirror])
    assert same_chirality(both, ref, ALANINE_CHIRAL_CENTRES).tolist() == [True] * 6 + [False] * 6
    # a mirror image has the same bonds and angles, and negated dihedrals
    q, _ = ic._raw(x)
    q_m, _ = ic._raw(mirror)
    torch.testing.assert_close(q_m[:, :41], q[:, :41])
    torch.testing.assert_close(torch.cos(q_m[:, 41:] + q[:, 41:]), torch.ones(6, 19, dtype=torch.float64))


def test_bad_z_matrices():
    ref = alanine_dipeptide_positions().tolist()
    with pytest.raises(ValueError, match="each of the 22 atoms once"):
        InternalCoordinates(ALANINE_Z_MATRIX[:-1], ALANINE_ANCHORS, ref)
    cyclic = [(0, (1, 4, 6)), (1, (0, 6, 8))] + list(ALANINE_Z_MATRIX[2:])
    with pytest.raises(ValueError, match="cycle"):
        InternalCoordinates(cyclic, ALANINE_ANCHORS, ref)
    with pytest.raises(ValueError, match="anchors"):
        InternalCoordinates(ALANINE_Z_MATRIX, (8, 8, 14), ref)
    with pytest.raises(ValueError, match="circular"):
        InternalCoordinates(ALANINE_Z_MATRIX, ALANINE_ANCHORS, ref, circular=[19])
    with pytest.raises(ValueError, match="reference"):
        InternalCoordinates(ALANINE_Z_MATRIX, ALANINE_ANCHORS, ref[:-1])
    with pytest.raises(ValueError, match="bond_scale"):
        InternalCoordinates(ALANINE_Z_MATRIX, ALANINE_ANCHORS, ref, bond_scale=0.0)
    with pytest.raises(ValueError, match="distinct partners"):
        InternalCoordinates([(0, (1, 1, 6))] + list(ALANINE_Z_MATRIX[1:]), ALANINE_ANCHORS, ref)
