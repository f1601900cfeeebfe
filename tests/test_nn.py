"""flowkit.nn: the kernel machines (Ferumal flows) and the shared conditioners (NanoFlow)."""

import math

import numpy as np
import pytest
import torch

from flowkit.bijectors import Chain, Coupling, MaskedAutoregressive
from flowkit.flows import MAF, NSF, RealNVP
from flowkit.flows.presets import EMBEDDING
from flowkit.nn import Conditioner, KernelMachine, MaskedKernelMachine, SharedConditioner, SharedTrunk
from flowkit.testing import check_bijector, randomize
from flowkit.transformers import Affine, RationalQuadraticSpline

# Kernel machines

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


# Shared conditioners


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def formula(n, c, e, hidden, outputs, gates=True, shared_out=None):
    """The docstring's count: the trunk once, then per step its embedding, gates and output projection."""
    trunk = (n + c + e + 1) * hidden[0] + sum((a + 1) * b for a, b in zip(hidden[:-1], hidden[1:], strict=True))
    if shared_out is not None:
        trunk += (hidden[-1] + 1) * shared_out
    per_step = [e + (sum(hidden) if gates else 0) + (0 if shared_out else (hidden[-1] + 1) * o) for o in outputs]
    return trunk + sum(per_step)


@pytest.mark.parametrize("autoregressive", [False, True])
@pytest.mark.parametrize("gates", [False, True])
@pytest.mark.parametrize("steps", [1, 3, 7])
def test_the_parameter_count_is_the_stated_formula(steps, gates, autoregressive):
    trunk = SharedTrunk(4, (16, 12), context=3, embedding=5, gates=gates, autoregressive=autoregressive)
    views = torch.nn.ModuleList(SharedConditioner(trunk, 4, 8) for _ in range(steps))
    assert count(views) == formula(4, 3, 5, [16, 12], [8] * steps, gates)


def test_the_parameter_count_with_a_shared_output_layer():
    trunk = SharedTrunk(3, (10,), embedding=2, out_features=6)
    views = torch.nn.ModuleList(SharedConditioner(trunk, 3) for _ in range(4))
    assert count(views) == formula(3, 0, 2, [10], [6] * 4, shared_out=6)


@pytest.mark.parametrize("coupling", [True, False])
def test_a_shared_nsf_has_the_stated_count_and_fewer_parameters_than_an_independent_one(coupling):
    d, bins, hidden, k = 6, 4, [32, 32], 5
    flow = NSF(d, transforms=k, bins=bins, hidden=hidden, coupling=coupling, shared=True)
    n = d // 2 if coupling else d
    o = (d - d // 2 if coupling else d) * (3 * bins - 1)
    assert count(flow) == formula(n, 0, EMBEDDING, hidden, [o] * k)
    assert count(flow) < count(NSF(d, transforms=k, bins=bins, hidden=hidden, coupling=coupling))
    # sublinear: the trunk is counted once, so each further step costs only its own parts
    deeper = NSF(d, transforms=2 * k, bins=bins, hidden=hidden, coupling=coupling, shared=True)
    assert count(deeper) - count(flow) == k * (EMBEDDING + sum(hidden) + (hidden[-1] + 1) * o)


def _outputs(trunk, steps, x, context=None):
    views = [randomize(SharedConditioner(trunk, x.shape[-1], 6), seed=k).to(x.dtype) for k in range(steps)]
    randomize(trunk, seed=99)
    return [view(x, context) for view in views]


@pytest.mark.parametrize("autoregressive", [False, True])
def test_without_embeddings_the_steps_compute_one_function_and_with_them_they_differ(autoregressive):
    x, context = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, 2, dtype=torch.float64)
    kw = dict(context=2, gates=False, out_features=6, autoregressive=autoregressive)
    naive = SharedTrunk(3, (16, 16), embedding=0, **kw).double()
    first, *others = _outputs(naive, 4, x, context)
    for out in others:
        torch.testing.assert_close(out, first, rtol=0, atol=0)
    embedded = SharedTrunk(3, (16, 16), embedding=4, **kw).double()
    outputs = _outputs(embedded, 4, x, context)
    for a in range(4):
        for b in range(a):
            assert (outputs[a] - outputs[b]).abs().max() > 1e-3


