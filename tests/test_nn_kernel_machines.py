"""flowkit.nn's kernel-machine conditioners (Ferumal flows): the formula, the mask, the parameter count, bad input."""

import math

import numpy as np
import pytest
import torch

from flowkit.bijectors import Coupling, MaskedAutoregressive
from flowkit.nn import KernelMachine, MaskedKernelMachine
from flowkit.testing import randomize
from flowkit.transformers import Affine

KERNELS = ("squared_exponential", "matern32", "matern52")


def numpy_kernel(name, r):
    """The kernel profiles written out from their textbook definitions, of the scaled distance r."""
    if name == "squared_exponential":
        return np.exp(-0.5 * r**2)
    if name == "matern32":
        return (1 + math.sqrt(3) * r) * np.exp(-math.sqrt(3) * r)
    return (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)


def _parameters(net):
    """The inducing points, lengthscales, weights and bias as numpy arrays (the lengthscales after softplus)."""
    return (
        net.inducing_points.detach().numpy(),
        np.log1p(np.exp(net.raw_lengthscales.detach().numpy())),
        net.weight.detach().numpy(),
        net.bias.detach().numpy(),
    )


@pytest.mark.parametrize("ard", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_machine_is_its_formula(kernel, ard):
    # sum_m alpha_m k(u, z_m) + b, u = [x, context], evaluated point by point in numpy, for random parameters.
    torch.manual_seed(0)
    net = randomize(KernelMachine(3, 4, inducing=7, kernel=kernel, ard=ard, context=2).double(), scale=0.5)
    x, context = torch.randn(9, 3, dtype=torch.float64), torch.randn(9, 2, dtype=torch.float64)
    z, ell, alpha, b = _parameters(net)
    assert ell.shape == ((5,) if ard else (1,))
    u = np.concatenate([x.numpy(), context.numpy()], axis=1)
    expected = np.zeros((9, 4))
    for n in range(9):
        for m in range(7):
            r = math.sqrt(sum(((u[n, j] - z[m, j]) / ell[j if ard else 0]) ** 2 for j in range(5)))
            expected[n] += alpha[m] * numpy_kernel(kernel, r)
    expected += b
    np.testing.assert_allclose(net(x, context).detach().numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_masked_kernel_machine_is_one_machine_per_feature_on_the_features_before_it(kernel):
    torch.manual_seed(1)
    order, params = [2, 0, 3, 1], 3
    net = MaskedKernelMachine(4, params, inducing=6, kernel=kernel, context=1, order=order).double()
    net = randomize(net, scale=0.5)
    x, context = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)
    z, ell, alpha, b = _parameters(net)
    u = np.concatenate([x.numpy(), context.numpy()], axis=1)
    expected = np.tile(b, (5, 1))
    for i in range(4):
        seen = [j for j in range(4) if order.index(j) < order.index(i)] + [4]  # earlier features and the context
        for n in range(5):
            for m in range(6):
                r = math.sqrt(sum(((u[n, j] - z[m, j]) / ell[j]) ** 2 for j in seen))
                expected[n, i * params : (i + 1) * params] += alpha[m, i * params : (i + 1) * params] * numpy_kernel(
                    kernel, r
                )
    np.testing.assert_allclose(net(x, context).detach().numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_masked_kernel_machine_jacobian_is_triangular_in_its_order(kernel):
    torch.manual_seed(2)
    order, params = [3, 1, 4, 0, 2], 2
    net = randomize(MaskedKernelMachine(5, params, inducing=8, kernel=kernel, order=order).double(), scale=0.5)
    rank = {feature: r for r, feature in enumerate(order)}
    for x in torch.randn(4, 5, dtype=torch.float64):
        jacobian = torch.autograd.functional.jacobian(net, x).view(5, params, 5)
        for i in range(5):
            for j in range(5):
                block = jacobian[i, :, j]
                if rank[j] >= rank[i]:
                    assert bool((block == 0).all()), (i, j, block)
                else:
                    assert bool((block != 0).any()), (i, j)  # and it does depend on the features before
    # The layer's Jacobian, permuted to the order, is lower triangular.
    layer = randomize(MaskedAutoregressive(Affine(), 5, conditioner=net), scale=0.5).double()
    jacobian = torch.autograd.functional.jacobian(lambda t: layer(t)[0], torch.randn(5, dtype=torch.float64))
    permuted = jacobian[order][:, order]
    assert torch.equal(permuted, permuted.tril())


def test_the_first_feature_in_the_order_depends_on_the_context_only():
    net = randomize(MaskedKernelMachine(3, 2, inducing=4, context=2, order=[1, 2, 0]).double())
    x = torch.randn(6, 3, dtype=torch.float64)
    context = torch.randn(1, 2, dtype=torch.float64).expand(6, 2)
    first = net(x, context)[:, 2:4]  # feature 1's block
    torch.testing.assert_close(first, first[:1].expand(6, 2), rtol=0, atol=0)
    assert not torch.allclose(net(x, context + 1)[:, 2:4], first)


@pytest.mark.parametrize(
    ("in_features", "out_features", "inducing", "context", "ard"),
    [(1, 2, 64, 0, True), (3, 8, 10, 2, True), (3, 8, 10, 2, False), (0, 5, 3, 4, True)],
)
def test_kernel_machine_parameter_count_is_the_stated_formula(in_features, out_features, inducing, context, ard):
    net = KernelMachine(in_features, out_features, inducing=inducing, ard=ard, context=context)
    d = in_features + context
    stated = inducing * (d + out_features) + (d if ard else 1) + out_features
    assert sum(p.numel() for p in net.parameters()) == stated


@pytest.mark.parametrize(
    ("features", "params", "inducing", "context", "ard"), [(4, 2, 16, 0, True), (3, 11, 5, 2, False)]
)
def test_masked_kernel_machine_parameter_count_is_the_stated_formula(features, params, inducing, context, ard):
    net = MaskedKernelMachine(features, params, inducing, ard=ard, context=context)
    d = features + context
    stated = inducing * (d + features * params) + (d if ard else 1) + features * params
    assert sum(p.numel() for p in net.parameters()) == stated


@pytest.mark.parametrize("machine", [lambda **k: KernelMachine(2, 4, **k), lambda **k: MaskedKernelMachine(2, 2, **k)])
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"inducing": 0}, "inducing must be at least one point"),
        ({"inducing": -3}, "inducing must be at least one point"),
        ({"kernel": "rbf"}, "unknown kernel 'rbf'"),
        ({"lengthscale": 0.0}, "lengthscale must be a positive"),
        ({"lengthscale": -1.0}, "lengthscale must be a positive"),
        ({"lengthscale": [1.0, -0.5]}, "lengthscale must be a positive"),
        ({"lengthscale": [1.0, 2.0, 3.0]}, "one per input"),
        ({"lengthscale": [1.0, 2.0], "ard": False}, "one per input"),
    ],
)
def test_bad_input_raises_value_error(machine, arguments, message):
    with pytest.raises(ValueError, match=message):
        machine(**arguments)


