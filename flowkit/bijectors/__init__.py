"""Bijectors: invertible maps with log-determinants, data -> latent in the forward direction."""

from ..domains import Box, Circle, Domain, Interval, Product, Real, Sphere
from .activations import Logit, SmoothLeakyReLU, SmoothTanh
from .autoregressive import MaskedAffineAutoregressive, MaskedAutoregressive, MaskedSplineAutoregressive
from .base import Bijector, Chain, Invert, Reshape
from .block_autoregressive import BlockNeuralAutoregressive
from .continuous import ContinuousFlow
from .coupling import AffineCoupling, Coupling
from .elementwise import ElementwiseTransformer
from .householder import Householder
from .image import Conv1x1, EIWShuffle, FactorOut, Squeeze
from .internal import InternalCoordinates
from .linear import Linear, LULinear
from .masked_coupling import MaskedCoupling
from .normalization import ActNorm
from .permutations import Permutation, Reverse
from .planar import Planar, Radial
from .regression import RegressionWhitening
from .residual import Residual
from .sphere import ConvexDoubleMoebius, ConvexMoebius, DoubleMoebius, Moebius, RigidCoupling
from .spline_coupling import CircularSplineCoupling, SplineCoupling
from .standardization import Standardization
from .support import BoundedSupport, support_bounds
from .sylvester import Sylvester
from .tails import MarginalTailCDF, TailLU
from .transformer_autoregressive import TransformerAutoregressive

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
    "RegressionWhitening",
    "TailLU",
    "MarginalTailCDF",
    "Coupling",
    "AffineCoupling",
    "MaskedCoupling",
    "Squeeze",
    "Conv1x1",
    "FactorOut",
    "EIWShuffle",
    "SplineCoupling",
    "CircularSplineCoupling",
    "MaskedAutoregressive",
    "MaskedAffineAutoregressive",
    "MaskedSplineAutoregressive",
    "BlockNeuralAutoregressive",
    "Moebius",
    "DoubleMoebius",
    "ConvexMoebius",
    "ConvexDoubleMoebius",
    "RigidCoupling",
    "InternalCoordinates",
    "Residual",
    "Planar",
    "Radial",
    "Householder",
    "Sylvester",
    "ElementwiseTransformer",
    "BoundedSupport",
    "support_bounds",
    "ContinuousFlow",
    "TransformerAutoregressive",
    "Domain",
    "Real",
    "Interval",
    "Box",
    "Circle",
    "Sphere",
    "Product",
]
