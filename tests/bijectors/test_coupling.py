"""broadcast_context: the conditioner input of coupling and autoregressive layers, checked element by element."""

import torch

from flowkit.bijectors.coupling import broadcast_context


def test_without_context_the_input_is_returned_as_is():
    h = torch.randn(4, 3)
    assert broadcast_context(h, None) is h


def test_equal_batch_shapes_concatenate_along_the_last_dimension():
    h, c = torch.randn(4, 3), torch.randn(4, 2)
    out = broadcast_context(h, c)
    assert out.shape == (4, 5)
    for i in range(4):
        assert torch.equal(out[i, :3], h[i]) and torch.equal(out[i, 3:], c[i])


def test_a_context_without_batch_dimensions_is_repeated_for_every_row():
    h, c = torch.randn(5, 3), torch.randn(2)
    out = broadcast_context(h, c)
    assert out.shape == (5, 5)
    for i in range(5):
        assert torch.equal(out[i], torch.tensor([*h[i].tolist(), *c.tolist()]))


def test_an_input_without_batch_dimensions_is_repeated_for_every_context():
    h, c = torch.randn(3), torch.randn(6, 2)
    out = broadcast_context(h, c)
    assert out.shape == (6, 5)
    for i in range(6):
        assert torch.equal(out[i, :3], h) and torch.equal(out[i, 3:], c[i])


def test_batch_dimensions_broadcast_both_ways():
    h, c = torch.randn(3, 1, 2), torch.randn(4, 5)
    out = broadcast_context(h, c)
    assert out.shape == (3, 4, 7)
    for i in range(3):
        for j in range(4):
            assert torch.equal(out[i, j, :2], h[i, 0]) and torch.equal(out[i, j, 2:], c[j])


def test_an_empty_input_gives_the_context_alone():
    # autoregressive layers condition their first output on the context only
    h, c = torch.zeros(5, 0), torch.randn(5, 3)
    assert torch.equal(broadcast_context(h, c), c)
    assert torch.equal(broadcast_context(torch.zeros(0), c), c)


def test_gradients_reach_both_inputs_once_per_copy():
    h = torch.randn(4, 3, requires_grad=True)
    c = torch.randn(2, requires_grad=True)
    weights = torch.randn(4, 5)
    (broadcast_context(h, c) * weights).sum().backward()
    # h appears once; the context is copied to each of the 4 rows, so its gradient sums them
    assert torch.equal(h.grad, weights[:, :3])
    torch.testing.assert_close(c.grad, weights[:, 3:].sum(0))
