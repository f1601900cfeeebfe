"""Glow and EIW: exact log_prob and bits/dim at any number of levels, sampling, save/load, the EIW regulariser."""

import functools
import json
import math

import pytest
import torch

import flowkit
from flowkit import io
from flowkit.bijectors import EIWShuffle, Logit
from flowkit.data import bits_per_dim
from flowkit.distributions import StandardNormal
from flowkit.flows import EIW, Glow
from flowkit.testing import randomize
from flowkit.train import MaximumLikelihood, fit


# EIW shuffles the channels before a split, so it needs at least two levels
@pytest.mark.parametrize("preset, levels", [(Glow, 1), (Glow, 2), (Glow, 3), (EIW, 2), (EIW, 3)])
def test_a_fresh_flow_is_the_logit_and_a_rotation_for_any_number_of_levels(preset, levels):
    flow = preset((1, 8, 8), levels=levels, steps=2, hidden=(4,)).double().eval()
    x = torch.rand(6, 1, 8, 8, dtype=torch.float64) * 0.98 + 0.01
    z, ladj = Logit((1, 8, 8), alpha=0.0).double()(x)
    # ActNorm is uninitialised (identity) in eval mode, couplings start at the identity and the
    # 1x1 convolutions at rotations (orthogonal to float32 precision, drawn before .double()),
    # so log p(x) is the standard normal of logit(x) plus its ladj
    expected = StandardNormal((1, 8, 8)).double().log_prob(z) + ladj
    log_p = flow.log_prob(x)
    torch.testing.assert_close(log_p, expected, atol=1e-4, rtol=0)
    bpd = (-expected + 64 * math.log(17)) / (64 * math.log(2))
    torch.testing.assert_close(bits_per_dim(log_p, 64, 17), bpd, atol=1e-5, rtol=0)


def test_multiscale_latent_is_full_dimensional_and_sampling_inverts_log_prob():
    flow = EIW((1, 8, 8), levels=3, steps=1, hidden=(4,), alpha=None)  # no logit: samples on the real line
    randomize(flow, scale=0.05)
    flow.eval()
    assert flow.bijector.latent_shape == (1, 8, 8) and flow.base.event_shape == (1, 8, 8)
    x, log_q = flow.sample_and_log_prob((5,))
    assert x.shape == (5, 1, 8, 8)
    torch.testing.assert_close(flow.log_prob(x), log_q, atol=1e-4, rtol=1e-5)


def test_fashion_mnist_shape_levels_run_at_7x7_after_one_squeeze():
    flow = Glow((1, 14, 14), levels=2, steps=1, hidden=(4,))
    shapes = [tuple(layer.event_shape) for layer in flow.bijector[1]]
    assert shapes[0] == (1, 14, 14) and shapes[1] == (4, 7, 7)
    assert flow.log_prob(torch.rand(2, 1, 14, 14)).shape == (2,)
    with pytest.raises(ValueError, match="2 channels"):
        Glow((1, 14, 14), levels=3, steps=1, hidden=(4,))  # (1, 7, 7) at level 3


def test_eiw_saves_and_loads_with_its_permutations(tmp_path):
    flow = EIW((1, 8, 8), levels=3, steps=1, hidden=(4,))
    randomize(flow, scale=1.0)
    flow.train()
    flow.log_prob(torch.rand(16, 1, 8, 8))  # ActNorm initialises, the permutations refresh
    flow.eval()
    io.save(flow, tmp_path / "eiw")
    loaded = io.load(tmp_path / "eiw").eval()
    perms = [m.perm for m in flow.modules() if isinstance(m, EIWShuffle)]
    assert len(perms) == 2
    loaded_perms = [m.perm for m in loaded.modules() if isinstance(m, EIWShuffle)]
    assert all(torch.equal(a, b) for a, b in zip(perms, loaded_perms, strict=True))
    x = torch.rand(4, 1, 8, 8)
    torch.testing.assert_close(loaded.log_prob(x), flow.log_prob(x))


def test_fit_adds_the_eiw_regulariser_and_trains_on_image_counts():
    data = flowkit.data.digits_images()
    flow = EIW((1, 8, 8), levels=2, steps=1, hidden=(8,), weight=0.1)
    history = fit(flow, MaximumLikelihood(), flowkit.data.training_data(data), steps=3, batch_size=32, progress=False)
    assert len(history) == 3
    aux = history.metrics["auxiliary_loss"]
    assert len(aux) == 3 and all(a > 0 for a in aux)


def test_the_eiw_regulariser_counts_once():
    """A Flow's auxiliary_loss sums its layers': the fit loop must find the layers, not the flow as well."""
    from flowkit.utils import auxiliary_loss_modules, sum_auxiliary_losses

    flow = EIW((1, 8, 8), levels=2, steps=1, hidden=(4,), weight=0.1).train()
    flow.log_prob(torch.rand(8, 1, 8, 8))  # the shuffles keep the regulariser of this training-mode call
    shuffles = [m for m in flow.modules() if isinstance(m, EIWShuffle)]
    assert auxiliary_loss_modules(flow) == shuffles
    expected = sum(m.auxiliary_loss() for m in shuffles)
    assert float(expected) > 0
    torch.testing.assert_close(sum_auxiliary_losses(auxiliary_loss_modules(flow)), expected)
    torch.testing.assert_close(flow.auxiliary_loss(), expected)


