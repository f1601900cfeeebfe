"""Base distributions for flows."""

from .base import Distribution
from .normal import DiagNormal, StandardNormal
from .studentt import StudentT, TailAdaptiveBase

__all__ = ["Distribution", "StandardNormal", "DiagNormal", "StudentT", "TailAdaptiveBase"]
