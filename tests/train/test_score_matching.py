"""EBFlow score matching: the score, the Gaussian closed form, covariance recovery, no determinants."""

import math

import pytest
import torch

import flowkit
from flowkit.bijectors import (
    ActNorm,
    AffineCoupling,
    Chain,
    Invert,
    Linear,
    Logit,
    LULinear,
    Reverse,
    SmoothLeakyReLU,
    SmoothTanh,
)
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.testing import randomize
from flowkit.train import EMA, ScoreMatching, exact_log_prob, fit
from flowkit.train.score_matching import energy, score


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny: one thread is faster, and robust on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mixed_flow(features=4, context=0):
    """Constant-ladj layers (dense, LU, ActNorm, permutation) mixed with varying ones, nested chains."""
    act = ActNorm(features)
    act(torch.randn(64, features) * 2 + 1)
    layers = Chain(
        Linear(features),
        SmoothLeakyReLU(features, 0.3),
        Chain(LULinear(features), randomize(AffineCoupling(features, hidden=(8,), context=context)), act),
        Reverse(features),
        SmoothTanh(features),
        Linear(features),
    )
    return flowkit.Flow(randomize(layers, scale=0.2), DiagNormal(features, loc=0.3, scale=1.5))


def gaussian_flow(weight, bias=None):
    """X -> z = W x + b over N(0, I): a Gaussian with precision W^T W and mean -W^{-1} b."""
    d = weight.shape[0]
    layer = Linear(d, bias=bias is not None).double()
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return flowkit.Flow(layer, StandardNormal(d).double())


def model_covariance(flow):
    w = flow.bijector.weight.detach()
    return torch.linalg.inv(w.T @ w)


# -- the energy and its score ------------------------------------------------------------


def test_score_equals_autograd_grad_log_prob_of_the_full_flow():
    flow = mixed_flow().double()
    x = torch.randn(16, 4, dtype=torch.float64) * 1.5
    xg = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(flow.log_prob(xg).sum(), xg)
    torch.testing.assert_close(score(flow, x), expected, rtol=1e-10, atol=1e-10)


def test_score_with_context():
    flow = mixed_flow(context=2).double()
    x = torch.randn(8, 4, dtype=torch.float64)
    c = torch.randn(8, 2, dtype=torch.float64)
    xg = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(flow.log_prob(xg, c).sum(), xg)
    torch.testing.assert_close(score(flow, x, c), expected, rtol=1e-10, atol=1e-10)


def test_energy_differs_from_minus_log_prob_by_the_constant_log_dets():
    flow = mixed_flow().double()
    x = torch.randn(10, 4, dtype=torch.float64)
    constant = sum(
        float(layer.log_abs_det().detach())
        for layer in flow.bijector.modules()
        if isinstance(layer, (Linear, LULinear, ActNorm))
    )
    torch.testing.assert_close(-energy(flow, x) + constant, flow.log_prob(x).detach(), rtol=1e-10, atol=1e-10)


def test_exact_log_prob_batched_and_with_preprocessing():
    flow = mixed_flow().double()
    x = torch.randn(37, 4, dtype=torch.float64)
    torch.testing.assert_close(exact_log_prob(flow, x, batch_size=8), flow.log_prob(x).detach())
    # Match after preprocessing: the raw-data density is that of the flow over Chain(Logit, bijector).
    logit = Logit(4, alpha=0.05).double()
    u = torch.rand(37, 4, dtype=torch.float64)
    full = flowkit.Flow(Chain(logit, flow.bijector), flow.base)
    torch.testing.assert_close(exact_log_prob(flow, u, preprocessing=logit, batch_size=10), full.log_prob(u).detach())
    objective = ScoreMatching("dsm", preprocessing=logit)
    torch.testing.assert_close(objective.validation_loss(flow, u), -full.log_prob(u).detach().mean())


# -- Gaussian model, Gaussian data: the SSM closed form ------------------------------------


def ssm_closed_form(w, data_cov):
    """(1/D) [1/2 tr(S_m^-1 S_d S_m^-1) - tr S_m^-1] for centred data and model, S_m^-1 = W^T W."""
    precision = w.T @ w
    return float(0.5 * torch.trace(precision @ data_cov @ precision) - torch.trace(precision)) / w.shape[0]


DATA_COV = torch.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]], dtype=torch.float64)


