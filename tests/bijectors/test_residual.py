"""Residual blocks: an unbiased Russian-roulette log-det and gradient, the spectral bound, the stated inverse tolerance.

Also: implicit gradients of the inverse, an exact and deterministic eval mode, bad arguments refused.
"""

import pytest
import torch

from flowkit._validation import set_validation
from flowkit.bijectors import Residual
from flowkit.testing import randomize


def _at_bound(features: int, **kwargs) -> Residual:
    """A series block whose layers all sit at their bound (Lip(g) <= 0.8^2 < sqrt(1 - p), finite variance).

    The second weight is minus the first's transpose, so that near 0 the Jacobian is close to
    `-0.64 P` for a projection `P`: a log-det far from 0 and a series of terms of one sign.
    """
    layer = Residual(features, hidden=(8,), coefficient=0.8, activation="tanh", logdet="series", **kwargs)
    randomize(layer, scale=1.0).double()
    with torch.no_grad():
        layer.linears[1].weight.copy_(-layer.linears[0].weight.T)
        layer.linears[0].bias.mul_(0.3)
    layer(torch.zeros(1, features, dtype=torch.float64))  # converge the power iterations
    return layer


def _exact(layer: Residual, x: torch.Tensor) -> torch.Tensor:
    layer.eval()
    try:
        return layer(x)[1]
    finally:
        layer.train()


@pytest.mark.slow
@pytest.mark.parametrize("features,estimator", [(2, "geometric"), (5, "poisson")])
def test_russian_roulette_log_det_is_unbiased(features, estimator):
    layer = _at_bound(features, estimator=estimator)
    for linear in layer.linears:  # the bound is active: the raw weights are larger than it
        assert torch.linalg.matrix_norm(linear.weight, ord=2) > 1.0
    x = 0.3 * torch.randn(1, features, dtype=torch.float64)
    exact = _exact(layer, x).item()
    assert abs(exact) > 0.1  # a log-det far from that of the identity
    set_validation(False)
    try:
        with torch.no_grad():
            draws = torch.cat([layer(x)[1] for _ in range(10_000)])
    finally:
        set_validation(True)
    assert draws.std() > 0.01  # the estimator is random in training mode ...
    se = draws.std().item() / len(draws) ** 0.5
    assert abs(draws.mean().item() - exact) < 3 * se, (draws.mean().item(), exact, se)  # ... and unbiased


@pytest.mark.parametrize("neumann,exact_terms", [(True, 2), (False, 2), (True, 0)])
def test_log_det_gradient_is_unbiased(neumann, exact_terms):
    layer = _at_bound(2, neumann=neumann, exact_terms=exact_terms)
    params = [layer.linears[0].weight, layer.linears[1].weight, layer.linears[0].bias]
    direction = [torch.randn_like(p) for p in params]
    x = 0.3 * torch.randn(1, 2, dtype=torch.float64)

    def projected(ladj):
        if not ladj.requires_grad:  # no term drawn (exact_terms=0): the estimate 0, its gradient 0
            return 0.0
        grads = torch.autograd.grad(ladj.sum(), params)
        return sum((g * d).sum() for g, d in zip(grads, direction, strict=True)).item()

    exact = projected(_exact(layer, x))
    assert abs(exact) > 0.01
    draws = torch.tensor([projected(layer(x)[1]) for _ in range(1500)], dtype=torch.float64)
    se = draws.std().item() / len(draws) ** 0.5
    assert abs(draws.mean().item() - exact) < 3 * se, (draws.mean().item(), exact, se)


def test_eval_log_det_is_exact_and_deterministic():
    layer = _at_bound(3)
    x = torch.randn(4, 3, dtype=torch.float64)
    layer.eval()
    first, second = layer(x)[1], layer(x)[1]
    assert torch.equal(first, second)
    jac = torch.autograd.functional.jacobian(lambda v: layer(v.unsqueeze(0))[0][0], x[0])
    torch.testing.assert_close(first[0], torch.linalg.slogdet(jac)[1])
    layer.train()
    assert not torch.equal(layer(x)[1], layer(x)[1])  # the series estimate is random


