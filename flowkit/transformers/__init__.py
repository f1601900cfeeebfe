"""Elementwise monotone transformers (affine, splines, ...) for coupling and autoregressive layers."""

from .affine import Affine
from .base import Transformer
from .bernstein import Bernstein
from .gaussianization import Gaussianization
from .monotonic import MonotonicMLP, UnconstrainedMonotonic
from .smooth import SmoothMixture
from .sos import SumOfSquares
from .spline import CircularSpline, RationalQuadraticSpline, unconstrained_rqs

__all__ = [
    "Transformer",
    "Affine",
    "RationalQuadraticSpline",
    "CircularSpline",
    "unconstrained_rqs",
    "SmoothMixture",
    "MonotonicMLP",
    "UnconstrainedMonotonic",
    "Bernstein",
    "SumOfSquares",
    "Gaussianization",
]
