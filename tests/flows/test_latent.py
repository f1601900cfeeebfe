"""Latent flows (SimFlow): the fixed-variance ELBO, the stages, bad input, and a short run on the digits."""

import math

import pytest
import torch

from flowkit.data import digits_images
from flowkit.flows import LatentFlow, TarFlow
from flowkit.train import LatentFlowLoss, fit


def test_fixed_variance_makes_log_q_independent_of_the_parameters():
    torch.manual_seed(0)
    model = LatentFlow((1, 8, 8), hidden=8, variance=0.5)
    x = torch.rand(5, 1, 8, 8)
    mean, log_std = model.encode(x)
    assert torch.allclose(log_std, torch.full_like(log_std, 0.5 * math.log(0.5)))
    torch.manual_seed(1)
    z, log_q = model.noisy_latents(x)
    eps = (z - mean) / math.sqrt(0.5)
    expected = (-0.5 * eps**2 - 0.5 * math.log(2 * math.pi * 0.5)).sum((1, 2, 3))
    assert torch.allclose(log_q, expected, atol=1e-5)
    assert not log_q.requires_grad  # a function of the noise alone
    assert z.requires_grad


def test_joint_loss_is_reconstruction_minus_weighted_flow_likelihood_plus_log_q():
    torch.manual_seed(0)
    model = LatentFlow((1, 8, 8), hidden=8, variance=None)
    x = torch.rand(6, 1, 8, 8)
    torch.manual_seed(2)
    loss = LatentFlowLoss(0.3).loss(model, x)
    torch.manual_seed(2)
    z, log_q = model.noisy_latents(x)
    recon = (model.decode(z) - x).square().sum((1, 2, 3))
    assert torch.allclose(loss, (recon + 0.3 * (log_q - model.flow.log_prob(z))).mean())
    assert model.encode(x)[1].std() > 0  # a learned variance varies


def test_flow_stage_trains_the_flow_alone_and_autoencoder_stage_the_autoencoder_alone():
    model = LatentFlow((1, 8, 8), hidden=8)
    x = torch.rand(6, 1, 8, 8)
    LatentFlowLoss(stage="flow").loss(model, x).backward()
    assert all(p.grad is None for p in [*model.encoder.parameters(), *model.decoder.parameters()])
    assert any(p.grad is not None for p in model.flow.parameters())
    model.zero_grad(set_to_none=True)
    LatentFlowLoss(stage="autoencoder").loss(model, x).backward()
    assert all(p.grad is None for p in model.flow.parameters())


def test_bad_input():
    with pytest.raises(ValueError, match="height and width must be even"):
        LatentFlow((1, 7, 8))
    with pytest.raises(ValueError, match="latents of shape"):
        LatentFlow((1, 8, 8), latent_channels=2, flow=TarFlow((3, 4, 4), patch=1, blocks=1, width=8, heads=2))
    with pytest.raises(ValueError, match="stage must be one of"):
        LatentFlowLoss(stage="both")
    with pytest.raises(ValueError, match="expects a LatentFlow"):
        LatentFlowLoss().loss(TarFlow((1, 4, 4), patch=2, blocks=1, width=8, heads=2), torch.rand(2, 1, 4, 4))


@pytest.mark.slow
def test_a_short_joint_run_on_the_digits_reconstructs_better_than_the_mean_image():
    torch.manual_seed(0)
    data = digits_images()
    model = LatentFlow((1, 8, 8), hidden=16)
    fit(model, LatentFlowLoss(0.1), data.train, steps=200, batch_size=128, lr=3e-3, progress=False, seed=0)
    model.eval()
    with torch.no_grad():
        z, _ = model.noisy_latents(data.test)
        error = (model.decode(z) - data.test).square().sum((1, 2, 3)).mean()
        baseline = (data.train.mean(0) - data.test).square().sum((1, 2, 3)).mean()
        samples = model.sample(16)
    assert error < 0.6 * baseline, (error, baseline)
    assert samples.shape == (16, 1, 8, 8) and torch.isfinite(samples).all()


def test_saves_and_loads(tmp_path):
    from flowkit import io
    from flowkit.testing import randomize

    model = randomize(LatentFlow((1, 8, 8), hidden=8, variance=None), 0.1)
    io.save(model, tmp_path / "m")
    loaded = io.load(tmp_path / "m")
    x, z = torch.rand(3, 1, 8, 8), torch.randn(3, 2, 4, 4)
    assert isinstance(loaded, LatentFlow) and loaded.learned_variance
    assert torch.allclose(loaded.encode(x)[1], model.encode(x)[1])
    assert torch.allclose(loaded.flow.log_prob(z), model.flow.log_prob(z))
