"""Fixed permutations of the feature dimension (volume preserving)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_number
from .base import Bijector

__all__ = ["Permutation", "Reverse"]


def _show(values: Tensor, most: int = 10) -> str:
    """The first values of a 1-D tensor, for an error message."""
    shown = values[:most].tolist()
    return str(shown) if values.numel() <= most else str(shown)[:-1] + ", ...]"


def _check_permutation(perm: Tensor, size: int, where: str) -> None:
    """Refuse a loaded `perm` that is not a permutation of `0, ..., size - 1` (`ValueError` naming `where`)."""
    if perm.dtype in (torch.bool, torch.complex64, torch.complex128) or perm.is_floating_point():
        raise ValueError(f"{where}: the loaded perm must hold integers, got dtype {perm.dtype}")
    if not torch.equal(torch.sort(perm.cpu()).values, torch.arange(size)):
        raise ValueError(f"{where}: the loaded perm is not a permutation of 0..{size - 1}: {_show(perm)}")


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

    def _check_perm(self, perm: Tensor) -> None:
        """Refuse a loaded `perm` that is not a permutation of `0, ..., D - 1` (`ValueError`)."""
        _check_permutation(perm, self.perm.numel(), type(self).__name__)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        perm = state_dict.get(prefix + "perm")
        if isinstance(perm, Tensor) and not perm.is_meta and perm.shape == self.perm.shape:
            self._check_perm(perm)  # a wrong shape is reported by torch, with the other mismatches
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # `index_select` rather than advanced indexing: a quarter of the time forward on the CPU, and its
    # backward is an `index_add` (advanced indexing's is an accumulating `index_put`, slower).
    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return x.index_select(-1, self.perm), x.new_zeros(x.shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return z.index_select(-1, self.inverse_perm), z.new_zeros(z.shape[:-1])

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return x.index_select(-1, self.perm)


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

    def _check_perm(self, perm: Tensor) -> None:
        super()._check_perm(perm)
        if not torch.equal(perm.cpu(), self._make(self.perm.numel(), None)):
            raise ValueError(f"Reverse: the loaded perm does not reverse the features: {_show(perm)}")
