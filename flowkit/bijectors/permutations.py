"""Fixed permutations of the feature dimension (volume preserving)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_number
from .base import Bijector

__all__ = ["Permutation", "Reverse"]


class Permutation(Bijector):
    """A fixed permutation of the last dimension, `z_i = x_{perm[i]}`; `log|det| = 0`.

    Arguments:
        features: number of features `D`.
        seed: seed of the random permutation (the global torch RNG when None).
            The permutation is a buffer, so it is saved and restored with the weights.
    """

    ladj_is_constant = True

    def __init__(self, features: int, seed: int | None = None) -> None:
        super().__init__()
        features = check_number(features, "features", where=type(self).__name__, integer=True, low=1)
        self.event_shape = torch.Size([features])
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.register_buffer("perm", self._make(features, generator))

    @staticmethod
    def _make(features: int, generator: torch.Generator | None) -> Tensor:
        return torch.randperm(features, generator=generator)

    @property
    def inverse_perm(self) -> Tensor:
        return torch.argsort(self.perm)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return x[..., self.perm], x.new_zeros(x.shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return z[..., self.inverse_perm], z.new_zeros(z.shape[:-1])

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return x[..., self.perm]


class Reverse(Permutation):
    """Reverse the order of the features (the MAF/RealNVP default between layers).

    Arguments:
        features: number of features `D`.
    """

    def __init__(self, features: int) -> None:
        super().__init__(features, seed=0)

    @staticmethod
    def _make(features: int, generator: torch.Generator | None) -> Tensor:
        return torch.arange(features - 1, -1, -1)
