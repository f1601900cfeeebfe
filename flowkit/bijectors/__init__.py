"""Bijectors: invertible maps with log-determinants, data -> latent in the forward direction."""

from ..domains import Circle, Domain, Interval, Real, Sphere
from .activations import Logit, SmoothLeakyReLU, SmoothTanh
from .autoregressive import MaskedAffineAutoregressive, MaskedAutoregressive, MaskedSplineAutoregressive
from .base import Bijector, Chain, Invert, Reshape
from .coupling import AffineCoupling, Coupling
from .internal import InternalCoordinates
from .linear import Linear, LULinear
from .masked_coupling import MaskedCoupling
from .normalization import ActNorm
from .permutations import Permutation, Reverse
from .spline_coupling import CircularSplineCoupling, SplineCoupling
from .standardization import Standardization

__all__ = [
    "Bijector",
    "Chain",
    "Invert",
    "Reshape",
    "Permutation",
    "Reverse",
    "Linear",
    "LULinear",
    "ActNorm",
    "SmoothLeakyReLU",
    "SmoothTanh",
    "Logit",
    "Standardization",
    "Coupling",
    "AffineCoupling",
    "MaskedCoupling",
    "SplineCoupling",
    "CircularSplineCoupling",
    "MaskedAutoregressive",
    "MaskedAffineAutoregressive",
    "MaskedSplineAutoregressive",
    "InternalCoordinates",
    "Domain",
    "Real",
    "Interval",
    "Circle",
    "Sphere",
]
