"""PDB and DCD files of configurations, written with OpenMM's writers, read back to file precision."""

import numpy as np
import pytest
import torch
from trajectory_files import read_dcd

pytest.importorskip("openmm")

import openmm.app  # noqa: E402
import openmm.unit  # noqa: E402

from flowkit.targets import AlanineDipeptide  # noqa: E402
from flowkit.targets.trajectory import write_dcd, write_pdb  # noqa: E402


@pytest.fixture(scope="module")
def molecule():
    target = AlanineDipeptide(1000.0)
    gen = torch.Generator().manual_seed(0)
    frames = target.positions + 0.03 * torch.randn(5, 66, dtype=torch.float64, generator=gen)
    return target, frames


def test_pdb_round_trip_through_openmm(molecule, tmp_path):
    target, frames = molecule
    write_pdb(tmp_path / "x.pdb", target.topology, frames)  # several frames: the first
    pdb = openmm.app.PDBFile(str(tmp_path / "x.pdb"))
    back = np.asarray(pdb.getPositions(asNumpy=True).value_in_unit(openmm.unit.nanometer))
    # PDB keeps 3 decimals of angstrom: 5e-5 nm
    np.testing.assert_allclose(back, frames[0].reshape(22, 3).numpy(), rtol=0, atol=5.01e-5)
    assert [a.name for a in pdb.topology.atoms()] == [a.name for a in target.topology.atoms()]
    assert [r.name for r in pdb.topology.residues()] == ["ACE", "ALA", "NME"]
    # a single frame, (22, 3) or (66,), writes the same file
    write_pdb(tmp_path / "y.pdb", target.topology, frames[0].reshape(22, 3))
    lines = lambda p: [line for line in p.read_text().splitlines() if line.startswith(("ATOM", "HETATM"))]  # noqa: E731
    assert lines(tmp_path / "y.pdb") == lines(tmp_path / "x.pdb")


def test_dcd_round_trip(molecule, tmp_path):
    target, frames = molecule
    write_dcd(tmp_path / "x.dcd", target.topology, frames)
    back = read_dcd(tmp_path / "x.dcd")  # angstrom, float32
    assert back.shape == (5, 22, 3)
    np.testing.assert_allclose(back / 10.0, frames.reshape(5, 22, 3).numpy(), rtol=1e-6, atol=1e-7)


def test_dcd_reads_in_mdtraj(molecule, tmp_path):
    mdtraj = pytest.importorskip("mdtraj")
    target, frames = molecule
    write_pdb(tmp_path / "x.pdb", target.topology, frames)
    write_dcd(tmp_path / "x.dcd", target.topology, frames)
    trajectory = mdtraj.load(str(tmp_path / "x.dcd"), top=str(tmp_path / "x.pdb"))
    assert trajectory.n_frames == 5 and trajectory.n_atoms == 22
    np.testing.assert_allclose(trajectory.xyz, frames.reshape(5, 22, 3).numpy(), rtol=1e-6, atol=1e-7)  # nm


def test_writers_bad_input(molecule, tmp_path):
    target, frames = molecule
    with pytest.raises(ValueError, match="positions must be"):
        write_dcd(tmp_path / "x.dcd", target.topology, frames[:, :63])
    with pytest.raises(ValueError, match="positions must be"):
        write_pdb(tmp_path / "x.pdb", target.topology, torch.zeros(0, 66))
    bad = frames.clone()
    bad[1, 4] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        write_dcd(tmp_path / "x.dcd", target.topology, bad)
    with pytest.raises(ValueError, match="interval"):
        write_dcd(tmp_path / "x.dcd", target.topology, frames, interval=0.0)


def test_pdb_refuses_coordinates_wider_than_its_columns(molecule, tmp_path):
    """Issue 38, defect 5: coordinates beyond %8.3f angstrom ran into the next field; now an error names the atom."""
    target, frames = molecule
    with pytest.raises(ValueError, match=r"atom 1 \(H1 of ACE 1\) .* -999.999 to 9999.999"):
        write_pdb(tmp_path / "wide.pdb", target.topology, frames[0] * 1e5)
    assert not (tmp_path / "wide.pdb").exists()
    edge = frames[0].reshape(22, 3).clone()
    edge[5, 2] = -100.0  # -1000 angstrom: one column too wide
    with pytest.raises(ValueError, match=r"atom 6 \(.*\) has z = -100 nm"):
        write_pdb(tmp_path / "edge.pdb", target.topology, edge)
    edge[5, 2] = 999.9999  # 9999.999 angstrom: the widest that fits
    write_pdb(tmp_path / "edge.pdb", target.topology, edge)
    atoms = [line for line in (tmp_path / "edge.pdb").read_text().splitlines() if line.startswith(("ATOM", "HETATM"))]
    assert atoms[5][46:54] == "9999.999"
    assert [float(line[30:38]) for line in atoms][5] == pytest.approx(10 * float(edge[5, 0]), abs=1e-3)
