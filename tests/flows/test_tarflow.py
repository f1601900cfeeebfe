"""TarFlow: Tweedie denoising on a Gaussian model, the likelihood classifier against Bayes, labels, CLI, save/load."""

import json
import math

import pytest
import torch

from flowkit import io
from flowkit.bijectors import Bijector, Chain, Linear, Reshape
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow, TarFlow
from flowkit.flows.tarflow import class_log_likelihoods, classify, optimize_label, tweedie_denoise
from flowkit.testing import randomize


def _gaussian_flow(mean: torch.Tensor, cov: torch.Tensor) -> Flow:
    """A flow on `(1, 2, 2)` images whose density is exactly N(mean, cov): z = L^-1 (x - mean)."""
    chol = torch.linalg.cholesky(cov)
    linear = Linear(4).double()
    with torch.no_grad():
        linear.weight.copy_(torch.linalg.inv(chol))
        linear.bias.copy_(-torch.linalg.solve(chol, mean))
    return Flow(Chain(Reshape((1, 2, 2), (4,)), linear), StandardNormal(4).double())


def test_tweedie_step_on_a_gaussian_image_model_is_the_posterior_mean():
    torch.manual_seed(0)
    mean = torch.randn(4, dtype=torch.float64)
    a = torch.randn(4, 4, dtype=torch.float64)
    prior = a @ a.T + 0.1 * torch.eye(4, dtype=torch.float64)  # the clean images: N(mean, prior)
    sigma = 0.7
    noisy_cov = prior + sigma**2 * torch.eye(4, dtype=torch.float64)  # what a flow trained on x + sigma eps learns
    flow = _gaussian_flow(mean, noisy_cov)
    y = torch.randn(6, 1, 2, 2, dtype=torch.float64) * 2
    denoised = tweedie_denoise(flow, y, sigma).reshape(6, 4)
    posterior_mean = mean + (prior @ torch.linalg.solve(noisy_cov, (y.reshape(6, 4) - mean).T)).T
    assert torch.allclose(denoised, posterior_mean, atol=1e-10)
    assert (denoised - y.reshape(6, 4)).abs().max() > 0.1  # the step does move the points


class _ClassGaussians(Bijector):
    """The exact conditional flow of classes N(mu_y, s^2 I): z = (x - M c) / s for a one-hot (or soft) label c."""

    def __init__(self, means: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.event_shape = torch.Size((1, 1, means.shape[1]))
        self.context_features = means.shape[0]
        self.register_buffer("means", means)
        self.scale = scale

    def forward(self, x, context=None):
        shift = (context.to(x) @ self.means).reshape(x.shape)
        ladj = torch.full(x.shape[:-3], -x[0].numel() * math.log(self.scale), dtype=x.dtype)
        return (x - shift) / self.scale, ladj

    def inverse(self, z, context=None):
        x = z * self.scale + (context.to(z) @ self.means).reshape(z.shape)
        return x, -self.forward(x, context)[1]


def test_likelihood_classifier_is_bayes_optimal_with_the_exact_flow():
    torch.manual_seed(1)
    dims, scale, n = 3, 1.0, 6000
    direction = torch.nn.functional.normalize(torch.randn(dims, dtype=torch.float64), dim=0)
    means = torch.stack([0.6 * direction, -0.6 * direction])  # separation 1.2 sigma
    flow = Flow(_ClassGaussians(means, scale), StandardNormal((1, 1, dims)).double())
    labels = torch.randint(2, (n,))
    x = (means[labels] + scale * torch.randn(n, dims, dtype=torch.float64)).reshape(n, 1, 1, dims)
    accuracy = (classify(flow, x) == labels).double().mean().item()
    bayes = 0.5 * (1 + math.erf(0.6 / scale / math.sqrt(2)))  # Phi(d / (2 sigma)) = 0.7257
    se = math.sqrt(bayes * (1 - bayes) / n)
    assert abs(accuracy - bayes) < 2 * se, (accuracy, bayes, se)
    scores = class_log_likelihoods(flow, x[:5])
    assert scores.shape == (5, 2)
    # a prior shifts the decision: with pi = (0.9, 0.1) class 0 wins more often
    assert (classify(flow, x, prior=torch.tensor([0.9, 0.1])) == 0).double().mean() > 0.6
    # FlowBack's test-time label optimisation picks the same class (the log-likelihood is concave in c)
    soft = optimize_label(flow, x[:300], steps=60, lr=0.2)
    assert (soft.argmax(-1) == classify(flow, x[:300])).double().mean() > 0.97
    assert torch.allclose(soft.sum(-1), torch.ones(300, dtype=torch.float64))


def test_classifier_refuses_an_unconditional_flow():
    flow = TarFlow((1, 4, 4), patch=2, blocks=1, width=8, layers=1, heads=2)
    with pytest.raises(ValueError, match="needs a class-conditional flow"):
        classify(flow, torch.rand(2, 1, 4, 4))
    with pytest.raises(ValueError, match="denoise needs a flow trained with noise"):
        flow.generate(2, denoise=True)


def test_label_dropout_only_in_training_with_gradients():
    torch.manual_seed(0)
    flow = randomize(TarFlow((1, 4, 4), patch=2, blocks=2, width=8, layers=1, heads=2, classes=3, label_dropout=1.0))
    x, labels = torch.rand(5, 1, 4, 4), flow.label_context([0, 1, 2, 0, 1])
    dropped = flow.log_prob(x, labels)  # training mode, gradients on: every label dropped
    assert torch.allclose(dropped, flow.log_prob(x, torch.zeros(5, 3)))
    flow.eval()
    assert not torch.allclose(flow.log_prob(x, labels), dropped)


def test_generate_matches_the_inverse_and_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    flow = randomize(TarFlow((1, 4, 4), patch=2, blocks=2, width=8, layers=1, heads=2, classes=3, alpha=None), 0.1)
    flow.eval()
    torch.manual_seed(5)
    images = flow.generate(4, labels=[0, 1, 2, 1])
    torch.manual_seed(5)
    z = flow.base.sample((4,))
    assert torch.allclose(flow.bijector.inverse(z, flow.label_context([0, 1, 2, 1]))[0], images, atol=1e-5)
    assert not torch.allclose(flow.generate(4, labels=[0, 1, 2, 1], guidance=3.0), images)
    io.save(flow, tmp_path / "m")
    loaded = io.load(tmp_path / "m")
    assert isinstance(loaded, TarFlow) and loaded.classes == 3
    x, context = torch.randn(3, 1, 4, 4), flow.label_context([2, 0, 1])
    assert torch.allclose(loaded.log_prob(x, context), flow.log_prob(x, context))


@pytest.mark.slow
def test_flowkit_fit_model_tarflow_on_digits(tmp_path):
    from flowkit.cli import main

    out = tmp_path / "run"
    args = ["fit", "digits-images", "--model", "tarflow", "--steps", "2", "--batch-size", "16", "--hidden", "8"]
    assert main([*args, "--transforms", "2", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flow"] == "tarflow" and metrics["test_bits_per_dim"] > 0
    assert (out / "samples.png").is_file()
    assert isinstance(io.load(out / "model"), TarFlow)
