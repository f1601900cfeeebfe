"""Datasets: built-in 2-D sets, sklearn's digits, CSV/NPY files and the MAF tabular benchmarks.

Every loader returns a [`Splits`][flowkit.data.Splits] (train/val/test float32 tensors); [`load`][flowkit.data.load]
picks the loader from a name or a file path. Nothing is downloaded: the 2-D sets are generated from a seed, digits ship
inside scikit-learn, and the tabular benchmarks are read when their files are present.

Examples:
    >>> import flowkit
    >>> data = flowkit.data.load("moons")
    >>> data.train.shape
    torch.Size([20000, 2])
"""

from __future__ import annotations

import os
import pathlib

from .alanine import alanine_dipeptide_md
from .dependent import DEPENDENT_SHAPES, DependentSplits, equicorrelated_groups, random_kinship, stock_pairs
from .digits import DIGITS_LEVELS, DequantizedDataset, bits_per_dim, dequantize, digits, training_data
from .evaluation import NLL, evaluate_nll, log_prob_batched
from .files import FILE_SUFFIXES, file_splits, read_array
from .heavy_tails import HEAVY_TAILED_DATASETS, heavy_tailed, mtaf_synthetic, stock_returns
from .images import (
    FASHION_MNIST_LEVELS,
    IMAGE_DATASETS,
    digits_images,
    fashion_mnist,
    image_dataset,
    image_labels,
    read_idx,
)
from .splits import Splits, split_array
from .standardize import standardize
from .tabular import TABULAR_DATASETS, available_tabular, data_root, tabular
from .toy import TOY_DATASETS, toy, toy_splits

__all__ = [
    "load",
    "names",
    "Splits",
    "split_array",
    "standardize",
    "toy",
    "toy_splits",
    "TOY_DATASETS",
    "digits",
    "DIGITS_LEVELS",
    "dequantize",
    "DequantizedDataset",
    "training_data",
    "bits_per_dim",
    "read_array",
    "file_splits",
    "FILE_SUFFIXES",
    "tabular",
    "available_tabular",
    "data_root",
    "TABULAR_DATASETS",
    "mtaf_synthetic",
    "stock_returns",
    "heavy_tailed",
    "HEAVY_TAILED_DATASETS",
    "NLL",
    "evaluate_nll",
    "log_prob_batched",
    "digits_images",
    "image_labels",
    "fashion_mnist",
    "read_idx",
    "image_dataset",
    "IMAGE_DATASETS",
    "FASHION_MNIST_LEVELS",
    "alanine_dipeptide_md",
    "DependentSplits",
    "DEPENDENT_SHAPES",
    "equicorrelated_groups",
    "random_kinship",
    "stock_pairs",
]


def names() -> list[str]:
    """Names [`load`][flowkit.data.load] accepts besides file paths: 2-D sets, digits, images, tabular benchmarks."""
    return [*TOY_DATASETS, "digits", *IMAGE_DATASETS, *TABULAR_DATASETS, *HEAVY_TAILED_DATASETS]


def load(name_or_path: str | os.PathLike, *, root: str | os.PathLike | None = None, seed: int = 0) -> Splits:
    """Load a dataset by name or from a file, as train/val/test splits.

    Arguments:
        name_or_path: a built-in 2-D set (`moons`, `circles`, `checkerboard`, `8gaussians`, `pinwheel`, `spirals`,
            `rings`), `digits`, a tabular benchmark (`power`, `gas`, `hepmass`, `miniboone`, `bsds300`, read from
            `root`), or the path of a `.csv`/`.tsv`/`.npy` file (split 80/10/10 by a seeded permutation; a header's
            column names go to `info["columns"]`).
        root: data directory of the tabular benchmarks (default `$FLOWKIT_DATA` or `./data`);
            for `fashion-mnist` (14x14) and `fashion-mnist-28`, the folder of the idx files
            (see [`fashion_mnist`][flowkit.data.fashion_mnist]). `digits-images` are the digits as `(1, 8, 8)` images.
        seed: seed of the 2-D sets' draws, of digits' dequantisation noise, and of a file's split permutation.

    Raises:
        ValueError: an unknown name that is not a file path either, or a malformed file.
        FileNotFoundError: a missing file.
    """
    text = os.fspath(name_or_path)
    key = text.lower()
    if key in TOY_DATASETS:
        return toy_splits(key, seed=seed)
    if key == "digits":
        return digits(seed)
    if key in IMAGE_DATASETS:
        return image_dataset(key, root, seed)
    if key in TABULAR_DATASETS:
        return tabular(key, root)
    if key in HEAVY_TAILED_DATASETS:  # mtaf-8-1, mtaf-8-4, mtaf-50-5, mtaf-50-10, returns
        return heavy_tailed(key, seed)
    path = pathlib.Path(text)
    if path.suffix.lower() in FILE_SUFFIXES or path.exists():
        return file_splits(path, seed=seed)
    raise ValueError(f"unknown dataset {text!r}: not a built-in name ({', '.join(names())}) nor a .csv/.tsv/.npy file")
