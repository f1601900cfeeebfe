"""Lattice field theory: observables with blocked-jackknife errors, Z2 symmetry and staggered fermions.

`observables` (magnetisation, two-point functions, jackknife, `measure`), `equivariance` (Z2) and `fermions`
(the staggered Dirac operator, conjugate gradient, fermion observables).
"""

from .equivariance import Z2Equivariant, z2_reflection
from .fermions import (
    StaggeredDirac,
    chiral_condensate,
    conjugate_gradient,
    fermion_correlator,
    free_spectrum,
    measure_fermions,
    parity_sign,
    pion_correlator,
    staggered_phases,
)
from .observables import effective_mass, jackknife, magnetization, measure, two_point, zero_momentum_correlator

__all__ = [
    "magnetization",
    "two_point",
    "zero_momentum_correlator",
    "effective_mass",
    "jackknife",
    "measure",
    "z2_reflection",
    "Z2Equivariant",
    "StaggeredDirac",
    "staggered_phases",
    "parity_sign",
    "free_spectrum",
    "conjugate_gradient",
    "chiral_condensate",
    "fermion_correlator",
    "pion_correlator",
    "measure_fermions",
]
