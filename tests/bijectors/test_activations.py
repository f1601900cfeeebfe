"""Smooth activations and the logit preprocessing: closed forms, inverse precision, peers."""

import math

import pytest
import torch
from torch.distributions import transforms as T

from flowkit.bijectors import Chain, Linear, Logit, SmoothLeakyReLU, SmoothTanh
from flowkit.bijectors.activations import monotone_inverse
from flowkit.root_finding import ConvergenceError
from flowkit.testing import check_bijector

WIDE = torch.cat([torch.linspace(-1e4, 1e4, 20001), torch.linspace(-8, 8, 4001)]).double().unsqueeze(-1)


@pytest.mark.parametrize("alpha", [0.3, 0.01, 1.0])
def test_smooth_leaky_relu_closed_form_and_slopes(alpha):
    b = SmoothLeakyReLU(1, alpha=alpha).double()
    x = torch.linspace(-30, 30, 601, dtype=torch.float64).unsqueeze(-1)
    z, ladj = b(x)
    expected = alpha * x + (1 - alpha) * torch.log1p(torch.exp(x))
    torch.testing.assert_close(z, expected, rtol=1e-12, atol=1e-12)
    expected_slope = alpha + (1 - alpha) * torch.sigmoid(x[:, 0])
    torch.testing.assert_close(ladj, expected_slope.log(), rtol=1e-12, atol=1e-12)
    # slope alpha far left, 1 far right: a smooth leaky ReLU
    assert abs(ladj[0].exp().item() - alpha) < 1e-12
    assert abs(ladj[-1].exp().item() - 1) < 1e-12


@pytest.mark.parametrize(
    "bijector",
    [SmoothLeakyReLU(1, 0.3), SmoothLeakyReLU(1, 0.01), SmoothTanh(1), SmoothTanh(1, scale=5.0, leak=0.01)],
    ids=["slrelu0.3", "slrelu0.01", "tanh", "tanh-steep"],
)
def test_inverse_precision_on_a_wide_range(bijector):
    """The documented tolerance: round trip below 1e-12 (relative to 1 + |y|) in float64 for |y| <= 1e4."""
    b = bijector.double()
    x, ladj_inv = b.inverse(WIDE)
    err = ((b.call(x) - WIDE).abs() / (1 + WIDE.abs())).max().item()
    assert err < 1e-12
    torch.testing.assert_close(ladj_inv, -b(x)[1], rtol=0, atol=1e-12)


def test_inverse_gradient_is_the_implicit_derivative():
    b = SmoothLeakyReLU(3, 0.3).double()
    y = (torch.randn(4, 3, dtype=torch.float64) * 3).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: b.inverse(t)[0], (y,))
    x = b.inverse(y)[0]
    (g,) = torch.autograd.grad(x.sum(), y)
    torch.testing.assert_close(g, (-b._log_df(x.detach())).exp())


def test_monotone_inverse_converges_where_plain_newton_cycles():
    # Newton on tanh(x) + 0.1 x = -0.857 from the bracket's middle cycles between two points.
    f = lambda t: torch.tanh(t) + 0.1 * t  # noqa: E731
    df = lambda t: 0.1 + 1 / torch.cosh(t).square()  # noqa: E731
    y = torch.tensor([-0.857], dtype=torch.float64)
    x = monotone_inverse(f, df, y, (y - 1) / 0.1, (y + 1) / 0.1, iterations=60)
    assert abs((f(x) - y).item()) < 1e-14


def test_smooth_tanh_matches_its_formula():
    b = SmoothTanh(2, scale=2.0, leak=0.2).double()
    x = torch.randn(10, 2, dtype=torch.float64) * 4
    z, ladj = b(x)
    torch.testing.assert_close(z, torch.tanh(2 * x) + 0.2 * x)
    torch.testing.assert_close(ladj, (0.2 + 2 / torch.cosh(2 * x).square()).log().sum(-1))


