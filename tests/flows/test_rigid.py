"""Flows on S^3 and rigid-body layouts: normalisation, antipodal equivariance, the double cover, inverses."""

import math

import pytest
import torch
from manifold_checks import assert_antipodally_equivariant, assert_integrates_to_one
from scipy.spatial.transform import Rotation

from flowkit.bijectors import Chain, DoubleMoebius, Moebius, RigidCoupling
from flowkit.bijectors.sphere import circle_moebius, double_moebius, double_moebius_inverse, gated_center, moebius
from flowkit.distributions import RigidBase, SphereUniform, haar_log_prob
from flowkit.domains import Circle, Product, Sphere, matrix_to_quaternion, quaternion_to_matrix
from flowkit.flows import Flow
from flowkit.testing import check_bijector, check_flow, randomize

BODY = ["quaternion", "angle", "angle", "angle"]
TWO_BODIES = [*BODY, *BODY, "real"]


def _unit(n, d=4, generator=None):
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    return x / x.norm(dim=-1, keepdim=True)


def _sphere_flow(layers=4, seed=0):
    torch.manual_seed(seed)
    chain = Chain(*[randomize(DoubleMoebius(4, heads=2), scale=1.5, seed=seed + i) for i in range(layers)])
    return Flow(chain, SphereUniform(4)).double()


def _rigid_flow(seed=0):
    torch.manual_seed(seed)
    segments = BODY + BODY
    layers = [
        RigidCoupling(segments, [0], heads=2, hidden=(16,)),
        RigidCoupling(segments, [1, 2, 3, 5, 6, 7], heads=2, hidden=(16,)),
        RigidCoupling(segments, [4], heads=2, hidden=(16,)),
    ]
    layers = [randomize(b, scale=0.3, seed=seed + i) for i, b in enumerate(layers)]
    return Flow(Chain(*layers), RigidBase(segments)).double()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_randomised_sphere_flows_integrate_to_one_on_s3(seed):
    """2 pi^2 E_{U(S^3)}[p] = 1 within 3 standard errors."""
    # the flow is not uniform, but the estimate is informative (standard error below 0.05)
    assert_integrates_to_one(_sphere_flow(seed=seed), Sphere(4), 200_000, seed, max_err=0.05)


def test_randomised_rigid_flow_integrates_to_one_on_s3_x_t3_squared():
    domain = Product(Sphere(4), Circle(), Circle(), Circle())
    assert_integrates_to_one(_rigid_flow(), domain, 200_000, 5, max_err=0.1)


def test_check_flow_uses_the_uniform_measure_of_the_manifold():
    report = check_flow(_sphere_flow(layers=2))
    (detail,) = [d for c, ok, d in report.results if c == "density integrates to 1"]
    assert "Sphere(4)" in detail and report.passed


def test_a_wrong_density_fails_the_mass_check():
    flow = _sphere_flow(layers=2)
    flow.base._log_p += 0.1  # 10% too much mass
    report = check_flow(flow, raise_on_failure=False)
    assert not dict((c, ok) for c, ok, _ in report.results)["density integrates to 1"]


def test_double_moebius_is_antipodally_equivariant_with_equal_ladj():
    layer = randomize(DoubleMoebius(4, heads=3), scale=2.0).double()
    q = _unit(64)
    (z, ladj), (z_neg, ladj_neg) = layer(q), layer(-q)
    torch.testing.assert_close(z_neg, -z, atol=1e-12, rtol=0)
    torch.testing.assert_close(ladj_neg, ladj, atol=1e-12, rtol=0)
    x, lx = layer.inverse(z)
    x_neg, lx_neg = layer.inverse(-z)
    torch.testing.assert_close(x_neg, -x, atol=1e-12, rtol=0)
    torch.testing.assert_close(lx_neg, lx, atol=1e-12, rtol=0)


def test_the_plain_moebius_map_is_not_equivariant():
    layer = randomize(Moebius(4), scale=2.0).double()
    q = _unit(16)
    assert (layer(-q)[0] + layer(q)[0]).abs().max() > 1e-2


def test_rigid_flow_is_equivariant_in_each_quaternion_and_positions_invariant():
    flow = _rigid_flow()
    assert_antipodally_equivariant(flow.bijector, flow.sample((32,)), (slice(0, 4), slice(7, 11)))  # two bodies


