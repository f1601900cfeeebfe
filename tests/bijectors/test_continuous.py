"""ContinuousFlow: exact answers for a linear field, Hutchinson's unbiasedness, round trips, gradients, a normaliser."""

import copy
import math

import pytest
import torch
from torch import nn

from flowkit.bijectors import Chain, ContinuousFlow, LULinear
from flowkit.bijectors.continuous import function_evaluations
from flowkit.data.toy import toy
from flowkit.distributions import StandardNormal
from flowkit.flows import CNF, Flow
from flowkit.nn import VectorField
from flowkit.testing import check_bijector
from flowkit.train import MaximumLikelihood, fit


class LinearField(nn.Module):
    """f(x, t) = A x, whose time-T map is expm(T A) with log-det T tr(A)."""

    def __init__(self, a: torch.Tensor) -> None:
        super().__init__()
        self.a = nn.Parameter(a)

    def forward(self, x, context=None, *, t):
        return x @ self.a.T


def _matrix(d=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(d, d, generator=gen, dtype=torch.float64) * 0.5 + torch.diag(torch.tensor([1.0, -0.5, 0.8]))


def test_linear_field_exact_trace_gives_t1_trace_and_the_matrix_exponential():
    a = _matrix()
    flow = ContinuousFlow(LinearField(a.clone()), 3, t1=0.7, atol=1e-10, rtol=1e-10).double()
    x = torch.randn(6, 3, dtype=torch.float64)
    z, ladj = flow(x)
    torch.testing.assert_close(ladj, torch.full((6,), 0.7 * a.trace().item(), dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(z, x @ torch.linalg.matrix_exp(0.7 * a).T, atol=1e-6, rtol=1e-6)


def _hutchinson_estimates(probe: str, n: int = 10_000) -> tuple[torch.Tensor, float]:
    a = _matrix()
    flow = ContinuousFlow(LinearField(a.clone()), 3, t1=0.7, trace="hutchinson", probe=probe, atol=1e-8, rtol=1e-8)
    flow = flow.double()
    torch.manual_seed(1)
    with torch.no_grad():
        _, ladj = flow(torch.randn(1, 3, dtype=torch.float64).expand(n, 3))  # one probe per point
    return ladj, 0.7 * a.trace().item()


@pytest.mark.parametrize("probe", ["rademacher", "gaussian"])
def test_hutchinson_trace_is_unbiased_within_three_standard_errors(probe):
    ladj, exact = _hutchinson_estimates(probe)
    se = ladj.std().item() / math.sqrt(ladj.numel())
    assert ladj.std() > 0  # a stochastic estimate
    assert abs(ladj.mean().item() - exact) < 3 * se


def test_rademacher_variance_is_not_larger_than_gaussian_and_matches_theory():
    a = _matrix()
    s = 0.7 * (a + a.T) / 2  # the estimate is T eps^T A eps = eps^T (T S) eps
    gaussian_var = 2 * s.square().sum().item()
    rademacher_var = 2 * (s.square().sum() - s.diagonal().square().sum()).item()
    var_r = _hutchinson_estimates("rademacher")[0].var().item()
    var_g = _hutchinson_estimates("gaussian")[0].var().item()
    assert var_r <= var_g
    assert abs(var_r / rademacher_var - 1) < 0.1 and abs(var_g / gaussian_var - 1) < 0.1


def _field(features=2, context=0, seed=0):
    torch.manual_seed(seed)
    return VectorField(features, hidden=(16, 16), context=context, activation="tanh")


def test_round_trip_within_1e5_at_atol_1e7_in_float64():
    flow = ContinuousFlow(_field(3), 3, atol=1e-7, rtol=1e-7).double()
    x = 2 * torch.randn(64, 3, dtype=torch.float64)
    z, ladj = flow(x)
    x_back, ladj_back = flow.inverse(z)
    assert (x_back - x).abs().max() < 1e-5
    assert (ladj_back + ladj).abs().max() < 1e-5


def test_conditional_round_trip_and_batch_shapes():
    flow = ContinuousFlow(_field(2, context=3), 2, atol=1e-8, rtol=1e-8).double()
    assert flow.context_features == 3
    x, c = torch.randn(4, 5, 2, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    z, ladj = flow(x, c)
    assert z.shape == (4, 5, 2) and ladj.shape == (4, 5)
    x_back, _ = flow.inverse(z, c)
    assert (x_back - x).abs().max() < 1e-6
    # The context changes the map.
    assert (flow(x, c + 1)[0] - z).abs().max() > 1e-3


@pytest.mark.parametrize("trace", ["exact", "hutchinson"])
def test_adjoint_and_direct_gradients_agree(trace):
    direct = ContinuousFlow(_field(2, context=2), 2, trace=trace, atol=1e-8, rtol=1e-8).double()
    direct.t1.requires_grad_(True)
    adjoint = copy.deepcopy(direct)
    adjoint.adjoint = True
    x = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    c = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    grads = []
    for flow in (direct, adjoint):
        torch.manual_seed(3)  # the same Hutchinson probe
        z, ladj = flow(x, c)
        loss = 0.5 * z.square().sum() - ladj.sum()
        grads.append(torch.autograd.grad(loss, [x, c, flow.t1, *flow.vector_field.parameters()]))
    for g_direct, g_adjoint in zip(*grads, strict=True):
        assert (g_direct - g_adjoint).abs().max() < 1e-4


def test_check_bijector_in_a_chain():
    chain = Chain(LULinear(2), ContinuousFlow(_field(2), 2, atol=1e-8, rtol=1e-8))
    report = check_bijector(chain, torch.randn(5, 2))
    assert report.passed, str(report)


def test_function_evaluations_are_counted_exactly_for_a_fixed_step_solver():
    flow = ContinuousFlow(_field(2), 2, solver="euler", solver_options={"step_size": 0.125})
    flow(torch.randn(3, 2))
    assert flow.nfe == 8 and function_evaluations(Chain(LULinear(2), flow)) == 8
    flow.solver = "rk4"
    flow.inverse(torch.randn(3, 2))
    assert flow.nfe == 32


def test_trained_two_dimensional_cnf_density_integrates_to_one():
    torch.manual_seed(0)
    data = torch.as_tensor(toy("moons", 1024, seed=0), dtype=torch.float32) / 2
    flow = Flow(ContinuousFlow(_field(2), 2, atol=1e-5, rtol=1e-5), StandardNormal(2))
    history = fit(flow, MaximumLikelihood(), data, steps=40, batch_size=256, lr=1e-2, progress=False)
    assert history.loss[-1] < history.loss[0] - 0.1  # it learnt something
    flow = flow.double()
    for layer in flow.modules():
        if isinstance(layer, ContinuousFlow):
            layer.atol = layer.rtol = 1e-7
    n, bound = 121, 6.0
    grid = torch.linspace(-bound, bound, n, dtype=torch.float64)
    points = torch.cartesian_prod(grid, grid)
    with torch.no_grad():
        density = flow.log_prob(points).exp().reshape(n, n)
    mass = torch.trapezoid(torch.trapezoid(density, grid), grid).item()
    assert abs(mass - 1) < 1e-2


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"t1": 0.0}, "t1"),
        ({"t1": -1.0}, "t1"),
        ({"t1": math.inf}, "t1"),
        ({"atol": math.nan}, "atol"),
        ({"rtol": 0.0}, "rtol"),
        ({"solver": "magic"}, "solver"),
        ({"trace": "approx"}, "trace"),
        ({"probe": "uniform"}, "probe"),
        ({"solver": "rk4", "solver_options": {"step_size": 0}}, "step_size"),
        ({"solver": "euler", "solver_options": {"step_size": -0.1}}, "step_size"),
        ({"solver_options": {"first_step": math.nan}}, "first_step"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ContinuousFlow(_field(2), 2, **kwargs)


def test_a_field_of_the_wrong_shape_or_not_a_module_is_refused():
    class Wrong(nn.Module):
        def forward(self, x, context=None, *, t):
            return x[..., :1]

    with pytest.raises(ValueError, match="vector_field"):
        ContinuousFlow(Wrong(), 2)(torch.randn(3, 2))
    with pytest.raises(ValueError, match="vector_field"):
        ContinuousFlow(lambda x, c, t: x, 2)


def test_a_field_of_the_wrong_input_width_is_a_value_error_not_a_deep_matmul_error():
    with pytest.raises(ValueError, match="takes 3 features but the event has 2"):
        ContinuousFlow(VectorField(3, hidden=(8,)), 2)

    class Wide(nn.Module):  # declares nothing: found at the first call
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x, context=None, *, t):
            return self.linear(x)

    with pytest.raises(ValueError, match=r"vector field fails on points of shape \(4, 2\)"):
        ContinuousFlow(Wide(), 2)(torch.randn(4, 2))


def test_empty_batches_give_empty_results():
    flow = CNF(2, hidden=(8,))
    assert flow.log_prob(torch.randn(0, 2)).shape == (0,)
    assert flow.sample((0,)).shape == (0, 2)
    x, log_q = flow.rsample_and_log_prob((0,))
    assert x.shape == (0, 2) and log_q.shape == (0,)


@pytest.mark.parametrize("t1", [0.0, -1.0, math.nan])
def test_a_loaded_end_time_is_checked_like_the_constructors(t1):
    state = CNF(2, hidden=(8,)).state_dict()
    state["bijector.t1"] = torch.tensor(t1)
    with pytest.raises(ValueError, match="t1"):
        CNF(2, hidden=(8,)).load_state_dict(state)


def test_a_solver_that_does_not_converge_raises_naming_the_end_time_and_tolerances():
    class Explosive(nn.Module):  # dx/dt = x^2 leaves every bound at t = 1 / x(0)
        def forward(self, x, context=None, *, t):
            return x.square()

    flow = ContinuousFlow(Explosive(), 2, t1=1.0)
    with pytest.raises(RuntimeError, match=r"did not converge.*t1=1, atol=1e-05"):
        flow(torch.full((3, 2), 2.0))
    before = ContinuousFlow(Explosive(), 2, t1=0.25)  # before the blow-up: solved
    assert torch.isfinite(before(torch.full((3, 2), 2.0))[0]).all()


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_a_field_with_a_kink_is_warned_about(activation):
    with pytest.warns(UserWarning, match="kink"):
        CNF(2, hidden=(8,), activation=activation)


@pytest.mark.parametrize("activation", ["softplus", "tanh", "elu", "silu"])
def test_vector_field_forward_jacobian_matches_autograd(activation):
    torch.manual_seed(0)
    field = VectorField(3, hidden=(8, 8), activation=activation, context=2).double()
    x, c = 2 * torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    v, jacobian = field.velocity_and_jacobian(x, c, t=0.3)
    torch.testing.assert_close(v, field(x, c, t=0.3))
    for n in range(5):
        expected = torch.autograd.functional.jacobian(lambda y, n=n: field(y, c[n], t=0.3), x[n])
        torch.testing.assert_close(jacobian[n], expected)
    assert not VectorField(3, activation="relu").jacobian_available


def test_forward_jacobian_and_vjp_traces_agree():
    class Opaque(nn.Module):  # the same field without velocity_and_jacobian: the VJP path
        def __init__(self, field):
            super().__init__()
            self.field = field

        def forward(self, x, context=None, *, t):
            return self.field(x, context, t=t)

    field = _field(3).double()
    x = torch.randn(6, 3, dtype=torch.float64)
    fast = ContinuousFlow(field, 3, atol=1e-9, rtol=1e-9).double()
    slow = ContinuousFlow(Opaque(field), 3, atol=1e-9, rtol=1e-9).double()
    assert fast._forward_jacobian and not slow._forward_jacobian
    (z1, l1), (z2, l2) = fast(x), slow(x)
    torch.testing.assert_close(z1, z2)
    torch.testing.assert_close(l1, l2)


def test_vector_field_divergence_is_the_trace_of_its_jacobian():
    torch.manual_seed(0)
    for hidden in [(8, 8), ()]:
        field = VectorField(3, hidden=hidden, activation="elu", context=1).double()
        x, c = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
        v, jacobian = field.velocity_and_jacobian(x, c, t=0.7)
        v2, divergence = field.velocity_and_divergence(x, c, t=0.7)
        torch.testing.assert_close(v2, v)
        torch.testing.assert_close(divergence, torch.diagonal(jacobian, dim1=-2, dim2=-1).sum(-1))


def test_forward_jvp_gives_the_hutchinson_estimate_of_the_vjp_path():
    torch.manual_seed(0)
    field = VectorField(3, hidden=(8, 8), activation="silu", context=2).double()
    x, c, eps = (torch.randn(4, k, dtype=torch.float64) for k in (3, 2, 3))
    v, jvp = field.velocity_and_jvp(x, eps, c, t=0.2)
    expected = torch.func.jvp(lambda y: field(y, c, t=0.2), (x,), (eps,))[1]
    torch.testing.assert_close(jvp, expected)

    class Opaque(nn.Module):
        def __init__(self, field):
            super().__init__()
            self.field = field

        def forward(self, x, context=None, *, t):
            return self.field(x, context, t=t)

    fast = ContinuousFlow(field, 3, trace="hutchinson", atol=1e-9, rtol=1e-9).double()
    slow = ContinuousFlow(Opaque(field), 3, trace="hutchinson", atol=1e-9, rtol=1e-9, context=2).double()
    torch.manual_seed(5)
    _, l_fast = fast(x, c)
    torch.manual_seed(5)
    _, l_slow = slow(x, c)
    torch.testing.assert_close(l_fast, l_slow)


def test_a_training_solve_starts_from_the_previous_ones_step_and_evaluation_does_not():
    flow = ContinuousFlow(_field(2), 2, atol=1e-6, rtol=1e-6).double()
    x = torch.randn(64, 2, dtype=torch.float64)
    with torch.no_grad():
        z0, ladj0 = flow(x)
    fresh = flow.nfe
    z1, _ = flow(x)  # the first training solve estimates its first step, as a fresh one does
    assert flow.nfe == fresh and torch.equal(z1, z0)
    assert torch.equal(flow(x)[0], z0)  # without a parameter update in between: the same solve
    with torch.no_grad():  # an optimiser's in-place update (here by 1, the values unchanged)
        for p in flow.parameters():
            p.mul_(1.0)
    z2, ladj2 = flow(x)  # starts from the step the previous solve proposed: fewer evaluations, same tolerance
    assert flow.nfe < fresh
    assert torch.equal(flow(x)[0], z2)  # the same parameters again: the same first step, the same solve
    assert (z2 - z0).abs().max() < 1e-4 and (ladj2 - ladj0).abs().max() < 1e-4
    flow.eval()  # evaluation ignores the history: bit-identical to a fresh solve
    assert torch.equal(flow(x)[0], z0) and flow.nfe == fresh
    flow.train()
    with torch.no_grad():
        assert torch.equal(flow(x)[1], ladj0)