@pytest.mark.parametrize("alpha", [0.0, 0.05])
def test_logit_matches_torch_distributions(alpha):
    """Peer: torch's AffineTransform(alpha, 1 - 2 alpha) then the inverse sigmoid."""
    b = Logit(4, alpha=alpha).double()
    x = torch.rand(20, 4, dtype=torch.float64) * 0.98 + 0.01
    peer = T.ComposeTransform([T.AffineTransform(alpha, 1 - 2 * alpha), T.SigmoidTransform().inv])
    z, ladj = b(x)
    torch.testing.assert_close(z, peer(x))
    torch.testing.assert_close(ladj, peer.log_abs_det_jacobian(x, peer(x)).sum(-1))
    x_back, ladj_inv = b.inverse(z)
    torch.testing.assert_close(x_back, x)
    torch.testing.assert_close(ladj_inv, -ladj)


def test_logit_domain_and_checks():
    b = Logit((2, 2), alpha=0.1)
    assert b.domain.contains(torch.tensor([0.5])).all() and not b.domain.contains(torch.tensor([1.5])).any()
    assert check_bijector(b).passed


@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.3])
def test_logit_inverse_stays_in_its_domain_and_a_flow_on_it_is_normalised_there(alpha):
    from flowkit import Flow
    from flowkit.distributions import StandardNormal

    b = Logit(1, alpha=alpha).double()
    # the domain is the preimage of the real line: p = alpha + (1 - 2 alpha) x is 0 and 1 at its ends
    assert alpha + (1 - 2 * alpha) * b.domain.low == pytest.approx(0, abs=1e-15)
    assert alpha + (1 - 2 * alpha) * b.domain.high == pytest.approx(1, abs=1e-15)
    x, _ = b.inverse(torch.linspace(-30, 30, 601, dtype=torch.float64).unsqueeze(-1))
    assert b.domain.admits(x).all()
    flow = Flow(b, StandardNormal(1)).double()
    torch.manual_seed(0)
    samples = flow.sample((4000,))
    assert torch.isfinite(flow.log_prob(samples)).all()  # its own samples, also those outside [0, 1]
    grid = torch.linspace(b.domain.low, b.domain.high, 200001, dtype=torch.float64)[1:-1].unsqueeze(-1)
    mass = torch.trapezoid(flow.log_prob(grid).exp(), grid[:, 0])
    assert float(mass) == pytest.approx(1.0, abs=1e-6)


def test_activation_in_a_chain_passes_the_checks():
    chain = Chain(Linear(3), SmoothLeakyReLU(3, 0.3), Linear(3), SmoothTanh(3))
    assert check_bijector(chain, torch.randn(6, 3) * 2).passed


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: SmoothLeakyReLU(3, alpha=0.0), "alpha"),
        (lambda: SmoothLeakyReLU(3, alpha=1.5), "alpha"),
        (lambda: SmoothTanh(3, scale=-1.0), "scale"),
        (lambda: Logit(3, alpha=0.5), "alpha"),
    ],
)
def test_bad_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_input_shape():
    with pytest.raises(ValueError, match="shape"):
        SmoothLeakyReLU(3)(torch.randn(5, 4))


def test_float32_inverse():
    b = SmoothLeakyReLU(5, 0.3)
    x = torch.randn(100, 5) * 5
    x_back = b.inverse(b(x)[0])[0]
    assert x_back.dtype == torch.float32
    torch.testing.assert_close(x_back, x, rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(b.inverse(torch.full((1, 5), -1e6))[0].min()))


def test_monotone_inverse_final_step_stays_in_the_bracket():
    # x^3 from the start 0, where f' = 0: the final Newton step of an unfinished solve would be infinite.
    f = lambda t: t**3  # noqa: E731
    df = lambda t: 3 * t**2  # noqa: E731
    y = torch.tensor([1e-3, 0.5, -0.2], dtype=torch.float64, requires_grad=True)
    low, high = torch.tensor(-1.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    start = torch.zeros(3, dtype=torch.float64)
    for iterations in (0, 1, 2):
        x = monotone_inverse(f, df, y, low, high, iterations, start=start, check=False)
        assert torch.isfinite(x).all() and (x.abs() <= 1).all()
        with pytest.raises(ConvergenceError, match=r"did not converge .* residual"):
            monotone_inverse(f, df, y, low, high, iterations, start=start)
    x = monotone_inverse(f, df, y, low, high, 80)
    (g,) = torch.autograd.grad(x.sum(), y)
    torch.testing.assert_close(x, y.detach().sign() * y.detach().abs() ** (1 / 3))
    torch.testing.assert_close(g, 1 / (3 * x.detach() ** 2))
