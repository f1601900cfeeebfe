r"""Image datasets: sklearn's 8x8 digits as images, and Fashion-MNIST from the Debian package's idx files.

Both return [`Splits`][flowkit.data.Splits] of shape `(N, 1, H, W)`, dequantised with uniform noise,
$\tilde x = (x + u) / K$, with `levels = K` and the integer training images in `info["counts"]` (for
[`training_data`][flowkit.data.training_data]); bits/dim use `dims = C H W`.

Nothing is downloaded. Fashion-MNIST is read from the idx files of the Debian package
`dataset-fashion-mnist` (under `/usr/share/datasets/fashion-mnist`), from `$FLOWKIT_FASHION_MNIST`, or from
`root=` (unpack the package anywhere with `apt-get download dataset-fashion-mnist && dpkg -x
dataset-fashion-mnist_*.deb DIR` and point `root` at `DIR/usr/share/datasets/fashion-mnist`).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from .digits import DIGITS_LEVELS, dequantize, digits
from .splits import Splits, _tensor

__all__ = [
    "IMAGE_DATASETS",
    "image_dataset",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_LEVELS",
    "digits_images",
    "fashion_mnist",
    "fashion_mnist_root",
    "read_idx",
    "downsample",
    "image_labels",
]

#: Where the Debian package `dataset-fashion-mnist` installs the idx files.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Grey levels of Fashion-MNIST (8-bit pixels).
FASHION_MNIST_LEVELS = 256
_FILES = {"train": "train-images-idx3-ubyte", "test": "t10k-images-idx3-ubyte"}
_LABEL_FILES = {"train": "train-labels-idx1-ubyte", "test": "t10k-labels-idx1-ubyte"}
#: Validation images held out of the 60000 training images (a fixed permutation, seed 0).
_VALIDATION = 5000
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (the MNIST format), gzipped or not, into an array.

    Raises:
        ValueError: when the file is not a well-formed idx file (magic number, type, sizes).
        FileNotFoundError: when it does not exist.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        raw = handle.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as error:
            raise ValueError(f"{path}: not a valid gzip file ({error})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES or raw[3] == 0:
        raise ValueError(f"{path}: not an idx file (bad magic number {raw[:4].hex() or 'missing'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: idx header truncated")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: idx data hold {len(raw) - header} bytes, the header announces {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def downsample(counts: np.ndarray, factor: int = 2) -> np.ndarray:
    """Average `factor x factor` blocks of integer images `(..., H, W)` and round down (integers stay integers)."""
    factor = check_number(factor, "factor", where="downsample", integer=True, low=1)
    *batch, h, w = counts.shape
    if h % factor or w % factor:
        raise ValueError(f"downsample: height and width {(h, w)} must be divisible by {factor}")
    blocks = counts.reshape(*batch, h // factor, factor, w // factor, factor).astype(np.int64)
    return blocks.sum(axis=(-3, -1)) // factor**2


def fashion_mnist_root(root: str | os.PathLike | None = None) -> Path:
    """The folder of the idx files: `root`, else `$FLOWKIT_FASHION_MNIST`, else the Debian package's."""
    if root is not None:
        return Path(root)
    env = os.environ.get("FLOWKIT_FASHION_MNIST")
    return Path(env) if env else FASHION_MNIST_DIR


