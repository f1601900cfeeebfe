"""TarFlow's block: block-triangular Jacobian in patch order, cached decoding, guidance, bad input."""

import pytest
import torch

from flowkit.bijectors import TransformerAutoregressive
from flowkit.bijectors.transformer_autoregressive import patchify, unpatchify
from flowkit.flows import TarFlow
from flowkit.testing import randomize


def _block(**options) -> TransformerAutoregressive:
    block = TransformerAutoregressive((2, 4, 6), patch=2, width=8, layers=2, heads=2, **options)
    return randomize(block, scale=0.3).double()


def test_patchify_round_trip_is_a_permutation():
    x = torch.arange(2 * 2 * 4 * 6.0).reshape(2, 2, 4, 6)
    seq = patchify(x, 2)
    assert seq.shape == (2, 6, 8)
    assert torch.equal(unpatchify(seq, 2, (2, 4, 6)), x)
    assert torch.equal(seq.flatten().sort().values, x.flatten().sort().values)


def test_fresh_block_is_the_identity():
    block = TransformerAutoregressive((1, 4, 4), patch=2, width=8, layers=1, heads=2)
    x = torch.randn(3, 1, 4, 4)
    z, ladj = block(x)
    assert torch.equal(z, x) and torch.equal(ladj, torch.zeros(3))


@pytest.mark.parametrize("reverse", [False, True])
def test_jacobian_is_block_triangular_in_patch_order(reverse):
    block = _block(reverse=reverse)
    x = torch.randn(1, 2, 4, 6, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda v: block(v.reshape(1, 2, 4, 6))[0].reshape(-1), x.reshape(-1))
    # the Jacobian between patch sequences, in the block's own reading order
    index = patchify(torch.arange(48.0).reshape(1, 2, 4, 6), 2)[0].long()  # (T, P) element indices
    order = index.flip(0) if reverse else index
    blocks = jac[order.reshape(-1)][:, order.reshape(-1)].reshape(6, 8, 6, 8)
    for t in range(6):
        for u in range(6):
            part = blocks[t, :, u, :]
            if u > t:
                assert part.abs().max() == 0, (t, u)
            elif u == t:  # diagonal: exp(-s_t), a positive diagonal matrix
                assert torch.allclose(part, torch.diag(part.diagonal()), atol=0, rtol=0)
                assert (part.diagonal() > 0).all()
    below = sum(blocks[t, :, u, :].abs().max() for t in range(6) for u in range(t))
    assert below > 1e-3  # the earlier patches do shape the later ones


@pytest.mark.parametrize("classes", [0, 3])
def test_cached_decoding_equals_decoding_without_cache(classes):
    block = _block(classes=classes)
    z = torch.randn(4, 2, 4, 6, dtype=torch.float64)
    context = torch.eye(3, dtype=torch.float64)[[0, 2, 1, 0]] if classes else None
    x_cached, ladj_cached = block.inverse(z, context)
    x_plain, ladj_plain = block.inverse(z, context, cache=False)
    assert (x_cached - x_plain).abs().max() < 1e-6
    assert (ladj_cached - ladj_plain).abs().max() < 1e-6
    z_back, ladj = block(x_cached, context)
    assert (z_back - z).abs().max() < 1e-10 and (ladj + ladj_cached).abs().max() < 1e-10


def test_guidance_combines_conditional_and_unconditional_predictions():
    block = _block(classes=3)
    z = torch.randn(3, 2, 4, 6, dtype=torch.float64)
    context = torch.eye(3, dtype=torch.float64)
    guided, ladj = block.inverse(z, context, guidance=2.0)
    assert (guided - block.inverse(z, context, guidance=2.0, cache=False)[0]).abs().max() < 1e-10
    assert (guided - block.inverse(z, context)[0]).abs().max() > 1e-4  # guidance changes the images
    # the first patch's parameters come from the prefix alone: mu = mu_c + w (mu_c - mu_u), s likewise
    net, w = block.net, 2.0
    mu_c, s_c = net.step(net.prefix_tokens(3, context, z), None)
    mu_u, s_u = net.step(net.prefix_tokens(3, torch.zeros_like(context), z), None)
    mu, s = mu_c + w * (mu_c - mu_u), s_c + w * (s_c - s_u)
    first = patchify(guided, 2)[:, 0]
    assert torch.allclose(first, patchify(z, 2)[:, 0] * s.exp() + mu, atol=1e-12)


def test_bad_input():
    with pytest.raises(ValueError, match="patch size 3 does not divide"):
        TransformerAutoregressive((1, 8, 8), patch=3)
    with pytest.raises(ValueError, match="not divisible by heads"):
        TransformerAutoregressive((1, 8, 8), patch=2, width=10, heads=4)
    with pytest.raises(ValueError, match="guidance needs a class-conditional"):
        _block().inverse(torch.randn(2, 2, 4, 6, dtype=torch.float64), guidance=1.0)
    flow = TarFlow((1, 4, 4), patch=2, blocks=1, width=8, layers=1, heads=2, classes=3)
    with pytest.raises(ValueError, match="label 3 is outside the classes 0 .. 2"):
        flow.label_context([0, 3])
    with pytest.raises(ValueError, match="label -1 is outside"):
        flow.generate(2, labels=[-1, 0])
    unconditional = TarFlow((1, 4, 4), patch=2, blocks=1, width=8, layers=1, heads=2)
    with pytest.raises(ValueError, match="guidance needs a class-conditional flow"):
        unconditional.generate(2, guidance=1.0)
    with pytest.raises(ValueError, match="unconditional"):
        unconditional.label_context([0])
