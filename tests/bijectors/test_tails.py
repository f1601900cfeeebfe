"""TailLU against dense linear algebra; MarginalTailCDF: continuity, monotonicity, inverse, mass, GPD fits, saving."""

import numpy as np
import pytest
import torch
from scipy import stats

import flowkit
from flowkit.bijectors import MarginalTailCDF, TailLU
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow
from flowkit.testing import randomize


@pytest.mark.parametrize("light", [0, 2, 5])
def test_tail_lu_matches_dense_linear_algebra(light):
    layer = randomize(TailLU(5, light=light)).double()
    lower = torch.tril(layer.lower, -1) + torch.eye(5, dtype=torch.float64)
    upper = torch.triu(layer.upper, 1)
    upper[:light, light:] = 0  # U is block diagonal
    weight = lower @ (upper + torch.diag(layer.log_diag.exp()))
    assert torch.count_nonzero(weight[:light, light:]) == 0
    x = torch.randn(7, 5, dtype=torch.float64)
    z, ladj = layer(x)
    torch.testing.assert_close(z, x @ weight.T + layer.bias)
    torch.testing.assert_close(layer.weight, weight)
    blocks = torch.linalg.slogdet(weight[:light, :light])[1] + torch.linalg.slogdet(weight[light:, light:])[1]
    torch.testing.assert_close(ladj, torch.linalg.slogdet(weight)[1].expand(7))
    torch.testing.assert_close(ladj, blocks.expand(7))
    x_back, ladj_inv = layer.inverse(z)
    torch.testing.assert_close(x_back, torch.linalg.solve(weight, (z - layer.bias).T).T)
    torch.testing.assert_close(ladj_inv, -ladj)


