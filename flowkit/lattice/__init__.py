"""Lattice field theory: observables with blocked-jackknife errors (`observables`) and Z2 symmetry (`equivariance`)."""

from .equivariance import Z2Equivariant, z2_reflection
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
]
