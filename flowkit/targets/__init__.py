"""Targets: unnormalised densities `exp(-u(x))` given by an energy, for training without data.

Each target has [`energy`][flowkit.targets.base.Target.energy], `event_shape`,
[`force`][flowkit.targets.base.Target.force] (`-grad u`), and, when known,
`log_Z` and exact [`sample`][flowkit.targets.base.Target.sample].
"""

from .alanine import AlanineDipeptide
from .base import Energy, Target
from .evaluate import energy_of
from .funnel import BimodalGaussian, NealFunnel
from .lattice import Phi4, Phi4Hopping
from .mixture import GaussianMixture
from .openmm import OpenMMEnergy
from .rigid import MatrixFisher, Octupole, RigidDipoles, WithAuxiliaries
from .torus import TorusDoubleWell
from .wells import DoubleWell, ManyWell
from .yukawa import YukawaJoint, YukawaStaggered

__all__ = [
    "Target",
    "Energy",
    "energy_of",
    "DoubleWell",
    "ManyWell",
    "GaussianMixture",
    "Phi4",
    "Phi4Hopping",
    "YukawaStaggered",
    "YukawaJoint",
    "OpenMMEnergy",
    "AlanineDipeptide",
    "MatrixFisher",
    "Octupole",
    "RigidDipoles",
    "WithAuxiliaries",
    "TorusDoubleWell",
    "NealFunnel",
    "BimodalGaussian",
]
