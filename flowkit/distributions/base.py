"""Base distributions: `nn.Module` s with `log_prob`, `sample` and `rsample`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._config import Configurable
from ..utils import TensorAnchor

__all__ = ["Distribution", "as_shape"]


def as_shape(shape: int | Sequence[int] | torch.Size) -> torch.Size:
    """Turn an int or a sequence into a `torch.Size` (refusing negative sizes)."""
    size = torch.Size((shape,) if isinstance(shape, int) else tuple(shape))
    if any(n < 0 for n in size):
        raise ValueError(f"a shape cannot have negative sizes, got {tuple(size)}")
    return size


class Distribution(Configurable, TensorAnchor):
    """Base of flowkit's distributions over events of shape `event_shape`.

    Subclasses implement [`log_prob`][flowkit.distributions.base.Distribution.log_prob] (summed over the event
    dimensions)
    and [`rsample`][flowkit.distributions.base.Distribution.rsample]. Parameters and buffers follow `.to()`: a
    parameter-free distribution keeps a zero-size buffer to know its dtype and device.
    """

    _flowkit_register = False
    event_shape: torch.Size

    def log_prob(self, x: Tensor) -> Tensor:
        """Log density of events `x` of shape `(..., *event_shape)`; returns the batch shape."""
        raise NotImplementedError

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        """Reparameterised sample of shape `(*shape, *event_shape)`."""
        raise NotImplementedError

    @torch.no_grad()
    def sample(self, shape: int | Sequence[int] = ()) -> Tensor:
        """Sample of shape `(*shape, *event_shape)` without gradients."""
        return self.rsample(shape)

    def forward(self, x: Tensor) -> Tensor:
        return self.log_prob(x)
