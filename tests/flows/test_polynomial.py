"""The BPF, SOSPF and GF presets: sizes as declared, samples from the exact inverse, the GF count, save and load."""

import pytest
import torch

import flowkit
from flowkit.flows import GF, build_flow
from flowkit.flows.registry import count_parameters


@pytest.mark.parametrize("name", ["bpf", "sospf", "gf"])
def test_samples_are_the_inverse_of_the_density_map(name):
    torch.manual_seed(0)
    flow = build_flow(name, 3, transforms=2, hidden=(8,)).double()
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn_like(p))
        x = flow.sample((50,))
        z, _ = flow.bijector(x)
        back, _ = flow.bijector.inverse(z)
    torch.testing.assert_close(back, x, rtol=1e-8, atol=1e-8)
    assert torch.isfinite(flow.log_prob(x)).all()


@pytest.mark.parametrize("name", ["bpf", "sospf"])
def test_hidden_sizes_are_honoured(name):
    small, large = (count_parameters(build_flow(name, 3, transforms=1, hidden=h)) for h in ((4,), (16,)))
    assert small < large


def test_gf_parameter_count_is_as_stated():
    # transforms (3 K D) + (transforms - 1) D^2: free mixtures and Householder rotations of D reflections.
    for features, transforms, components in ((2, 3, 8), (5, 2, 4)):
        flow = GF(features, transforms, components)
        assert count_parameters(flow) == transforms * 3 * components * features + (transforms - 1) * features**2


@pytest.mark.parametrize("name", ["bpf", "sospf", "gf"])
def test_save_and_load_give_identical_log_prob(name, tmp_path):
    flow = build_flow(name, 3, transforms=2, hidden=(8,))
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn_like(p))
    flowkit.io.save(flow, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    x = torch.randn(10, 3)
    assert type(loaded) is type(flow) and torch.equal(flow.log_prob(x), loaded.log_prob(x))
