"""One sweep over the bijector cases (tests/cases.py): the float64 checks, a float32 round trip, completeness."""

import pytest
import torch
from cases import BIJECTORS, missing_cases

from flowkit.bijectors import Bijector
from flowkit.root_finding import ConvergenceError
from flowkit.testing import check_bijector, randomize


def test_every_public_bijector_has_a_case():
    assert len(BIJECTORS) >= 10
    missing = missing_cases(Bijector, BIJECTORS)
    assert not missing, f"add a case to tests/cases.py BIJECTORS for: {', '.join(missing)}"


@pytest.mark.parametrize("name", BIJECTORS)
def test_check_bijector_float64(name):
    bijector, x = BIJECTORS[name]()
    report = check_bijector(bijector, x)
    assert report.passed, str(report)


@pytest.mark.parametrize("name", BIJECTORS)
def test_round_trip_float32(name):
    bijector, x = BIJECTORS[name]()
    b = bijector.float().eval()
    x = x.float()
    ctx = torch.randn(x.shape[0], b.context_features) if b.context_features else None
    z, ladj = b(x, ctx)
    x_back, ladj_inv = b.inverse(z, ctx)
    assert z.dtype == torch.float32 and ladj.dtype == torch.float32
    torch.testing.assert_close(x_back, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(ladj_inv, -ladj, atol=1e-5, rtol=0)


#: Round-trip tolerance of the perturbed sweep, relative to `max(1, |x|)` (`check_bijector`'s `atol`).
SWEEP_TOL = 1e-6
#: Above it, an error within this many times the rounding bound `eps ||J^-1||_2 max(1, |z|)` is conditioning.
SLACK = 100.0


def _conditioning_bound(b, x, z, context):
    """`eps ||J^-1(x)||_2 max(1, |z|)` per point: the rounding of `z` carried back by the inverse Jacobian."""
    bounds = []
    for i in range(x.shape[0]):
        ctx = None if context is None else context[i : i + 1]
        jac = torch.autograd.functional.jacobian(
            lambda t, ctx=ctx: b(t.view(1, *x.shape[1:]), ctx)[0].flatten(), x[i].flatten()
        )
        if jac.shape[0] != jac.shape[1] or b.domain.is_manifold:
            bounds.append(0.0)  # no square ambient Jacobian: only the plain tolerance applies
            continue
        inverse_norm = torch.linalg.matrix_norm(torch.linalg.inv(jac), ord=2)
        bounds.append(float(torch.finfo(x.dtype).eps * inverse_norm * z[i].abs().max().clamp_min(1)))
    return torch.tensor(bounds, dtype=x.dtype)


@pytest.mark.parametrize("name", [n for n in BIJECTORS if not n.startswith("ContinuousFlow")])
def test_round_trip_with_unit_perturbations(name):
    # Issue 38: with every weight perturbed by N(0, 1), no inverse may return a wrong point silently: it meets
    # the tolerance (or the rounding its conditioning allows), or raises ConvergenceError naming the point.
    # ContinuousFlow has its own stated tolerance: test_ode_round_trip_with_unit_perturbations.
    bijector, x = BIJECTORS[name]()
    b = randomize(bijector, scale=1.0, seed=1).double().eval()
    x = x.double()
    context = torch.randn(x.shape[0], b.context_features, dtype=torch.float64) if b.context_features else None
    with torch.no_grad():
        z, ladj = b(x, context)
        try:
            back, _ = b.inverse(z, context)
        except ConvergenceError as error:
            assert "element" in str(error) and "target" in str(error), str(error)
            return
    err = (back - x).flatten(1).abs().max(-1).values / x.flatten(1).abs().max(-1).values.clamp_min(1)
    bad = err > SWEEP_TOL
    if bad.any():
        bound = _conditioning_bound(b, x, z, context)
        assert bool((err[bad] <= SLACK * bound[bad]).all()), (err, bound)


@pytest.mark.parametrize("name", [n for n in BIJECTORS if n.startswith("ContinuousFlow")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ode_round_trip_with_unit_perturbations(name, seed):
    # The ODE inverse's stated accuracy: the local tolerance atol + rtol |x| times the number of steps (at most
    # the field evaluations); a solve that cannot keep it raises (tests/bijectors/test_continuous.py).
    bijector, x = BIJECTORS[name]()
    b = randomize(bijector, scale=1.0, seed=seed).double().eval()
    x = x.double()
    context = torch.randn(x.shape[0], b.context_features, dtype=torch.float64) if b.context_features else None
    with torch.no_grad():
        z, ladj = b(x, context)
        steps = b.nfe
        back, ladj_inverse = b.inverse(z, context)
    scale = max(1.0, float(x.abs().max()), float(z.abs().max()))
    bound = (b.atol + b.rtol * scale) * max(steps, b.nfe)
    assert float((back - x).abs().max()) <= bound
    assert float((ladj + ladj_inverse).abs().max()) <= bound