def expected_ssm(flow, batches=40, n=5000, seed=0):
    """Mean of the SSM loss over fresh centred Gaussian batches, and its standard error."""
    gen = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(DATA_COV)
    objective = ScoreMatching("ssm")
    values = []
    for _ in range(batches):
        x = torch.randn(n, 3, dtype=torch.float64, generator=gen) @ chol.T
        values.append(float(objective.loss(flow, x).detach()))
    values = torch.tensor(values, dtype=torch.float64)
    return float(values.mean()), float(values.std() / math.sqrt(batches))


def test_ssm_matches_the_gaussian_closed_form():
    w = torch.tensor([[1.2, 0.3, -0.2], [0.1, 0.8, 0.4], [-0.5, 0.2, 1.5]], dtype=torch.float64)
    flow = gaussian_flow(w)
    mean, stderr = expected_ssm(flow)
    exact = ssm_closed_form(w, DATA_COV)
    assert abs(mean - exact) < 4 * stderr, (mean, exact, stderr)
    assert stderr < 0.02 * abs(exact)  # the comparison is sharp enough to mean something


def test_ssm_is_minimised_at_the_data_covariance():
    w_star = torch.linalg.inv(torch.linalg.cholesky(DATA_COV))  # W^T W = S_d^{-1}
    at_optimum, err0 = expected_ssm(gaussian_flow(w_star), seed=1)
    assert abs(at_optimum - ssm_closed_form(w_star, DATA_COV)) < 4 * err0
    # its closed-form value: -tr(S_d^-1) / (2 D)
    assert abs(ssm_closed_form(w_star, DATA_COV) + float(torch.trace(torch.linalg.inv(DATA_COV))) / 6) < 1e-12
    gen = torch.Generator().manual_seed(3)
    perturbations = [
        1.15 * w_star,
        0.87 * w_star,
        w_star + 0.15 * torch.randn(3, 3, dtype=torch.float64, generator=gen),
    ]
    for w in perturbations:
        value, err = expected_ssm(gaussian_flow(w), seed=1)
        assert value - at_optimum > 4 * math.hypot(err, err0), (value, at_optimum)


# -- training recovers the covariance -------------------------------------------------------


@pytest.mark.parametrize("method", ["ssm", "dsm", "fdsm"])
def test_training_a_2d_linear_flow_recovers_the_covariance(method):
    torch.manual_seed(0)
    cov = torch.tensor([[2.0, 0.8], [0.8, 0.5]], dtype=torch.float64)
    mean = torch.tensor([1.0, -1.0], dtype=torch.float64)
    data = torch.randn(2000, 2, dtype=torch.float64) @ torch.linalg.cholesky(cov).T + mean
    flow = flowkit.Flow(Linear(2).double(), StandardNormal(2).double())
    sigma = 0.5
    objective = ScoreMatching(method, sigma=sigma, epsilon=0.1)
    history = fit(
        flow,
        objective,
        data,
        steps=450,
        batch_size=len(data),
        lr=0.05,
        schedule="step",
        val_data=data[:500],
        restore_best=False,  # the score-matching optimum, not the weights of the best validation NLL
        progress=False,
        seed=0,
    )
    # the validation loss the loop reports is the exact NLL
    torch.testing.assert_close(history.val_loss[-1], -flow.log_prob(data[:500]).mean().item(), rtol=1e-6, atol=1e-6)
    sample_cov = torch.cov(data.T, correction=0)
    # DSM matches the data smoothed by N(0, sigma^2 I): its optimum is exactly S_d + sigma^2 I.
    target = sample_cov + (sigma**2 * torch.eye(2, dtype=torch.float64) if method == "dsm" else 0)
    learnt = model_covariance(flow)
    rel = float(torch.linalg.norm(learnt - target) / torch.linalg.norm(target))
    assert rel < 0.05, (method, learnt, target)
    learnt_mean = -torch.linalg.solve(flow.bijector.weight, flow.bijector.bias).detach()
    assert float((learnt_mean - data.mean(0)).norm()) < 0.05


# -- no determinant in a score-matching step ------------------------------------------------


def _no_determinants(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a determinant was computed")

    for module, name in [
        (torch.linalg, "slogdet"),
        (torch.linalg, "det"),
        (torch, "det"),
        (torch, "logdet"),
        (torch, "slogdet"),
    ]:
        monkeypatch.setattr(module, name, forbidden)


def _dense_flow(features=6):
    act = ActNorm(features)
    layers = Chain(
        act,
        Linear(features),
        SmoothLeakyReLU(features, 0.3),
        Chain(LULinear(features), Linear(features)),
        Invert(Linear(features)),
    )
    return flowkit.Flow(layers, StandardNormal(features))


@pytest.mark.parametrize("method", ["ssm", "dsm", "fdsm"])
def test_a_score_matching_step_never_computes_a_determinant(method, monkeypatch):
    flow = _dense_flow()
    x = torch.randn(32, 6)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    _no_determinants(monkeypatch)
    optimizer.zero_grad()
    loss = ScoreMatching(method, slices=2).loss(flow, x)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in flow.bijector[1].parameters())
    # the patch is effective: maximum likelihood on the same flow does need slogdet
    with pytest.raises(AssertionError, match="determinant"):
        flow.log_prob(x)


