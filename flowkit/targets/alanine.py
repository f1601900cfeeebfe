r"""Alanine dipeptide (ACE-ALA-NME, 22 atoms), the standard test molecule of Boltzmann generators.

The AMBER ff96 topology and coordinates ship with flowkit (from the MIT-licensed
`openmmtools` package, see `flowkit/data/files/alanine_dipeptide/SOURCE.md`), and the
system is built with OpenMM without constraints (a constrained system has no density in
Cartesian space), in vacuum or in OBC1 implicit solvent. Atom indices (0-based) follow
the shipped PDB file: `4` C and `6` N of the first peptide bond, `8` the alpha carbon,
`10` the beta carbon, `14` C and `16` N of the second peptide bond. The backbone
dihedrals are $\phi$ = (4, 6, 8, 14) and $\psi$ = (6, 8, 14, 16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..bijectors.internal import InternalCoordinates, dihedral
from .openmm import OpenMMEnergy, require_openmm

__all__ = [
    "AlanineDipeptide",
    "alanine_dipeptide_files",
    "alanine_dipeptide_positions",
    "alanine_internal_coordinates",
    "backbone_dihedrals",
    "ALANINE_Z_MATRIX",
    "ALANINE_ANCHORS",
    "ALANINE_CIRCULAR",
    "ALANINE_CHIRAL_CENTRES",
    "PHI_ATOMS",
    "PSI_ATOMS",
]

#: Atoms of the backbone dihedral $\phi$ (C-N-CA-C).
PHI_ATOMS = (4, 6, 8, 14)
#: Atoms of the backbone dihedral $\psi$ (N-CA-C-N).
PSI_ATOMS = (6, 8, 14, 16)

#: Z-matrix of the 19 non-anchor atoms: `(atom, (bond partner, angle partner, dihedral partner))`.
#: FAB's (Midgley et al. 2023), except that HA (9) and CB (10) take their dihedral about the N-CA bond
#: relative to the anchor C (14) instead of the acetyl C (4): the handedness of the alpha carbon is then
#: a stiff coordinate (about +-2.1 rad, moving by under 0.9 rad at 1000 K) rather than the sum of two
#: circular ones, so a flow rarely draws the mirror image (D-alanine).
ALANINE_Z_MATRIX = (
    (0, (1, 4, 6)),
    (1, (4, 6, 8)),
    (2, (1, 4, 0)),
    (3, (1, 4, 0)),
    (4, (6, 8, 14)),
    (5, (4, 6, 8)),
    (7, (6, 8, 4)),
    (9, (8, 6, 14)),
    (10, (8, 6, 14)),
    (11, (10, 8, 6)),
    (12, (10, 8, 11)),
    (13, (10, 8, 11)),
    (15, (14, 8, 16)),
    (16, (14, 8, 6)),
    (17, (16, 14, 15)),
    (18, (16, 14, 8)),
    (19, (18, 16, 14)),
    (20, (18, 16, 19)),
    (21, (18, 16, 19)),
)
#: The three Cartesian anchor atoms (CA, N, C), which fix the frame.
ALANINE_ANCHORS = (8, 6, 14)
#: Rows of `ALANINE_Z_MATRIX` whose dihedrals are treated as circular:
#: the torsions that rotate freely or visit several minima (the three methyl rotations, $\phi$, $\psi$, the
#: peptide-bond torsions), those whose circular mean resultant length is below 0.9 in flowkit's own MD at
#: 1000 K and that reach the far side of the circle, and the out-of-plane dihedral of the amide hydrogen of
#: ALA (row 6: it moves by up to 1.5 rad, 7.5 scales, and as a Gaussian coordinate it dominated the importance
#: weights). The other nine (hydrogens of a methyl group relative to each other, HA and CB, the carbonyl
#: oxygens) stay within 1.1 rad of the minimum.
ALANINE_CIRCULAR = (0, 1, 4, 5, 6, 9, 13, 14, 15, 16)
#: Chiral centre of L-alanine: `(centre, a, b, c)` = (CA, N, C, CB).
ALANINE_CHIRAL_CENTRES = ((8, 6, 14, 10),)

_FILES = Path(__file__).resolve().parent.parent / "data" / "files" / "alanine_dipeptide"
_SOLVENTS = (None, "obc")


def alanine_dipeptide_files() -> dict[str, Path]:
    """Paths of the shipped files: `prmtop`, `crd`, `pdb`, `licence` and `source`."""
    return {
        "prmtop": _FILES / "alanine-dipeptide.prmtop",
        "crd": _FILES / "alanine-dipeptide.crd",
        "pdb": _FILES / "alanine-dipeptide.pdb",
        "licence": _FILES / "LICENSE",
        "source": _FILES / "SOURCE.md",
    }


def alanine_dipeptide_positions() -> Tensor:
    """The shipped coordinates (the AMBER `.crd` file), `(66,)` float64 in nm; read without OpenMM."""
    lines = alanine_dipeptide_files()["crd"].read_text().splitlines()
    n_atoms = int(lines[1].split()[0])
    values = np.array([float(v) for line in lines[2:] for v in line.split()][: 3 * n_atoms])
    return torch.from_numpy(values / 10.0)  # angstrom -> nm


def backbone_dihedrals(x: Tensor) -> tuple[Tensor, Tensor]:
    r"""The backbone dihedrals $(\phi, \psi)$ in radians, float64, of configurations `(..., 66)`."""
    pos = x.detach().double().unflatten(-1, (22, 3))
    phi = dihedral(*(pos[..., i, :] for i in PHI_ATOMS))
    psi = dihedral(*(pos[..., i, :] for i in PSI_ATOMS))
    return phi, psi


def alanine_internal_coordinates(
    reference: Tensor | None = None,
    bond_scale: float = 0.005,
    angle_scale: float = 0.15,
    dihedral_scale: float = 0.2,
) -> InternalCoordinates:
    """The [`InternalCoordinates`][flowkit.bijectors.InternalCoordinates] of alanine dipeptide (66 -> 60 coordinates).

    The Z-matrix and anchors (CA, N, C) of FAB (Midgley et al. 2023; HA and CB changed),
    `ALANINE_Z_MATRIX`, and the 10 circular
    dihedrals of `ALANINE_CIRCULAR`.

    Arguments:
        reference: the frame to normalise around, `(66,)` in nm (a minimum-energy frame,
            e.g. [`AlanineDipeptide.minimum`][flowkit.targets.alanine.AlanineDipeptide.minimum]);
            the shipped coordinates when None.
        bond_scale: scale of the bonds, nm.
        angle_scale: scale of the angles, rad.
        dihedral_scale: scale of the non-circular dihedrals, rad.
    """
    ref = alanine_dipeptide_positions() if reference is None else torch.as_tensor(reference, dtype=torch.float64)
    return InternalCoordinates(
        ALANINE_Z_MATRIX,
        ALANINE_ANCHORS,
        ref.flatten().tolist(),
        ALANINE_CIRCULAR,
        bond_scale,
        angle_scale,
        dihedral_scale,
    )


def _build(solvent: str | None) -> tuple[Any, Any, np.ndarray]:
    """The OpenMM system (no constraints, no cutoff), topology and shipped positions (nm, `(22, 3)`)."""
    mm = require_openmm()
    app = mm.app
    files = alanine_dipeptide_files()
    prmtop = app.AmberPrmtopFile(str(files["prmtop"]))
    inpcrd = app.AmberInpcrdFile(str(files["crd"]))
    implicit = app.OBC1 if solvent == "obc" else None
    system = prmtop.createSystem(implicitSolvent=implicit, constraints=None, nonbondedCutoff=None)
    positions = np.asarray(inpcrd.getPositions(asNumpy=True).value_in_unit(mm.unit.nanometer), dtype=np.float64)
    return system, prmtop.topology, positions


class AlanineDipeptide(OpenMMEnergy):
    r"""Reduced energy of alanine dipeptide (AMBER ff96) at a temperature, in vacuum or OBC1 implicit solvent.

    Configurations are the 66 Cartesian coordinates (nm) of the 22 atoms, flattened
    `(x_0, y_0, z_0, x_1, ...)`; see [`OpenMMEnergy`][flowkit.targets.OpenMMEnergy] for the
    energy, its forces and the damping of huge energies. The system has no constraints.

    Arguments:
        temperature: temperature in kelvin.
        solvent: `None` (vacuum) or `"obc"` (OBC1 generalised Born implicit solvent).
        platform: OpenMM platform; by default `"Reference"` in vacuum and `"CPU"` in solvent
            (the faster one for each, measured on 2 cores).
        energy_cut: reduced energy above which energies are damped.
        energy_max: reduced energy at which they are capped.

    Attributes:
        positions: the shipped coordinates, `(66,)` float64 in nm.
        topology: the OpenMM topology (atom names, residues).

    Examples:
        >>> import flowkit
        >>> target = flowkit.targets.AlanineDipeptide(temperature=300.0)
        >>> round(float(target.energy(target.positions)), 2)  # reduced units at 300 K
        -35.32
    """

    def __init__(
        self,
        temperature: float = 300.0,
        solvent: str | None = None,
        platform: str | None = None,
        energy_cut: float = 1e8,
        energy_max: float = 1e20,
    ) -> None:
        if solvent not in _SOLVENTS:
            raise ValueError(f"AlanineDipeptide: solvent must be None (vacuum) or 'obc', got {solvent!r}")
        system, topology, positions = _build(solvent)
        if platform is None:
            platform = "Reference" if solvent is None else "CPU"
        super().__init__(system, temperature, platform, energy_cut, energy_max)
        self.solvent = solvent
        self.topology = topology
        self.positions = torch.from_numpy(positions.reshape(-1))

    def minimum(self, tolerance: float = 1e-3) -> Tensor:
        """A minimum-energy configuration: OpenMM's local minimiser from the shipped coordinates, `(66,)` float64.

        Arguments:
            tolerance: the minimiser's tolerance on the root-mean-square force, kJ/mol/nm.
        """
        mm = require_openmm()
        context = self.context
        context.setPositions(self.positions.reshape(-1, 3).numpy())
        mm.LocalEnergyMinimizer.minimize(context, tolerance, 0)
        state = context.getState(getPositions=True)
        pos = state.getPositions(asNumpy=True).value_in_unit(mm.unit.nanometer)
        return torch.as_tensor(np.asarray(pos, dtype=np.float64).reshape(-1))

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, solvent={self.solvent!r}, platform={self.platform!r}"
