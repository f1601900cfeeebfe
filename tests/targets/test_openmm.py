"""The OpenMM bridge and alanine dipeptide: energies against OpenMM's own, forces against finite differences."""

import copy
import sys

import numpy as np
import pytest
import torch

mm = pytest.importorskip("openmm")
from openmm import app, unit  # noqa: E402

from flowkit.targets import AlanineDipeptide, OpenMMEnergy  # noqa: E402
from flowkit.targets.alanine import alanine_dipeptide_files  # noqa: E402
from flowkit.targets.openmm import require_openmm  # noqa: E402

KJ = unit.kilojoule_per_mole


def _openmm_energies(x: torch.Tensor, implicit=None, platform="Reference") -> np.ndarray:
    """Energies (kJ/mol) from a Simulation built here straight from the shipped files, not through flowkit."""
    files = alanine_dipeptide_files()
    prmtop = app.AmberPrmtopFile(str(files["prmtop"]))
    system = prmtop.createSystem(implicitSolvent=implicit, constraints=None, nonbondedCutoff=None)
    sim = app.Simulation(
        prmtop.topology, system, mm.LangevinIntegrator(300, 1, 0.001), mm.Platform.getPlatformByName(platform)
    )
    out = []
    for pos in x.reshape(-1, 22, 3).numpy():
        sim.context.setPositions(pos * unit.nanometer)
        out.append(sim.context.getState(getEnergy=True).getPotentialEnergy().value_in_unit(KJ))
    return np.array(out)


def _frames(target: AlanineDipeptide, n: int, scale: float = 0.005) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return target.positions + scale * torch.randn(n, 66, generator=gen, dtype=torch.float64)


@pytest.fixture(scope="module")
def vacuum():
    return AlanineDipeptide(temperature=600.0)


def test_shipped_files_and_system(vacuum):
    files = alanine_dipeptide_files()
    assert all(path.is_file() for path in files.values())
    assert "MIT" in files["licence"].read_text()
    assert vacuum.event_shape == torch.Size([66]) and vacuum.n_atoms == 22
    assert vacuum.system.getNumConstraints() == 0
    kT = float(unit.MOLAR_GAS_CONSTANT_R.value_in_unit(KJ / unit.kelvin)) * 600.0
    assert vacuum.kT == pytest.approx(kT, rel=1e-12)


@pytest.mark.parametrize("solvent", [None, "obc"])
def test_energies_equal_openmm(vacuum, solvent):
    target = vacuum if solvent is None else AlanineDipeptide(temperature=600.0, solvent="obc")
    x = torch.cat([target.positions[None], _frames(target, 5)])
    u = target.energy(x)
    assert u.dtype == torch.float64 and u.shape == (6,)
    implicit = None if solvent is None else app.OBC1
    expected = _openmm_energies(x, implicit, target.platform) / target.kT
    # the CPU platform (used for OBC) sums in mixed precision: two contexts agree to about 1e-5
    tol = 1e-6 if target.platform == "Reference" else 2e-5
    np.testing.assert_allclose(u.numpy(), expected, rtol=tol, atol=tol)
    # float32 input: energies stay float64 (of the float32-rounded positions)
    u32 = target.energy(x.float())
    assert u32.dtype == torch.float64
    same = 1e-12 if target.platform == "Reference" else tol  # the CPU platform is not bit-reproducible
    np.testing.assert_allclose(u32.numpy(), target.energy(x.float().double()).numpy(), rtol=same)


def test_forces_are_minus_the_gradient(vacuum):
    x = _frames(vacuum, 2)
    force = vacuum.force(x)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(vacuum.energy(leaf).sum(), leaf)
    torch.testing.assert_close(grad, -force, rtol=1e-12, atol=1e-12)
    u, f = vacuum.energy_and_force(x)
    torch.testing.assert_close(f, force)
    torch.testing.assert_close(u, vacuum.energy(x))
    # central finite differences on a few coordinates of each frame
    h = 1e-6
    for k in (0, 17, 26, 65):
        step = torch.zeros(66, dtype=torch.float64)
        step[k] = h
        fd = (vacuum.energy(x + step) - vacuum.energy(x - step)) / (2 * h)
        torch.testing.assert_close(fd, -force[:, k], rtol=1e-5, atol=1e-4)


def test_backward_scales_by_the_upstream_gradient(vacuum):
    x = _frames(vacuum, 3).float().requires_grad_(True)
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    (vacuum.energy(x) * weights).sum().backward()
    assert x.grad.dtype == torch.float32
    expected = -(weights[:, None] * vacuum.force(x.detach().double())).float()
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5)


def test_energy_damping_above_the_cut():
    target = AlanineDipeptide(temperature=600.0, energy_cut=10.0, energy_max=1e6)
    plain = AlanineDipeptide(temperature=600.0)
    x = _frames(plain, 4, scale=0.02)
    u_raw = plain.energy(x)
    assert bool((u_raw > 10.0).all())  # these frames are strained, above the cut
    u = target.energy(x)
    torch.testing.assert_close(u, 10.0 + torch.log1p(u_raw - 10.0))
    torch.testing.assert_close(target.force(x), plain.force(x) / (1 + u_raw - 10.0)[:, None])
    # two atoms on top of each other: a finite, capped energy
    bad = plain.positions.clone().repeat(2, 1)
    bad[0, 3:6] = bad[0, 0:3]
    bad[1, 3:6] = bad[1, 0:3] + 1e-7
    u_bad = target.energy(bad)
    assert bool(torch.isfinite(u_bad).all()) and bool((u_bad <= 10.0 + np.log1p(1e6)).all())
    assert bool(torch.isfinite(target.force(bad)).all())


def test_counts_evaluations_and_copies(vacuum):
    before = vacuum.evaluations
    vacuum.energy(_frames(vacuum, 7))
    assert vacuum.evaluations == before + 7
    twin = copy.deepcopy(vacuum)
    torch.testing.assert_close(twin.energy(vacuum.positions), vacuum.energy(vacuum.positions))


def test_minimum_lowers_the_energy(vacuum):
    x_min = vacuum.minimum()
    assert float(vacuum.energy(x_min)) < float(vacuum.energy(vacuum.positions)) - 5.0
    assert float(vacuum.force(x_min).abs().max()) < 1.0


def test_bad_arguments(vacuum):
    with pytest.raises(ValueError, match="solvent"):
        AlanineDipeptide(300.0, solvent="water")
    with pytest.raises(ValueError, match="platform"):
        OpenMMEnergy(vacuum.system, 300.0, platform="CUDA")
    with pytest.raises(ValueError, match="openmm.System"):
        OpenMMEnergy("not a system", 300.0)
    with pytest.raises(ValueError, match="temperature"):
        AlanineDipeptide(-1.0)
    with pytest.raises(ValueError, match="shape"):
        vacuum.energy(torch.zeros(2, 65, dtype=torch.float64))
    with pytest.raises(ValueError, match="non-finite"):
        vacuum.energy(torch.full((66,), float("nan"), dtype=torch.float64))


def test_missing_openmm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openmm", None)
    with pytest.raises(ValueError, match=r"flowkit\[md\]"):
        require_openmm()
    with pytest.raises(ValueError, match=r"flowkit\[md\]"):
        AlanineDipeptide(300.0)
