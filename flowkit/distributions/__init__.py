"""Base distributions for flows."""

from ..domains import matrix_to_quaternion, quaternion_to_matrix, rigid_domain
from .base import Distribution
from .dependent import DependentNormal, EquicorrelatedGroups, Kinship
from .normal import DiagNormal, StandardNormal
from .sphere import RigidBase, SphereUniform, haar_log_prob
from .studentt import StudentT, TailAdaptiveBase

__all__ = [
    "Distribution",
    "StandardNormal",
    "DiagNormal",
    "DependentNormal",
    "Kinship",
    "EquicorrelatedGroups",
    "StudentT",
    "TailAdaptiveBase",
    "SphereUniform",
    "RigidBase",
    "rigid_domain",
    "quaternion_to_matrix",
    "matrix_to_quaternion",
    "haar_log_prob",
]