def test_glow_takes_a_conditioner_factory_and_a_transformer():
    net = functools.partial(flowkit.nn.ConvNet, hidden=(6,), kernel=1)
    spline = flowkit.transformers.RationalQuadraticSpline(4, 4.0)
    flow = Glow((2, 4, 4), levels=2, steps=1, conditioner=net, transformer=spline)
    assert flow.log_prob(torch.rand(3, 2, 4, 4)).shape == (3,)
    with pytest.raises(ValueError, match="levels"):
        Glow((1, 8, 8), levels=0)
    with pytest.raises(ValueError, match="levels"):
        EIW((1, 8, 8), levels=1)


def test_flowkit_fit_model_glow_on_image_data(tmp_path, capsys):
    from flowkit.cli import main

    out = tmp_path / "run"
    args = ["fit", "digits-images", "--model", "eiw", "--steps", "2", "--batch-size", "16", "--hidden", "4"]
    assert main([*args, "--transforms", "1", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flow"] == "eiw" and metrics["features"] == 64 and metrics["test_bits_per_dim"] > 0
    assert metrics["standardized"] is False  # the logit layer preprocesses
    assert (out / "samples.png").is_file() and (out / "bits_per_dim.png").is_file()
    assert isinstance(io.load(out / "model"), EIW)
    assert main(["fit", "moons", "--model", "glow", "--steps", "1", "--out", str(tmp_path / "m")]) == 2
    assert "needs image data" in capsys.readouterr().err


def test_uniform_dequantization_is_the_flow_density_minus_d_log_k():
    from flowkit.flows.images import Dequantized

    flow = Glow((1, 4, 4), levels=2, steps=1, hidden=(4,)).eval()
    model = Dequantized(flow, 17)
    counts = torch.randint(0, 17, (5, 1, 4, 4)).float()
    torch.manual_seed(3)
    lower = model.log_prob(counts)
    torch.manual_seed(3)
    u = torch.rand_like(counts)
    torch.testing.assert_close(lower, flow.log_prob((counts + u) / 17) - 16 * math.log(17))
    assert model.sample((3,)).shape == (3, 1, 4, 4)


def test_variational_dequantizer_log_density_is_the_change_of_variables():
    from flowkit.flows.images import VariationalDequantizer

    q = randomize(VariationalDequantizer((1, 2, 2), 5, hidden=(4,)), scale=0.5).double()
    counts = torch.randint(0, 5, (3, 1, 2, 2)).double()
    torch.manual_seed(1)
    u, log_q = q.rsample_and_log_prob(counts)
    assert bool(((u > 0) & (u < 1)).all())
    # u is elementwise in eps: log q(u) = log N(eps) - sum log du/deps, du/deps by autograd
    torch.manual_seed(1)
    mu, s = q.net(counts / 4 - 0.5).chunk(2, dim=-3)
    eps = torch.randn_like(mu).requires_grad_(True)
    out = torch.sigmoid(mu + s.exp() * eps)
    (grad,) = torch.autograd.grad(out.sum(), eps)
    normal = torch.distributions.Normal(0.0, 1.0).log_prob(eps.detach())
    torch.testing.assert_close(u, out.detach())
    torch.testing.assert_close(log_q, (normal - grad.log()).sum((-3, -2, -1)))


@pytest.mark.parametrize("preset, levels", [(Glow, 1), (EIW, 2)])
@pytest.mark.parametrize("end", [0.0, 1.0])
def test_a_pixel_on_an_end_of_the_plain_logit_is_refused_by_name(preset, levels, end):
    torch.manual_seed(0)
    flow = preset((2, 4, 4), levels=levels, steps=1, hidden=(4,))
    x = torch.rand(2, 2, 4, 4)
    x[0, 0, 0, 0] = end
    with pytest.raises(ValueError, match=r"open interval \(0, 1\): dequantise the pixels .* or use alpha > 0"):
        flow.log_prob(x)
    # just inside the ends, log densities and gradients are finite
    x[0, 0, 0, 0] = torch.finfo(x.dtype).tiny if end == 0 else 1 - torch.finfo(x.dtype).eps / 2
    leaf = x.clone().requires_grad_()
    log_p = flow.log_prob(leaf)
    log_p.sum().backward()
    assert bool(torch.isfinite(log_p).all()) and bool(torch.isfinite(leaf.grad).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in flow.parameters() if p.grad is not None)
    # alpha > 0 maps [0, 1] inside the logit's domain: the ends are data like any other
    squeezed = preset((2, 4, 4), levels=levels, steps=1, hidden=(4,), alpha=0.05)
    x[0, 0, 0, 0] = end
    assert bool(torch.isfinite(squeezed.log_prob(x)).all())


def test_dequantised_pixels_that_round_onto_the_ends_stay_inside(monkeypatch):
    from flowkit.flows.images import Dequantized

    levels = 256
    flow = Dequantized(Glow((1, 2, 2), levels=1, steps=1, hidden=(4,)), levels)
    counts = torch.tensor([[[[0.0, 255.0], [3.0, 255.0]]]])
    # u = 0 puts a 0 count on 0, and u just below 1 rounds (255 + u) / 256 to 1 in float32
    assert float((torch.tensor(255.0) + (1 - 2.0**-24)) / levels) == 1.0
    monkeypatch.setattr(torch, "rand_like", lambda x: torch.where(x > 100, 1 - 2.0**-24, 0.0).to(x))
    assert bool(torch.isfinite(flow.log_prob(counts)).all())
