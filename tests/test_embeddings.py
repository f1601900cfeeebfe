"""Embedding networks: shapes, the set encoder's invariance and padding, input checks."""

from __future__ import annotations

import pytest
import torch

from flowkit.embeddings import Conv1dEmbedding, DeepSetEmbedding, MLPEmbedding


@pytest.mark.parametrize("pooling", ["mean", "sum"])
def test_the_set_embedding_ignores_the_order_of_the_observations(pooling: str) -> None:
    torch.manual_seed(0)
    embedding = DeepSetEmbedding(3, 5, hidden=(16,), set_features=8, pooling=pooling).double()
    y = torch.randn(4, 7, 3, dtype=torch.float64)
    shuffled = y[:, torch.randperm(7)]
    torch.testing.assert_close(embedding(shuffled), embedding(y))
    assert not torch.allclose(embedding(y[:, :6]), embedding(y))  # but not the observations themselves


def test_a_padded_set_embeds_as_the_set_without_its_padding() -> None:
    torch.manual_seed(0)
    embedding = DeepSetEmbedding(2, 4, hidden=(16,), set_features=8).double()
    y = torch.randn(3, 6, 2, dtype=torch.float64)
    padded = y.clone()
    padded[0, 2:] = float("nan")  # 2 observations
    padded[1, 5:] = float("nan")  # 5 observations
    out = embedding(padded)
    torch.testing.assert_close(out[0], embedding(y[0, :2]))
    torch.testing.assert_close(out[1], embedding(y[1, :5]))
    torch.testing.assert_close(out[2], embedding(y[2]))
    # the padding rows sit anywhere: padding is a row of NaN, not a position
    torch.testing.assert_close(embedding(padded[0, [3, 0, 4, 1]]), out[0])


def test_the_set_embedding_refuses_partial_rows_empty_sets_and_infinities() -> None:
    embedding = DeepSetEmbedding(2, 4, hidden=(8,), set_features=4)
    y = torch.randn(2, 3, 2)
    partial = y.clone()
    partial[0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="some NaN entries"):
        embedding(partial)
    empty = y.clone()
    empty[1] = float("nan")
    with pytest.raises(ValueError, match="no observation"):
        embedding(empty)
    infinite = y.clone()
    infinite[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="infinite"):
        embedding(infinite)
    with pytest.raises(ValueError, match="shape"):
        embedding(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="dtype"):
        embedding(y.double())
    with pytest.raises(ValueError, match="pooling"):
        DeepSetEmbedding(2, 4, pooling="max")


def test_the_mlp_and_convolutional_embeddings_give_their_sizes_and_check_their_input() -> None:
    mlp = MLPEmbedding(6, 3, hidden=(8,))
    assert mlp(torch.randn(2, 5, 6)).shape == (2, 5, 3)
    with pytest.raises(ValueError, match=r"shape \(4, 7\).*\(\.\.\., 6\)"):
        mlp(torch.randn(4, 7))
    with pytest.raises(ValueError, match="non-finite"):
        mlp(torch.full((1, 6), float("nan")))

    conv = Conv1dEmbedding(32, 4, channels=(4, 8), kernel=3, hidden=(8,))
    assert conv(torch.randn(5, 32)).shape == (5, 4)
    assert conv(torch.randn(2, 5, 32)).shape == (2, 5, 4)
    two = Conv1dEmbedding(32, 4, channels=(4,), in_channels=2)
    assert two.condition_shape == (2, 32) and two(torch.randn(3, 2, 32)).shape == (3, 4)
    with pytest.raises(ValueError, match="shape"):
        conv(torch.randn(5, 31))
    with pytest.raises(ValueError, match="halve the length"):
        Conv1dEmbedding(4, 2, channels=(4, 4, 4))
    with pytest.raises(ValueError, match="odd"):
        Conv1dEmbedding(32, 2, kernel=4)
