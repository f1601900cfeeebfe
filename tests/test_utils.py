"""The small shared helpers of `flowkit.utils` against what they stand for."""

import pytest
import torch

from flowkit.utils import broadcast_shapes

SHAPES = [
    [(256,), (256,)],
    [(256,), ()],
    [(), ()],
    [(4, 1), (), (4, 1)],
    [(4, 1), (3,)],
    [(1,), (5,), ()],
    [(2, 3), (1, 3), (2, 1)],
    [(0,), (0,)],
    [(0,), (1,)],
]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_broadcast_shapes_is_torchs(shapes):
    got = broadcast_shapes(*shapes)
    assert isinstance(got, torch.Size)
    assert got == torch.broadcast_shapes(*shapes)


@pytest.mark.parametrize("shapes", [[(3,), (4,)], [(2, 3), (3, 2)], [(), (2,), (3,)]], ids=str)
def test_broadcast_shapes_refuses_what_torch_refuses(shapes):
    with pytest.raises(RuntimeError):
        torch.broadcast_shapes(*shapes)
    with pytest.raises(RuntimeError):
        broadcast_shapes(*shapes)
