"""The train/validation/test container every flowkit loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

__all__ = ["Splits", "split_array"]


@dataclass
class Splits:
    """Train, validation and test sets of one dataset, as float32 tensors of shape `(N, D)` (or `(N, C, H, W)`).

    Attributes:
        name: dataset name (a built-in name or the file path).
        train: training points.
        val: validation points (for early stopping and model choice).
        test: test points (touched once, for the reported numbers).
        levels: number of quantisation levels `K` per dimension for dequantised discrete data (17 for digits), else
            None; when set, bits/dim are reported (see [`flowkit.data.bits_per_dim`][flowkit.data.bits_per_dim]).
        info: free-form notes (source, preprocessing).
    """

    name: str
    train: Tensor
    val: Tensor
    test: Tensor
    levels: int | None = None
    info: dict = field(default_factory=dict)

    @property
    def features(self) -> int:
        """Number of dimensions `D` of one point (`C H W` for images `(N, C, H, W)`)."""
        return int(self.train.shape[1:].numel())

    def __repr__(self) -> str:
        return (
            f"Splits({self.name!r}, features={self.features}, train={len(self.train)}, "
            f"val={len(self.val)}, test={len(self.test)})"
        )


def _tensor(a: np.ndarray) -> Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32)


def split_array(
    data: np.ndarray, name: str, *, val: float = 0.1, test: float = 0.1, seed: int = 0, shuffle: bool = True
) -> Splits:
    """Split an `(N, D)` array into train/val/test by a seeded random permutation.

    Arguments:
        data: the points.
        name: dataset name.
        val: fraction of points for validation.
        test: fraction of points for testing.
        seed: seed of the permutation (fixed, so splits are reproducible).
        shuffle: permute before splitting (otherwise the last rows are the test set).
    """
    for label, fraction in (("val", val), ("test", test)):
        if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
            raise ValueError(f"{name}: the {label} fraction must lie in (0, 1), got {fraction!r}")
    if val + test >= 1:
        raise ValueError(f"{name}: val + test = {val + test} leaves no training data")
    data = np.asarray(data)
    if data.ndim != 2:
        raise ValueError(f"{name}: data must be a table of shape (N, D), got shape {data.shape}")
    if not np.issubdtype(data.dtype, np.integer) and not np.issubdtype(data.dtype, np.floating):
        raise ValueError(f"{name}: data must be numbers (integers or floats), got dtype {data.dtype}")
    if not np.isfinite(data).all():
        raise ValueError(f"{name}: data contain {int((~np.isfinite(data)).sum())} non-finite value(s) (NaN or inf)")
    n = len(data)
    n_test, n_val = int(round(test * n)), int(round(val * n))
    if n - n_test - n_val < 2 or n_val < 1 or n_test < 1:
        raise ValueError(f"{name}: {n} rows are too few for a train/val/test split")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    data = data[order]
    n_train = n - n_val - n_test
    return Splits(
        name, _tensor(data[:n_train]), _tensor(data[n_train : n_train + n_val]), _tensor(data[n_train + n_val :])
    )
