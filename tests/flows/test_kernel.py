"""flowkit.flows.kernel: the Ferumal preset (kernel-coupling), its parameter count and the data start."""

import functools

import pytest
import torch

import flowkit
from flowkit.bijectors import Coupling, MaskedAutoregressive
from flowkit.data import toy_splits
from flowkit.flows import MAF, KernelCouplingFlow, build_flow, init_inducing
from flowkit.flows.registry import count_parameters
from flowkit.nn import MaskedKernelMachine
from flowkit.testing import check_flow


def _is_row_of(points, rows):
    return bool((points[:, None, :] == rows[None]).all(-1).any(1).all())


@pytest.mark.parametrize(
    ("features", "inducing", "context", "ard"), [(2, 64, 0, True), (5, 7, 3, True), (4, 9, 0, False)]
)
def test_parameter_count_is_the_stated_formula(features, inducing, context, ard):
    transforms = 3
    flow = KernelCouplingFlow(features, transforms, inducing=inducing, ard=ard, context=context)
    stated = 0
    for parity in range(transforms):
        transformed = (features + 1 - parity % 2) // 2  # parity 0 transforms the even-indexed features
        kept, outputs = features - transformed, 2 * transformed
        d = kept + context
        stated += inducing * (d + outputs) + (d if ard else 1) + outputs
    assert count_parameters(flow) == stated


def test_the_preset_builds_by_name_and_starts_as_the_identity():
    flow = build_flow("kernel-coupling", 3, transforms=2)
    assert isinstance(flow, KernelCouplingFlow) and len(flow.bijector) == 2
    x = torch.randn(5, 3)
    z, ladj = flow.bijector(x)
    assert torch.equal(z, x) and torch.equal(ladj, torch.zeros(5))


def test_from_data_puts_each_layers_inducing_points_on_its_kept_features():
    x = torch.randn(200, 5) * torch.tensor([1.0, 5.0, 0.1, 2.0, 3.0]) + 4
    flow = KernelCouplingFlow.from_data(x, transforms=3, inducing=16, generator=torch.Generator().manual_seed(0))
    for layer in flow.bijector:
        assert _is_row_of(layer.conditioner.inducing_points.detach(), x[:, layer.identity_idx])
    with pytest.raises(ValueError, match="non-finite"):
        KernelCouplingFlow.from_data(torch.full((4, 2), float("nan")), inducing=2)


def test_init_inducing_follows_the_data_through_permutations_of_an_autoregressive_flow():
    machine = functools.partial(MaskedKernelMachine, inducing=6)
    flow = MAF(3, transforms=2, conditioner=machine)
    x = torch.randn(40, 3) + torch.tensor([0.0, 10.0, 20.0])
    assert init_inducing(flow, x) == 2
    first, second = (layer for layer in flow.bijector if isinstance(layer, MaskedAutoregressive))
    assert _is_row_of(first.conditioner.inducing_points.detach(), x)
    assert _is_row_of(second.conditioner.inducing_points.detach(), x.flip(-1))  # after the reversal


def test_context_is_concatenated_to_every_kernel_input():
    flow = flowkit.testing.randomize(KernelCouplingFlow(2, transforms=2, inducing=5, context=3))
    x = torch.randn(4, 2)
    assert not torch.allclose(flow.log_prob(x, torch.zeros(4, 3)), flow.log_prob(x, torch.ones(4, 3)))
    assert all(isinstance(layer, Coupling) and layer.conditioner.in_features == 1 for layer in flow.bijector)
    assert all(layer.conditioner.inducing_points.shape == (5, 4) for layer in flow.bijector)


@pytest.mark.parametrize("kernel", ["squared_exponential", "matern32", "matern52"])
def test_the_flow_is_a_normalised_density_and_saves(kernel, tmp_path):
    flow = flowkit.testing.randomize(KernelCouplingFlow(2, transforms=2, inducing=6, kernel=kernel)).double()
    report = check_flow(flow)
    assert report.passed, str(report)
    flowkit.io.save(flow, tmp_path / "model")
    loaded = flowkit.io.load(tmp_path / "model").double()
    x = torch.randn(5, 2, dtype=torch.float64)
    torch.testing.assert_close(loaded.log_prob(x), flow.log_prob(x))


@pytest.mark.slow
def test_it_learns_moons_beyond_the_best_gaussian():
    splits = toy_splits("moons", n_train=2000, n_val=10, n_test=2000, seed=0)
    train, test = splits.train.float(), splits.test.float()
    mean, std = train.mean(0), train.std(0)
    train, test = (train - mean) / std, (test - mean) / std
    gaussian = torch.distributions.MultivariateNormal(train.mean(0), torch.cov(train.T))
    gaussian_nll = -gaussian.log_prob(test).mean().item()
    torch.manual_seed(0)
    flow = KernelCouplingFlow.from_data(train, transforms=6, inducing=32)
    flowkit.train.fit(flow, flowkit.train.MaximumLikelihood(), train, steps=400, lr=1e-2, progress=False, seed=0)
    nll = -flow.log_prob(test).mean().item()
    assert nll < gaussian_nll - 0.3, (nll, gaussian_nll)
