"""The fused spline node (`_FusedSpline`) against the reference path (full knot table, autograd chain rule).

Every test runs twice, on each kernel of the fused node: the native C++ one (`flowkit._native`) and the
PyTorch one.
"""

import math
import warnings

import pytest
import torch
from cases import BIJECTORS

from flowkit.kernels import rational_quadratic, use_spline_kernel
from flowkit.kernels.fused import fused_spline
from flowkit.transformers import CircularSpline, RationalQuadraticSpline
from flowkit.transformers.rational_quadratic import reference_spline

SPLINES = {
    "K=8, B=3": lambda: RationalQuadraticSpline(8, 3.0),
    "K=1": lambda: RationalQuadraticSpline(1, 2.0),
    "K=2": lambda: RationalQuadraticSpline(2, 1.0),
    "unequal minimums": lambda: RationalQuadraticSpline(
        5, 2.0, min_bin_width=1e-2, min_bin_height=3e-3, min_derivative=1e-2
    ),
    "circular K=6": lambda: CircularSpline(6),
    "circular K=1": lambda: CircularSpline(1),
}


@pytest.fixture(autouse=True)
def kernel(spline_kernel):
    """Every test here on both kernels (`spline_kernel` in conftest.py)."""
    return spline_kernel


def inputs(spline, shape, seed, scale=2.0):
    """Float64 points (a third or so outside the interval) and parameters, with gradients."""
    g = torch.Generator().manual_seed(seed)
    high = spline.layout.high
    x = 1.4 * high * (2 * torch.rand(*shape, generator=g, dtype=torch.float64) - 1)
    params = scale * torch.randn(*shape, spline.params_per_element, generator=g, dtype=torch.float64)
    return x.requires_grad_(True), params.requires_grad_(True)


def both(x, params, spline, inverse):
    """`(out, ladj, dlog)` of the fused node and of the reference."""
    layout = spline.layout
    return fused_spline(x, params, layout, inverse, True), reference_spline(x, params, layout, inverse, True)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("name", list(SPLINES))
def test_values_and_gradients_match_the_reference(name, inverse, kernel):
    spline = SPLINES[name]()
    x, params = inputs(spline, (300, 3), seed=1)
    outside = (x.abs() > spline.layout.high).float().mean()
    assert 0.15 < outside < 0.45
    fused, reference = both(x, params, spline, inverse)
    # The native kernel rounds differently from the reference (its inverse's solve, the order of its sums),
    # and a steep bin multiplies a rounding of 1e-16 by up to ~1e6.
    tolerance = 1e-9 if kernel == "native" else 1e-10
    for f, r in zip(fused, reference, strict=True):
        torch.testing.assert_close(f, r, rtol=tolerance, atol=tolerance)
    # Gradients in x and the parameters, for random cotangents on both outputs.
    g = torch.Generator().manual_seed(2)
    w_out, w_ladj = torch.randn(2, *x.shape, generator=g, dtype=torch.float64)
    grads = [
        torch.autograd.grad((out * w_out + ladj * w_ladj).sum(), (x, params)) for out, ladj, _ in (fused, reference)
    ]
    for f, r in zip(*grads, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-9, atol=1e-9 * r.abs().max().item())
    if name != "K=1":  # one bin with boundary derivatives 1 is the identity
        assert grads[1][1].abs().sum() > 0