def test_a_step_computes_the_network_on_its_input_concatenated_with_its_embedding():
    torch.manual_seed(0)
    trunk = randomize(SharedTrunk(4, (8, 6), "tanh", context=2, embedding=3))
    view = randomize(SharedConditioner(trunk, 3, 5), seed=1)  # 3 of the trunk's 4 inputs: the 4th as a zero
    x, c = torch.randn(7, 3), torch.randn(7, 2)
    first, second = trunk.layers
    h = torch.tanh(first(torch.cat([x, torch.zeros(7, 1), c, view.embedding.expand(7, 3)], -1))) * view.gates[0]
    h = torch.tanh(second(h)) * view.gates[1]
    torch.testing.assert_close(view(x, c), view.last(h))


@pytest.mark.parametrize("context", [0, 2])
def test_the_autoregressive_jacobian_is_triangular_in_the_order(context):
    order = [2, 0, 3, 1]
    trunk = SharedTrunk(4, (24, 24), "tanh", context=context, embedding=5, autoregressive=True, order=order)
    trunk = randomize(trunk)  # tanh: every allowed link has a non-zero derivative
    views = [randomize(SharedConditioner(trunk, 4, 12), seed=k) for k in range(2)]
    rank = {feature: r for r, feature in enumerate(order)}
    c = torch.randn(context) if context else None
    for view in views:
        assert view.order == order
        jacobian = torch.autograd.functional.jacobian(lambda x, view=view: view(x, c), torch.randn(4)).unflatten(
            0, (4, 3)
        )
        for i in range(4):
            for j in range(4):
                dependent = jacobian[i, :, j].abs().max() > 0
                assert bool(dependent) == (rank[j] < rank[i]), (i, j)  # all allowed links are used, none else


def test_layers_on_one_trunk_pass_check_bijector_and_share_its_parameters():
    trunk = SharedTrunk(3, (16,), context=2, embedding=4)
    layers = [
        Coupling(
            RationalQuadraticSpline(4, 3.0), 5, parity=k % 2, context=2, conditioner=SharedConditioner(trunk, n, o)
        )
        for k, (n, o) in enumerate([(2, 33), (3, 22), (2, 33)])
    ]
    chain = randomize(Chain(*layers), scale=0.2).double()
    assert count(chain) == formula(3, 2, 4, [16], [33, 22, 33])
    report = check_bijector(chain, torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64))
    assert report.passed, str(report)


def test_presets_with_shared_conditioners_share_one_trunk_and_train():
    flow = MAF(3, transforms=3, hidden=(8,), shared=True)
    trunks = {id(m.conditioner.trunk) for m in flow.bijector if isinstance(m, MaskedAutoregressive)}
    assert len(trunks) == 1
    loss = -flow.log_prob(torch.randn(16, 3)).mean()
    loss.backward()
    assert all(p.grad is not None for p in flow.parameters())


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="at least one hidden layer"):
        SharedTrunk(2, ())
    with pytest.raises(ValueError, match="embedding >= 0"):
        SharedTrunk(2, (4,), embedding=-1)
    with pytest.raises(ValueError, match="order applies to an autoregressive trunk"):
        SharedTrunk(2, (4,), order=[1, 0])
    with pytest.raises(ValueError, match="permutation"):
        SharedTrunk(2, (4,), autoregressive=True, order=[0, 0])
    with pytest.raises(ValueError, match="not a multiple"):
        SharedTrunk(2, (4,), autoregressive=True, out_features=3)
    with pytest.raises(ValueError, match="in_features=3 does not fit"):
        SharedConditioner(SharedTrunk(2, (4,)), 3, 4)
    with pytest.raises(ValueError, match="exactly when autoregressive"):
        SharedConditioner(SharedTrunk(3, (4,), autoregressive=True), 2, 4)
    with pytest.raises(ValueError, match="out_features .positive. is needed"):
        SharedConditioner(SharedTrunk(2, (4,)), 2)
    with pytest.raises(ValueError, match="differs from the trunk's shared output layer"):
        SharedConditioner(SharedTrunk(2, (4,), out_features=4), 2, 6)
    with pytest.raises(ValueError, match="trunk must be a SharedTrunk"):
        SharedConditioner(torch.nn.Linear(2, 2), 2, 2)
    with pytest.raises(ValueError, match="shared must be one of"):
        NSF(3, shared="yes")
    with pytest.raises(ValueError, match="shared must be one of"):
        NSF(3, shared=1)
    with pytest.raises(ValueError, match="either conditioner= or shared="):
        RealNVP(4, shared=True, conditioner=lambda i, o, context: None)
    with pytest.raises(ValueError, match="no residual blocks"):
        MAF(3, residual=True, shared=True)
    with pytest.raises(ValueError, match="use shared=True"):
        RealNVP(5, shared="naive")


