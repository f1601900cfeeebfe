"""Image data: idx files (synthetic, written here), Fashion-MNIST's splits at 28x28 and 14x14, digits as images."""

import gzip

import numpy as np
import pytest
import torch

import flowkit
from flowkit.data import digits, digits_images, fashion_mnist, read_idx
from flowkit.data.images import downsample


def _write_idx(path, array, compress=False):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    raw = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.fixture(scope="module")
def fashion_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    _write_idx(root / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (5010, 28, 28)), compress=True)
    _write_idx(root / "t10k-images-idx3-ubyte", rng.integers(0, 256, (7, 28, 28)))
    return root


def test_read_idx_reads_gzipped_and_plain_files(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a", array)
    _write_idx(tmp_path / "b.gz", array, compress=True)
    assert np.array_equal(read_idx(tmp_path / "a"), array)
    assert np.array_equal(read_idx(tmp_path / "b.gz"), array)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x00", "magic"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05\x00", "bytes"),
        (b"", "magic"),
    ],
)
def test_read_idx_refuses_malformed_files(tmp_path, data, match):
    (tmp_path / "bad").write_bytes(data)
    with pytest.raises(ValueError, match=match):
        read_idx(tmp_path / "bad")


def test_downsample_averages_blocks_and_rounds_down():
    counts = np.array([[[0, 1, 2, 2], [1, 1, 2, 3], [255, 255, 0, 0], [255, 254, 0, 1]]])
    assert np.array_equal(downsample(counts), [[[0, 2], [254, 0]]])


@pytest.mark.parametrize("size", [28, 14])
def test_fashion_mnist_splits_and_dequantisation(fashion_root, size):
    data = fashion_mnist(fashion_root, size=size, seed=3)
    assert (len(data.train), len(data.val), len(data.test)) == (10, 5000, 7)
    assert data.train.shape[1:] == (1, size, size) and data.features == size * size and data.levels == 256
    counts = data.info["counts"]
    assert counts.shape == (10, 1, size, size)
    # each dequantised pixel lies in [count / 256, (count + 1) / 256)
    x = data.train.double().numpy() * 256
    assert np.all(x >= counts) and np.all(x < counts + 1)
    raw = read_idx(fashion_root / "t10k-images-idx3-ubyte")
    expected = raw if size == 28 else downsample(raw)
    assert np.array_equal(np.floor(data.test.double().numpy() * 256)[:, 0], expected)
    assert torch.equal(fashion_mnist(fashion_root, size=size, seed=3).train, data.train)


def test_fashion_mnist_by_name_from_the_environment(fashion_root, monkeypatch):
    monkeypatch.setenv("FLOWKIT_FASHION_MNIST", str(fashion_root))
    assert flowkit.data.load("fashion-mnist").train.shape[1:] == (1, 14, 14)
    assert flowkit.data.load("fashion-mnist-28").train.shape[1:] == (1, 28, 28)
    assert "fashion-mnist" in flowkit.data.names()


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        fashion_mnist(tmp_path)
    with pytest.raises(ValueError, match="28 or 14"):
        fashion_mnist(tmp_path, size=7)


def test_digits_images_are_the_digits_reshaped():
    images, flat = digits_images(seed=1), digits(seed=1)
    assert images.train.shape == (1257, 1, 8, 8) and images.levels == 17 and images.features == 64
    assert torch.equal(images.test.reshape(-1, 64), flat.test)
    assert np.array_equal(images.info["counts"].reshape(-1, 64), flat.info["counts"])
    train = flowkit.data.training_data(images)
    assert train[0].shape == (1, 8, 8)
