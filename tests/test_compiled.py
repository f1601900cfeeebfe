"""flowkit.compile: compiled log_prob, gradients and samples equal the eager ones; input checks stay eager.

The suite compiles with the ``aot_eager`` backend (dynamo's graph capture and
AOTAutograd's joint forward-backward graph, run with eager kernels, so the
values must agree exactly, the gradients to rounding): Inductor's C++ build takes minutes on a loaded
machine. ``bench/speed.py --compile`` measures Inductor itself.
"""

import copy

import pytest
import torch

import flowkit
from flowkit.compiled import CompiledFlow
from flowkit.train import MaximumLikelihood, fit


@pytest.fixture(scope="module")
def flows():
    torch.manual_seed(0)
    flow = flowkit.flows.NSF(3, transforms=2, bins=4, hidden=(8,), coupling=True, bound=2.0).double()
    flowkit.testing.randomize(flow, scale=0.3)
    return flow, flowkit.compile(flow, backend="aot_eager", fullgraph=True)


def test_log_prob_and_gradients_equal_eager(flows):
    flow, fast = flows
    x = 1.5 * torch.randn(16, 3, dtype=torch.float64)
    eager = flow.log_prob(x)
    grads = torch.autograd.grad(eager.square().sum(), list(flow.parameters()))
    compiled = fast.log_prob(x)
    compiled_grads = torch.autograd.grad(compiled.square().sum(), list(fast.parameters()))
    # Under compilation the spline's fused eager path (one autograd node with a hand-written
    # backward) gives way to the reference maths it fuses: equal up to float64 rounding.
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    assert len(compiled_grads) == len(grads) > 0
    for a, b in zip(compiled_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # Path log-likelihood (what the objectives call) is the same compiled function.
    torch.testing.assert_close(fast.path_log_likelihood(x), eager, rtol=1e-12, atol=1e-12)


def test_samples_equal_eager(flows):
    flow, fast = flows
    torch.manual_seed(1)
    eager = flow.sample((5,))
    torch.manual_seed(1)
    compiled = fast.sample((5,))
    assert compiled.shape == (5, 3)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-12)


def test_shares_parameters_and_attributes(flows):
    flow, fast = flows
    assert [p.data_ptr() for p in fast.parameters()] == [p.data_ptr() for p in flow.parameters()]
    assert fast.event_shape == flow.event_shape and fast.base is flow.base
    assert isinstance(fast, CompiledFlow)


def test_implements_the_flow_contract_as_its_flow(flows):
    flow, fast = flows
    assert isinstance(fast, flowkit.flows.FlowModel)
    for ability in ("exact_log_prob", "samples_match_density", "sampler_mismatch", "bijective", "free_form"):
        assert getattr(fast, ability) == getattr(flow, ability), ability
    free = flowkit.compile(flowkit.flows.FreeFormFlow(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), 2))
    assert (free.free_form, free.samples_match_density, free.bijective) == (True, False, False)
    with pytest.raises(ValueError, match="CompiledFlow's samples do not come from the density .*decoder"):
        flowkit.sampling.importance_sample(free, flowkit.targets.DoubleWell(), 4)
    # The weights through the latent-to-data map are the flow's.
    target = flowkit.targets.Energy(lambda x: x.square().sum(-1), 3)
    z = torch.randn(6, 3, dtype=torch.float64)
    compiled, eager = flowkit.sampling.log_weights_at(fast, z, target), flowkit.sampling.log_weights_at(flow, z, target)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_input_checks_stay_eager(flows):
    _, fast = flows
    with pytest.raises(ValueError, match="CompiledFlow.log_prob"):
        fast.log_prob(torch.randn(4, 5, dtype=torch.float64))  # wrong event shape
    with pytest.raises(ValueError, match="context"):
        fast.sample((2,), context=torch.randn(2, 1, dtype=torch.float64))  # this flow takes none


def test_refuses_non_flows(flows):
    with pytest.raises(ValueError, match="expected a flow"):
        flowkit.compile(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="already compiled"):
        flowkit.compile(flows[1])


def test_fit_trains_the_compiled_flow_as_eager(flows):
    flow, fast = flows
    twin = copy.deepcopy(flow)
    before = [p.detach().clone() for p in flow.parameters()]
    data = 1.5 * torch.randn(64, 3, dtype=torch.float64)
    options = dict(steps=3, batch_size=16, schedule=None, progress=False, seed=0)
    fit(twin, MaximumLikelihood(), data, **options)
    fit(fast, MaximumLikelihood(), data, **options)  # trains `flow`, whose parameters it shares
    assert any(not torch.equal(p, b) for p, b in zip(flow.parameters(), before, strict=True))
    for a, b in zip(flow.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