def _find(root: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(
        f"Fashion-MNIST: no {stem}[.gz] in {root}; install the Debian package dataset-fashion-mnist "
        "(or unpack it with apt-get download and dpkg -x) and pass root= or set $FLOWKIT_FASHION_MNIST"
    )


def fashion_mnist(root: str | os.PathLike | None = None, size: int = 14, seed: int = 0) -> Splits:
    """Fashion-MNIST as `(N, 1, size, size)` images dequantised to `[0, 1]`, 55000/5000/10000 images.

    The validation images are 5000 of the training images (a fixed permutation); the test set is `t10k`.

    Arguments:
        root: folder of `train-images-idx3-ubyte[.gz]` and `t10k-images-idx3-ubyte[.gz]`
            (default: `$FLOWKIT_FASHION_MNIST`, else `/usr/share/datasets/fashion-mnist`).
        size: 28 (the original images) or 14 (2x2 blocks averaged and rounded down to integers).
        seed: seed of the dequantisation noise of the fixed train/val/test draws.

    Returns:
        [`Splits`][flowkit.data.Splits] with `levels = 256`; `info["counts"]` holds the integer
        training images.

    Raises:
        FileNotFoundError: when the idx files are not there (the message says how to get them).
        ValueError: for another size, or malformed files.
    """
    if size not in (28, 14):
        raise ValueError(f"fashion_mnist: size must be 28 or 14, got {size!r}")
    folder = fashion_mnist_root(root)
    train, test = (read_idx(_find(folder, _FILES[part])) for part in ("train", "test"))
    for name, images in (("train", train), ("test", test)):
        if images.ndim != 3 or images.shape[1:] != (28, 28) or images.dtype != np.uint8:
            raise ValueError(f"Fashion-MNIST: the {name} images must be 28x28 bytes, got {images.shape} {images.dtype}")
    if len(train) <= _VALIDATION:
        raise ValueError(f"Fashion-MNIST: {len(train)} training images are too few (need more than {_VALIDATION})")
    if size == 14:
        train, test = downsample(train), downsample(test)
    order = np.random.default_rng(0).permutation(len(train))
    parts = [train[order[_VALIDATION:]], train[order[:_VALIDATION]], test]
    parts = [p[:, None].astype(np.float64) for p in parts]
    streams = np.random.SeedSequence(seed).spawn(3)
    noisy = [_tensor(dequantize(p, FASHION_MNIST_LEVELS, s)) for p, s in zip(parts, streams, strict=True)]
    info = {"source": str(folder), "size": size, "counts": parts[0], "dequantization_seed": seed}
    return Splits("fashion-mnist" if size == 14 else "fashion-mnist-28", *noisy, levels=FASHION_MNIST_LEVELS, info=info)


def digits_images(seed: int = 0) -> Splits:
    """The digits (see [`digits`][flowkit.data.digits]) as `(N, 1, 8, 8)` images: the same split and noise."""
    data, shape = digits(seed), (1, 8, 8)
    info = {**data.info, "counts": data.info["counts"].reshape(-1, *shape)}
    images = (t.reshape(-1, *shape) for t in (data.train, data.val, data.test))
    return Splits("digits-images", *images, levels=DIGITS_LEVELS, info=info)


#: The image datasets [`flowkit.data.load`][flowkit.data.load] knows by name.
IMAGE_DATASETS = ("digits-images", "fashion-mnist", "fashion-mnist-28")


def image_dataset(name: str, root: str | os.PathLike | None = None, seed: int = 0) -> Splits:
    """One of `IMAGE_DATASETS` by name (`root`: the folder of Fashion-MNIST's idx files)."""
    if name == "digits-images":
        return digits_images(seed)
    if name in ("fashion-mnist", "fashion-mnist-28"):
        return fashion_mnist(root, size=14 if name == "fashion-mnist" else 28, seed=seed)
    raise ValueError(f"unknown image dataset {name!r}; choose one of {', '.join(IMAGE_DATASETS)}")


def image_labels(name: str, root: str | os.PathLike | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The class labels (`int64`) of the train, validation and test images of `image_dataset(name)`, in their order.

    The digits' labels come with scikit-learn; Fashion-MNIST's from `train-labels-idx1-ubyte[.gz]` and
    `t10k-labels-idx1-ubyte[.gz]` beside the images (10 classes each).

    Raises:
        ValueError: for an unknown name or malformed label files.
        FileNotFoundError: when Fashion-MNIST's label files are missing.
    """
    if name == "digits-images":
        from sklearn.datasets import load_digits

        from .digits import _SPLIT

        labels = load_digits().target[np.random.default_rng(0).permutation(len(load_digits().target))]
        parts = np.split(labels, [_SPLIT[0], _SPLIT[0] + _SPLIT[1]])
    elif name in ("fashion-mnist", "fashion-mnist-28"):
        folder = fashion_mnist_root(root)
        train, test = (read_idx(_find(folder, _LABEL_FILES[part])) for part in ("train", "test"))
        if train.ndim != 1 or test.ndim != 1 or (train.max(initial=0) > 9) or (test.max(initial=0) > 9):
            raise ValueError("Fashion-MNIST: the label files must hold one label in 0 .. 9 per image")
        order = np.random.default_rng(0).permutation(len(train))
        parts = [train[order[_VALIDATION:]], train[order[:_VALIDATION]], test]
    else:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {', '.join(IMAGE_DATASETS)}")
    return tuple(torch.as_tensor(np.asarray(p, dtype=np.int64)) for p in parts)  # type: ignore[return-value]
