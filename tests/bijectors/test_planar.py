"""Planar and radial layers: invertibility constraints for any parameters, exact inverses, bad sizes refused."""

import pytest
import torch

from flowkit.bijectors import Planar, Radial


def test_planar_constraint_holds_for_any_u():
    layer = Planar(3).double()
    with torch.no_grad():
        layer.w.copy_(torch.tensor([2.0, -1.0, 0.5]))
        for u in ([-10.0, 3.0, 0.0], [0.0, 0.0, 0.0], [4.0, -2.0, 1.0]):
            layer.u.copy_(torch.tensor(u))
            wu = (layer.w @ layer.u_hat()).item()
            assert wu > -1
            assert wu == pytest.approx(torch.nn.functional.softplus(layer.w @ layer.u).item() - 1)


def test_planar_with_w_zero_is_a_shift():
    # w = 0: f(x) = x + u tanh(b), no 0/0 in u_hat and a log-det of exactly 0
    layer = Planar(3).double()
    with torch.no_grad():
        layer.w.zero_()
        layer.b.fill_(0.4)
    x = torch.randn(8, 3, dtype=torch.float64)
    z, ladj = layer(x)
    torch.testing.assert_close(z, x + layer.u.detach() * torch.tanh(torch.tensor(0.4, dtype=torch.float64)))
    assert torch.equal(ladj, torch.zeros(8, dtype=torch.float64))
    x_back, ladj_inv = layer.inverse(z)
    torch.testing.assert_close(x_back, x, rtol=0, atol=1e-12)
    assert torch.equal(ladj_inv, torch.zeros(8, dtype=torch.float64))


def test_planar_inverse_is_exact_where_the_map_is_nearly_flat():
    # w.u_hat = -1 + softplus(-8) ~ -0.9997: the map along w has slope 3e-4 at its steepest point
    layer = Planar(2).double()
    with torch.no_grad():
        layer.w.copy_(torch.tensor([3.0, 0.0]))
        layer.u.copy_(torch.tensor([-8.0 / 3.0, 1.0]))
        layer.b.fill_(0.2)
    x = torch.cat([torch.randn(64, 2, dtype=torch.float64), torch.tensor([[-0.2 / 3, 0.5]], dtype=torch.float64)])
    z, ladj = layer(x)
    assert torch.isfinite(ladj).all() and ladj.min() < -7  # close to the constraint, still invertible
    x_back, ladj_inv = layer.inverse(z)
    assert (x_back - x).abs().max() < 1e-10
    torch.testing.assert_close(ladj_inv, -ladj)


def test_radial_constraint_holds_for_any_beta():
    layer = Radial(2).double()
    with torch.no_grad():
        layer.raw_beta.fill_(-30.0)  # beta_hat -> -alpha, the edge of invertibility
    alpha, beta = layer.alpha_beta()
    assert beta > -alpha
    x = layer.center.detach() + torch.randn(64, 2, dtype=torch.float64) * 1e-3
    z, ladj = layer(x)
    assert torch.isfinite(ladj).all()
    assert (layer.inverse(z)[0] - x).abs().max() < 1e-10


@pytest.mark.parametrize("beta", [-0.4, 5.0])
def test_radial_inverse_is_exact_near_and_far_from_the_centre(beta):
    layer = Radial(3).double()
    with torch.no_grad():
        alpha = torch.nn.functional.softplus(layer.raw_alpha)
        layer.raw_beta.copy_(torch.log(torch.expm1(alpha + beta)))  # softplus(raw_beta) - alpha = beta
    x = layer.center.detach() + torch.randn(64, 3, dtype=torch.float64) * torch.logspace(-6, 3, 64).unsqueeze(-1)
    z, _ = layer(x)
    x_back = layer.inverse(z)[0]
    assert ((x_back - x).abs().max(-1).values / x.abs().max(-1).values.clamp(min=1)).max() < 1e-12


@pytest.mark.parametrize("build", [lambda: Planar(0), lambda: Radial(0), lambda: Planar(2, iterations=0)])
def test_bad_sizes_are_refused(build):
    with pytest.raises(ValueError, match="features|iterations"):
        build()