@pytest.mark.parametrize("power_iterations", [None, 1])
def test_spectral_norm_of_every_block_stays_below_its_bound_after_training(power_iterations):
    torch.manual_seed(1)
    c = 0.9
    layers = [Residual(2, hidden=(32, 32), coefficient=c, power_iterations=power_iterations) for _ in range(3)]
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    x = torch.randn(256, 2) * torch.tensor([3.0, 0.3])
    for _ in range(150):
        z, ladj = x, 0
        for layer in layers:
            z, step = layer(z)
            ladj = ladj + step
        loss = (0.5 * z.pow(2).sum(-1) - ladj).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for layer in layers:
        raw = torch.stack([torch.linalg.matrix_norm(lin.weight.detach(), ord=2) for lin in layer.linears])
        assert (raw > c).any()  # training pushed weights past the bound: the normalisation is at work
        layer(x)  # training mode: the weights of this call (exact norms, or power-iteration estimates)
        trained = layer.spectral_norms()
        if power_iterations is None:  # the default: the bound itself at every training step
            assert (trained <= c * (1 + 1e-6)).all(), trained
        else:  # the estimate lags below the norm: every block contractive, Lip(g) < c
            assert (trained < 1).all() and trained.prod() < c, trained
        layer.eval()
        assert (layer.spectral_norms() <= c * (1 + 1e-6)).all()  # exact norms: the bound itself
        jac = torch.func.vmap(torch.func.jacrev(lambda v, m=layer: m.residual(v)))(x[:64])
        assert torch.linalg.matrix_norm(jac, ord=2).max() <= c**3 * (1 + 1e-6)  # Lip(g) <= c^L at the data


@pytest.mark.parametrize("tolerance", [1e-6, 1e-10])
def test_fixed_point_inverse_meets_its_stated_tolerance(tolerance):
    c = 0.97
    layer = randomize(Residual(4, hidden=(16,), coefficient=c, tolerance=tolerance), scale=1.0).double().eval()
    x = torch.randn(32, 4, dtype=torch.float64)
    z = layer.call(x)
    x_back = layer.inverse_call(z)
    error = (x_back - x).abs().max().item()
    assert error <= c / (1 - c) * tolerance
    if tolerance == 1e-10:
        assert error <= 1e-8  # the acceptance tolerance of numerical inverses


def test_inverse_gradients_are_the_implicit_ones():
    layer = _at_bound(2).eval()
    z = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    params = [layer.linears[0].weight, layer.linears[1].bias]

    def unrolled(z):  # autograd through enough fixed-point steps to converge
        x = z
        for _ in range(200):
            x = z - layer.residual(x)
        return x

    x, ladj = layer.inverse(z)
    loss = x.pow(2).sum() + ladj.sum()
    x_ref = unrolled(z)
    loss_ref = x_ref.pow(2).sum() - layer(x_ref)[1].sum()
    for got, want in zip(
        torch.autograd.grad(loss, [z, *params]), torch.autograd.grad(loss_ref, [z, *params]), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_series_without_gradients_returns_no_graph():
    layer = _at_bound(3)
    with torch.no_grad():
        z, ladj = layer(torch.randn(4, 3, dtype=torch.float64))
    assert not z.requires_grad and not ladj.requires_grad


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"coefficient": 1.0}, "coefficient"),
        ({"coefficient": 1.5}, "coefficient"),
        ({"coefficient": 0.0}, "coefficient"),
        ({"coefficient": -0.5}, "coefficient"),
        ({"power_iterations": 0}, "power_iterations"),
        ({"max_iterations": 0}, "max_iterations"),
        ({"exact_terms": -1}, "exact_terms"),
        ({"tolerance": 0.0}, "tolerance"),
        ({"p": 1.0}, "p"),
        ({"p": 0.0}, "p"),
        ({"rate": 0.0}, "rate"),
        ({"logdet": "stochastic"}, "logdet"),
        ({"estimator": "uniform"}, "estimator"),
        ({"activation": "relu"}, "activation"),
        ({"hidden": "64"}, "hidden"),
        ({"hidden": (0,)}, "hidden"),
        ({"neumann": 1}, "neumann"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Residual(2, **kwargs)


def test_bad_features_are_refused():
    with pytest.raises(ValueError, match="features"):
        Residual(0)
