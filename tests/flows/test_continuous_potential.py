"""OT-Flow's potential form: f = -grad Phi, the Hessian's trace, the HJB residual."""

import pytest
import torch

from flowkit.bijectors import ContinuousFlow
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow
from flowkit.nn import PotentialField, VectorField
from flowkit.train import RegularizedLikelihood


def _field(context=0):
    torch.manual_seed(0)
    field = PotentialField(2, hidden=(8,), context=context).double()
    with torch.no_grad():
        field.quadratic.copy_(0.3 * torch.randn(2, 2))
    return field


def test_the_field_is_minus_the_gradient_and_the_residual_is_hjbs():
    field = _field(context=1)
    x, c = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)
    t = torch.full((5,), 0.4, dtype=torch.float64)
    grad = torch.autograd.functional.jacobian(lambda y: field.potential(y, c, t=t).sum(), x)
    torch.testing.assert_close(field(x, c, t=0.4), -grad)
    h = 1e-6
    with torch.no_grad():
        dt = (field.potential(x, c, t=0.4 + h) - field.potential(x, c, t=0.4 - h)) / (2 * h)
    expected = dt - 0.5 * grad.square().sum(-1)
    torch.testing.assert_close(field.hjb_residual(x, c, t=0.4), expected, atol=1e-7, rtol=1e-6)


def test_a_potential_flows_log_det_is_the_integrated_hessian_trace():
    # Fixed-step RK4: the discrete map is smooth in x, so central differences give its Jacobian.
    flow = ContinuousFlow(_field(), 2, solver="rk4", solver_options={"step_size": 0.05}).double()
    x = torch.randn(1, 2, dtype=torch.float64)
    with torch.no_grad():
        z, ladj = flow(x)
        h = 1e-5
        columns = [(flow(x + h * e)[0] - flow(x - h * e)[0])[0] / (2 * h) for e in torch.eye(2, dtype=torch.float64)]
        x_back, ladj_back = flow.inverse(z)
    assert abs(torch.logdet(torch.stack(columns, 1)).item() - ladj.item()) < 1e-8
    assert (x_back - x).abs().max() < 1e-6 and abs(ladj_back.item() + ladj.item()) < 1e-6


def test_hjb_penalty_is_integrated_and_needs_a_potential():
    field = ContinuousFlow(_field(), 2, solver="rk4", solver_options={"step_size": 0.25})
    flow = Flow(field, StandardNormal(2)).double()
    x = torch.randn(8, 2, dtype=torch.float64)
    objective = RegularizedLikelihood(kinetic=0.5, hjb=1.0)
    total = objective.loss(flow, x)
    m = objective.metrics()
    assert m["hjb"] > 0
    torch.testing.assert_close(total.item(), m["nll"] + 0.5 * m["kinetic"] + m["hjb"], rtol=1e-6, atol=1e-6)
    total.backward()
    assert flow.bijector.vector_field.quadratic.grad.abs().sum() > 0
    plain = ContinuousFlow(VectorField(2, hidden=(4,)), 2)
    with pytest.raises(ValueError, match="hjb"):
        plain.forward_with_integrals(torch.randn(3, 2), names=["hjb"])
