"""Configurations of a molecule as files a chemist opens: PDB and DCD, written with OpenMM's own writers.

Flowkit's molecular configurations are flattened Cartesian positions in nm, `(n, 3 n_atoms)`
(`(x_0, y_0, z_0, x_1, ...)`, the convention of [`OpenMMEnergy`][flowkit.targets.OpenMMEnergy]).
[`write_pdb`][flowkit.targets.trajectory.write_pdb] writes a topology with one frame (`openmm.app.PDBFile`),
[`write_dcd`][flowkit.targets.trajectory.write_dcd] a trajectory (`openmm.app.DCDFile`); both read back in VMD,
PyMOL, MDTraj or OpenMM. Resample reweighted samples first
([`flowkit.sampling.resample`][flowkit.sampling.resample]) for a trajectory of equally weighted configurations.

OpenMM is an optional dependency: `pip install 'flowkit[md]'`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .openmm import require_openmm

__all__ = ["write_pdb", "write_dcd"]


def _frames(positions: Any, topology: Any, where: str) -> np.ndarray:
    """Positions `(n, 3 n_atoms)` or `(n, n_atoms, 3)` (or one frame) in nm as `(n, n_atoms, 3)` float64."""
    if isinstance(positions, torch.Tensor):
        positions = positions.detach().cpu().double().numpy()
    x = np.asarray(positions, dtype=np.float64)
    atoms = int(topology.getNumAtoms())
    if x.ndim >= 1 and x.shape[-1] == 3 * atoms and x.ndim <= 2:
        x = x.reshape(-1, atoms, 3)
    elif x.ndim == 2 and x.shape == (atoms, 3):
        x = x[None]
    if x.ndim != 3 or x.shape[1:] != (atoms, 3) or x.shape[0] < 1:
        raise ValueError(
            f"{where}: positions must be (frames, {3 * atoms}) or (frames, {atoms}, 3) in nm for a topology "
            f"of {atoms} atoms, got shape {np.shape(positions)}"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{where}: positions contain {int((~np.isfinite(x)).sum())} non-finite value(s)")
    return x


#: The range of a PDB coordinate field (`%8.3f`, angstrom): wider values run into the next column.
PDB_RANGE_ANGSTROM = (-999.999, 9999.999)


def _check_pdb_columns(frame: np.ndarray, topology: Any) -> None:
    """Raise `ValueError` naming the first atom whose coordinates, in angstrom to 3 decimals, do not fit `%8.3f`."""
    low, high = PDB_RANGE_ANGSTROM
    angstrom = np.round(frame * 10.0, 3)
    outside = (angstrom < low) | (angstrom > high)
    if not outside.any():
        return
    i, axis = (int(k) for k in np.argwhere(outside)[0])
    atom = list(topology.atoms())[i]
    residue = atom.residue
    raise ValueError(
        f"write_pdb: atom {i + 1} ({atom.name} of {residue.name} {residue.id}) has {'xyz'[axis]} = "
        f"{frame[i, axis]:.6g} nm = {frame[i, axis] * 10:.6g} angstrom, outside the PDB coordinate columns "
        f"(%8.3f angstrom: {low} to {high}, i.e. {low / 10:.4f} to {high / 10:.4f} nm); {int(outside.any(1).sum())} "
        "atom(s) are out of range. Positions are in nm (angstrom given as nm are 10 times too large); "
        "write such frames with write_dcd or as PDBx/mmCIF (openmm.app.PDBxFile)"
    )


def write_pdb(path: str | os.PathLike, topology: Any, positions: Any) -> None:
    """Write a PDB file of the topology with one frame, with `openmm.app.PDBFile`.

    Arguments:
        path: the file to write.
        topology: an `openmm.app.Topology` (e.g. [`AlanineDipeptide.topology`][flowkit.targets.AlanineDipeptide]).
        positions: one frame in nm, `(3 n_atoms,)` or `(n_atoms, 3)`; of several frames `(n, 3 n_atoms)`, the first.

    Raises:
        ValueError: when OpenMM is missing, the positions do not fit the topology or are not finite, or a
            coordinate does not fit the PDB's `%8.3f` angstrom columns (`PDB_RANGE_ANGSTROM`), naming the atom.
    """
    mm = require_openmm()
    frame = _frames(positions, topology, "write_pdb")[0]
    _check_pdb_columns(frame, topology)
    with open(path, "w") as file:
        mm.app.PDBFile.writeFile(topology, mm.unit.Quantity(frame, mm.unit.nanometer), file)


def write_dcd(path: str | os.PathLike, topology: Any, positions: Any, *, interval: float = 1.0) -> None:
    """Write the frames as a DCD trajectory, with `openmm.app.DCDFile`.

    Arguments:
        path: the file to write.
        topology: an `openmm.app.Topology` with the atoms of the frames (a periodic one gets its box
            written with every frame).
        positions: frames in nm, `(n, 3 n_atoms)` or `(n, n_atoms, 3)`.
        interval: time between frames in ps, recorded in the header (samples of a flow have no time: 1 ps).

    Raises:
        ValueError: when OpenMM is missing, or the positions do not fit the topology or are not finite.
    """
    mm = require_openmm()
    frames = _frames(positions, topology, "write_dcd")
    if not interval > 0:
        raise ValueError(f"write_dcd: interval must be positive, got {interval}")
    with open(path, "wb") as file:
        dcd = mm.app.DCDFile(file, topology, interval * mm.unit.picosecond)
        for frame in frames:
            dcd.writeModel(mm.unit.Quantity(frame, mm.unit.nanometer))