@pytest.mark.parametrize("name", list(SPLINES))
def test_points_on_knots_and_bounds_match_the_reference(name):
    spline = SPLINES[name]()
    x, params = inputs(spline, (40,), seed=3)
    positions = spline.knots(params.detach())[0]  # (40, 2, K + 1)
    for inverse in (False, True):
        # Every knot of each row on the searched axis, the interval's ends among them.
        points = positions[:, int(inverse)].T.contiguous()  # (K + 1, 40)
        p = params.detach().expand(points.shape[0], -1, -1)
        fused, reference = both(points, p, spline, inverse)
        # Output and log-derivative are continuous at a knot; the derivative of the log-derivative is
        # one-sided there, and a knot rounded differently (exp2 against exp, ~1e-16) may pick the other
        # side, where the log-derivative moves by that rounding times a slope of up to ~1e6 in steep bins.
        for f, r in zip(fused[:2], reference[:2], strict=True):
            assert torch.isfinite(f).all()
            torch.testing.assert_close(f, r, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("name", list(SPLINES))
def test_gradcheck(name, inverse):
    spline = SPLINES[name]()
    x, params = inputs(spline, (7,), seed=4, scale=1.0)

    def fused(x, params):
        return fused_spline(x, params, spline.layout, inverse, False)[:2]

    assert torch.autograd.gradcheck(fused, (x, params))


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_second_derivatives_fall_back_to_the_reference(inverse):
    # A backward pass with create_graph (score matching, force matching) differentiates the reference.
    spline = RationalQuadraticSpline(6, 2.0)
    x, params = inputs(spline, (50,), seed=5)

    def score_loss(fn):
        _, ladj, _ = fn(x, params, spline.layout, inverse, False)
        (score,) = torch.autograd.grad(ladj.sum(), x, create_graph=True)
        return torch.autograd.grad((score**2).sum(), (x, params))

    for f, r in zip(score_loss(fused_spline), score_loss(reference_spline), strict=True):
        torch.testing.assert_close(f, r, rtol=1e-10, atol=1e-10)
    x7, p7 = inputs(spline, (5,), seed=6, scale=1.0)
    assert torch.autograd.gradgradcheck(lambda a, b: fused_spline(a, b, spline.layout, inverse, False)[:2], (x7, p7))


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_nested_torch_func_transforms_agree_with_autograd(inverse, kernel):
    # The node's torch.func rules (vmap, jvp, the reference backward with a graph) and the native op's
    # batching rule: every nesting gives autograd's numbers, with no per-sample fallback and no op
    # differentiated without its autograd kernel (both only warn in torch).
    from torch.func import grad, hessian, vmap

    spline = RationalQuadraticSpline(4, 2.0).double()
    x, params = (t.detach() for t in inputs(spline, (6,), seed=11, scale=1.0))
    transform = spline.inverse if inverse else spline.forward

    def ladj(x, params):
        return transform(x, params)[1].sum()

    xg = x.clone().requires_grad_(True)
    (slope,) = torch.autograd.grad(ladj(xg, params), xg, create_graph=True)
    second = torch.stack([torch.autograd.grad(s, xg, retain_graph=True)[0] for s in slope])
    rows = (x[:, None], params[:, None])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(performance drop|autograd kernel was not registered).*")
        torch.testing.assert_close(grad(ladj)(x, params), slope)
        torch.testing.assert_close(vmap(grad(ladj))(*rows).squeeze(-1), slope)
        torch.testing.assert_close(grad(lambda x: vmap(ladj)(x[:, None], params[:, None]).sum())(x), slope)
        torch.testing.assert_close(hessian(ladj)(x, params), second)
        with torch.no_grad():
            batched = vmap(lambda a, b: torch.stack(transform(a, b)))(x.view(2, 3), params.view(2, 3, -1))
    torch.testing.assert_close(batched, torch.stack(transform(x, params)).view(2, 2, 3).transpose(0, 1))


def test_eager_calls_use_the_fused_node_and_transforms_the_reference():
    spline = RationalQuadraticSpline(4, 2.0).double()
    x, params = inputs(spline, (6,), seed=7)
    y, _ = spline(x, params)
    assert type(y.grad_fn).__name__ == "_FusedSplineBackward"
    # Forward-mode AD (not implemented by the fused node) goes through the reference.
    import torch.autograd.forward_ad as fwad

    tangent = torch.randn_like(x)
    with fwad.dual_level():
        y_dual, _ = spline(fwad.make_dual(x.detach(), tangent), params.detach())
        jvp = fwad.unpack_dual(y_dual).tangent
    (slope,) = torch.autograd.grad(spline(x, params)[0].sum(), x)
    torch.testing.assert_close(jvp, slope * tangent)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_float32_is_as_accurate_as_the_reference(inverse):
    # Against the float64 values, the fused float32 path errs no more than the reference's float32 path
    # (steep bins make the log-derivative's float32 error ~1e-4 on either).
    spline = RationalQuadraticSpline(8, 3.0)
    x64, p64 = inputs(spline, (2000,), seed=8)
    x, params = x64.detach().float().requires_grad_(True), p64.detach().float().requires_grad_(True)
    exact = reference_spline(x64, p64, spline.layout, inverse, True)
    fused, reference = both(x, params, spline, inverse)
    for f, r, e in zip(fused, reference, exact, strict=True):
        assert torch.isfinite(f).all()
        assert (f.double() - e).abs().max() <= 2 * (r.double() - e).abs().max() + 1e-6
    exact_grads = torch.autograd.grad((exact[0] + exact[1]).sum(), (x64, p64))
    grads = [torch.autograd.grad((out + ladj).sum(), (x, params)) for out, ladj, _ in (fused, reference)]
    for f, r, e in zip(*grads, exact_grads, strict=True):
        assert torch.isfinite(f).all()
        assert (f.double() - e).abs().max() <= 2 * (r.double() - e).abs().max() + 1e-6


def _has_spline(bijector):
    return any(isinstance(m, RationalQuadraticSpline | CircularSpline) for m in bijector.modules())


SPLINE_CASES = [name for name, case in BIJECTORS.items() if "pline" in name or "spline" in name]


@pytest.mark.parametrize("name", SPLINE_CASES)
def test_registry_spline_cases_match_the_reference(name, monkeypatch):
    bijector, x = BIJECTORS[name]()
    assert _has_spline(bijector)
    bijector, x = bijector.double(), x.double()
    context = (
        torch.randn(x.shape[0], bijector.context_features, dtype=torch.float64) if bijector.context_features else None
    )

    def run():
        z, ladj = bijector(x, context)
        back, ladj_inverse = bijector.inverse(z.detach(), context)
        grads = torch.autograd.grad((z.sum() + ladj.sum()), [p for p in bijector.parameters() if p.requires_grad])
        return (z, ladj, back, ladj_inverse, *grads)

    fused = run()
    with use_spline_kernel("reference"):
        reference = run()
    for f, r in zip(fused, reference, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_gradient_in_the_input_alone(inverse):
    # Parameters without gradients (sampling, path gradients in the input): the fused backward skips them.
    spline = RationalQuadraticSpline(8, 3.0)
    x, params = inputs(spline, (200,), seed=9)
    params = params.detach()
    fused, reference = both(x, params, spline, inverse)
    grads = [torch.autograd.grad((out + 2 * ladj).sum(), x)[0] for out, ladj, _ in (fused, reference)]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-9 * grads[1].abs().max().item())


def test_mixed_dtypes_take_the_reference_path():
    spline = RationalQuadraticSpline(4, 2.0)
    x, params = inputs(spline, (6,), seed=10)
    y, ladj = spline(x.float(), params)
    assert type(y.grad_fn).__name__ != "_FusedSplineBackward"
    assert y.dtype == ladj.dtype == torch.float64


@pytest.mark.parametrize("name", list(SPLINES))
def test_without_gradients_the_forward_pass_alone_matches(name, monkeypatch):
    spline = SPLINES[name]()
    x, params = inputs(spline, (100,), seed=11)
    with torch.no_grad():
        fused = spline(x, params), spline.inverse(x, params)
        with use_spline_kernel("reference"):
            reference = spline(x, params), spline.inverse(x, params)
    for f, r in zip(sum(fused, ()), sum(reference, ()), strict=True):
        torch.testing.assert_close(f, r, rtol=1e-10, atol=1e-10)


def assert_agree(fused, reference, wrt, tolerance):
    """Values, and gradients of `out + ladj` in `wrt`, agree to `tolerance`; returns the fused gradients."""
    for f, r in zip(fused, reference, strict=True):
        torch.testing.assert_close(f, r, rtol=tolerance, atol=tolerance)
    grads = [torch.autograd.grad((out + ladj).sum(), wrt) for out, ladj, _ in (fused, reference)]
    for f, r in zip(*grads, strict=True):
        torch.testing.assert_close(f, r, rtol=tolerance, atol=tolerance * r.abs().max().item())
    return grads[0]


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_float32_circle_at_its_float32_ends_matches_the_reference(inverse):
    # float32(pi) lies outside double's pi: clamped and compared in float32, as torch does, it is inside.
    spline = CircularSpline(5)
    x = torch.linspace(-math.pi, math.pi, 41).requires_grad_(True)
    params = torch.randn(41, spline.params_per_element, generator=torch.Generator().manual_seed(12))
    params.requires_grad_(True)
    grads = assert_agree(*both(x, params, spline, inverse), (x, params), 2e-4)
    assert grads[0][[0, -1]].abs().min() > 0  # the ends are inside: their input gradient is the slope's


def test_broadcast_rows_and_extra_columns_match_the_reference():
    # One row of parameters for every point (stride-0 rows once flattened), with columns past the spline's own.
    spline = RationalQuadraticSpline(6, 2.0)
    x, _ = inputs(spline, (30,), seed=13)
    row = torch.randn(1, spline.params_per_element + 3, dtype=torch.float64, requires_grad=True)
    params = row.expand(30, -1)
    grads = assert_agree(*both(x, params, spline, False), (x, row), 1e-9)
    assert (grads[1][:, spline.params_per_element :] == 0).all()


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_non_finite_inputs_give_what_the_reference_gives(inverse):
    spline = RationalQuadraticSpline(4, 2.0)
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.5, 1.0], dtype=torch.float64)
    params = torch.randn(5, spline.params_per_element, dtype=torch.float64, generator=torch.Generator().manual_seed(14))
    params[3, 0] = math.nan  # a NaN logit at a point inside
    with torch.no_grad():
        got = rational_quadratic(x, params, spline.layout, inverse, True)
        expected = reference_spline(x, params, spline.layout, inverse, True)
    for f, r in zip(got, expected, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-12, atol=1e-12, equal_nan=True)