def test_light_outputs_do_not_depend_on_heavy_inputs():
    layer = randomize(TailLU(6, light=4), scale=1.0).double()
    x = torch.randn(6, dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(lambda v: layer(v)[0], x)
    assert torch.count_nonzero(jacobian[:4, 4:]) == 0
    assert torch.count_nonzero(jacobian[4:, :4]) > 0  # light inputs do feed the heavy outputs
    inverse = torch.autograd.functional.jacobian(lambda v: layer.inverse(v)[0], x)
    assert torch.count_nonzero(inverse[:4, 4:]) == 0


def test_tail_lu_refuses_bad_arguments_and_weights(tmp_path):
    for light in (-1, 4, 1.5):
        with pytest.raises(ValueError):
            TailLU(3, light=light)
    layer = TailLU(3, light=1)
    state = layer.state_dict()
    state["log_diag"] = torch.tensor([0.0, 1e3, 0.0])
    with pytest.raises(ValueError, match="log_diag"):
        layer.load_state_dict(state)


def _fitted(x, **kwargs):
    return MarginalTailCDF(x.shape[1], **kwargs).double().fit(x)


def _student_data(n=4000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    chi2 = torch.distributions.Chi2(torch.tensor([2.0, 3.0, 50.0], dtype=torch.float64)).sample((n,))
    return normal / (chi2 / torch.tensor([2.0, 3.0, 50.0], dtype=torch.float64)).sqrt()


def _cdf(layer, x):
    z = layer(x)[0]
    return torch.special.ndtr(z) if layer.output == "normal" else torch.sigmoid(z)


@pytest.mark.parametrize("output", ["normal", "logit"])
def test_cdf_is_continuous_at_the_cut_points_and_monotone(output):
    torch.manual_seed(0)
    layer = _fitted(_student_data(), output=output)
    alpha, beta = layer.cuts.unbind(-1)
    for cut, level in ((alpha, layer.lower_mass), (beta, layer.upper_cut)):
        for delta in (1e-9, 1e-12):
            below, above = _cdf(layer, (cut - delta)[None]), _cdf(layer, (cut + delta)[None])
            assert (above - below).abs().max() < 1e-6
            torch.testing.assert_close(below, torch.full_like(below, level), atol=1e-6, rtol=0)
    grid = torch.linspace(-200, 200, 200_001, dtype=torch.float64)[:, None].expand(-1, 3).contiguous()
    z = layer(grid)[0]
    assert bool((z[1:] > z[:-1]).all())


@pytest.mark.parametrize("output", ["normal", "logit"])
def test_inverse_round_trips_to_1e_6(output):
    layer = _fitted(_student_data(seed=1), output=output)
    x = torch.cat([torch.linspace(-1e4, 1e4, 2001), torch.linspace(-3, 3, 2001)]).double()[:, None].expand(-1, 3)
    z, ladj = layer(x)
    x_back, ladj_inv = layer.inverse(z)
    assert ((x_back - x).abs() / x.abs().clamp_min(1)).max() < 1e-6
    assert (ladj + ladj_inv).abs().max() < 1e-6
    z = torch.linspace(-8, 8, 1001, dtype=torch.float64)[:, None].expand(-1, 3)
    torch.testing.assert_close(layer(layer.inverse(z)[0])[0], z, atol=1e-6, rtol=0)


@pytest.mark.parametrize("output", ["normal", "logit"])
@pytest.mark.parametrize("feature", [0, 2])  # df 2 and df 50
def test_density_integrates_to_one_by_quadrature(output, feature):
    x = _student_data(seed=2)[:, feature : feature + 1]
    layer = _fitted(x, output=output)
    base = StandardNormal(1).double() if output == "normal" else _Logistic()
    flow = Flow(layer, base)

    def mass(points, weights):
        x = torch.from_numpy(points)[:, None]
        return float((flow.log_prob(x).exp() * torch.from_numpy(weights)).sum())

    alpha, beta = layer.cuts[0].tolist()
    nodes, weights = np.polynomial.legendre.leggauss(40)  # on [-1, 1]
    knots = alpha + (beta - alpha) * layer.knots[0, 0].numpy()  # the body: one rational function per bin
    lo, hi = knots[:-1, None], knots[1:, None]
    body = mass((lo + (hi - lo) * (nodes + 1) / 2).ravel(), ((hi - lo) / 2 * weights).ravel())
    # The tails through x = cut -+ w / (1 - w), w in (0, 1): the integrand is bounded for xi <= 1.
    edges = 1 - np.geomspace(1, 1e-12, 60)  # finer towards w = 1
    lo, hi = edges[:-1, None], edges[1:, None]
    w = (lo + (hi - lo) * (nodes + 1) / 2).ravel()
    jac = ((hi - lo) / 2 * weights).ravel() / (1 - w) ** 2
    masses = [mass(alpha - w / (1 - w), jac), body, mass(beta + w / (1 - w), jac)]
    assert masses[0] == pytest.approx(layer.lower_mass, abs=1e-6)
    assert masses[2] == pytest.approx(1 - layer.upper_cut, abs=1e-6)
    assert sum(masses) == pytest.approx(1, abs=1e-6)


class _Logistic(flowkit.distributions.Distribution):
    """The standard logistic density, the latent of the logit output (`u = sigmoid(z)` is uniform)."""

    _flowkit_register = False

    def __init__(self):
        super().__init__()
        self.event_shape = torch.Size([1])
        self.double()

    def log_prob(self, z):
        return (-torch.nn.functional.softplus(z) - torch.nn.functional.softplus(-z)).sum(-1)


@pytest.mark.parametrize("xi", [0.25, 0.5])
def test_generalized_pareto_tails_recover_xi_on_pareto_draws(xi):
    rng = np.random.default_rng(3)
    upper = rng.pareto(1 / xi, 20_000) + 1
    lower = -(rng.pareto(1 / xi, 20_000) + 1)
    layer = _fitted(torch.from_numpy(np.stack([upper, lower], 1)))
    assert abs(float(layer.tail_params[0, 1, 0]) - xi) < 0.1  # upper tail of the first feature
    assert abs(float(layer.tail_params[1, 0, 0]) - xi) < 0.1  # lower tail of the second
    # scipy's convention: c = xi > 0 is heavy; the GPD fitted in flowkit agrees with scipy's fit of the excesses.
    beta = float(layer.cuts[0, 1])
    c, _, scale = stats.genpareto.fit(upper[upper > beta] - beta, floc=0)
    assert float(layer.tail_params[0, 1, 0]) == pytest.approx(min(max(c, 0), 1))
    assert float(layer.tail_params[0, 1, 1]) == pytest.approx(scale)


def test_light_tails_clip_xi_at_zero_and_stay_finite_far_out():
    layer = _fitted(torch.randn(5000, 1, dtype=torch.float64))
    assert float(layer.tail_params[..., 0].max()) <= 0.05
    z, ladj = layer(torch.tensor([[-1e6], [1e6]], dtype=torch.float64))
    assert bool(torch.isfinite(z).all() and torch.isfinite(ladj).all())


def test_saves_and_loads_its_fitted_marginals_without_pickles(tmp_path):
    x = _student_data(seed=4).float()
    for model in (Flow(MarginalTailCDF(3).fit(x), StandardNormal(3)), flowkit.flows.COMET.from_data(x, transforms=1)):
        directory = flowkit.io.save(model, tmp_path / type(model).__name__)
        assert sorted(p.name for p in directory.iterdir()) == ["config.json", "weights.safetensors"]
        loaded = flowkit.io.load(directory)
        assert (
            bool(loaded.bijector[0].fitted) if isinstance(model, flowkit.flows.COMET) else bool(loaded.bijector.fitted)
        )
        torch.testing.assert_close(loaded.log_prob(x[:50]), model.log_prob(x[:50]))


def test_unfitted_layer_and_bad_data_are_value_errors():
    layer = MarginalTailCDF(2)
    with pytest.raises(ValueError, match="not fitted"):
        layer(torch.randn(3, 2))
    with pytest.raises(ValueError, match="non-finite"):
        layer.fit(torch.tensor([[float("nan"), 0.0]] * 1000))
    with pytest.raises(ValueError, match="fewer than 20"):
        layer.fit(torch.randn(100, 2))
    with pytest.raises(ValueError, match="shape"):
        layer.fit(torch.randn(1000, 3))
    for bad in ({"lower": 0.6}, {"upper": 1.0}, {"output": "uniform"}, {"knots": 1}):
        with pytest.raises(ValueError):
            MarginalTailCDF(2, **bad)
    state = MarginalTailCDF(2).fit(torch.randn(1000, 2)).state_dict()
    state["tail_params"][0, 0, 0] = -0.5
    with pytest.raises(ValueError, match="tail_params"):
        MarginalTailCDF(2).load_state_dict(state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("output", ["normal", "logit"])
def test_inverse_far_in_the_latent_tails_has_finite_values_and_gradients(dtype, output):
    # A latent 1e6 out maps beyond the float range in a heavy tail: the output saturates at a
    # quarter of the largest float instead of inf, and the gradients stay finite (torch's
    # log_ndtr gradient is NaN there in float32).
    layer = _fitted(_student_data(), output=output).to(dtype)
    z = torch.tensor([[1e6, -1e6, 0.5], [-1e4, 1e4, 40.0]], dtype=dtype, requires_grad=True)
    x, ladj = layer.inverse(z)
    (grad,) = torch.autograd.grad(x.sum() + ladj.sum(), z)
    assert torch.isfinite(x).all() and torch.isfinite(ladj).all() and torch.isfinite(grad).all()
    assert x[0, 0] > 1e30 and x[0, 1] < -1e30


def test_log_ndtr_and_its_gradient_are_accurate_far_out():
    from flowkit.bijectors.tails import _log_ndtr

    z = torch.tensor([-50.0, -1e3, -1e6], dtype=torch.float64, requires_grad=True)
    value = _log_ndtr(z)
    (grad,) = torch.autograd.grad(value.sum(), z)
    exact = [float(stats.norm.logcdf(v)) for v in z.tolist()]
    torch.testing.assert_close(value, torch.tensor(exact, dtype=torch.float64), rtol=1e-12, atol=0)
    # d/dz log Phi(z) = phi(z) / Phi(z), which is -z - 1/z + 2/z^3 + ... far out
    v = z.detach()
    torch.testing.assert_close(grad, -v - 1 / v + 2 / v**3, rtol=1e-9, atol=0)
