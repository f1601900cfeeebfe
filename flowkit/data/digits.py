r"""sklearn's 8x8 digits as a 64-dimensional density benchmark, and bits per dimension.

The 1797 images (17 grey levels, 0..16) ship inside scikit-learn, so nothing
is downloaded. They are dequantised with uniform noise,

$$
\tilde x = (x + u) / K, \qquad u \sim U[0, 1)^{64}, \quad K = 17,
$$

so that a uniform model scores $\log_2 K = 4.09$ bits/dim (a full-covariance Gaussian 2.96). The split
is a fixed permutation (seed 0) into 1257 training, 180 validation and 360 test images.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .._validation import check_number
from ..utils import into_open_unit_interval
from .splits import Splits, _tensor

__all__ = ["DIGITS_LEVELS", "digits", "dequantize", "bits_per_dim", "DequantizedDataset", "training_data"]

#: Grey levels of sklearn's digits (0..16).
DIGITS_LEVELS = 17
_SPLIT = (1257, 180, 360)


def _checked_counts(counts: np.ndarray | Tensor, levels: int, where: str) -> tuple[np.ndarray, int]:
    """`counts` as an array and `levels` as an int; the counts must be integers in `{0, ..., levels-1}`."""
    levels = check_number(levels, "levels", where=where, integer=True, low=1)
    counts = np.asarray(counts)
    if not np.issubdtype(counts.dtype, np.number) or np.issubdtype(counts.dtype, np.complexfloating):
        raise ValueError(f"{where}: counts must be an array of numbers, got dtype {counts.dtype}")
    valid = np.isfinite(counts) & (counts >= 0) & (counts <= levels - 1) & (counts == np.round(counts))
    if not valid.all():
        raise ValueError(
            f"{where}: counts must be integers in {{0, ..., {levels - 1}}}; {int((~valid).sum())} value(s) are not"
        )
    return counts, levels


def dequantize(counts: np.ndarray, levels: int, seed: int) -> np.ndarray:
    """Uniform dequantisation `(x + u) / levels` of integer data `x` in `{0, ..., levels-1}`, inside `(0, 1)`."""
    counts, levels = _checked_counts(counts, levels, "dequantize")
    rng = np.random.default_rng(seed)
    # inside (0, 1) also once stored in float32: the plain logit of an image flow is infinite at 0 and 1
    info = np.finfo(np.float32)
    return np.clip((counts + rng.random(counts.shape)) / levels, info.tiny, 1 - info.epsneg)


class DequantizedDataset(Dataset):
    """Integer data dequantised with *fresh* uniform noise at every access (a regulariser for training).

    Arguments:
        counts: integer data of shape `(N, D)` with values in `{0, ..., levels-1}`.
        levels: number of levels `K`.

    Raises:
        ValueError: when a count is not an integer in `{0, ..., levels-1}` (NaN included).
    """

    def __init__(self, counts: np.ndarray | Tensor, levels: int) -> None:
        counts, self.levels = _checked_counts(counts, levels, "DequantizedDataset")
        self.counts = torch.as_tensor(counts, dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, index: int) -> Tensor:
        x = self.counts[index]
        return into_open_unit_interval((x + torch.rand(x.shape)) / self.levels)


def digits(seed: int = 0) -> Splits:
    """The digits of scikit-learn, dequantised to `[0, 1]^64`, split 1257/180/360 by a fixed permutation (seed 0).

    Arguments:
        seed: seed of the dequantisation noise (the split itself never changes).

    Returns:
        [`Splits`][flowkit.data.Splits] with `levels = 17`; `info["counts"]`
        holds the integer training images, for [`DequantizedDataset`][flowkit.data.DequantizedDataset].
    """
    from sklearn.datasets import load_digits

    counts = load_digits().data.astype(np.float64)
    order = np.random.default_rng(0).permutation(len(counts))
    n_train, n_val, _ = _SPLIT
    parts = np.split(counts[order], [n_train, n_train + n_val])
    streams = np.random.SeedSequence(seed).spawn(3)
    noisy = (_tensor(dequantize(p, DIGITS_LEVELS, s)) for p, s in zip(parts, streams, strict=True))
    info = {"source": "sklearn.datasets.load_digits", "counts": parts[0], "dequantization_seed": seed}
    return Splits("digits", *noisy, levels=DIGITS_LEVELS, info=info)


def bits_per_dim(log_prob: Tensor | float, dims: int, levels: int) -> Tensor | float:
    r"""Bits per dimension of dequantised data: `(-log p(x~) + D log K) / (D ln 2)`.

    `log_prob` is the log density of the dequantised point $\tilde x = (x + u)/K$ in `[0, 1]^D`; adding
    `D log K` makes it a lower bound of the discrete data's log probability, in nats.

    Arguments:
        log_prob: log density (or mean log density) in nats.
        dims: number of dimensions `D`.
        levels: quantisation levels `K` (17 for digits, 256 for 8-bit images).

    Raises:
        ValueError: when `dims` or `levels` is not a positive integer.
    """
    dims = check_number(dims, "dims", where="bits_per_dim", integer=True, low=1)
    levels = check_number(levels, "levels", where="bits_per_dim", integer=True, low=1)
    return (-log_prob + dims * math.log(levels)) / (dims * math.log(2))


def training_data(data: Splits) -> Tensor | DequantizedDataset:
    """What to train on: the train split, or, for count data, its counts dequantised afresh at every pass.

    Fresh noise at each pass is a regulariser; the fixed draw in `data.train` stays for evaluation.
    """
    counts = data.info.get("counts")
    return DequantizedDataset(counts, data.levels) if data.levels and counts is not None else data.train