# -- the objective's interface --------------------------------------------------------------


def test_losses_are_divided_by_the_dimension():
    """Model and data N(0, I) in D dimensions, s(x) = -x: the expectations do not depend on D.

    SSM: (1/D) E[-v^T v + |x|^2 / 2] = -1/2. FDSM: ((x.v)^2 / 2 - |v|^2) / eps^2 with |v| = eps
    has expectation -1/2. DSM: (1/2D) E|-x + (1/s - s) n|^2 = (1 + (1/s - s)^2) / 2.
    """
    s = 0.3
    for d in (2, 8):
        flow = flowkit.Flow(Linear(d, bias=False).double(), StandardNormal(d).double())
        with torch.no_grad():
            flow.bijector.weight.copy_(torch.eye(d, dtype=torch.float64))
        x = torch.randn(20000, d, dtype=torch.float64)
        assert abs(ScoreMatching("ssm").loss(flow, x).item() + 0.5) < 0.02
        assert abs(ScoreMatching("fdsm", epsilon=0.5).loss(flow, x).item() + 0.5) < 0.02
        expected = 0.5 * (1 + (1 / s - s) ** 2)
        assert abs(ScoreMatching("dsm", sigma=s).loss(flow, x).item() - expected) < 0.02 * expected


def test_batches_with_context_and_energy_regulariser():
    flow = mixed_flow(context=2)
    x, c = torch.randn(16, 4), torch.randn(16, 2)
    for method in ("ssm", "dsm", "fdsm"):
        plain = ScoreMatching(method)
        torch.manual_seed(1)
        a = plain.loss(flow, (x, c))
        torch.manual_seed(1)
        b = ScoreMatching(method, energy_weight=0.1).loss(flow, (x, c))
        torch.manual_seed(1)
        # DSM's energy term is taken at the noisy points, as the reference does
        points = x + plain.sigma * torch.randn_like(x) if method == "dsm" else x
        torch.testing.assert_close(b - a, 0.1 * energy(flow, points, c).mean(), rtol=1e-4, atol=1e-5)
        assert set(plain.metrics()) == {"energy"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"method": "ml"}, "method"),
        ({"sigma": 0.0}, "sigma"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"slices": 0}, "slices"),
        ({"preprocessing": "logit"}, "preprocessing"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScoreMatching(**kwargs)


def test_bad_batches():
    flow = mixed_flow()
    with pytest.raises(ValueError, match="shape"):
        ScoreMatching().loss(flow, torch.randn(5, 3))
    with pytest.raises(ValueError, match="pair"):
        ScoreMatching().loss(flow, (torch.randn(5, 4),))
    with pytest.raises(ValueError, match="Flow"):
        ScoreMatching().loss(torch.nn.Linear(4, 4), torch.randn(5, 4))


def test_ema_average_and_restore():
    flow = _dense_flow(3)
    ema = EMA(flow, decay=0.5)
    w0 = flow.bijector[1].weight.detach().clone()
    with torch.no_grad():
        flow.bijector[1].weight.add_(1.0)
    ema.update()  # first update: d = min(0.5, 1/10) = 0.1
    expected = 0.1 * w0 + 0.9 * (w0 + 1)
    with ema.average() as model:
        torch.testing.assert_close(model.bijector[1].weight, expected)
    torch.testing.assert_close(flow.bijector[1].weight.detach(), w0 + 1)
    torch.testing.assert_close(ema.averaged().bijector[1].weight, expected)
    state = ema.state_dict()
    other = EMA(flow, decay=0.9)
    other.load_state_dict(state)
    assert other.updates == 1 and other.decay == 0.5
    with pytest.raises(ValueError, match="decay"):
        EMA(flow, decay=1.0)


def test_objective_is_saved_with_its_config():
    objective = ScoreMatching("dsm", sigma=0.5, preprocessing=Logit(4, alpha=0.05))
    cls, config = flowkit._config.get_config(objective)
    assert cls is ScoreMatching and config["sigma"] == 0.5 and config["method"] == "dsm"
