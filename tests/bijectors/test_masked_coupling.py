"""MaskedCoupling and ConvNet: masks, identity at initialisation, translation equivariance, bad input."""

import pytest
import torch

from flowkit import io
from flowkit.bijectors import MaskedCoupling
from flowkit.bijectors.masked_coupling import grid_mask
from flowkit.nn import ConvNet
from flowkit.testing import randomize
from flowkit.transformers import Affine, RationalQuadraticSpline


def test_checkerboard_and_channel_masks():
    board = grid_mask((3, 4))
    assert board.sum() == 6 and bool(board[0, 0]) and not bool(board[0, 1])
    assert torch.equal(grid_mask((3, 4), parity=1), ~board)
    channel = grid_mask((4, 2, 2), "channel")
    assert channel[:2].all() and not channel[2:].any()


def test_fresh_layer_is_the_identity():
    layer = MaskedCoupling(Affine(), (2, 4, 4), hidden=(8,))
    x = torch.randn(3, 2, 4, 4)
    z, ladj = layer(x)
    assert torch.equal(z, x) and torch.equal(ladj, torch.zeros(3))


def test_only_masked_sites_change_and_depend_on_the_others():
    layer = randomize(MaskedCoupling(Affine(), (4, 4), hidden=(8,), padding_mode="circular"))
    x = torch.randn(2, 4, 4)
    z, _ = layer(x)
    mask = grid_mask((4, 4))
    assert torch.equal(z[:, ~mask], x[:, ~mask])
    assert not torch.allclose(z[:, mask], x[:, mask])
    # a transformed site's output does not depend on the other transformed sites
    jac = torch.autograd.functional.jacobian(lambda v: layer(v)[0], x[0])  # (4, 4, 4, 4)
    flat = jac.reshape(16, 16)[mask.flatten()][:, mask.flatten()]
    assert torch.equal(flat - torch.diag(torch.diagonal(flat)), torch.zeros_like(flat))


@pytest.mark.parametrize("shift", [(2, 0), (0, 2), (1, 1), (3, 1)])
def test_circular_layer_commutes_with_mask_preserving_translations(shift):
    torch.manual_seed(0)
    layer = randomize(MaskedCoupling(RationalQuadraticSpline(4, 3.0), (6, 6), hidden=(8,), padding_mode="circular"))
    x = torch.randn(4, 6, 6, dtype=torch.float64)
    layer = layer.double()
    z, ladj = layer(x)
    z_shift, ladj_shift = layer(x.roll(shift, dims=(-2, -1)))
    torch.testing.assert_close(z_shift, z.roll(shift, dims=(-2, -1)))
    torch.testing.assert_close(ladj_shift, ladj)


def test_zero_padding_breaks_translation_equivariance():
    layer = randomize(MaskedCoupling(Affine(), (6, 6), hidden=(8,), padding_mode="zeros")).double()
    x = torch.randn(4, 6, 6, dtype=torch.float64)
    assert not torch.allclose(layer(x.roll(2, -1))[0], layer(x)[0].roll(2, -1))


def test_saves_and_loads(tmp_path):
    layer = randomize(MaskedCoupling(Affine(), (2, 3, 3), mask="channel", hidden=(4,), context=1))
    io.save(layer, tmp_path / "m")
    loaded = io.load(tmp_path / "m")
    x, c = torch.randn(2, 2, 3, 3), torch.randn(2, 1)
    torch.testing.assert_close(loaded(x, c), layer(x, c))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"event_shape": (5,)}, "event_shape"),
        ({"event_shape": (1, 4, 4), "mask": "channel"}, "channel mask"),
        ({"event_shape": (4, 4), "mask": "stripes"}, "mask must be"),
        ({"event_shape": (2, 2), "mask": [[1, 1], [1, 1]]}, "transform some"),
        ({"event_shape": (2, 2), "mask": [[1, 2], [0, 1]]}, "zeros and ones"),
        ({"event_shape": (4, 4), "parity": 2}, "parity"),
        ({"event_shape": (4, 4), "kernel": 2}, "odd"),
        ({"event_shape": (4, 4), "padding_mode": "reflect"}, "padding_mode"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MaskedCoupling(Affine(), **kwargs)


def test_conditioner_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="out_features"):
        MaskedCoupling(Affine(), (2, 4, 4), conditioner=ConvNet(2, 3))


def test_convnet_refuses_a_grid_with_other_channels():
    with pytest.raises(ValueError, match="expects"):
        ConvNet(2, 4)(torch.randn(3, 1, 4, 4))
