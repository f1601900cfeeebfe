"""Small tensor helpers shared across flowkit."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["sum_event", "TensorAnchor"]


def sum_event(t: Tensor, event_dims: int) -> Tensor:
    """Sum the last ``event_dims`` dimensions (an elementwise log-density or log-determinant)."""
    return t.sum(dim=tuple(range(-event_dims, 0))) if event_dims else t


class TensorAnchor(nn.Module):
    """Module with a zero-size buffer, so that even a parameter-free module knows its dtype and device.

    The buffer follows ``.to()``, ``.double()`` and ``.cuda()`` like any other.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self._anchor.dtype

    @property
    def device(self) -> torch.device:
        return self._anchor.device
