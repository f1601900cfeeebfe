"""Every preset of the registry takes a context: it changes the density, sets the sample batch, saves and loads."""

from __future__ import annotations

import pytest
import torch

import flowkit
from flowkit.flows.registry import DATA_PRESETS, IMAGE_PRESETS, PRESETS

CONTEXT = 3
IMAGE = (2, 4, 4)

CASES = (
    [("vector", name) for name in PRESETS]
    + [("data", name) for name in DATA_PRESETS]
    + [("image", name) for name in IMAGE_PRESETS]
)


def _build(kind: str, name: str) -> tuple[flowkit.flows.FlowModel, torch.Tensor]:
    """The preset at small sizes with `CONTEXT` context features, and five points of its data."""
    generator = torch.Generator().manual_seed(0)
    if kind == "image":
        flow = IMAGE_PRESETS[name](IMAGE, levels=2, steps=1, hidden=(8,), context=CONTEXT)
        return flow, 0.05 + 0.9 * torch.rand(5, *IMAGE, generator=generator)
    features = 4  # a square: the lattice preset takes L * L features
    if kind == "data":
        data = torch.distributions.StudentT(3.0).sample((400, features))
        flow = DATA_PRESETS[name](data, transforms=2, hidden=(8,), bins=4, context=CONTEXT)
    else:
        flow = PRESETS[name](features, transforms=2, hidden=(8,), bins=4, context=CONTEXT)
    return flow, torch.randn(5, features, generator=generator)


def _perturb(flow: torch.nn.Module) -> None:
    """Move every parameter off its start (zero last layers make a fresh conditional layer ignore the context)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in flow.parameters():
            if p.is_floating_point():
                p.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


#: The presets whose case takes seconds (sampling by numerical inverses, forward-mode Jacobians).
SLOW = {"nanoflow", "bnaf", "free-form", "comet"}


@pytest.mark.parametrize(
    ("kind", "name"),
    [pytest.param(k, n, id=f"{k}-{n}", marks=[pytest.mark.slow] if n in SLOW else []) for k, n in CASES],
)
def test_every_preset_takes_a_context(kind: str, name: str, tmp_path) -> None:
    torch.manual_seed(0)
    flow, x = _build(kind, name)
    assert flow.context_features == CONTEXT
    flow.eval()
    _perturb(flow)
    c = torch.randn(5, CONTEXT, generator=torch.Generator().manual_seed(2))
    log_p = flow.log_prob(x, c)
    assert log_p.shape == (5,) and bool(torch.isfinite(log_p).all())
    assert not torch.allclose(log_p, flow.log_prob(x, c + 1.0), atol=1e-6), "the context does not change log_prob"

    samples = flow.sample((2,), c)
    assert samples.shape == (2, 5, *flow.event_shape)
    if flow.samples_match_density:  # round trip: the samples are points of finite density
        assert bool(torch.isfinite(flow.log_prob(samples, c)).all())

    for bad, what in ((torch.randn(5, CONTEXT + 1), "shape"), (c.double(), "dtype"), (c.long(), "floating")):
        with pytest.raises(ValueError, match=f"context.*{what}|{what}.*context"):
            flow.log_prob(x, bad)
    with pytest.raises(ValueError, match="context"):
        flow.log_prob(x)  # a conditional flow without its context

    flowkit.io.save(flow, tmp_path / "model")
    loaded = flowkit.io.load(tmp_path / "model").eval()
    torch.testing.assert_close(loaded.log_prob(x, c), flow.log_prob(x, c))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["planar", "residual", "sylvester", "free-form"])
def test_the_families_that_took_no_context_learn_a_conditional_density(name: str) -> None:
    # x | c ~ N((2c, -c), 0.3^2 I), c ~ N(0, 1): the best unconditional Gaussian is 2 nats per point worse.
    torch.manual_seed(0)
    c = torch.randn(4000, 1)
    x = torch.cat([2 * c, -c], -1) + 0.3 * torch.randn(4000, 2)
    (c_test, x_test), (c, x) = (c[:1000], x[:1000]), (c[1000:], x[1000:])
    exact = torch.distributions.Normal(torch.cat([2 * c_test, -c_test], -1), 0.3).log_prob(x_test).sum(-1).mean()
    gaussian = torch.distributions.MultivariateNormal(x.mean(0), torch.cov(x.T)).log_prob(x_test).mean()
    flow = flowkit.flows.build_flow(name, 2, transforms=2, hidden=(32,), context=1)
    objective = (
        flowkit.train.FreeFormLikelihood(beta=10.0) if name == "free-form" else flowkit.train.MaximumLikelihood()
    )
    flowkit.train.fit(flow, objective, (x, c), steps=300, batch_size=256, lr=3e-3, progress=False)
    with torch.no_grad():
        learnt = flow.eval().log_prob(x_test, c_test).mean()
    assert float(exact - learnt) < 0.2, (float(learnt), float(exact))
    assert float(learnt - gaussian) > 1.5
