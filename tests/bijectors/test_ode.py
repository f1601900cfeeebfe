"""dopri5: exact answers on linear systems both ways, torchdiffeq's error control, gradients, failures named."""

import math

import pytest
import torch
import torchdiffeq

from flowkit.bijectors.ode import dopri5
from flowkit.root_finding import ConvergenceError


def _system(seed=0):
    """dy/dt = A y with a rotation-and-decay A, and dl/dt = tr A: the pair a continuous flow solves."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    a = a - a.T - 0.3 * torch.eye(3, dtype=torch.float64)
    y0 = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    return a, y0


@pytest.mark.parametrize(("t0", "t1"), [(0.0, 1.5), (1.5, 0.0), (0.2, 0.7)])
def test_a_linear_system_and_its_trace_integral_are_exact_to_the_tolerance(t0, t1):
    a, y0 = _system()
    f = lambda t, y: (y[0] @ a.T, a.trace().expand(5))  # noqa: E731
    solution = dopri5(f, (y0, torch.zeros(5, dtype=torch.float64)), t0, t1, atol=1e-10, rtol=1e-10)
    y, trace = solution.state
    torch.testing.assert_close(y, y0 @ torch.linalg.matrix_exp((t1 - t0) * a).T, atol=1e-8, rtol=0)
    torch.testing.assert_close(trace, torch.full((5,), (t1 - t0) * a.trace().item(), dtype=torch.float64))
    assert solution.accepted >= 1 and solution.evaluations == 2 + 6 * (solution.accepted + solution.rejected)
    assert 0 < solution.next_first_step <= 10 * abs(t1 - t0)


def test_the_global_error_shrinks_with_the_tolerance_and_stays_near_it():
    # y' = cos(t) y on [0, 6]: y = y0 exp(sin t); the accepted steps' local errors are each below tolerance.
    y0 = torch.linspace(0.5, 2.0, 7, dtype=torch.float64)
    exact = y0 * math.exp(math.sin(6.0))
    errors, steps = [], []
    for tol in (1e-4, 1e-6, 1e-8):
        solution = dopri5(lambda t, y: (math.cos(t) * y[0],), (y0,), 0.0, 6.0, atol=tol, rtol=tol)
        errors.append((solution.state[0] - exact).abs().max().item())
        steps.append(solution.accepted)
        assert errors[-1] < 100 * tol * exact.abs().max()
    assert errors[0] > errors[1] > errors[2] and steps[0] < steps[1] < steps[2]


def test_the_same_error_control_as_torchdiffeq_takes_about_as_many_steps():
    # torchdiffeq's dopri5 steps past t1 and interpolates, dopri5 here ends its last step on t1: the counts
    # of evaluations differ by at most a step or two, and both answers are within the tolerance.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).double()
    counts = {"here": 0, "torchdiffeq": 0}

    def field(name):
        def f(t, y):
            counts[name] += 1
            x = y[0]
            tt = torch.as_tensor(t, dtype=x.dtype).expand(x.shape[0], 1)
            return (net(torch.cat([x, tt], -1)), x.square().sum(-1))

        return f

    x0 = torch.randn(64, 2, dtype=torch.float64)
    state = (x0, torch.zeros(64, dtype=torch.float64))
    with torch.no_grad():
        ours = dopri5(field("here"), state, 0.0, 2.0, atol=1e-6, rtol=1e-6).state
        times = torch.tensor([0.0, 2.0], dtype=torch.float64)
        theirs = [s[-1] for s in torchdiffeq.odeint(field("torchdiffeq"), state, times, atol=1e-6, rtol=1e-6)]
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-4, rtol=1e-4)
    assert abs(counts["here"] - counts["torchdiffeq"]) <= 12


def test_gradients_through_the_steps_are_the_exact_solutions_derivatives():
    # y' = k y: y(1) = y0 e^k, so d y(1) / dk = y(1) and d y(1) / d y0 = e^k.
    k = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)
    y0 = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    y1 = dopri5(lambda t, y: (k * y[0],), (y0,), 0.0, 1.0, atol=1e-10, rtol=1e-10).state[0]
    grad_k, grad_y0 = torch.autograd.grad(y1.sum(), (k, y0))
    torch.testing.assert_close(grad_k, y1.sum().detach(), atol=1e-8, rtol=0)
    torch.testing.assert_close(grad_y0, torch.full((2,), math.exp(-0.7), dtype=torch.float64), atol=1e-8, rtol=0)


def test_a_blow_up_is_a_convergence_error_not_an_infinite_answer():
    with pytest.raises(ConvergenceError, match="underflow"):
        dopri5(lambda t, y: (y[0].square(),), (torch.full((3,), 2.0),), 0.0, 1.0, atol=1e-5, rtol=1e-5)
    nan = lambda t, y: (torch.full_like(y[0], math.nan),)  # noqa: E731
    with pytest.raises(ConvergenceError):
        dopri5(nan, (torch.ones(3),), 0.0, 1.0, atol=1e-5, rtol=1e-5)


def test_too_many_steps_is_a_convergence_error_naming_the_count():
    with pytest.raises(ConvergenceError, match="3 steps"):
        dopri5(lambda t, y: (math.cos(50 * t) * y[0],), (torch.ones(2),), 0.0, 10.0, atol=1e-9, rtol=1e-9, max_steps=3)


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"atol": 0.0}, "atol"), ({"rtol": -1.0}, "rtol"), ({"first_step": 0.0}, "first_step")]
)
def test_bad_arguments_are_value_errors_naming_them(kwargs, name):
    options = {"atol": 1e-5, "rtol": 1e-5, **kwargs}
    with pytest.raises(ValueError, match=name):
        dopri5(lambda t, y: y, (torch.ones(2),), 0.0, 1.0, **options)


def test_an_empty_interval_returns_the_initial_state_without_evaluating():
    solution = dopri5(lambda t, y: 1 / 0, (torch.ones(2),), 0.3, 0.3, atol=1e-5, rtol=1e-5)
    assert solution.evaluations == 0 and torch.equal(solution.state[0], torch.ones(2))
