"""Squeeze, FactorOut, Conv1x1 and EIWShuffle: exact round trips, dense-matrix references, EIW's permutation."""

import pytest
import torch

from flowkit import io
from flowkit.bijectors import Chain, Conv1x1, EIWShuffle, FactorOut, Invert, Squeeze
from flowkit.testing import randomize
from flowkit.utils import auxiliary_loss


def test_squeeze_moves_each_block_into_channels_in_glow_order():
    x = torch.randn(3, 2, 4, 6)
    z, ladj = Squeeze((2, 4, 6))(x)
    assert z.shape == (3, 8, 2, 3) and torch.equal(ladj, torch.zeros(3))
    for c in range(2):
        for i in range(2):
            for j in range(2):
                assert torch.equal(z[:, 4 * c + 2 * i + j], x[:, c, i::2, j::2])


def test_squeeze_and_factor_out_round_trip_exactly():
    squeeze = Squeeze((2, 4, 4))
    x = torch.randn(5, 2, 4, 4)
    assert torch.equal(squeeze.inverse(squeeze(x)[0])[0], x)
    assert torch.equal(squeeze.inverse_call(squeeze.call(x)), x)
    level = FactorOut(Chain(Squeeze((2, 4, 4)), Invert(Squeeze((2, 4, 4)))), 5)
    x = torch.randn(3, 5, 4, 4)
    z, ladj = level(x)
    assert torch.equal(z, x) and torch.equal(level.inverse(z)[0], x) and torch.equal(ladj, torch.zeros(3))


def test_factor_out_transforms_the_first_channels_only():
    inner = randomize(Conv1x1((2, 3, 3)))
    level = FactorOut(inner, 3)
    x = torch.randn(4, 3, 3, 3)
    z, ladj = level(x)
    assert torch.equal(z[:, 2:], x[:, 2:])
    torch.testing.assert_close(z[:, :2], inner(x[:, :2])[0])
    torch.testing.assert_close(ladj, inner(x[:, :2])[1])


def test_factor_out_refuses_inner_layers_that_change_the_shape():
    with pytest.raises(ValueError, match="keep the shape"):
        FactorOut(Squeeze((2, 4, 4)), 4)
    with pytest.raises(ValueError, match="channels"):
        FactorOut(Conv1x1((2, 3, 3)), 2)


def test_conv1x1_matches_a_dense_matrix_on_the_channel_axis():
    layer = randomize(Conv1x1((3, 4, 5))).double()
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    weight = layer.weight.detach()
    z, ladj = layer(x)
    torch.testing.assert_close(z, torch.einsum("oc,bchw->bohw", weight, x))
    torch.testing.assert_close(ladj, torch.full((2,), 20 * torch.linalg.slogdet(weight)[1].item(), dtype=torch.float64))
    # the same map as one dense (C H W) x (C H W) matrix: kron(W, I_{HW})
    dense = torch.kron(weight, torch.eye(20, dtype=torch.float64))
    torch.testing.assert_close(z.reshape(2, -1), x.reshape(2, -1) @ dense.T)
    torch.testing.assert_close(ladj[0], torch.linalg.slogdet(dense)[1])
    solved = torch.linalg.solve(dense, z.reshape(2, -1).T).T
    torch.testing.assert_close(layer.inverse(z)[0], solved.reshape(x.shape))


def test_eiw_permutation_is_argsort_of_the_global_weights_and_the_same_in_train_and_eval():
    layer = randomize(EIWShuffle((8, 3, 3)), scale=1.0)
    x = torch.randn(4, 8, 3, 3)
    layer.train()
    z_train, ladj = layer(x)
    perm = layer.perm.clone()
    assert torch.equal(perm, torch.argsort(layer.global_weights(), descending=True))
    assert torch.equal(z_train, x[:, perm]) and torch.equal(ladj, torch.zeros(4))
    layer.eval()
    z_eval, _ = layer(x)
    assert torch.equal(z_eval, z_train) and torch.equal(layer.perm, perm)
    assert torch.equal(layer.inverse(z_eval)[0], x)
    # the map does not depend on the input
    assert torch.equal(layer(2 * x + 1)[0], (2 * x + 1)[:, perm])