def test_double_moebius_matches_the_definition_by_two_moebius_maps():
    p, w = _unit(200), 0.9 * _unit(200) * torch.rand(200, 1, dtype=torch.float64)
    m_plus, m_minus = moebius(p, w)[0], moebius(p, -w)[0]
    reference = torch.nn.functional.normalize(m_plus + m_minus, dim=-1)
    y, ladj = double_moebius(p, w)
    torch.testing.assert_close(y, reference, atol=1e-12, rtol=0)
    # the reference's volume change: (1-|w|^2)(1+|w|^2)^3 / ((1+|w|^2)^2 - 4 (w.p)^2)^2
    r2, a = w.square().sum(-1), (w * p).sum(-1)
    torch.testing.assert_close(ladj, torch.log((1 - r2) * (1 + r2) ** 3 / ((1 + r2) ** 2 - 4 * a**2) ** 2))


def test_unit_norm_and_round_trip_after_many_layers_float64():
    torch.manual_seed(3)
    layers = [randomize(DoubleMoebius(4, heads=2), scale=3.0, seed=i) for i in range(40)]
    layers += [randomize(Moebius(4), scale=3.0, seed=100 + i) for i in range(10)]
    chain = Chain(*layers).double()
    q = _unit(500)
    z, ladj = chain(q)
    assert (z.norm(dim=-1) - 1).abs().max() < 1e-6
    x, ladj_inv = chain.inverse(z)
    assert (x.norm(dim=-1) - 1).abs().max() < 1e-6
    assert (x - q).abs().max() < 1e-9
    assert (ladj + ladj_inv).abs().max() < 1e-9 * ladj.abs().max()  # |ladj| ~ 30 after 50 strong layers
    centres = [c for b in layers for c in b.centres(q, q.shape[:-1], None).unbind(-2)]
    assert max(c.norm(dim=-1).max().item() for c in centres) > 0.75  # strong layers (|w| = 0.95 is the bound)


@pytest.mark.parametrize(("radius", "tol"), [(0.95, 1e-13), (0.999, 1e-9)])
def test_inverse_near_the_unit_ball_boundary(radius, tol):
    w = radius * _unit(1000)
    p = _unit(1000)
    y, ladj = double_moebius(p, w)
    x, ladj_inv = double_moebius_inverse(y, w)
    assert (x - p).abs().max() < tol
    assert (ladj + ladj_inv).abs().max() < 10 * tol


def test_circle_moebius_on_angles():
    theta = Circle().uniform((300,))
    w = 0.9 * _unit(300, 2) * torch.rand(300, 1, dtype=torch.float64)
    phi, ladj = circle_moebius(theta, w)
    assert bool(((phi >= -math.pi) & (phi < math.pi)).all())
    back, ladj_inv = circle_moebius(phi, -w)
    diff = torch.remainder(back - theta + math.pi, 2 * math.pi) - math.pi
    assert diff.abs().max() < 1e-10 and (ladj + ladj_inv).abs().max() < 1e-10
    leaf = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(circle_moebius(leaf, w)[0].sum(), leaf)
    torch.testing.assert_close(grad.log(), ladj)


def test_gated_centres_stay_inside_the_slack_ball_and_zero_is_the_identity():
    raw = torch.randn(1000, 4, dtype=torch.float64) * 100
    w = gated_center(raw, torch.randn(1000, dtype=torch.float64) * 10)
    assert w.norm(dim=-1).max() < 0.95
    assert gated_center(torch.zeros(3, 4), torch.zeros(3)).abs().max() == 0
    layer = RigidCoupling(TWO_BODIES, [0, 4], hidden=(8,), init=0.0).double()
    x = RigidBase(TWO_BODIES).double().sample((5,))
    z, ladj = layer(x)
    assert (z - x).abs().max() < 1e-12 and ladj.abs().max() < 1e-12
    (z.square().sum() + ladj.sum()).backward()  # finite gradients at w = 0
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


def test_w_zero_is_a_stationary_point_so_layers_start_near_not_at_the_identity():
    q = _unit(64)
    w = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(double_moebius(q, w.expand(64, 4))[0].sum() + 0.0, w)
    assert grad.abs().max() < 1e-12  # the double map depends on w to second order
    layer = RigidCoupling(TWO_BODIES, [0, 4], hidden=(8,)).double()
    x = RigidBase(TWO_BODIES).double().sample((5,))
    z, ladj = layer(x)
    assert 1e-6 < (z - x).abs().max() < 0.2
    assert DoubleMoebius(4).centres.raw[:, :4].abs().max() > 0


