"""Free-form and injective flows: the log-det surrogate, the exact densities, training, saving, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import flowkit
from flowkit.bijectors import Standardization
from flowkit.flows import FlowModel, FreeFormFlow, InjectiveFlow, ResidualMLP
from flowkit.nn import MLP
from flowkit.train import FreeFormLikelihood, fit
from flowkit.train.free_form import log_det_surrogate, orthonormal_probes

F64 = torch.float64


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False).to(F64)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def _invertible(d: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(d, d, dtype=F64, generator=generator) + 3 * torch.eye(d, dtype=F64)


def test_probes_are_scaled_orthonormal_columns():
    like = torch.zeros((), dtype=F64)
    v = orthonormal_probes(5, 4, 3, like)  # (probes, batch, features)
    assert v.shape == (3, 5, 4)
    gram = torch.einsum("kbi,lbi->bkl", v, v) / 4
    assert torch.allclose(gram, torch.eye(3, dtype=F64).expand(5, 3, 3), atol=1e-12)
    full = orthonormal_probes(5, 4, 4, like)
    outer = torch.einsum("kbi,kbj->bij", full, full) / 4  # (1/K) sum_k v v^T = I for K = d
    assert torch.allclose(outer, torch.eye(4, dtype=F64).expand(5, 4, 4), atol=1e-12)


def test_surrogate_gradient_is_the_log_det_gradient_for_an_invertible_linear_pair():
    # f(x) = A x, g = A^{-1}: with K = D probes the gradient of the surrogate is d log|det A| / dA = A^{-T}.
    g = torch.Generator().manual_seed(0)
    a = _invertible(4, g)
    encoder, decoder = _linear(a), _linear(torch.linalg.inv(a))
    x = torch.randn(6, 4, dtype=F64, generator=g)
    z, surrogate, reconstruction = log_det_surrogate(encoder, decoder, x, probes=4)
    (gradient,) = torch.autograd.grad(surrogate.mean(), encoder.weight)
    exact = a.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch.linalg.slogdet(exact)[1], exact)
    assert (gradient - expected).abs().max() < 1e-6
    assert torch.allclose(z, x @ a.T) and torch.allclose(reconstruction, x, atol=1e-12)
    # the surrogate's value is tr(f' g') = D here; the decoder gets no gradient from it
    assert torch.allclose(surrogate, torch.full((6,), 4.0, dtype=F64))
    assert torch.autograd.grad(surrogate.sum(), decoder.weight, allow_unused=True)[0] is None


def test_loss_gradient_is_the_exact_nll_gradient_for_an_invertible_linear_pair():
    # beta = 0: the objective's gradient in the encoder equals that of the model's exact mean NLL.
    g = torch.Generator().manual_seed(1)
    a = _invertible(3, g)
    model = FreeFormFlow(_linear(a), _linear(torch.linalg.inv(a)), 3)
    x = torch.randn(8, 3, dtype=F64, generator=g)
    (surrogate_gradient,) = torch.autograd.grad(
        FreeFormLikelihood(beta=0.0, probes=3).loss(model, x), model.encoder.weight
    )
    (exact_gradient,) = torch.autograd.grad(-model.log_prob(x).mean(), model.encoder.weight)
    assert (surrogate_gradient - exact_gradient).abs().max() < 1e-6


def test_injective_surrogate_gradient_for_a_linear_pair_and_its_pseudo_inverse():
    # f(x) = A x (d x D), g = A^+: with K = d the gradient is d/dA 1/2 log det(A A^T) = (A A^T)^{-1} A.
    g = torch.Generator().manual_seed(2)
    a = torch.randn(2, 5, dtype=F64, generator=g)
    encoder, decoder = _linear(a), _linear(torch.linalg.pinv(a))
    x = torch.randn(7, 5, dtype=F64, generator=g)
    _, surrogate, _ = log_det_surrogate(encoder, decoder, x, probes=2)
    (gradient,) = torch.autograd.grad(surrogate.mean(), encoder.weight)
    assert (gradient - torch.linalg.solve(a @ a.T, a)).abs().max() < 1e-6


def test_one_probe_is_unbiased_for_the_trace():
    # For linear f = A, g = B (not inverses): E[v^T A B v] = tr(A B) with one probe; K = d gives it exactly.
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 3, dtype=F64, generator=g), torch.randn(3, 3, dtype=F64, generator=g)
    encoder, decoder = _linear(a), _linear(b)
    x = torch.zeros(20000, 3, dtype=F64)
    torch.manual_seed(0)
    one = log_det_surrogate(encoder, decoder, x, probes=1)[1].detach()
    trace = float(torch.trace(a @ b))
    assert abs(float(one.mean()) - trace) < 4 * float(one.std()) / math.sqrt(one.numel())
    assert float(one.std()) > 0.1  # a random estimate, not the trace itself
    _, full, _ = log_det_surrogate(encoder, decoder, x[:5], probes=3)
    assert torch.allclose(full, torch.full((5,), trace, dtype=F64), atol=1e-12)


def test_free_form_log_prob_is_the_change_of_variables_through_the_encoder():
    torch.manual_seed(0)
    model = FreeFormFlow(MLP(3, 3, (16,), "tanh"), MLP(3, 3, (16,), "tanh"), 3).to(F64)
    x = torch.randn(5, 3, dtype=F64)
    expected = torch.stack(
        [
            model.base.log_prob(model.encoder(p[None]))[0]
            + torch.linalg.slogdet(torch.autograd.functional.jacobian(lambda t: model.encoder(t[None])[0], p))[1]
            for p in x
        ]
    )
    assert torch.allclose(model.log_prob(x), expected, atol=1e-12)
    assert model.log_prob(x.reshape(5, 1, 3)).shape == (5, 1)
    # a linear encoder A: the density of N(0, (A^T A)^{-1})
    a = _invertible(3, torch.Generator().manual_seed(4))
    linear = FreeFormFlow(_linear(a), _linear(torch.linalg.inv(a)), 3)
    gaussian = torch.distributions.MultivariateNormal(torch.zeros(3, dtype=F64), precision_matrix=a.T @ a)
    assert torch.allclose(linear.log_prob(x), gaussian.log_prob(x), atol=1e-12)


def test_preprocessing_enters_the_density_the_samples_and_the_loss():
    torch.manual_seed(1)
    data = torch.randn(200, 2, dtype=F64) * torch.tensor([3.0, 0.5], dtype=F64) + 4
    encoder, decoder = MLP(2, 2, (8,), "tanh").to(F64), MLP(2, 2, (8,), "tanh").to(F64)
    scaling = Standardization.from_data(data).to(F64)
    model = FreeFormFlow(encoder, decoder, 2, preprocessing=scaling)
    plain = FreeFormFlow(encoder, decoder, 2)
    y, ladj = scaling(data[:5])
    assert torch.allclose(model.log_prob(data[:5]), plain.log_prob(y) + ladj, atol=1e-12)
    torch.manual_seed(2)
    samples = model.sample((4,))
    torch.manual_seed(2)
    assert torch.allclose(samples, scaling.inverse(plain.sample((4,)))[0], atol=1e-12)
    torch.manual_seed(3)
    loss = FreeFormLikelihood(beta=2.0).loss(model, data[:5])
    torch.manual_seed(3)
    assert torch.allclose(loss, FreeFormLikelihood(beta=2.0).loss(plain, y) - ladj.mean(), atol=1e-12)
    standardized = flowkit.data.standardize(plain, data)  # the same networks, with this preprocessing
    assert isinstance(standardized.preprocessing, Standardization) and standardized.encoder is encoder
    assert torch.allclose(standardized.log_prob(data[:5]), model.log_prob(data[:5]), atol=1e-12)
    with pytest.raises(ValueError, match="preprocessing already"):
        flowkit.data.standardize(model, data)


def test_injective_log_prob_is_the_manifold_density_at_the_projection():
    # g(z) = z a with |a| = 5: log p(x) = log N(f(x)) - log 5.
    encoder = _linear(torch.tensor([[0.12, 0.16]], dtype=F64))  # the pseudo-inverse of a
    decoder = _linear(torch.tensor([[3.0], [4.0]], dtype=F64))
    model = InjectiveFlow(encoder, decoder, 2, 1)
    x = torch.randn(6, 2, dtype=F64)
    z = x @ torch.tensor([0.12, 0.16], dtype=F64)
    expected = -0.5 * z**2 - 0.5 * math.log(2 * math.pi) - math.log(5.0)
    assert torch.allclose(model.log_prob(x), expected, atol=1e-12)
    samples = model.sample((100,))
    assert torch.allclose(samples[:, 0] * 4, samples[:, 1] * 3, atol=1e-12)  # on the line through a
    assert torch.allclose(model.distance_to_manifold(x), (x - torch.outer(z, decoder.weight[:, 0])).norm(dim=-1))


def test_log_prob_of_one_point_and_of_a_last_chunk_of_one_row():
    # Issue 38 (6): one point (a batch of 1, unbatched, or the last Jacobian chunk of 16385 points in 2-D)
    # made forward-mode AD write tangents into rows that shared memory. Each point gets its batched value.
    torch.manual_seed(0)
    x = torch.randn(5, 3, dtype=F64)
    models = (
        FreeFormFlow(MLP(3, 3, (8,), "tanh"), MLP(3, 3, (8,), "tanh"), 3).to(F64),
        InjectiveFlow(MLP(3, 2, (8,), "tanh"), MLP(2, 3, (8,), "tanh"), 3, 2).to(F64),
    )
    for model in models:
        batched = model.log_prob(x)
        torch.testing.assert_close(model.log_prob(x[:1]), batched[:1], rtol=0, atol=1e-12)
        torch.testing.assert_close(model.log_prob(x[2]), batched[2], rtol=0, atol=1e-12)
    plane = FreeFormFlow(MLP(2, 2, (8,), "tanh"), MLP(2, 2, (8,), "tanh"), 2)
    many = torch.randn(2**14 + 1, 2)  # 2**15 rows per pass over 2 directions: a last chunk of one point
    with torch.no_grad():
        values = plane.log_prob(many)
    assert values.shape == (2**14 + 1,) and torch.isfinite(values).all()
    torch.testing.assert_close(values[-1:], plane.log_prob(many[-1:]).detach())


def test_fit_validates_a_last_batch_of_one_row():
    # Issue 38 (6): fit(..., batch_size=256, val_data=x[:257]) validated a last batch of one point.
    torch.manual_seed(0)
    x = torch.randn(300, 2)
    model = FreeFormFlow(MLP(2, 2, (8,)), MLP(2, 2, (8,)), 2)
    history = fit(
        model, FreeFormLikelihood(), x, steps=2, batch_size=256, val_data=x[:257], val_every=1, progress=False, seed=0
    )
    assert len(history.val_loss) >= 1 and all(math.isfinite(v) for v in history.val_loss)


def test_residual_networks_start_as_the_identity_and_as_exact_inverses():
    torch.manual_seed(0)
    model = FreeFormFlow(ResidualMLP(3, (8,), blocks=2), ResidualMLP(3, (8,), blocks=3), 3)
    x = torch.randn(6, 3)
    assert torch.equal(model.encode(x), x) and torch.equal(model.reconstruct(x), x)
    assert torch.allclose(model.log_prob(x), model.base.log_prob(x))  # log|det| = 0 at the start
    _, surrogate, _ = log_det_surrogate(model.encoder, model.decoder, x, probes=1)
    assert torch.allclose(surrogate, torch.full((6,), 3.0))  # tr(f' g') = tr(I) for any probe of norm sqrt(3)
    with pytest.raises(ValueError, match="blocks"):
        ResidualMLP(3, blocks=0)


def test_models_follow_the_flow_contract():
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    for model in (
        FreeFormFlow(MLP(3, 3, (8,)), MLP(3, 3, (8,)), 3),
        InjectiveFlow(MLP(3, 2, (8,)), MLP(2, 3, (8,)), 3, 2),
    ):
        assert isinstance(model, FlowModel) and model.exact_log_prob and model.context_features == 0
        assert model.event_shape == (3,) and model.sample((2, 5)).shape == (2, 5, 3)
        assert torch.equal(model.path_log_likelihood(x), model.log_prob(x)) and model.auxiliary_loss() is None
        with pytest.raises(ValueError, match="unconditional"):
            model.log_prob(x, torch.randn(4, 1))
        with pytest.raises(ValueError, match="shape"):
            model.log_prob(torch.randn(4, 2))


def test_samples_with_their_density_and_as_a_torch_distribution():
    # Issue 38 (13): rsample_and_log_prob gives the decoder's samples and the model's (encoder's) density at them,
    # differentiable in both networks; a FreeFormFlow is a torch Distribution, an InjectiveFlow (no density on
    # R^D) says why it is not; neither gives importance weights (its samples do not follow its density).
    torch.manual_seed(0)
    free = FreeFormFlow(MLP(2, 2, (8,), "tanh"), MLP(2, 2, (8,), "tanh"), 2).to(F64)
    injective = InjectiveFlow(MLP(3, 2, (8,), "tanh"), MLP(2, 3, (8,), "tanh"), 3, 2).to(F64)
    for model in (free, injective):
        assert not model.samples_match_density
        torch.manual_seed(1)
        x, log_p = model.rsample_and_log_prob((4, 5))
        torch.manual_seed(1)
        assert torch.equal(x, model.sample((4, 5))) and x.shape == (4, 5, model.features)
        torch.testing.assert_close(log_p, model.log_prob(x), rtol=0, atol=1e-12)
        log_p.sum().backward()
        assert all(p.grad is not None for p in (*model.encoder.parameters(), *model.decoder.parameters()))
        x, log_p = model.sample_and_log_prob(3)
        assert x.shape == (3, model.features) and log_p.shape == (3,) and not log_p.requires_grad
        with pytest.raises(ValueError, match=r"sample_with_log_weights: .*samples do not come from the density"):
            flowkit.sampling.sample_with_log_weights(
                model, 4, flowkit.targets.Energy(lambda y: y.square().sum(-1), model.features)
            )
    distribution = free.to_distribution()
    assert isinstance(distribution, torch.distributions.Distribution) and distribution.has_rsample
    y = torch.randn(6, 2, dtype=F64)
    torch.testing.assert_close(distribution.log_prob(y), free.log_prob(y))
    assert distribution.rsample((2, 3)).shape == (2, 3, 2) and distribution.event_shape == (2,)
    with pytest.raises(ValueError, match="unconditional"):
        free.to_distribution(torch.randn(1, 2))
    with pytest.raises(ValueError, match="InjectiveFlow.to_distribution: .*no density on R\\^D"):
        injective.to_distribution()


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    data = torch.randn(50, 3) * 2
    models = (
        FreeFormFlow(MLP(3, 3, (8,)), MLP(3, 3, (8,)), 3, preprocessing=Standardization.from_data(data)),
        InjectiveFlow(MLP(3, 1, (8,), "silu"), MLP(1, 3, (8,), "silu"), 3, 1),
    )
    for i, model in enumerate(models):
        flowkit.io.save(model, tmp_path / str(i))
        loaded = flowkit.io.load(tmp_path / str(i))
        assert type(loaded) is type(model)
        assert torch.allclose(loaded.log_prob(data), model.log_prob(data))
        torch.manual_seed(1)
        samples = loaded.sample((5,))
        torch.manual_seed(1)
        assert torch.equal(samples, model.sample((5,)))


def _curve(t: torch.Tensor) -> torch.Tensor:
    return torch.stack([t, torch.sin(1.5 * t) + 1], -1)


@pytest.mark.slow
def test_injective_flow_learns_a_curve_in_the_plane():
    # Points on a curve plus noise of standard deviation 0.1; a 1-D latent: 95% of the samples within 0.1 of
    # the curve, spread along it (their nearest curve points close to uniform, as the data's are).
    g = torch.Generator().manual_seed(0)
    t = torch.rand(2000, generator=g) * 4 - 2
    x = _curve(t) + 0.1 * torch.randn(2000, 2, generator=g)
    torch.manual_seed(0)
    model = InjectiveFlow(MLP(2, 1, (64, 64), "silu"), MLP(1, 2, (64, 64), "silu"), 2, 1)
    history = fit(model, FreeFormLikelihood(beta=10.0), x, steps=1000, batch_size=256, lr=3e-3, progress=False, seed=0)
    assert history.metrics["reconstruction"][-1] < 0.05  # about the noise variance across the curve, 0.01
    samples = model.sample((4000,))
    grid = torch.linspace(-2, 2, 4001)
    distance, nearest = torch.cdist(samples, _curve(grid)).min(1)
    assert float((distance < 0.1).float().mean()) >= 0.95
    position = (grid[nearest].sort().values + 2) / 4  # uniform on [0, 1] for samples spread like the data
    assert float((position - torch.arange(1, 4001) / 4000).abs().max()) < 0.15
    assert torch.isfinite(model.log_prob(x[:100])).all()


@pytest.mark.slow
def test_free_form_flow_fits_a_correlated_gaussian():
    # The exact density after training is close to the true one: the KL estimate on test points is small.
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([[1.0, 0.0], [0.8, 0.6]])
    x = torch.randn(4000, 2, generator=g) @ scale.T
    true = torch.distributions.MultivariateNormal(torch.zeros(2), scale_tril=scale)
    torch.manual_seed(0)
    model = FreeFormFlow(MLP(2, 2, (32, 32), "silu"), MLP(2, 2, (32, 32), "silu"), 2)
    with torch.no_grad():
        untrained = float((true.log_prob(x[3000:]) - model.log_prob(x[3000:])).mean())
    fit(model, FreeFormLikelihood(beta=10.0), x[:3000], steps=600, batch_size=256, lr=3e-3, progress=False, seed=0)
    with torch.no_grad():
        kl = float((true.log_prob(x[3000:]) - model.log_prob(x[3000:])).mean())
        reconstruction = float((model.reconstruct(x[3000:]) - x[3000:]).square().sum(-1).mean())
    assert untrained > 1 and abs(kl) < 0.02 and reconstruction < 0.01


def test_bad_input_is_refused():
    mlp = MLP(3, 3, (4,))
    with pytest.raises(ValueError, match="probes"):
        FreeFormLikelihood(probes=0)
    with pytest.raises(ValueError, match="beta"):
        FreeFormLikelihood(beta=-1.0)
    with pytest.raises(ValueError, match="beta"):
        FreeFormLikelihood(beta=float("nan"))
    with pytest.raises(ValueError, match="latent_features"):
        InjectiveFlow(mlp, MLP(3, 3, (4,)), 3, 3)
    with pytest.raises(ValueError, match="latent_features"):
        InjectiveFlow(mlp, MLP(3, 3, (4,)), 3, 0)
    with pytest.raises(ValueError, match=r"encoder maps inputs of shape \(2, 3\) to \(2, 2\)"):
        FreeFormFlow(MLP(3, 2, (4,)), mlp, 3)
    with pytest.raises(ValueError, match="decoder maps"):
        InjectiveFlow(MLP(3, 1, (4,)), MLP(1, 2, (4,)), 3, 1)
    with pytest.raises(ValueError, match="encoder cannot take"):
        FreeFormFlow(MLP(2, 3, (4,)), mlp, 3)
    with pytest.raises(ValueError, match="nn.Module"):
        FreeFormFlow(lambda x: x, mlp, 3)
    model = InjectiveFlow(MLP(3, 2, (4,)), MLP(2, 3, (4,)), 3, 2)
    with pytest.raises(ValueError, match="probes=3 exceeds the latent dimension 2"):
        FreeFormLikelihood(probes=3).loss(model, torch.randn(4, 3))
    with pytest.raises(ValueError, match="MaximumLikelihood"):
        FreeFormLikelihood().loss(flowkit.flows.RealNVP(3, transforms=1, hidden=(4,)), torch.randn(4, 3))
    with pytest.raises(ValueError, match="unconditional"):
        FreeFormLikelihood().loss(model, (torch.randn(4, 3), torch.randn(4, 1)))
    with pytest.raises(ValueError, match="non-finite"):
        FreeFormLikelihood().loss(model, torch.full((4, 3), float("nan")))