def test_eiw_permutation_is_frozen_at_eval_and_saved(tmp_path):
    layer = randomize(EIWShuffle((6, 2, 2)), scale=1.0)
    layer.train()
    layer(torch.randn(3, 6, 2, 2))
    layer.eval()
    before = layer.perm.clone()
    with torch.no_grad():  # weights that would sort differently do not move the frozen permutation
        layer.generator[-1].bias.copy_(torch.arange(6.0) * 100)
    assert torch.equal(layer.perm, before)
    io.save(layer, tmp_path / "m")
    loaded = io.load(tmp_path / "m").eval()
    assert torch.equal(loaded.perm, before)
    x = torch.randn(2, 6, 2, 2)
    assert torch.equal(loaded(x)[0], layer(x)[0])
    loaded.train()
    loaded(x)  # a training call takes up the new weights
    assert torch.equal(loaded.perm, torch.arange(5, -1, -1))


def test_eiw_refuses_a_loaded_perm_that_is_not_a_permutation():
    layer = EIWShuffle((4, 2, 2))
    state = layer.state_dict()
    state["perm"] = torch.tensor([0, 0, 1, 2])
    with pytest.raises(ValueError, match="not a permutation"):
        layer.load_state_dict(state)


def test_eiw_regulariser_is_a_nonnegative_kl_and_zero_when_the_weights_agree():
    layer = randomize(EIWShuffle((8, 2, 2), reduction=4, weight=0.5), scale=1.0)
    z = torch.randn(10, 8, 2, 2)
    kl = layer.divergence(z)
    assert kl.shape == (10,) and bool((kl >= 0).all()) and bool((kl > 0).any())
    # against the definition, with the global weights in the permuted order
    p = torch.softmax(layer.excitation(z.mean((-2, -1))), -1)
    q = layer.global_weights()[layer.perm]
    torch.testing.assert_close(kl, (p * (p / q).log()).sum(-1))
    with torch.no_grad():  # an SE head that outputs the global weights for every input
        layer.excitation[-1].weight.zero_()
        layer.excitation[-1].bias.copy_(layer.log_global_weights()[layer.perm])
    torch.testing.assert_close(layer.divergence(z), torch.zeros(10), atol=1e-6, rtol=0)


def test_eiw_auxiliary_loss_is_the_weighted_mean_kl_of_the_last_training_batch():
    layer = randomize(EIWShuffle((4, 2, 2), weight=0.25), scale=1.0)
    assert layer.auxiliary_loss() is None
    x = torch.randn(6, 4, 2, 2)
    layer.train()
    z, _ = layer(x)
    expected = 0.25 * layer.divergence(z).mean()
    torch.testing.assert_close(auxiliary_loss(Chain(layer)), expected)
    # only the regulariser trains the global weights (the sort has no gradient)
    layer.auxiliary_loss().backward()
    assert layer.generator[-1].bias.grad.abs().sum() > 0
    layer.eval()
    assert layer.auxiliary_loss() is None


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Squeeze((1, 3, 4)), "divisible"),
        (lambda: Squeeze((4, 4)), r"\(C, H, W\)"),
        (lambda: Conv1x1((0, 2, 2)), "positive"),
        (lambda: EIWShuffle((1, 2, 2)), "2 channels"),
        (lambda: EIWShuffle((4, 2, 2), weight=-1.0), "weight"),
    ],
)
def test_bad_arguments_name_the_problem(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_log_abs_det_of_conv1x1_is_pixels_times_log_diag():
    layer = randomize(Conv1x1((4, 3, 2)))
    torch.testing.assert_close(layer.log_abs_det(), 6 * layer.linear.log_diag.sum())
