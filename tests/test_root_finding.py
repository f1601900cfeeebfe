"""The root finders' brackets and convergence checks (issue 38: wrong samples from BNAF, unchecked solves)."""

import pytest
import torch

import flowkit
from flowkit import root_finding  # names looked up in the tests, so that each fails alone on a version without them
from flowkit.bijectors import Residual
from flowkit.testing import randomize


def test_expand_bracket_doubles_its_width_until_it_holds_the_root():
    # Issue 38: from [-1, 1], y = 1000 gave [79, 81], a shifted interval of the same width.
    y = torch.tensor([1000.0, -3e5, 0.5, 1e-9], dtype=torch.float64)
    low, high = root_finding.expand_bracket(lambda t: t, y, y * 0 - 1, y * 0 + 1, 40)
    assert bool(((low <= y) & (y <= high)).all()), (low, high)
    assert float((high - low).max()) < 4 * float(y.abs().max())  # grown geometrically, not further than needed


def test_expand_bracket_names_a_target_beyond_the_map():
    y = torch.tensor([0.5, 3.0], dtype=torch.float64)
    with pytest.raises(
        root_finding.ConvergenceError, match=r"expand_bracket: no bracket .* element \(1,\), target y = 3"
    ):
        root_finding.expand_bracket(torch.tanh, y, y - 1, y + 1, 40)


def test_bnaf_samples_are_the_inverse_of_its_density_map():
    # Issue 38: the inverse stopped at the end of a bracket that did not hold the root, z = 4 came back as 3.307.
    torch.manual_seed(0)
    m = flowkit.flows.BNAF(2, transforms=1).double()
    z = torch.tensor([[4.0, 0.0], [-30.0, 12.0]], dtype=torch.float64)
    x, _ = m.bijector.inverse(z)
    torch.testing.assert_close(m.bijector(x)[0], z, rtol=0, atol=1e-10)


def test_perturbed_bnaf_draws_samples_whose_log_prob_is_the_flows():
    # Issue 38: a perturbed BNAF drew 12 of 64 wrong samples, its log q off by up to 8 nats.
    torch.manual_seed(0)
    m = randomize(flowkit.flows.BNAF(2, transforms=2), scale=1.0, seed=3).double()
    x, log_q = m.rsample_and_log_prob((64,))
    torch.testing.assert_close(log_q, m.log_prob(x), rtol=0, atol=1e-8)


def test_an_unfinished_newton_solve_raises_naming_the_element():
    f, df = torch.tanh, lambda t: 1 / torch.cosh(t).square()
    y = torch.tensor([0.1, 0.99], dtype=torch.float64)
    x = root_finding.monotone_inverse(f, df, y, y * 0 - 10, y * 0 + 10, 60)
    torch.testing.assert_close(torch.tanh(x), y, rtol=0, atol=1e-14)
    with pytest.raises(
        root_finding.ConvergenceError, match=r"monotone_inverse: .* did not converge .* element \(1,\).* residual"
    ):
        root_finding.monotone_inverse(f, df, y, y * 0 - 10, y * 0 + 10, 3)
    with pytest.raises(
        root_finding.ConvergenceError, match="did not converge"
    ):  # a bracket that does not hold the root
        root_finding.monotone_inverse(f, df, y, y * 0 + 3, y * 0 + 10, 60)


def test_solve_monotone_refuses_a_target_outside_the_range():
    def fn(u, cells, slope):
        return u * u, (2 * u if slope else None)

    target = torch.tensor([0.25, 0.81], dtype=torch.float64)
    torch.testing.assert_close(root_finding.solve_monotone(fn, target, 8, 20, 4), target.sqrt(), rtol=0, atol=1e-12)
    with pytest.raises(root_finding.ConvergenceError, match=r"SmoothThing: .* element \(0,\), target y = 1.5"):
        root_finding.solve_monotone(fn, torch.tensor([1.5], dtype=torch.float64), 8, 20, 4, "SmoothThing")


def test_residual_fixed_point_raises_when_it_runs_out_of_iterations():
    b = randomize(Residual(3, hidden=(16,), coefficient=0.97, max_iterations=3), scale=1.0).double().eval()
    with pytest.raises(
        root_finding.ConvergenceError, match=r"Residual.inverse: the fixed-point .* element \(\d, \d\).* residual"
    ):
        b.inverse(torch.randn(4, 3, dtype=torch.float64))


def test_tolerance_is_stated_per_dtype():
    assert root_finding.tolerance(torch.float64) == 2.0**10 * torch.finfo(torch.float64).eps
    assert 1e-4 < root_finding.tolerance(torch.float32) < 2e-4
