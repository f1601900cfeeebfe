"""Activation normalisation with data-dependent initialisation."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..utils import as_shape
from .base import Bijector

#: The scale a channel gets when its initialising batch is constant (no spread to normalise).
_CONSTANT_CHANNEL_SCALE = 1.0

__all__ = ["ActNorm"]


class ActNorm(Bijector):
    """Per-channel affine normalisation `z = (x - m) e^{-s}` with data-dependent init.

    On the first forward call in training mode, `m` and `s` are set to the batch mean and log standard deviation, so
    that `z` starts standardised. An empty first batch is refused (`ValueError`); a channel that is constant over the
    first batch keeps scale 1 (`s = 0`) and a `RuntimeWarning` names it. `log|det dz/dx| = -n sum_c s_c` where `n` is
    the number of positions per channel (1 for vectors, `H W` for images).

    Arguments:
        event_shape: `D` or `(D,)` for vectors, `(C, H, W)` for images (then one scale per channel).

    References:
        Kingma & Dhariwal, *Glow: Generative Flow with Invertible 1x1
        Convolutions*, NeurIPS 2018 (arXiv:1807.03039).
    """

    ladj_is_constant = True

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__()
        shape = tuple(as_shape(event_shape))
        if not shape or 0 in shape:
            raise ValueError(f"ActNorm: event_shape must have at least one dimension and no zero size, got {shape}")
        self.event_shape = torch.Size(shape)
        param_shape = (shape[0],) + (1,) * (len(shape) - 1)
        self.loc = nn.Parameter(torch.zeros(param_shape))
        self.log_scale = nn.Parameter(torch.zeros(param_shape))
        self._positions = int(torch.Size(shape[1:]).numel())
        self.register_buffer("initialized", torch.tensor(False))
        self._initialized = False
        self.register_load_state_dict_post_hook(ActNorm._after_load)

    @staticmethod
    def _after_load(module: ActNorm, incompatible: object) -> None:
        module._initialized = bool(module.initialized)

    @torch.no_grad()
    def _initialize(self, x: Tensor) -> None:
        # Channels first, everything else (batch and positions) flattened.
        flat = x.movedim(x.dim() - len(self.event_shape), 0).reshape(self.event_shape[0], -1)
        if flat.shape[1] == 0:
            raise ValueError("ActNorm: cannot initialise from an empty batch; give the first training call data")
        mean = flat.mean(dim=1)
        std = flat.std(dim=1) if flat.shape[1] > 1 else torch.ones_like(mean)
        # A constant channel (its spread no more than rounding) has nothing to normalise: keep its scale.
        info = torch.finfo(flat.dtype)
        constant = std <= 16 * info.eps * mean.abs() + info.tiny
        if bool(constant.any()) and flat.shape[1] > 1:
            channels = torch.nonzero(constant).flatten().tolist()
            warnings.warn(
                f"ActNorm: feature(s) {channels} are constant over the initialising batch; "
                f"their scale is set to {_CONSTANT_CHANNEL_SCALE}",
                RuntimeWarning,
                stacklevel=5,  # the caller of forward
            )
        std = torch.where(constant, torch.full_like(std, _CONSTANT_CHANNEL_SCALE), std)
        self.loc.copy_(mean.reshape(self.loc.shape))
        self.log_scale.copy_(std.log().reshape(self.log_scale.shape))
        self.initialized.fill_(True)
        self._initialized = True

    def log_abs_det(self) -> Tensor:
        return -self._positions * self.log_scale.sum()

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if self.training and not self._initialized:
            self._initialize(x)
        return (x - self.loc) * torch.exp(-self.log_scale)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z = self.call(x)
        return z, self.log_abs_det().expand(x.shape[: x.dim() - len(self.event_shape)])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = z * torch.exp(self.log_scale) + self.loc
        return x, (-self.log_abs_det()).expand(z.shape[: z.dim() - len(self.event_shape)])
