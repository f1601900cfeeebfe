"""Base distributions for flows."""

from .base import Distribution
from .normal import DiagNormal, StandardNormal

__all__ = ["Distribution", "StandardNormal", "DiagNormal"]