def test_a_masked_autoregressive_layer_takes_the_trunks_order():
    trunk = SharedTrunk(3, (8,), autoregressive=True, order=[1, 2, 0])
    layer = MaskedAutoregressive(Affine(), 3, conditioner=SharedConditioner(trunk, 3, 6))
    assert list(layer.conditioner.order) == [1, 2, 0]
    with pytest.raises(ValueError, match="must be autoregressive"):
        MaskedAutoregressive(Affine(), 3, conditioner=SharedConditioner(SharedTrunk(3, (8,)), 3, 6))


# The convolutional trunk (image flows' couplings).


def test_the_convolutional_count_is_the_formula_with_kernel_taps():
    trunk = SharedTrunk(2, (6, 5), context=2, embedding=3, kernel=3)
    views = torch.nn.ModuleList(SharedConditioner(trunk, n, o) for n, o in [(2, 2), (1, 4), (2, 2)])
    taps = 9
    expected = (2 + 2 + 3) * taps * 6 + 6 + (6 * taps + 1) * 5 + sum(3 + 11 + (5 * taps + 1) * o for o in (2, 4, 2))
    assert count(views) == expected


def test_a_convolutional_step_sees_its_embedding_as_constant_channels():
    torch.manual_seed(0)
    trunk = randomize(SharedTrunk(3, (6,), "tanh", context=2, embedding=4, kernel=3, padding_mode="circular"))
    view = randomize(SharedConditioner(trunk, 2, 5), seed=1)  # 2 of the trunk's 3 channels: the 3rd as zeros
    x, c = torch.randn(7, 2, 5, 5), torch.randn(7, 2)
    planes = [torch.zeros(7, 1, 5, 5), c[:, :, None, None].expand(7, 2, 5, 5), view.embedding[:, None, None]]
    h = torch.tanh(trunk.layers[0](torch.cat([x, *(p.expand(7, -1, 5, 5) for p in planes)], 1)))
    torch.testing.assert_close(view(x, c), view.last(h * view.gates[0][:, None, None]))
    # circular padding: the step commutes with translations
    torch.testing.assert_close(view(x.roll(2, -1), c), view(x, c).roll(2, -1), atol=1e-6, rtol=0)


def test_a_shared_glow_has_one_trunk_per_level_and_fewer_parameters():
    from flowkit.bijectors import MaskedCoupling
    from flowkit.flows import Glow

    flow = Glow((1, 8, 8), levels=2, steps=3, hidden=(16, 16), shared=True)
    trunks = {id(m.conditioner.trunk) for m in flow.modules() if isinstance(m, MaskedCoupling)}
    assert len(trunks) == 2
    assert count(flow) < count(Glow((1, 8, 8), levels=2, steps=3, hidden=(16, 16)))
    assert torch.isfinite(flow.log_prob(torch.rand(3, 1, 8, 8))).all()


def test_a_convolutional_trunk_refuses_bad_options():
    with pytest.raises(ValueError, match="positive odd size"):
        SharedTrunk(2, (4,), kernel=2)
    with pytest.raises(ValueError, match="positive odd size"):
        SharedTrunk(2, (4,), kernel=3, autoregressive=True)
    with pytest.raises(ValueError, match="padding_mode"):
        SharedTrunk(2, (4,), kernel=3, padding_mode="reflect")
    with pytest.raises(ValueError, match=r"expects \(\.\.\., 2, H, W\)"):
        SharedConditioner(SharedTrunk(2, (4,), kernel=3), 2, 2)(torch.randn(3, 2))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("context", "ard"), [(0, True), (2, True), (2, False)])
def test_masked_kernel_machine_incremental_inverse_equals_the_generic_one(kernel, context, ard):
    torch.manual_seed(3)
    net = MaskedKernelMachine(4, 2, inducing=7, kernel=kernel, ard=ard, context=context, order=[2, 0, 3, 1])
    net = randomize(net.double(), scale=0.5)
    layer = MaskedAutoregressive(Affine(), 4, conditioner=net, context=context).double()
    z = torch.randn(6, 4, dtype=torch.float64)
    c = torch.randn(6, context, dtype=torch.float64) if context else None
    x = layer.inverse(z, c)[0]
    torch.testing.assert_close(layer(x, c)[0], z, rtol=0, atol=1e-12)
    calls: list[int] = []

    def solve(i, params):
        calls.append(i)
        return params.sum(-1)

    incremental = net.invert(solve, z, c)
    assert calls == net.order  # each feature solved once, in order
    torch.testing.assert_close(incremental, Conditioner.invert(net, solve, z, c), rtol=1e-12, atol=1e-12)
