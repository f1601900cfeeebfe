"""LatticeFlow: the tutorial architecture, translation equivariance, Z2 symmetry, saving, fast path gradients."""

import pytest
import torch

from flowkit import io
from flowkit.flows import LatticeFlow
from flowkit.flows.registry import count_parameters
from flowkit.lattice import Z2Equivariant
from flowkit.targets import Phi4
from flowkit.testing import randomize
from flowkit.train.pathgrad import reverse_kl_loss
from flowkit.transformers import RationalQuadraticSpline


def test_tutorial_architecture():
    flow = LatticeFlow(8)
    assert len(flow.bijector) == 16 and tuple(flow.event_shape) == (8, 8)
    # 16 layers of conv(1 -> 8) + conv(8 -> 8) + conv(8 -> 2), kernel 3, with biases
    assert count_parameters(flow) == 16 * ((9 * 8 + 8) + (72 * 8 + 8) + (72 * 2 + 2))
    parities = [bool(layer.keep[0, 0]) for layer in flow.bijector]
    assert parities == [i % 2 == 0 for i in range(16)] or parities == [i % 2 == 1 for i in range(16)]
    x = torch.randn(3, 8, 8)
    torch.testing.assert_close(flow.log_prob(x), flow.base.log_prob(x))  # starts as the identity


@pytest.mark.parametrize("shift", [(2, 0), (0, 2), (1, 1), (3, 5)])
@pytest.mark.parametrize("z2", [False, True])
def test_flow_commutes_with_checkerboard_preserving_translations(shift, z2):
    flow = randomize(LatticeFlow(6, transforms=4, hidden=(4,), z2=z2), scale=0.1).double()
    z = torch.randn(4, 6, 6, dtype=torch.float64)
    x, _ = flow.bijector.inverse(z)
    x_shift, _ = flow.bijector.inverse(z.roll(shift, (-2, -1)))
    torch.testing.assert_close(x_shift, x.roll(shift, (-2, -1)))
    torch.testing.assert_close(flow.log_prob(x.roll(shift, (-2, -1))), flow.log_prob(x))


def test_odd_shifts_are_not_symmetries_of_the_checkerboard():
    flow = randomize(LatticeFlow(6, transforms=4, hidden=(4,)), scale=0.1).double()
    x = torch.randn(4, 6, 6, dtype=torch.float64)
    assert not torch.allclose(flow.log_prob(x.roll(1, -1)), flow.log_prob(x))


@pytest.mark.parametrize("transformer", [None, RationalQuadraticSpline(4, 4.0)], ids=["affine", "spline"])
def test_z2_flow_density_is_even(transformer):
    flow = randomize(LatticeFlow(4, transforms=2, hidden=(4,), z2=True, transformer=transformer), scale=0.2)
    flow = flow.double()
    assert all(isinstance(layer.conditioner, Z2Equivariant) for layer in flow.bijector)
    x = torch.randn(5, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(flow.log_prob(-x), flow.log_prob(x))
    plain = randomize(LatticeFlow(4, transforms=2, hidden=(4,)), scale=0.2).double()
    assert not torch.allclose(plain.log_prob(-x), plain.log_prob(x))


def test_saves_and_loads(tmp_path):
    flow = randomize(LatticeFlow(4, transforms=2, hidden=(4,), z2=True), scale=0.1)
    io.save(flow, tmp_path / "m")
    x = torch.randn(3, 4, 4)
    torch.testing.assert_close(io.load(tmp_path / "m").log_prob(x), flow.log_prob(x))


def test_fast_path_gradient_equals_the_standard_one():
    """The closed-form MaskedCoupling score rule gives the gradient of the autograd (second-pass) estimator."""
    target = Phi4(4, -4.0, 8.0).double()
    grads = []
    for estimator in ("fast", "standard"):
        torch.manual_seed(0)
        flow = randomize(LatticeFlow(4, transforms=2, hidden=(4,)), scale=0.1).double()
        z = torch.randn(16, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        loss, _ = reverse_kl_loss(flow, target, z, estimator)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in flow.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_channel_lattices():
    flow = LatticeFlow((2, 4, 4), transforms=2, hidden=(4,), z2=True)
    assert flow.sample((3,)).shape == (3, 2, 4, 4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lattice": 1}, "lattice"),
        ({"lattice": (4,)}, "lattice must be"),
        ({"transforms": 0}, "transforms"),
        ({"hidden": (0,)}, "hidden"),
        ({"z2": 1}, "z2"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LatticeFlow(**kwargs)
