"""Base distributions: `nn.Module` s with `log_prob`, `sample` and `rsample`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._config import Configurable
from .._validation import check_tensor, module_dtype, outermost
from ..utils import TensorAnchor, as_shape  # as_shape: imported here for code that imported it from here

__all__ = ["Distribution", "as_shape"]


def _checked_log_prob(method: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Check the input of `log_prob` (shape, dtype, finiteness) at the outermost flowkit call."""

    @functools.wraps(method)
    def log_prob(self: Distribution, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        with outermost() as check:
            if check:
                where = f"{type(self).__name__}.log_prob"
                check_tensor(x, self.event_shape, name="x", dtype=module_dtype(self), where=where)
            return method(self, x, *args, **kwargs)

    log_prob._flowkit_checked = True  # type: ignore[attr-defined]
    return log_prob


class Distribution(Configurable, TensorAnchor):
    """Base of flowkit's distributions over events of shape `event_shape`.

    Subclasses implement [`log_prob`][flowkit.distributions.base.Distribution.log_prob] (summed over the event
    dimensions)
    and [`rsample`][flowkit.distributions.base.Distribution.rsample]. Parameters and buffers follow `.to()`: a
    parameter-free distribution keeps a zero-size buffer to know its dtype and device.
    The input of `log_prob` is checked at the outermost call (its shape ends in
    `event_shape`, its dtype is the distribution's, its values are finite), as a
    bijector's is.
    """

    _flowkit_register = False
    event_shape: torch.Size

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        method = cls.__dict__.get("log_prob")
        if method is not None and not getattr(method, "_flowkit_checked", False):
            cls.log_prob = _checked_log_prob(method)  # type: ignore[method-assign]

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
