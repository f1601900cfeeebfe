"""Gaussian base distributions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..utils import sum_event
from .base import Distribution, as_shape

__all__ = ["StandardNormal", "DiagNormal"]

_LOG_2PI = math.log(2 * math.pi)


class StandardNormal(Distribution):
    r"""Standard normal $\mathcal N(0, I)$ over events of a given shape.

    `log p(z) = -|z|^2/2 - (n/2) log 2 pi` with `n` the number of elements of an event.

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
    """

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__()
        self.event_shape = as_shape(event_shape)

    def log_prob(self, x: Tensor) -> Tensor:
        n = len(self.event_shape)
        return sum_event(-0.5 * x.square(), n) - 0.5 * self.event_shape.numel() * _LOG_2PI

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        return torch.randn(*as_shape(shape), *self.event_shape, dtype=self.dtype, device=self.device)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


class DiagNormal(Distribution):
    """Gaussian with learnable mean `mu` and diagonal scale `sigma = exp(log_scale)`.

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        loc: initial mean, the same for every element (a scalar; constructor arguments are saved as JSON).
        scale: initial standard deviation (a positive scalar).
        trainable: whether `mu` and `log sigma` are learnt.
    """

    def __init__(
        self, event_shape: int | Sequence[int], loc: float = 0.0, scale: float = 1.0, trainable: bool = True
    ) -> None:
        super().__init__()
        self.event_shape = as_shape(event_shape)
        loc = check_number(loc, "loc", where="DiagNormal")
        scale = check_number(scale, "scale", where="DiagNormal", positive=True)
        loc_t = torch.full(self.event_shape, loc)
        log_scale_t = torch.full(self.event_shape, math.log(scale))
        if trainable:
            self.loc = nn.Parameter(loc_t)
            self.log_scale = nn.Parameter(log_scale_t)
        else:
            self.register_buffer("loc", loc_t)
            self.register_buffer("log_scale", log_scale_t)

    def log_prob(self, x: Tensor) -> Tensor:
        n = len(self.event_shape)
        u = (x - self.loc) * torch.exp(-self.log_scale)
        return sum_event(-0.5 * u.square() - self.log_scale, n) - 0.5 * self.event_shape.numel() * _LOG_2PI

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        eps = torch.randn(*as_shape(shape), *self.event_shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * torch.exp(self.log_scale)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"
