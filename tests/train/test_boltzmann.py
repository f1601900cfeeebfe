"""Boltzmann-generator training on targets with known log Z and modes."""

import pytest
import torch
from cases import MISMATCH, mismatched_free_form

import flowkit
from flowkit.bijectors import Chain, Standardization
from flowkit.sampling import ess, importance_sample, log_Z
from flowkit.targets import DoubleWell, GaussianMixture
from flowkit.train import BoltzmannGenerator, fit


@pytest.mark.slow
def test_double_well_log_Z_and_ess_with_exact_samples():
    torch.manual_seed(0)
    target = DoubleWell()
    flow = flowkit.flows.RealNVP(2, transforms=6, hidden=(64, 64))
    objective = BoltzmannGenerator(target, samples=target.sample(20_000), w_ml=1.0, w_kl=1.0, estimator="fast")
    history = fit(flow, objective, steps=500, batch_size=256, lr=3e-3, progress=False)
    assert len(history.loss) == 500
    _, log_w = importance_sample(flow, target, 50_000)
    estimate, error = log_Z(log_w)
    assert abs(estimate - 10.2935) < 0.05 and error < 0.01
    assert ess(log_w) > 0.5
    metrics = objective.metrics()
    assert set(metrics) == {"kl", "nll", "ess", "log_Z"}


@pytest.mark.slow
def test_gmm40_all_modes_covered():
    torch.manual_seed(0)
    target = GaussianMixture(n_modes=40, seed=0)
    inner = flowkit.flows.RealNVP(2, transforms=8, hidden=(64, 64))
    flow = flowkit.Flow(Chain(Standardization([0.0, 0.0], [23.0, 23.0]), inner.bijector), inner.base)
    objective = BoltzmannGenerator(target, samples=target.sample(20_000), w_ml=1.0, w_kl=0.1)
    fit(flow, objective, steps=300, batch_size=256, lr=2e-3, progress=False)
    counts = target.mode_counts(flow.sample((10_000,)))
    assert int((counts > 0).sum()) == 40


def test_ml_term_draws_its_own_batch_of_samples():
    target = DoubleWell()
    samples = target.sample(100)
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    objective = BoltzmannGenerator(target, samples=samples, w_ml=1.0, w_kl=0.0)
    z = flow.base.sample((32,))
    torch.manual_seed(5)
    loss = objective.loss(flow, z)
    torch.manual_seed(5)
    index = torch.randint(0, 100, (32,))
    torch.testing.assert_close(loss, -flow.log_prob(samples[index]).mean())
    path = BoltzmannGenerator(target, samples=samples, w_kl=0.0, ml_estimator="path")
    torch.manual_seed(5)
    torch.testing.assert_close(path.loss(flow, z), loss)


def test_kl_only_equals_path_gradient_vi():
    target = DoubleWell()
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    z = flow.base.sample((64,))
    a = BoltzmannGenerator(target, estimator="standard").loss(flow, z)
    b = flowkit.train.PathGradientVI(target, "standard").loss(flow, z)
    torch.testing.assert_close(a, b)


def test_bad_arguments():
    target = DoubleWell()
    with pytest.raises(ValueError, match="samples"):
        BoltzmannGenerator(target, samples=torch.randn(10, 3))
    with pytest.raises(ValueError, match="switched off"):
        BoltzmannGenerator(target, w_kl=0.0)
    with pytest.raises(ValueError, match="non-negative"):
        BoltzmannGenerator(target, w_ml=-1.0)
    with pytest.raises(ValueError, match="estimator"):
        BoltzmannGenerator(target, estimator="exact")


def test_stochastic_flow_uses_the_loops_latent_batch():
    from flowkit.bijectors import AffineCoupling
    from flowkit.distributions import StandardNormal
    from flowkit.flows import LangevinBlock, StochasticFlow

    target = DoubleWell()
    flow = StochasticFlow(
        [AffineCoupling(2, hidden=(8,)), LangevinBlock(target, lam=0.5, n_steps=2)], StandardNormal(2)
    )
    z = flow.base.sample((16,))
    torch.manual_seed(1)
    loss = BoltzmannGenerator(target).loss(flow, z)
    torch.manual_seed(1)
    _, log_w = flowkit.sampling.log_weights_at(flow, z, target)
    assert torch.equal(loss, -log_w.mean())


@pytest.mark.parametrize(
    ("objective", "clip", "expected"),
    [
        (lambda: BoltzmannGenerator(DoubleWell()), None, 10.0),
        (lambda: flowkit.train.PathGradientVI(DoubleWell()), None, 10.0),
        (lambda: BoltzmannGenerator(DoubleWell()), 2.5, 2.5),  # the user's clip wins
        (lambda: BoltzmannGenerator(DoubleWell()), float("inf"), float("inf")),  # and inf turns it off
        (lambda: flowkit.train.MaximumLikelihood(), None, None),  # likelihood: no default clip
    ],
)
def test_fit_clips_energy_based_objectives_by_default(monkeypatch, objective, clip, expected):
    import flowkit.train.loop as loop

    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs["clip"])
        return train_step(*args, **kwargs)

    train_step = loop.train_step
    monkeypatch.setattr(loop, "train_step", recording)
    torch.manual_seed(0)
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    data = None if objective().needs_data is False else torch.randn(64, 2)
    fit(flow, objective(), data, steps=2, batch_size=32, clip=clip, progress=False)
    assert seen == [expected, expected]
    assert BoltzmannGenerator.default_clip == flowkit.train.PathGradientVI.default_clip == 10.0


def test_reverse_kl_refuses_a_flow_whose_samples_do_not_follow_its_density():
    # Issue 38 (3): BoltzmannGenerator's reverse KL crashed with AttributeError on a FreeFormFlow; its weights would
    # be wrong. The maximum-likelihood term alone weights nothing and still trains it.
    model, target = mismatched_free_form()
    with pytest.raises(ValueError, match=f"BoltzmannGenerator: {MISMATCH}"):
        BoltzmannGenerator(target).loss(model, 16)
    samples = torch.randn(32, 2, dtype=torch.float64) * 2
    ml_only = BoltzmannGenerator(target, samples=samples, w_kl=0.0).loss(model, 16)
    assert torch.isfinite(ml_only)
