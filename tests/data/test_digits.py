import math

import numpy as np
import pytest
import torch

from flowkit.data import DIGITS_LEVELS, DequantizedDataset, bits_per_dim, digits, load


def test_digits_split_and_dequantisation():
    d = digits()
    assert (len(d.train), len(d.val), len(d.test)) == (1257, 180, 360)
    assert d.features == 64 and d.levels == DIGITS_LEVELS == 17
    for part in (d.train, d.val, d.test):
        assert float(part.min()) >= 0 and float(part.max()) < 1
    # undoing the dequantisation gives back integer grey levels 0..16
    from sklearn.datasets import load_digits

    counts = torch.floor(torch.cat([d.train, d.val, d.test]) * 17).double()
    original = torch.as_tensor(load_digits().data)
    order = np.random.default_rng(0).permutation(1797)
    assert torch.equal(counts, original[order])
    assert np.array_equal(d.info["counts"], original[order][:1257].numpy())
    # the split is fixed; the noise follows the seed
    other = digits(seed=1)
    assert torch.equal(torch.floor(other.test * 17), torch.floor(d.test * 17))
    assert not torch.equal(other.test, d.test)
    assert load("digits").train.shape == (1257, 64)


def test_bits_per_dim_of_the_uniform_model_is_log2_levels():
    # the uniform density on [0,1]^D has log p = 0, so it scores log2 K bits/dim
    assert bits_per_dim(0.0, 64, 17) == pytest.approx(math.log2(17))
    # a density e times larger scores 1/(D ln 2) bits/dim less
    assert bits_per_dim(torch.tensor(64.0), 64, 17) == pytest.approx(math.log2(17) - 1 / math.log(2))


def test_dequantized_dataset_draws_fresh_noise():
    ds = DequantizedDataset(np.array([[0.0, 16.0], [3.0, 5.0]]), 17)
    a, b = ds[0], ds[0]
    assert len(ds) == 2 and not torch.equal(a, b)
    assert torch.equal(torch.floor(a * 17), torch.tensor([0.0, 16.0]))


@pytest.mark.parametrize("dims,levels", [(0, 17), (64, 0), (2.5, 17), (64, float("nan")), (64, True)])
def test_bits_per_dim_refuses_bad_sizes(dims, levels):
    with pytest.raises(ValueError, match="bits_per_dim: (dims|levels) must be a positive integer"):
        bits_per_dim(0.0, dims, levels)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 17.0, 2.5, float("inf")])
def test_dequantized_dataset_refuses_counts_outside_the_levels(bad):
    with pytest.raises(ValueError, match=r"DequantizedDataset: counts must be integers in \{0, ..., 16\}; 1 value"):
        DequantizedDataset(np.array([[0.0, bad], [3.0, 5.0]]), 17)
    with pytest.raises(ValueError, match="levels"):
        DequantizedDataset(np.zeros((2, 2)), 0)


def test_dequantised_values_lie_inside_the_open_unit_interval_in_float32(monkeypatch):
    from flowkit.data import dequantize
    from flowkit.utils import into_open_unit_interval

    counts = np.array([[0, 16, 5]])
    rng = np.random.default_rng(0)
    for u in (0.0, 1 - 2.0**-53):  # the ends of rng.random's [0, 1)

        class Ends:
            def random(self, shape, u=u):
                return np.full(shape, u)

        with monkeypatch.context() as patch:
            patch.setattr(np.random, "default_rng", lambda seed: Ends())
            x = torch.as_tensor(dequantize(counts, DIGITS_LEVELS, seed=0), dtype=torch.float32)
        assert bool(((x > 0) & (x < 1)).all()), x
    np.testing.assert_allclose(
        dequantize(counts, DIGITS_LEVELS, 0), (counts + rng.random(counts.shape)) / DIGITS_LEVELS
    )
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.where(torch.arange(3) == 0, 0.0, 1 - 2.0**-24))
    x = DequantizedDataset(torch.tensor([[0, 16, 16]]), DIGITS_LEVELS)[0]
    assert float(x[1]) == 1 - 2.0**-24 and bool(((x > 0) & (x < 1)).all()), x
    edges = torch.tensor([0.0, 1.0, 0.5], dtype=torch.float64)
    assert into_open_unit_interval(edges).tolist() == [torch.finfo(torch.float64).tiny, 1 - 2.0**-53, 0.5]
