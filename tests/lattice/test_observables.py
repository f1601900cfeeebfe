"""flowkit.lattice: observables against the exact free field, the blocked jackknife, Z2-equivariant conditioners."""

import math

import pytest
import torch

from flowkit import io, lattice
from flowkit.bijectors import MaskedCoupling
from flowkit.nn import ConvNet
from flowkit.targets import Phi4
from flowkit.testing import randomize
from flowkit.transformers import Affine, RationalQuadraticSpline


def test_two_point_is_the_direct_sum():
    phi = torch.randn(3, 4, 5, dtype=torch.float64)
    direct = torch.stack(
        [torch.stack([(phi * phi.roll((-a, -b), (-2, -1))).mean((-1, -2)) for b in range(5)], -1) for a in range(4)],
        -2,
    )
    torch.testing.assert_close(lattice.two_point(phi), direct)
    assert lattice.magnetization(phi).shape == (3,)


def test_effective_mass_of_the_exact_free_correlator_is_the_lattice_mass():
    m2 = 0.5
    G = Phi4(10, m2, 0.0).free_propagator()
    C = lattice.zero_momentum_correlator(G)
    # the lattice dispersion 4 sinh^2(m / 2) = m^2 gives cosh(m) = 1 + m^2 / 2
    torch.testing.assert_close(lattice.effective_mass(C), torch.full((8,), math.acosh(1 + m2 / 2), dtype=torch.float64))
    assert float(C.sum()) == pytest.approx(1 / (2 * m2))  # chi_2


def test_measure_on_exact_free_field_samples():
    target = Phi4(6, 0.8, 0.0)
    samples = target.sample(8000, generator=torch.Generator().manual_seed(0)).double()
    obs = lattice.measure(samples.reshape(2000, 4, 6, 6), blocks=20)
    G = target.free_propagator()
    for name, exact in [("chi2", 1 / 1.6), ("phi2", float(G[0, 0])), ("M", 0.0)]:
        value, error = obs[name]
        assert abs(float(value) - exact) < 3.5 * float(error), name
    value, error = obs["G"]
    assert value.shape == (6, 6) and bool(((value - G).abs() < 4 * error + 1e-3).all())
    mass, error = obs["pole_mass"]
    assert abs(float(mass) - math.acosh(1.4)) < 4 * float(error)
    length, _ = obs["correlation_length"]
    assert float(length) == pytest.approx(1 / float(mass), rel=0.05)
    assert obs["C"][0].shape == (6,) and obs["m_eff"][0].shape == (4,)


def test_jackknife_error_of_a_mean_is_the_standard_error():
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mean, error = lattice.jackknife(lambda m: m, x, blocks=50)
    assert float(mean) == pytest.approx(float(x.mean()))
    assert float(error) == pytest.approx(float(x.std() / math.sqrt(x.numel())), rel=0.25)


def test_blocked_jackknife_sees_autocorrelation():
    """On an AR(1) chain the blocked error is about sqrt(2 tau_int) times the naive one."""
    generator = torch.Generator().manual_seed(1)
    phi, n = 0.9, 50_000
    noise = torch.randn(n, generator=generator, dtype=torch.float64)
    x = torch.empty_like(noise)
    x[0] = noise[0]
    for t in range(1, n):
        x[t] = phi * x[t - 1] + noise[t]
    _, error = lattice.jackknife(lambda m: m, x, blocks=25)
    naive = float(x.std() / math.sqrt(n))
    assert float(error) / naive == pytest.approx(math.sqrt((1 + phi) / (1 - phi)), rel=0.35)


@pytest.mark.parametrize("transformer", [Affine(), RationalQuadraticSpline(4, 3.0)], ids=["affine", "spline"])
def test_z2_equivariant_coupling_is_odd(transformer):
    params = transformer.params_per_element
    net = lattice.Z2Equivariant(ConvNet(1, params, (8,), padding_mode="circular"), transformer)
    layer = randomize(MaskedCoupling(transformer, (6, 6), conditioner=net)).double()
    x = torch.randn(3, 6, 6, dtype=torch.float64)
    z, ladj = layer(x)
    z_neg, ladj_neg = layer(-x)
    torch.testing.assert_close(z_neg, -z)
    torch.testing.assert_close(ladj_neg, ladj)
    assert not torch.allclose(z, x)
    x_back, _ = layer.inverse(z)
    torch.testing.assert_close(x_back, x)
    assert net.out_features == params


def test_z2_equivariant_layer_saves_and_loads(tmp_path):
    net = lattice.Z2Equivariant(ConvNet(1, 2, (4,), padding_mode="circular"), Affine())
    layer = randomize(MaskedCoupling(Affine(), (4, 4), conditioner=net))
    io.save(layer, tmp_path / "m")
    x = torch.randn(2, 4, 4)
    torch.testing.assert_close(io.load(tmp_path / "m")(x), layer(x))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: lattice.z2_reflection(object()), "no known reflection"),
        (lambda: lattice.Z2Equivariant(torch.nn.Linear(2, 2), Affine()), "Conditioner"),
        (lambda: lattice.jackknife(lambda m: m, torch.randn(5), blocks=10), "at least blocks"),
        (lambda: lattice.measure(torch.randn(10, 4, 4), plateau=[3]), "plateau"),
        (lambda: lattice.measure(torch.randn(10, 4)), "samples must be"),
        (lambda: lattice.effective_mass(torch.ones(2)), "L >= 3"),
    ],
)
def test_bad_input_is_an_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
