"""Training: one fit loop and small objective classes."""

from .objective import Objective

__all__ = ["Objective"]