def test_rotation_of_q_and_minus_q_agree_and_match_scipy():
    q = _unit(100)
    r = quaternion_to_matrix(q)
    torch.testing.assert_close(quaternion_to_matrix(-q), r)
    scipy_r = Rotation.from_quat(q[:, [1, 2, 3, 0]].numpy()).as_matrix()  # scipy is scalar-last
    torch.testing.assert_close(r, torch.from_numpy(scipy_r))
    back = matrix_to_quaternion(r)
    torch.testing.assert_close(back, q * q[:, :1].sign())
    eye = torch.eye(3, dtype=torch.float64)
    torch.testing.assert_close(r @ r.transpose(-1, -2), eye.expand(100, 3, 3))
    # rotations by pi (q_0 = 0) and the identity
    special = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(matrix_to_quaternion(quaternion_to_matrix(special)).abs(), special)


def test_haar_density_of_a_symmetric_flow_integrates_to_one_over_haar_rotations():
    """p_Haar(R) = 2 pi^2 p(q): its mean over Haar-distributed rotations (drawn by scipy) is 1."""
    flow = _sphere_flow(seed=4)
    n = 200_000
    rotations = torch.from_numpy(Rotation.random(n, random_state=0).as_matrix())
    q = matrix_to_quaternion(rotations)
    with torch.no_grad():
        p = haar_log_prob(flow.log_prob(q)).exp()
    mean, err = p.mean().item(), p.std().item() / math.sqrt(n)
    assert abs(mean - 1) < 3 * err and err < 0.05, (mean, err)
    assert math.isclose(haar_log_prob(SphereUniform(4).double().log_prob(q[:1])).item(), 0.0, abs_tol=1e-12)


def test_sphere_uniform_and_rigid_base():
    base = SphereUniform((3, 4)).double()
    q = base.sample((20_000,))
    assert (q.norm(dim=-1) - 1).abs().max() < 1e-12
    second = torch.einsum("nki,nkj->ij", q, q) / (3 * 20_000)
    torch.testing.assert_close(second, torch.eye(4, dtype=torch.float64) / 4, atol=0.01, rtol=0)
    assert torch.allclose(base.log_prob(q[:2]), torch.full((2,), -3 * math.log(2 * math.pi**2), dtype=torch.float64))
    rigid = RigidBase(TWO_BODIES).double()
    x = rigid.sample((4,))
    assert x.shape == (4, 15) and bool(rigid.domain.contains(x).all())
    expected = (
        -2 * math.log(2 * math.pi**2) - 6 * math.log(2 * math.pi) - 0.5 * math.log(2 * math.pi) - 0.5 * x[:, -1] ** 2
    )
    torch.testing.assert_close(rigid.log_prob(x), expected)


def test_product_domain_tangent_basis_is_orthonormal_and_tangent():
    domain = Product(Sphere(4), Circle(), Circle(), Circle())
    x = domain.sample((5, 14), generator=torch.Generator().manual_seed(0))
    basis = domain.tangent_basis(x)
    assert basis.shape == (5, 14, 12)
    torch.testing.assert_close(basis.transpose(-1, -2) @ basis, torch.eye(12, dtype=torch.float64).expand(5, 12, 12))
    for start in (0, 7):
        normal = torch.zeros(5, 14, dtype=torch.float64)
        normal[:, start : start + 4] = x[:, start : start + 4]
        assert (normal.unsqueeze(-2) @ basis).abs().max() < 1e-12


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="segment"):
        RigidBase(["quaternion", "spin"])
    with pytest.raises(ValueError, match="unchanged"):
        RigidCoupling(BODY, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="heads"):
        DoubleMoebius(4, heads=0)
    with pytest.raises(ValueError, match="event_shape"):
        SphereUniform(1)


def test_check_bijector_catches_a_wrong_tangent_ladj():
    class Wrong(DoubleMoebius):
        def forward(self, x, context=None):
            z, ladj = super().forward(x, context)
            return z, 0.8 * ladj

    report = check_bijector(randomize(Wrong(4), scale=1.0), raise_on_failure=False)
    assert not dict((c, ok) for c, ok, _ in report.results)["ladj = log|det| of the autograd Jacobian"]


def test_rigid_flow_saves_and_loads(tmp_path):
    from flowkit import io

    flow = _rigid_flow()
    io.save(flow, tmp_path / "model")
    loaded = io.load(tmp_path / "model")
    x = flow.sample((6,))
    torch.testing.assert_close(loaded.double().log_prob(x), flow.log_prob(x))


def test_quaternions_that_are_not_unit_are_refused_with_a_clear_error():
    from flowkit.bijectors import DoubleMoebius

    layer = DoubleMoebius(4)
    q = torch.randn(3, 4)
    layer(q / q.norm(dim=-1, keepdim=True))  # on the sphere: fine
    with pytest.raises(ValueError, match="outside Sphere"):
        layer(2 * q / q.norm(dim=-1, keepdim=True))
