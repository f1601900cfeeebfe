"""Small tensor helpers shared across flowkit."""

from __future__ import annotations

from torch import Tensor

__all__ = ["sum_event"]


def sum_event(t: Tensor, event_dims: int) -> Tensor:
    """Sum the last ``event_dims`` dimensions (an elementwise log-density or log-determinant)."""
    return t.sum(dim=tuple(range(-event_dims, 0))) if event_dims else t