def test_lengthscales_start_at_the_given_values_and_stay_positive():
    net = KernelMachine(2, 3, inducing=4, lengthscale=[0.5, 3.0])
    torch.testing.assert_close(net.lengthscales, torch.tensor([0.5, 3.0]))
    with torch.no_grad():
        net.raw_lengthscales.fill_(-50.0)
    assert bool((net.lengthscales > 0).all())


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_layer_starts_as_the_identity_and_its_gradients_are_finite_on_an_inducing_point(kernel):
    net = KernelMachine(2, 4, inducing=5, kernel=kernel)
    layer = Coupling(Affine(), 4, conditioner=net)
    x = torch.randn(6, 4)
    z, ladj = layer(x)
    assert torch.equal(z, x) and torch.equal(ladj, torch.zeros(6))
    randomize(net)
    at_point = net.inducing_points[:1].detach().clone().requires_grad_(True)  # r = 0: sqrt's gradient would be inf
    net(at_point).sum().backward()
    assert bool(torch.isfinite(at_point.grad).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in net.parameters())


def test_init_inducing_draws_distinct_rows_of_the_data_and_the_context():
    net = KernelMachine(2, 2, inducing=8, context=1)
    x, context = torch.randn(50, 2), torch.randn(50, 1)
    net.init_inducing(x, context, generator=torch.Generator().manual_seed(0))
    rows = torch.cat([x, context], dim=1)
    matches = (net.inducing_points[:, None, :] == rows[None]).all(-1)
    assert bool((matches.sum(1) == 1).all()) and len(set(matches.int().argmax(1).tolist())) == 8
    few = torch.randn(3, 2)
    net = KernelMachine(2, 2, inducing=8)
    net.init_inducing(few)
    points = net.inducing_points.detach()
    assert len({tuple(p.tolist()) for p in points}) == 8  # all distinct
    assert sorted(tuple(p.tolist()) for p in points[:3]) == sorted(tuple(p.tolist()) for p in few)
    with pytest.raises(ValueError, match="needs rows of 2 inputs"):
        net.init_inducing(torch.randn(5, 3))
    with pytest.raises(ValueError, match="non-finite"):
        net.init_inducing(torch.tensor([[0.0, math.nan]]))
