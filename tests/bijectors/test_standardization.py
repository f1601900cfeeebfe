import pytest
import torch
from scipy.stats import norm

import flowkit
from flowkit.bijectors import Standardization
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow


def test_log_prob_is_in_original_units():
    x = torch.randn(200, 3, dtype=torch.float64) * torch.tensor([0.1, 2.0, 30.0], dtype=torch.float64) + 4
    b = Standardization.from_data(x).double()
    flow = Flow(b, StandardNormal(3)).double()
    expected = norm.logpdf(x.numpy(), loc=b.loc.numpy(), scale=b.scale.numpy()).sum(1)
    torch.testing.assert_close(flow.log_prob(x), torch.as_tensor(expected))
    z, _ = b(x)
    torch.testing.assert_close(
        z.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-5, rtol=0
    )  # loc is stored in float32
    torch.testing.assert_close(z.std(0), torch.ones(3, dtype=torch.float64), atol=1e-5, rtol=0)


def test_saved_with_the_model(tmp_path):
    x = torch.randn(50, 2) * 5 + 1
    flow = Flow(flowkit.bijectors.Chain(Standardization.from_data(x), flowkit.bijectors.LULinear(2)), StandardNormal(2))
    flowkit.io.save(flow, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    assert torch.equal(loaded.log_prob(x), flow.log_prob(x))
    assert torch.equal(loaded.bijector[0].scale, flow.bijector[0].scale)


def test_bad_arguments():
    with pytest.raises(ValueError, match="scale must be positive"):
        Standardization([0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="same length"):
        Standardization([0.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        Standardization([float("nan")], [1.0])
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        Standardization.from_data(torch.randn(5))
    constant = Standardization.from_data(torch.ones(10, 2))
    assert bool((constant.scale > 0).all())
