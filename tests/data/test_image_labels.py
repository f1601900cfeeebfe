"""image_labels: the labels follow the images of each split."""

import gzip

import numpy as np
import pytest
from sklearn.datasets import load_digits

from flowkit.data import digits_images, fashion_mnist, image_labels


def test_digits_labels_follow_the_images():
    data, (train, val, test) = digits_images(), image_labels("digits-images")
    assert (len(train), len(val), len(test)) == (1257, 180, 360)
    raw = load_digits()
    rows = {tuple(image): label for image, label in zip(raw.data.astype(int), raw.target, strict=True)}
    counts = data.info["counts"].reshape(len(train), 64).astype(int)
    assert all(rows[tuple(c)] == y for c, y in zip(counts[:200], train[:200].tolist(), strict=True))


def _idx(path, array, code):
    header = bytes([0, 0, code, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + array.tobytes()))


def test_fashion_mnist_labels_follow_the_images(tmp_path):
    rng = np.random.default_rng(0)
    labels = {"train": rng.integers(10, size=5010).astype(np.uint8), "t10k": rng.integers(10, size=7).astype(np.uint8)}
    for part, y in labels.items():
        # each image is filled with its label, so the order of the two files can be compared
        _idx(tmp_path / f"{part}-images-idx3-ubyte.gz", np.repeat(y, 28 * 28).reshape(-1, 28, 28), 0x08)
        _idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", y, 0x08)
    data = fashion_mnist(tmp_path, size=28)
    train, val, test = image_labels("fashion-mnist-28", tmp_path)
    assert (len(train), len(val), len(test)) == (10, 5000, 7)
    assert np.array_equal(data.info["counts"][:, 0, 0, 0], train.numpy())
    assert np.array_equal((data.test[:, 0, 0, 0].numpy() * 256).astype(int), test.numpy())
    with pytest.raises(ValueError, match="unknown image dataset"):
        image_labels("mnist")
