"""ResidualFlow and PlanarFlow presets: densities that integrate to one, training, sampling, saving, bad sizes."""

import pytest
import torch

import flowkit
from flowkit.flows import PlanarFlow, ResidualFlow, build_flow
from flowkit.testing import check_flow, randomize
from flowkit.train import MaximumLikelihood, fit


@pytest.mark.parametrize(
    "build",
    [
        lambda: ResidualFlow(2, transforms=2, hidden=(16,), coefficient=0.9),
        lambda: PlanarFlow(2, transforms=4),
    ],
    ids=["residual", "planar"],
)
def test_presets_pass_check_flow(build):
    flow = randomize(build(), scale=0.5)
    report = check_flow(flow)
    assert report.passed, str(report)


@pytest.mark.parametrize("logdet", ["exact", "series"])
def test_residual_flow_trains_samples_and_saves(logdet, tmp_path):
    torch.manual_seed(0)
    data = flowkit.data.load("moons", seed=0).train[:2000].float()
    flow = ResidualFlow(2, transforms=2, hidden=(32, 32), logdet=logdet)
    flow.eval()
    before = -flow.log_prob(data).mean().item()
    fit(flow, MaximumLikelihood(), data, steps=150, batch_size=256, lr=3e-3, progress=False)
    flow.eval()
    after = -flow.log_prob(data).mean().item()
    assert after < before - 0.3, (before, after)
    for layer in flow.bijector:
        if isinstance(layer, flowkit.bijectors.Residual):
            assert (layer.spectral_norms() <= 0.97 * (1 + 1e-6)).all()
    samples = flow.sample((500,))
    assert samples.shape == (500, 2) and torch.isfinite(samples).all()
    flowkit.io.save(flow, tmp_path / "model")
    loaded = flowkit.io.load(tmp_path / "model").eval()
    torch.testing.assert_close(loaded.log_prob(data[:100]), flow.log_prob(data[:100]))


def test_registry_builds_residual_and_planar():
    residual, planar = build_flow("residual", 3, transforms=2), build_flow("planar", 3)
    assert isinstance(residual, ResidualFlow) and isinstance(planar, PlanarFlow)
    assert sum(isinstance(b, flowkit.bijectors.Planar) for b in planar.bijector) == 16
    assert build_flow("residual", 4).bijector[1].logdet == "exact"
    assert build_flow("residual", 5).bijector[1].logdet == "series"  # more features: the unbiased series


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: ResidualFlow(2, transforms=0), "transforms"),
        (lambda: ResidualFlow(2, coefficient=1.0), "coefficient"),
        (lambda: ResidualFlow(2, hidden=(8, 0)), "hidden"),
        (lambda: PlanarFlow(0), "features"),
    ],
)
def test_bad_sizes_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()
