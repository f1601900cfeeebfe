"""flowkit flows in sbi: the estimator's shape contract, sbi's own NPE loop, and the same density as flowkit's."""

from __future__ import annotations

import pickle

import pytest
import torch

import flowkit
from flowkit.bijectors import BoundedSupport, Standardization
from flowkit.embeddings import DeepSetEmbedding, StandardizedEmbedding
from flowkit.inference import build_posterior_flow, sbi_builder

sbi = pytest.importorskip("sbi")
from sbi.inference import NPE  # noqa: E402
from sbi.neural_nets.estimators.base import ConditionalDensityEstimator  # noqa: E402
from sbi.utils import BoxUniform  # noqa: E402


def _simulations(n: int, seed: int = 0) -> tuple[BoxUniform, torch.Tensor, torch.Tensor]:
    """Theta uniform in [-2, 2]^2 and x = theta + 5 + 0.3 noise: a Gaussian likelihood, a narrow posterior."""
    torch.manual_seed(seed)
    prior = BoxUniform(-2 * torch.ones(2), 2 * torch.ones(2))
    theta = prior.sample((n,))
    return prior, theta, theta + 5.0 + 0.3 * torch.randn_like(theta)


def test_the_estimator_keeps_sbis_shape_contract_and_z_scores_as_sbi_does() -> None:
    prior, theta, x = _simulations(300)
    estimator = sbi_builder("nsf", prior=prior, transforms=2, hidden=(16,))(theta, x)
    assert isinstance(estimator, ConditionalDensityEstimator)
    assert estimator.input_shape == (2,) and estimator.condition_shape == (2,)
    assert isinstance(estimator.embedding_net, StandardizedEmbedding)
    torch.testing.assert_close(estimator.embedding_net.loc, x.mean(0))
    torch.testing.assert_close(estimator.embedding_net.scale, x.std(0))
    support, scaling = estimator.model.flow.bijector[0], estimator.model.flow.bijector[1]
    assert isinstance(support, BoundedSupport) and isinstance(scaling, Standardization)
    unbounded = support(theta)[0]
    torch.testing.assert_close(scaling(unbounded)[0].mean(0), torch.zeros(2), atol=1e-5, rtol=0)

    inputs, conditions = theta[:12].reshape(3, 4, 2), x[:4]
    assert estimator.log_prob(inputs, conditions).shape == (3, 4)
    assert estimator.log_prob(theta[:4], conditions).shape == (1, 4)
    assert estimator.loss(theta[:4], conditions).shape == (4,)
    samples = estimator.sample(torch.Size((5,)), conditions)
    assert samples.shape == (5, 4, 2)
    samples, log_p = estimator.sample_and_log_prob(torch.Size((5,)), conditions)
    assert samples.shape == (5, 4, 2) and log_p.shape == (5, 4)
    torch.testing.assert_close(log_p, estimator.log_prob(samples, conditions), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="condition"):
        estimator.log_prob(theta[:4], x[:4, :1])
    with pytest.raises(ValueError, match="condition"):
        estimator.sample(torch.Size((2,)), x[:4, :1])
    with pytest.raises(ValueError, match="dtype"):
        estimator.log_prob(theta[:4], x[:4].double())


def test_a_set_embedding_goes_through_the_builder_and_keeps_its_invariance() -> None:
    torch.manual_seed(0)
    theta = torch.randn(200, 1)
    x = theta[:, None, :] + torch.randn(200, 6, 1)
    embedding = DeepSetEmbedding(1, 4, hidden=(8,), set_features=4)
    model = build_posterior_flow("maf", theta, x, embedding=embedding, transforms=1, hidden=(8,))
    assert model.embedding.loc.shape == (1,)  # statistics per observation feature: invariant to the order
    torch.testing.assert_close(model.log_prob(theta, x), model.log_prob(theta, x[:, torch.randperm(6)]))


def test_the_builder_refuses_bad_options_and_a_prior_without_bounds() -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        sbi_builder("nope")
    with pytest.raises(ValueError, match="z_score_x"):
        sbi_builder("nsf", z_score_x="maybe")
    _, theta, x = _simulations(50)
    gaussian = torch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match="no bound"):
        sbi_builder("maf", prior=gaussian)(theta, x)
    with pytest.raises(ValueError, match="outside the prior's support"):
        sbi_builder("maf", prior=BoxUniform(torch.zeros(2), torch.ones(2)))(theta, x)


@pytest.mark.slow
def test_sbis_npe_trains_a_flowkit_flow_whose_posterior_density_is_flowkits(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # sbi writes its training logs to ./sbi-logs
    prior, theta, x = _simulations(2000)
    builder = sbi_builder("nsf", prior=prior, transforms=2, hidden=(32, 32))
    inference = NPE(prior, density_estimator=builder, show_progress_bars=False)
    estimator = inference.append_simulations(theta, x).train(
        max_num_epochs=40, training_batch_size=100, learning_rate=2e-3
    )
    posterior = inference.build_posterior(estimator)

    x_o = torch.tensor([[5.5, 4.5]])
    samples = posterior.sample((2000,), x=x_o, show_progress_bars=False)
    assert samples.shape == (2000, 2) and bool(((samples > -2) & (samples < 2)).all())
    # The posterior is about N(x_o - 5, 0.3^2) inside the box: the flow has learnt it.
    torch.testing.assert_close(samples.mean(0), torch.tensor([0.5, -0.5]), atol=0.15, rtol=0)
    assert bool((samples.std(0) < 0.6).all())

    # sbi's posterior density is flowkit's own for the same weights: the z-scores are inside the flowkit model,
    # and the leakage correction is exactly zero, since no mass lies outside the prior's box.
    theta_o = samples[:50]
    torch.testing.assert_close(posterior.log_prob(theta_o, x=x_o), estimator.model.log_prob(theta_o, x_o))

    # The posterior pickles, as sbi users save it.
    again = pickle.loads(pickle.dumps(posterior))
    torch.testing.assert_close(again.log_prob(theta_o, x=x_o), posterior.log_prob(theta_o, x=x_o))

    # The flowkit model saves and loads on its own.
    flowkit.io.save(estimator.model, tmp_path / "posterior")
    loaded = flowkit.io.load(tmp_path / "posterior")
    torch.testing.assert_close(loaded.log_prob(theta_o, x_o), estimator.model.log_prob(theta_o, x_o))

    # Trained: held-out pairs are far more likely under the posterior than under the prior.
    _, theta_test, x_test = _simulations(500, seed=1)
    with torch.no_grad():
        gain = estimator.model.log_prob(theta_test, x_test).mean() - prior.log_prob(theta_test).mean()
    assert float(gain) > 1.5
