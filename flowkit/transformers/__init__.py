"""Elementwise monotone transformers (affine, splines, ...) for coupling and autoregressive layers."""

from .affine import Affine
from .base import Transformer

__all__ = ["Transformer", "Affine"]
