"""The MAF and NSF presets: shapes, correctness checks, save/load and torch.compile."""

import pytest
import torch

import flowkit
from flowkit.flows import MAF, NSF
from flowkit.testing import check_bijector, check_flow, randomize


def test_one_dimensional_nsf_passes_check_flow_and_integrates_to_one():
    report = check_flow(randomize(NSF(1, transforms=2, bins=6, hidden=(16,), bound=3.0), 0.1))
    assert report.passed, str(report)


@pytest.mark.parametrize(
    "flow",
    [
        NSF(3, transforms=2, bins=6, hidden=(16,), bound=3.0, context=2),
        NSF(3, transforms=3, bins=6, hidden=(16,), bound=3.0, coupling=True, context=2),
        MAF(3, transforms=2, hidden=(16,), residual=True, context=2),
    ],
    ids=["nsf-ar", "nsf-coupling", "maf"],
)
def test_presets_pass_check_bijector(flow):
    x = 2 * torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    report = check_bijector(randomize(flow, 0.1).bijector, x)
    assert report.passed, str(report)


def test_conditional_presets_sample_with_context():
    flows = (
        NSF(3, 2, hidden=(8,), context=2),
        NSF(3, 2, hidden=(8,), context=2, coupling=True),
        MAF(3, 2, (8,), context=2),
    )
    for flow in flows:
        context = torch.randn(4, 2)
        x, log_q = flow.sample_and_log_prob((5,), context)
        assert x.shape == (5, 4, 3) and log_q.shape == (5, 4)
        torch.testing.assert_close(flow.log_prob(x, context.expand(5, 4, 2)), log_q, atol=1e-4, rtol=1e-4)


def test_layers_and_permutations():
    flow = NSF(4, transforms=3, coupling=True)
    kinds = [b._get_name() for b in flow.bijector]  # the layer names shown in reprs and errors
    assert kinds == ["SplineCoupling", "Permutation", "SplineCoupling", "Permutation", "SplineCoupling"]
    flow = MAF(4, transforms=2)
    kinds = [b._get_name() for b in flow.bijector]
    assert kinds == ["MaskedAffineAutoregressive", "Reverse", "MaskedAffineAutoregressive"]
    with pytest.raises(ValueError, match="residual"):
        NSF(4, coupling=True, residual=True)


def test_save_and_load_round_trip(tmp_path):
    flow = randomize(NSF(3, transforms=2, hidden=(8,), residual=True))
    path = flowkit.io.save(flow, tmp_path / "nsf")
    loaded = flowkit.io.load(path)
    x = torch.randn(6, 3)
    torch.testing.assert_close(loaded.log_prob(x), flow.log_prob(x))


def test_torch_compile_gives_the_same_outputs():
    # aot_eager traces forward and backward through the compiler stack without
    # generating C++ (inductor takes minutes on two cores). fullgraph=True fails
    # on any graph break, i.e. on a host synchronisation or data-dependent branch.
    flow = randomize(NSF(3, transforms=2, bins=4, hidden=(8,), bound=2.0), 0.2)
    flowkit.set_validation(False)
    try:
        x = 2 * torch.randn(16, 3)
        x[0] = torch.tensor([2.0, -2.0, 10.0])  # at the bounds and in the tail
        compiled = torch.compile(flow.log_prob, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), flow.log_prob(x))
        z = torch.randn(16, 3)
        inverse = torch.compile(flow.bijector.inverse, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(inverse(z)[0], flow.bijector.inverse(z)[0])
    finally:
        flowkit.set_validation(True)
