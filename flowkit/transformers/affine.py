"""Affine transformer `y = x e^{s} + t`."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_number
from .base import Transformer

#: The largest clamp: `exp(clamp)` stays finite in float32.
_MAX_CLAMP = math.log(torch.finfo(torch.float32).max)

__all__ = ["Affine"]


class Affine(Transformer):
    r"""Elementwise affine map `y = x e^{s} + t` with `log|dy/dx| = s`.

    The log-derivative does not depend on `x`, so its `x`-derivative is zero.

    Parameters per element: `(t, s_raw)`. The log-scale is soft-clamped,
    `s = c \tanh(s_raw / c)`, which keeps the map well conditioned early in
    training (as in RealNVP's tanh-scaled scales).

    Arguments:
        clamp: the soft bound `c` on `|s|`, positive and at most `88.7` (so that
            `e^c` is finite in float32).

    References:
        Dinh, Sohl-Dickstein & Bengio, *Density estimation using Real NVP*,
        ICLR 2017 (arXiv:1605.08803).
    """

    params_per_element = 2

    def __init__(self, clamp: float = 5.0) -> None:
        super().__init__()
        self.clamp = check_number(clamp, "clamp", where="Affine", positive=True, high=_MAX_CLAMP)

    def _shift_log_scale(self, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, raw = params.unbind(-1)
        return shift, self.clamp * torch.tanh(raw / self.clamp)

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, log_scale = self._shift_log_scale(params)
        return x * torch.exp(log_scale) + shift, log_scale

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, log_scale = self._shift_log_scale(params)
        return (y - shift) * torch.exp(-log_scale), -log_scale

    def identity_params(self) -> Tensor:
        return torch.zeros(2)
