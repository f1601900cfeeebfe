r"""Monotone rational-quadratic splines (Neural Spline Flows), with linear tails or on the circle.

A rational-quadratic spline with `K` bins maps `[-B, B]` onto itself
through knots `(x_k, y_k)` with derivatives `\delta_k` at the knots. In
bin `k`, with `s = \Delta y / \Delta x`, `\xi = (x - x_k) / \Delta x` and
`\text{den} = s + (\delta_k + \delta_{k+1} - 2s)\,\xi(1-\xi)`:

$$
y = y_k + \Delta y \, \frac{s\xi^2 + \delta_k \xi(1-\xi)}{\text{den}}, \qquad
\frac{dy}{dx} = \frac{s^2\left[\delta_{k+1}\xi^2 + 2s\xi(1-\xi) + \delta_k(1-\xi)^2\right]}{\text{den}^2}.
$$

The inverse solves the quadratic `a\xi^2 + b\xi + c = 0` in the bin found on
the `y` knots, through the root `\xi = 2c / (-b - \sqrt{b^2 - 4ac})` for
`b >= 0` and its equal `(-b + \sqrt{b^2 - 4ac}) / (2a)` for `b < 0`, each
free of cancellation where it is used.

Unconstrained parameters map to knots as in nflows: bin widths
`m_w + (1 - K m_w)\,\mathrm{softmax}(\hat w)` scaled to `2B` (heights
alike), derivatives `m_d + \mathrm{softplus}(\hat\delta)`, with
`m_w = m_h = m_d = 10^{-3}` (and derivatives capped at `10^{12}`). With linear tails the map is the identity
outside `[-B, B]` and the two boundary derivatives are 1, so a spline has
`3K - 1` parameters per element.

Robustness: inputs are clamped to `[-B, B]` *before* the spline maths, the
bin is found by `torch.searchsorted` on the interior knots (so `\pm B`
and points exactly on knots land in a valid bin), the bin-relative coordinate
`\xi` is clamped to `[0, 1]` (rounding moves it out at the knots, in
float32, and in a steep bin the log-derivative of a point just outside is the
log of a negative number) and the tails are selected with `torch.where`.
Both branches are therefore finite everywhere, and so are the gradients,
also far outside the bound. Nothing in the hot path
synchronises with the device, so the code runs under `torch.compile`.

Speed: in eager mode a transformer's whole map (knot construction, bin
search, bin arithmetic, tails) is one autograd node with a hand-written
backward pass (`_FusedSpline`): it exponentiates and accumulates the logits
once, searches the bin, and then gathers only that bin's two knots and
derivatives per point, where the reference builds the full knot and derivative
tables; the backward pass maps the bin's cotangents to the logits in closed
form (a cumulative sum of three spikes per row) and the inverse uses the
implicit-function rule. On the CPU the node runs that maths point by point in
one C++ operation per direction (`flowkit._native`, built on first use), and
elsewhere (CUDA, half precision, no compiler) as a few dozen torch operations.
A backward pass that records a graph (higher
derivatives, as in score and force matching), `torch.func` transforms,
forward-mode AD and `torch.compile` use the reference path (a full knot table
and a bin node, `_RationalQuadraticBin`, that supports all of them); both give
the same numbers. The transformers also return the derivative of their
log-derivative in the input, which the fast path-gradient rule of coupling
layers uses.

References:
    Durkan, Bekasov, Murray & Papamakarios, *Neural Spline Flows*, NeurIPS 2019
    (arXiv:1906.04032); Gregory & Delbourgo, *Piecewise rational quadratic
    interpolation to monotonic data*, IMA J. Numer. Anal. 1982; Rezende et al.,
    *Normalizing flows on tori and spheres*, ICML 2020 (arXiv:2002.02428).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from .._validation import check_number
from ..domains import Circle
from .base import Transformer

__all__ = [
    "RationalQuadraticSpline",
    "CircularSpline",
    "unconstrained_rqs",
    "DEFAULT_MIN_BIN_WIDTH",
    "DEFAULT_MIN_BIN_HEIGHT",
    "DEFAULT_MIN_DERIVATIVE",
]

DEFAULT_MIN_BIN_WIDTH = 1e-3
DEFAULT_MIN_BIN_HEIGHT = 1e-3
DEFAULT_MIN_DERIVATIVE = 1e-3


#: Derivatives at the knots are capped here: the squares in the bin maths stay finite in
#: float32 for bounds up to 1e6 (a conditioner fed inputs of 1e30 outputs 1e32, say).
_MAX_DERIVATIVE = 1e12


def _softplus(x: Tensor) -> Tensor:
    """`log(1 + e^x)` of a slice of a parameter tensor.

    torch's CPU kernels run many times slower on the strided slice than on a
    contiguous copy of it, so copy first.
    """
    return F.softplus(x.contiguous())


def _check_minimums(bins: int, min_bin_width: float, min_bin_height: float, min_derivative: float) -> None:
    if bins < 1:
        raise ValueError(f"a spline needs at least one bin, got bins={bins}")
    for name, value in (("min_bin_width", min_bin_width), ("min_bin_height", min_bin_height)):
        # Zero is refused: a bin whose logit underflows would get zero size and a 0/0 slope.
        if not 0 < value * bins < 1:
            raise ValueError(f"{name}={value} times bins={bins} must lie in (0, 1)")
    if min_derivative <= 0:
        raise ValueError(f"min_derivative must be positive, got {min_derivative}")


def _identity_derivative(min_derivative: float) -> float:
    """The unconstrained derivative `log(e^{1 - m_d} - 1)` that gives `m_d + softplus(.) = 1`."""
    return math.log(math.expm1(1 - min_derivative))


def _scale_and_offset(
    total: Tensor, bins: int, low: float, high: float, min_bin_width: float, min_bin_height: float
) -> tuple[Tensor, Tensor]:
    """`scale = span (1 - K m) / C_K`, shaped like `total`, and `offset_k = k span m + low`.

    `total` has the rows (widths, heights) in dim -2: `(..., 2, 1)` for the reference, `(2, n)` fused.

    `offset` is `(K,)` when both minimums agree, else `(2, K)` (rows for the widths and the heights).
    Knot `k >= 1` on either axis sits at `offset_{k-1} + C_{k-1} scale`, with `C` the cumulative sum
    of the exponentiated logits and `C_K = total`; the reference and the fused knot constructions
    share this arithmetic.
    """
    span = high - low
    ramp = torch.arange(1, bins + 1, dtype=total.dtype, device=total.device)
    if min_bin_width == min_bin_height:
        return span * (1 - bins * min_bin_width) / total, ramp * (span * min_bin_width) + low
    minimum = total.new_tensor([[min_bin_width], [min_bin_height]])
    return span * (1 - bins * minimum) / total, ramp * (span * minimum) + low


def _knots(
    unnormalized_bins: Tensor,
    derivatives: Tensor,
    low: float,
    high: float,
    min_bin_width: float,
    min_bin_height: float,
) -> tuple[Tensor, Tensor]:
    """The knots: positions `(..., 2, K + 1)` (rows `x_k` and `y_k`) and derivatives `(..., K + 1)`.

    Arguments:
        unnormalized_bins: widths and heights stacked, `(..., 2, K)`.
        derivatives: constrained derivatives at all `K + 1` knots, `(..., K + 1)`
            (returned as they are).
        low: lower end of the spline's (co)domain `[low, high]` on both axes.
        high: upper end of that interval.
        min_bin_width: the minimum bin width as a fraction of `high - low`.
        min_bin_height: the minimum bin height, likewise.

    With `e = exp(logits)` and `C` its cumulative sum, knot `k >= 1` sits at
    `low + span ((1 - K m) C_k / C_K + k m)`: the cumulative softmax, with the
    minimum bin size `m` added to every bin. For the few bins of a spline
    (K ~ 8) and many rows, torch's fused softmax (and even a sum over the bins)
    is several times slower on CPU than this cumulative sum, and the scaling
    and offset take one fused pass. The logits, a strided slice of the
    conditioner's output, are copied first (strided kernels are slow); the max
    is taken on detached logits (any shift is exact).
    """
    logits = unnormalized_bins.contiguous()
    cumulative = torch.cumsum(torch.exp(logits - logits.detach().amax(dim=-1, keepdim=True)), dim=-1)
    bins = unnormalized_bins.shape[-1]
    scale, offset = _scale_and_offset(cumulative[..., -1:], bins, low, high, min_bin_width, min_bin_height)
    # The last knot is high up to rounding; the bin search uses the interior
    # knots only, inputs are clamped to [low, high] and the bin-relative
    # coordinate to [0, 1], so a point in a rounding gap at the end (an angle
    # just below pi, say) lands in the last bin, at its end.
    positions = F.pad(torch.addcmul(offset, cumulative, scale), (1, 0), value=low)
    return positions, derivatives


def _bin_shape(x0: Tensor, x1: Tensor, y0: Tensor, y1: Tensor, d0: Tensor, d1: Tensor) -> tuple[Tensor, ...]:
    """Width `w`, height `h`, slope `s = h / w` and curvature `c = d0 + d1 - 2s` of a bin."""
    w = x1 - x0
    h = y1 - y0
    s = h / w
    return w, h, s, d0 + d1 - (s + s)


def _bin_terms(x: Tensor, x0: Tensor, shape: tuple[Tensor, ...], d0: Tensor, d1: Tensor) -> tuple[Tensor, ...]:
    """The pieces of the forward map in one bin at the point `x`.

    Returns `(w, h, s, c, xi, 1 - xi, q, den, N, P)` with `(w, h, s, c)` from
    `_bin_shape`, `xi = (x - x0) / w`, `q = xi (1 - xi)`,
    `den = s + c q`, `N = s xi^2 + d0 q` and `P = d1 xi^2 + 2 s q + d0 (1 - xi)^2`,
    so that `y = y0 + h N / den` and `log dy/dx = log(s^2 P / den^2)`.
    """
    return _xi_terms(((x - x0) / shape[0]).clamp(0, 1), shape, d0, d1)


def _xi_terms(xi: Tensor, shape: tuple[Tensor, ...], d0: Tensor, d1: Tensor) -> tuple[Tensor, ...]:
    """`_bin_terms` at the bin-relative coordinate `xi`, which must lie in `[0, 1]`.

    Outside `[0, 1]` (by rounding, `x` on a knot) `P` can turn negative in a
    steep bin, and its log NaN: `_bin_terms` clamps.
    """
    w, h, s, c = shape
    one_m_xi = 1 - xi
    xi_sq = xi * xi
    q = xi * one_m_xi
    den = s + c * q
    n = s * xi_sq + d0 * q
    p = d1 * xi_sq + (s + s) * q + d0 * one_m_xi * one_m_xi
    return w, h, s, c, xi, one_m_xi, q, den, n, p


def _dp_dxi(terms: tuple[Tensor, ...], d0: Tensor, d1: Tensor) -> Tensor:
    """`dP/dxi = 2 (d1 xi + s (1 - 2 xi) - d0 (1 - xi))` in one bin."""
    _, _, s, _, xi, one_m_xi, *_ = terms
    return 2 * (d1 * xi + s * (one_m_xi - xi) - d0 * one_m_xi)


def _dlog_dx(terms: tuple[Tensor, ...], dp: Tensor) -> Tensor:
    """`d log(dy/dx) / dx = (P'/P - 2 den'/den) / w` in one bin, with `den' = c (1 - 2 xi)`."""
    w, _, _, c, xi, one_m_xi, _, den, _, p = terms
    return (dp / p - 2 * c * (one_m_xi - xi) / den) / w


def _bin_vjp(
    terms: tuple[Tensor, ...], dp: Tensor, d0: Tensor, d1: Tensor, g_y: Tensor, g_log: Tensor
) -> tuple[Tensor, ...]:
    """Pull the cotangents of `(y, log dy/dx)` back to `(x, x0, x1, y0, y1, d0, d1)` (reverse mode by hand)."""
    w, h, s, c, xi, one_m_xi, q, den, n, p = terms
    one_m_2xi = one_m_xi - xi
    g_n = g_y * h / den
    g_den = -(g_n * n + 2 * g_log) / den
    g_p = g_log / p
    g_xi = g_n * (2 * s * xi + d0 * one_m_2xi) + g_den * c * one_m_2xi + g_p * dp
    g_s = g_n * xi * xi + g_den * (1 - 2 * q) + 2 * g_p * q + 2 * g_log / s
    g_d0 = (g_n + g_den) * q + g_p * one_m_xi * one_m_xi
    g_d1 = g_den * q + g_p * xi * xi
    g_h = g_y * n / den + g_s / w
    g_w = -(g_s * s + g_xi * xi) / w
    g_x = g_xi / w
    return g_x, -g_x - g_w, g_w, g_y - g_h, g_h, g_d0, g_d1


def _terms_pullback(
    terms: tuple[Tensor, ...], d0: Tensor, d1: Tensor, inverse: bool, g_out: Tensor, g_ladj: Tensor
) -> tuple[Tensor, ...]:
    """`_bin_pullback` from the bin's `terms` (`_xi_terms` where the forward map is evaluated)."""
    dp = _dp_dxi(terms, d0, d1)
    if not inverse:
        return _bin_vjp(terms, dp, d0, d1, g_out, g_ladj)
    # x = tau^{-1}(v; theta), ladj = -L(x; theta): the cotangent on x picks up -g_ladj dL/dx,
    # and dx/dv = e^{-L}, dx/dtheta = -e^{-L} dtau/dtheta.
    _, _, s, _, _, _, _, den, _, p = terms
    g_v = (g_out - g_ladj * _dlog_dx(terms, dp)) * (den * den / (s * s * p))
    return (g_v, *_bin_vjp(terms, dp, d0, d1, -g_v, -g_ladj)[1:])


def _bin_pullback(
    point: Tensor, knots: tuple[Tensor, ...], inverse: bool, g_out: Tensor, g_ladj: Tensor
) -> tuple[Tensor, ...]:
    """Cotangents of `(out, ladj)` pulled back to the bin's inputs `(v, x0, x1, y0, y1, d0, d1)`.

    `point` is where the forward map is evaluated: the input `v` forward,
    the solved output inverse.
    """
    x0, x1, y0, y1, d0, d1 = knots
    terms = _bin_terms(point, x0, _bin_shape(x0, x1, y0, y1, d0, d1), d0, d1)
    return _terms_pullback(terms, d0, d1, inverse, g_out, g_ladj)


def _solve_bin(dy: Tensor, shape: tuple[Tensor, ...], d0: Tensor, d1: Tensor) -> Tensor:
    r"""The root `xi` in `[0, 1]` of `a xi^2 + b xi + c_0 = 0`, the bin's map solved for `y = y_0 + dy`.

    With `a = h (s - d_0) + dy\,c`, `b = h d_0 - dy\,c`, `c_0 = -s\,dy`
    (`c_0 <= 0`), the root is `-2 c_0 / (b + r)` for `b >= 0` and
    `(r - b) / (2a)` for `b < 0` (where `a >= |b| > 0`), `r = \sqrt{b^2 - 4 a c_0}`:
    each form without cancellation (the first alone loses all digits when
    `b < 0` and `a c_0` is small next to `b^2`, in steep bins). The coefficients are
    evaluated as `b = d_0 (h - dy) - dy (d_1 - 2s)` and `a = h s - b` (the same numbers, with
    `c = d_0 + d_1 - 2s` written out): the form `h d_0 - dy\,c` cancels `h d_0` against `dy\,d_0`
    in a steep bin and is accurate only where the CPU fuses the multiply-add; this one is accurate
    in plain arithmetic, on any CPU, as the native kernel computes it. One division of selected
    numerator and denominator, so no branch can produce inf or NaN; the root is clamped into the bin
    (it leaves `[0, 1]` by rounding at the knots).
    """
    _, h, s, _ = shape
    b = d0 * (h - dy) - dy * (d1 - (s + s))
    a = h * s - b
    s_dy = s * dy  # -c_0
    root = (b * b + 4 * (a * s_dy)).clamp_min(0).sqrt()
    positive = b >= 0
    numerator = torch.where(positive, s_dy + s_dy, root - b)
    denominator = torch.where(positive, b + root, a + a).clamp_min(torch.finfo(dy.dtype).tiny)
    return (numerator / denominator).clamp(0, 1)


def _bin_forward(
    v: Tensor, x0: Tensor, x1: Tensor, y0: Tensor, y1: Tensor, d0: Tensor, d1: Tensor, inverse: bool, derivative: bool
) -> tuple[Tensor, Tensor, Tensor | None, tuple[Tensor, ...]]:
    """The bin's map (or its inverse) at `v`: `(out, ladj, dlog, terms)`.

    `dlog` is the derivative of `ladj` in `v` (None unless `derivative`); `terms` are those of
    `_xi_terms` where the forward map is evaluated (at `v` forward, at the solved output inverse).
    """
    shape = _bin_shape(x0, x1, y0, y1, d0, d1)
    if inverse:
        xi = _solve_bin(v - y0, shape, d0, d1)
        point = torch.lerp(x0, x1, xi)  # exactly x0 at xi = 0 and x1 at xi = 1
        terms = _xi_terms(xi, shape, d0, d1)
    else:
        point = v
        terms = _bin_terms(point, x0, shape, d0, d1)
    _, h, s, _, _, _, _, den, n, p = terms
    log_derivative = torch.log(s * s * p / (den * den))
    dlog = None
    if derivative:
        dlog = _dlog_dx(terms, _dp_dxi(terms, d0, d1))
        if inverse:
            dlog = -dlog * torch.exp(-log_derivative)
    if inverse:
        return point, -log_derivative, dlog, terms
    return y0 + h * n / den, log_derivative, dlog, terms


class _RationalQuadraticBin(torch.autograd.Function):
    r"""One rational-quadratic bin, forward or inverse, as a single autograd node.

    The backward pass is written out by hand (`_bin_vjp`); the inverse
    uses the implicit-function rule on the forward map at the solved point,
    $\partial x / \partial \theta = -(\partial y / \partial \theta) / y'$.
    This replaces some forty elementwise autograd nodes per call. The backward
    is built from differentiable torch operations, so higher derivatives work
    too; forward mode (`jvp`) and `torch.func` transforms (`vmap`,
    `jacrev`, `jacfwd`) are supported.

    Outputs: `(out, ladj, point, dlog)`, where `point` is where the forward
    map was evaluated (kept for the backward pass) and `dlog` the derivative of
    `ladj` in the input (`None` unless asked for).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(  # type: ignore[override]
        v: Tensor,
        x0: Tensor,
        x1: Tensor,
        y0: Tensor,
        y1: Tensor,
        d0: Tensor,
        d1: Tensor,
        inverse: bool,
        derivative: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        return _bin_forward(v, x0, x1, y0, y1, d0, d1, inverse, derivative)[:3]

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:  # type: ignore[override]
        v, *knots, inverse, _ = inputs
        out, _, dlog = output
        if dlog is not None:
            ctx.mark_non_differentiable(dlog)
        ctx.inverse = inverse
        # The inverse saves its output, so that higher derivatives see its dependence on the inputs.
        point = out if inverse else v
        ctx.save_for_backward(point, *knots)
        ctx.save_for_forward(point, *knots)

    @staticmethod
    def backward(ctx: Any, g_out: Tensor, g_ladj: Tensor, _: Any) -> tuple:  # type: ignore[override]
        point, *knots = ctx.saved_tensors
        return (*_bin_pullback(point, tuple(knots), ctx.inverse, g_out, g_ladj), None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Tensor) -> tuple:  # type: ignore[override]
        point, *knots = ctx.saved_tensors
        ones, zeros = torch.ones_like(point), torch.zeros_like(point)
        # Everything is elementwise, so unit cotangents give every partial derivative at once.
        d_out = _bin_pullback(point, tuple(knots), ctx.inverse, ones, zeros)
        d_ladj = _bin_pullback(point, tuple(knots), ctx.inverse, zeros, ones)
        pairs = [(i, t) for i, t in enumerate(tangents[:7]) if t is not None]
        t_out = sum(d_out[i] * t for i, t in pairs)
        t_ladj = sum(d_ladj[i] * t for i, t in pairs)
        return t_out, t_ladj, None


# `autograd.Function.apply` binds its arguments with `inspect.signature(forward)` on every call
# (some 15 us, about 1% of a small flow's step): give it the signature ready-made.
_RationalQuadraticBin.forward.__signature__ = inspect.signature(_RationalQuadraticBin.forward)  # type: ignore[attr-defined]


def _spline(
    x: Tensor, knots: tuple[Tensor, Tensor], low: float, high: float, inverse: bool, derivative: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    r"""The spline (or its inverse) on `[low, high]` at `clamp(x)`, with the elementwise log-derivative.

    Returns `(y, log|dy/dx|, clamped x, d)` forward, `(x, log|dx/dy|, clamped y, d)`
    inverse, where `d` (only if `derivative`, else None; without a graph) is the
    derivative of the returned log-derivative in the input. With
    $L = \log|dy/dx| = \log(s^2 P) - 2\log \text{den}$,
    $P = \delta_{k+1}\xi^2 + 2s\xi(1-\xi) + \delta_k(1-\xi)^2$:
    $dL/dx = (P'/P - 2\,\text{den}'/\text{den}) / \Delta x$, and the
    inverse's is $-(dL/dx)\, e^{-L}$.
    """
    positions, derivatives = knots
    x = x.clamp(low, high)
    axis = 1 if inverse else 0
    # Number of interior knots strictly below x: the bin index, in [0, K - 1] for any x.
    inner = positions[..., axis, 1:-1].contiguous()
    k = torch.searchsorted(inner, x.unsqueeze(-1))
    ends = torch.cat([k, k + 1], dim=-1)
    table = positions.gather(-1, ends.unsqueeze(-2).expand(*positions.shape[:-1], 2))
    (x0, x1), (y0, y1) = (row.unbind(-1) for row in table.unbind(-2))
    d0, d1 = derivatives.gather(-1, ends).clamp_max(_MAX_DERIVATIVE).unbind(-1)
    if torch.compiler.is_compiling():
        # Dynamo cannot trace an autograd.Function with a custom jvp; the compiler
        # differentiates and fuses the same elementwise maths itself.
        out, ladj, dlog = _RationalQuadraticBin.forward(x, x0, x1, y0, y1, d0, d1, inverse, derivative)
        dlog = None if dlog is None else dlog.detach()
    else:
        out, ladj, dlog = _RationalQuadraticBin.apply(x, x0, x1, y0, y1, d0, d1, inverse, derivative)
    return out, ladj, x, dlog


def _tails(
    x: Tensor, clamped: Tensor, out: Tensor, ladj: Tensor, derivative: Tensor | None = None
) -> tuple[Tensor, ...]:
    """Identity with zero log-derivative where clamping moved `x` (selected without host synchronisation).

    With `derivative` (the log-derivative's derivative), also zero it in the tails.
    """
    inside = x == clamped
    mapped = torch.where(inside, out, x), torch.where(inside, ladj, 0.0)
    if derivative is None:
        return mapped
    return (*mapped, torch.where(inside, derivative, 0.0))


def _linear_tail_derivatives(unnormalized_derivatives: Tensor, min_derivative: float) -> Tensor:
    """`m_d + softplus` of the `K - 1` interior derivatives, padded with the boundary derivatives 1."""
    return F.pad(_softplus(unnormalized_derivatives) + min_derivative, (1, 1), value=1.0)


class _Layout(NamedTuple):
    """What a spline's parameter vector means: `K` width and `K` height logits, then the derivatives.

    Linear tails (`circular=False`): `K - 1` interior pre-softplus derivatives, boundary derivatives 1 and
    the identity outside `[low, high]`. Circular: `K` derivatives, the last one shared by both ends, and
    no tails (inputs are clamped). Columns past the spline's own are ignored (the circle's rotation).
    """

    bins: int
    low: float
    high: float
    min_bin_width: float
    min_bin_height: float
    min_derivative: float
    circular: bool


def _layout_knots(params: Tensor, layout: _Layout) -> tuple[Tensor, Tensor]:
    """The knot table of `_knots` from a parameter tensor `(..., P)` laid out as `layout` says."""
    k = layout.bins
    if layout.circular:
        derivatives = _softplus(params[..., 2 * k : 3 * k]) + layout.min_derivative
        derivatives = torch.cat([derivatives[..., -1:], derivatives], dim=-1)
    else:
        derivatives = _linear_tail_derivatives(params[..., 2 * k : 3 * k - 1], layout.min_derivative)
    bins = params[..., : 2 * k].unflatten(-1, (2, k))
    return _knots(bins, derivatives, layout.low, layout.high, layout.min_bin_width, layout.min_bin_height)


def _reference_map(
    x: Tensor, params: Tensor, layout: _Layout, inverse: bool, derivative: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The spline through the full knot table and autograd's chain rule: the reference of `_FusedSpline`.

    Returns `(out, ladj, d)` with `d` the derivative of `ladj` in the input (None unless `derivative`).
    """
    out, ladj, clamped, d = _spline(x, _layout_knots(params, layout), layout.low, layout.high, inverse, derivative)
    if layout.circular:
        return out, ladj, d
    if derivative:
        return _tails(x, clamped, out, ladj, d)
    return (*_tails(x, clamped, out, ladj), None)


#: `log2(e)`: `exp(t) = 2^(t log2 e)`; torch's CPU `exp2` kernel is about three times faster than `exp`.
_LOG2E = 1.4426950408889634


def _fused_forward(v: Tensor, p: Tensor, layout: _Layout, inverse: bool, derivative: bool) -> tuple[Tensor, ...]:
    r"""The spline at `v` `(n,)` from parameters `p` `(n, P)`, touching only the bin each point falls in.

    Only a few passes need all `K` bins of a row: the exponentiated, shifted logits and their cumulative
    sum `C` (both rows, shifted by the row maximum), and the knots of the searched axis (`x` forward,
    `y` inverse) for `torch.searchsorted`, as in `_knots`. Everything else (the bin's two knots on both
    axes, its two derivatives, softplus included) is gathered per point through flat indices, so the
    `(n, 2, K + 1)` knot and `(n, K + 1)` derivative tables of the reference are never built. Per-point
    pieces are stacked along a leading axis (`(2, n)`, `(4, n)`): torch's CPU kernels are slow on a short
    last axis (a broadcast over it, a reduction along it, a stack into it).

    Returns `(out, ladj, dlog, saved)`, where `saved` holds what `_fused_backward` needs.
    """
    k, low, high = layout.bins, layout.low, layout.high
    n, width = p.shape
    logits = p[:, : 2 * k].reshape(2 * n, k)  # a contiguous copy (a view only if p has no other columns)
    shift = logits.amax(-1, keepdim=True)
    # (logits - shift) log2(e), then 2^(.) in place. The subtraction comes first and alone: its result is
    # <= 0 on any CPU, where a fused `log2(e) l - log2(e) m` (an FMA) leaves the row maximum at the rounding
    # error of the product, ~1e25 for logits of 1e32, and 2^(that) is inf.
    exps = torch.sub(logits, shift).mul_(_LOG2E).exp2_()
    cumulative = exps.cumsum(-1)  # (2n, K): rows 2i (widths) and 2i + 1 (heights) of point i
    total = cumulative[:, -1].view(n, 2).t().contiguous()  # (2, n)
    scale, offset = _scale_and_offset(total, k, low, high, layout.min_bin_width, layout.min_bin_height)
    axis = 1 if inverse else 0
    clamped = v.clamp(low, high)
    small = n * max(width, 2 * k) < 2**31  # int32 flat indices (half the memory traffic of int64)
    index = torch.int32 if small else torch.long
    if k > 1:
        # The interior knots of the searched axis as `_knots` computes them; the bin is the number of them
        # strictly below the point.
        row = offset if offset.dim() == 1 else offset[axis]
        inner = torch.addcmul(row[: k - 1], cumulative.view(n, 2, k)[:, axis, : k - 1], scale[axis].unsqueeze(-1))
        bin_ = torch.searchsorted(inner, clamped.unsqueeze(-1), out_int32=small).view(n)
    else:
        bin_ = torch.zeros(n, dtype=index, device=v.device)
    ends = torch.stack([bin_ == 0, bin_ == k - 1])  # the first and the last bin
    first = ends[0]
    # The bin's lower and upper knot: indices of the cumulative sums ending there (none at knot 0).
    knot = torch.stack([(bin_ - 1).clamp_min(0), bin_])
    rows = torch.arange(0, 2 * k * n, 2 * k, dtype=index, device=v.device)  # row starts in the cumulative sums
    at = knot + rows
    sums = cumulative.view(-1).index_select(0, torch.cat([at, at + k]).view(-1)).view(2, 2, n)
    if offset.dim() == 1:
        offsets = offset.index_select(0, knot.view(-1)).view(2, n)
    else:
        offsets = offset.index_select(1, knot.view(-1)).view(2, 2, n)
    knots = torch.addcmul(offsets, sums, scale.unsqueeze(1))  # (axis, lower/upper, n)
    knots[:, 0].masked_fill_(first, low)  # knot 0 is low
    (x0, x1), (y0, y1) = knots
    # Derivatives at the bin's two knots: softplus of two gathered columns.
    columns = None
    if layout.circular:
        columns = torch.stack([torch.where(first, k - 1, bin_ - 1), bin_])
    elif k > 1:
        columns = knot.clamp_max(k - 2)
    raw = None
    if columns is None:
        d0 = d1 = softened = torch.ones_like(v)
    else:
        columns += torch.arange(2 * k, width * n, width, dtype=index, device=v.device)  # flat indices into p
        raw = p.reshape(-1).index_select(0, columns.view(-1)).view(2, n)
        softened = F.softplus(raw) + layout.min_derivative
        if not layout.circular:
            softened.masked_fill_(ends, 1.0)  # boundary derivatives 1
        d0, d1 = softened.clamp_max(_MAX_DERIVATIVE)
    out, ladj, dlog, terms = _bin_forward(clamped, x0, x1, y0, y1, d0, d1, inverse, derivative)
    inside = v == clamped
    if not layout.circular:
        out, ladj = torch.where(inside, out, v), torch.where(inside, ladj, 0.0)
        if dlog is not None:
            dlog = torch.where(inside, dlog, 0.0)
    saved = (*terms, d0, d1, inside, bin_, ends, exps, sums, total, scale, raw, softened, columns)
    return out, ladj, dlog, saved


def _fused_backward(
    saved: tuple[Tensor | None, ...],
    layout: _Layout,
    inverse: bool,
    width: int,
    g_out: Tensor,
    g_ladj: Tensor,
    need_params: bool = True,
) -> tuple[Tensor, Tensor | None]:
    r"""Cotangents of `(out, ladj)` `(n,)` pulled back to the input `(n,)` and the parameters `(n, P)`.

    The parameters' part is skipped (None) unless `need_params`.

    The bin's part is `_bin_pullback`. Knot `j` of a row is `low + A F_j + j\,span\,m`, with
    `F_j = \sum_{b<j} p_b`, `p = softmax(l)` and `A = span (1 - K m)`, so
    $\partial F_j / \partial l_i = p_i ([i<j] - F_j)$; the bin's two knots `k`, `k + 1` with cotangents
    `g_0`, `g_1` give

    $$ \bar l_i = A p_i \big( (g_0 + g_1 - c) - [i \ge k]\,g_0 - [i \ge k+1]\,g_1 \big),
       \qquad c = g_0 F_k + g_1 F_{k+1}, $$

    the cumulative sum of three spikes per row (at 0, `k` and `k + 1`): two passes over the `K` bins
    instead of the reference's chain. Knots 0 and `K` are constant (`low`, `high`). The derivatives'
    cotangents go to their two softplus columns.
    """
    *terms, d0, d1, inside, bin_, ends, exps, sums, total, scale, raw, softened, columns = saved
    k = layout.bins
    n = d0.shape[0]
    g_in, g_ladj_in = g_out, g_ladj
    if not layout.circular:
        g_in, g_ladj_in = torch.where(inside, g_out, 0.0), torch.where(inside, g_ladj, 0.0)
    g_v, g_x0, g_x1, g_y0, g_y1, g_d0, g_d1 = _terms_pullback(tuple(terms), d0, d1, inverse, g_in, g_ladj_in)
    g_x = torch.where(inside, g_v, g_out if not layout.circular else 0.0)
    if not need_params:
        return g_x, None
    g_params = torch.empty(n, width, dtype=d0.dtype, device=d0.device)
    if width > 2 * k:
        g_params[:, 2 * k :].zero_()
    # Width and height logits: the knot cotangents times A / C_K (knots 0 and K are constant), spikes
    # g_0 (1 - F_k) + g_1 (1 - F_{k+1}) at 0, -g_0 at k and -g_1 at k + 1, summed cumulatively, times e_i.
    g_knots = torch.stack([g_x0, g_x1, g_y0, g_y1]).view(2, 2, n).masked_fill_(ends, 0.0)
    g_knots.mul_(scale.unsqueeze(1))
    spikes = torch.empty(2, 3, n, dtype=d0.dtype, device=d0.device)
    total = total.unsqueeze(1)
    torch.mul(g_knots, (total - sums) / total, out=spikes[:, 1:])
    torch.add(spikes[:, 1], spikes[:, 2], out=spikes[:, 0])
    torch.neg(g_knots, out=spikes[:, 1:])
    base = torch.arange(0, n * 2 * k, 2 * k, dtype=bin_.dtype, device=d0.device)
    lower, upper = base + bin_, base + (bin_ + 1).clamp_max(k - 1)
    at = torch.stack([base, lower, upper, base + k, lower + k, upper + k])  # as spikes: (axis, spike, n)
    steps = torch.zeros(n * 2 * k, dtype=d0.dtype, device=d0.device).index_add_(0, at.view(-1), spikes.view(-1))
    torch.mul(exps.view(n, 2, k), steps.view(n, 2, k).cumsum_(-1), out=g_params[:, : 2 * k].view(n, 2, k))
    # Derivatives: d = m + softplus(raw), capped, 1 at the linear tails' boundaries.
    if raw is not None:
        keep = softened <= _MAX_DERIVATIVE
        if not layout.circular:
            keep &= ~ends
        g_raw = torch.ops.aten.softplus_backward(torch.stack([g_d0, g_d1]).mul_(keep), raw, 1.0, 20.0)
        g_params.view(-1).index_add_(0, columns.view(-1), g_raw.view(-1))
    return g_x, g_params


#: Bins the native kernel takes at most (its per-point tables live on the stack: `kMaxBins` in spline.cpp).
_NATIVE_MAX_BINS = 128


def _native_kernel(x: Tensor, layout: _Layout) -> Any:
    """The native spline operations (`flowkit._native`) where they apply to `x`, else None.

    They apply on the CPU, to float32 and float64, for up to `_NATIVE_MAX_BINS` bins; elsewhere
    (CUDA, half precision) the PyTorch fused path runs.
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or layout.bins > _NATIVE_MAX_BINS:
        return None
    return _native.spline_ops()


def _native_forward(
    ops: Any, v: Tensor, p: Tensor, layout: _Layout, inverse: bool, derivative: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """`_fused_forward`'s `(out, ladj, dlog)` from the native kernel (one operation), and the exponentiated logits.

    The backward pass takes the logits back (`rqs_backward`).
    """
    out, ladj, dlog, exps = ops.rqs_forward(v, p, *layout, inverse, derivative)
    return out, ladj, dlog if derivative else None, exps


class _FusedSpline(torch.autograd.Function):
    """The whole spline (knots, bin search, bin, tails) as one autograd node with a hand-written backward.

    With the native kernel (`flowkit._native`, on the CPU) the forward and the backward pass are one
    C++ operation each; the node saves the inputs and the exponentiated logits, and the backward pass
    recomputes each point's bin. Otherwise the node saves the exponentiated logits and the per-point bin
    (its terms, derivatives) of the forward pass, and the backward pass is `_fused_backward`. A backward
    pass that records a graph (`create_graph=True`, for higher derivatives) differentiates
    `_reference_map` on the saved inputs instead, so every order of derivative is that of the reference.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, params: Tensor, layout: _Layout, inverse: bool, derivative: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        batch = x.shape
        v, p = x.reshape(-1), params.reshape(-1, params.shape[-1])
        ctx.layout, ctx.inverse = layout, inverse
        ctx.native = _native_kernel(x, layout)
        if ctx.native is not None:
            out, ladj, dlog, exps = _native_forward(ctx.native, v, p, layout, inverse, derivative)
            # The flat views too: `x` may be a strided slice and `params` expanded, which `reshape` would copy
            # again.
            ctx.save_for_backward(x, params, v, p, exps)
        else:
            out, ladj, dlog, saved = _fused_forward(v, p, layout, inverse, derivative)
            ctx.save_for_backward(x, params, *saved)  # None (no derivative columns) is saved as None
        if dlog is not None:
            dlog = dlog.view(batch)
            ctx.mark_non_differentiable(dlog)
        return out.view(batch), ladj.view(batch), dlog

    @staticmethod
    def backward(ctx: Any, g_out: Tensor, g_ladj: Tensor, _: Any) -> tuple:  # type: ignore[override]
        x, params, *saved = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the reference, differentiable to any order
            wanted = [t for t, need in zip((x, params), ctx.needs_input_grad[:2], strict=True) if need]
            out, ladj, _ = _reference_map(x, params, ctx.layout, ctx.inverse, False)
            grads = iter(
                torch.autograd.grad((out, ladj), wanted, (g_out, g_ladj), create_graph=True, allow_unused=True)
            )
            g_x, g_params = (next(grads) if need else None for need in ctx.needs_input_grad[:2])
            return g_x, g_params, None, None, None
        need_params = ctx.needs_input_grad[1]
        if ctx.native is not None:
            g_x, g_params = ctx.native.rqs_backward(
                *saved,
                g_out.reshape(-1),
                g_ladj.reshape(-1),
                *ctx.layout,
                ctx.inverse,
                need_params,
            )
            g_params = g_params if need_params else None
        else:
            g_x, g_params = _fused_backward(
                tuple(saved),
                ctx.layout,
                ctx.inverse,
                params.shape[-1],
                g_out.reshape(-1),
                g_ladj.reshape(-1),
                need_params,
            )
        return g_x.view(x.shape), None if g_params is None else g_params.view(params.shape), None, None, None


_FusedSpline.forward.__signature__ = inspect.signature(_FusedSpline.forward)  # type: ignore[attr-defined]


#: Switch for the fused path (tests compare it with the reference by turning it off).
_FUSED = True


def _evaluate(
    x: Tensor, params: Tensor, layout: _Layout, inverse: bool, derivative: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The spline (or its inverse) with its log-derivative and, if asked, that one's derivative in the input.

    Fused (`_FusedSpline`) in eager mode; `_reference_map` under `torch.compile` (which fuses the
    elementwise maths itself), inside `torch.func` transforms and in forward-mode AD, which the fused
    node does not implement, and for inputs and parameters of different dtypes (promoted there).
    """
    if (
        not _FUSED
        or x.dtype != params.dtype
        or torch.compiler.is_compiling()
        or torch._C._functorch.peek_interpreter_stack() is not None
        or torch.autograd.forward_ad._current_level >= 0
    ):
        return _reference_map(x, params, layout, inverse, derivative)
    batch = x.shape
    if batch != params.shape[:-1]:
        batch = torch.broadcast_shapes(batch, params.shape[:-1])
        x, params = x.expand(batch), params.expand(*batch, params.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or params.requires_grad):
        return _FusedSpline.apply(x, params, layout, inverse, derivative)
    # Nothing to differentiate (sampling, densities without gradients): the forward pass alone.
    v, p = x.reshape(-1), params.reshape(-1, params.shape[-1])
    ops = _native_kernel(x, layout)
    if ops is not None:
        out, ladj, dlog, _ = _native_forward(ops, v, p, layout, inverse, derivative)
    else:
        out, ladj, dlog, _ = _fused_forward(v, p, layout, inverse, derivative)
    return out.view(batch), ladj.view(batch), None if dlog is None else dlog.view(batch)


def unconstrained_rqs(
    x: Tensor,
    unnormalized_widths: Tensor,
    unnormalized_heights: Tensor,
    unnormalized_derivatives: Tensor,
    bound: float,
    inverse: bool = False,
    min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
    min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
    min_derivative: float = DEFAULT_MIN_DERIVATIVE,
) -> tuple[Tensor, Tensor]:
    """Rational-quadratic spline on `[-B, B]` with linear (identity) tails, from unconstrained parameters.

    The layout and defaults are those of nflows'
    `unconstrained_rational_quadratic_spline(..., tails="linear", tail_bound=B)`,
    so the outputs agree number for number; unlike it, this function has no
    data-dependent branches or boolean-mask indexing and gives finite values
    and gradients for every finite input.

    Arguments:
        x: inputs of any shape `S`.
        unnormalized_widths: `(*S, K)` bin-width logits.
        unnormalized_heights: `(*S, K)` bin-height logits.
        unnormalized_derivatives: `(*S, K - 1)` pre-softplus interior derivatives.
        bound: the half-width `B` of the spline's interval.
        inverse: evaluate the inverse map instead.
        min_bin_width: minimum bin width, as a fraction of `2B`.
        min_bin_height: minimum bin height, as a fraction of `2B`.
        min_derivative: minimum derivative at the knots.

    Returns:
        `(y, ladj)`, both of shape `S`: the output and the elementwise
        `log|dy/dx|` (`log|dx/dy|` when `inverse`).
    """
    bins = unnormalized_widths.shape[-1]
    _check_minimums(bins, min_bin_width, min_bin_height, min_derivative)
    if unnormalized_heights.shape[-1] != bins or unnormalized_derivatives.shape[-1] != bins - 1:
        raise ValueError(
            "unconstrained_rqs: expected K widths, K heights and K - 1 derivatives, got "
            f"{unnormalized_widths.shape[-1]}, {unnormalized_heights.shape[-1]} "
            f"and {unnormalized_derivatives.shape[-1]}"
        )
    bound = float(bound)
    batch = torch.broadcast_shapes(
        x.shape, unnormalized_widths.shape[:-1], unnormalized_heights.shape[:-1], unnormalized_derivatives.shape[:-1]
    )
    bins_wh = torch.stack([unnormalized_widths.expand(*batch, bins), unnormalized_heights.expand(*batch, bins)], dim=-2)
    derivatives = _linear_tail_derivatives(unnormalized_derivatives.expand(*batch, bins - 1), min_derivative)
    knots = _knots(bins_wh, derivatives, -bound, bound, min_bin_width, min_bin_height)
    x = x.expand(batch)
    out, ladj, clamped, _ = _spline(x, knots, -bound, bound, inverse)
    return _tails(x, clamped, out, ladj)


class RationalQuadraticSpline(Transformer):
    """Monotone rational-quadratic spline with `K` bins on `[-B, B]` and linear tails.

    Parameters per element: `3K - 1`, laid out as `K` width logits, `K`
    height logits and `K - 1` pre-softplus interior derivatives (nflows'
    layout, see [`unconstrained_rqs`][flowkit.transformers.unconstrained_rqs]). Outside `[-B, B]` the map is the
    identity. The identity parameters (equal logits, derivatives 1) make the
    whole map the identity.

    Arguments:
        bins: number of bins `K`.
        bound: half-width `B` of the interval.
        min_bin_width: minimum bin width as a fraction of `2B`.
        min_bin_height: minimum bin height as a fraction of `2B`.
        min_derivative: minimum derivative at the knots.

    References:
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    def __init__(
        self,
        bins: int = 8,
        bound: float = 5.0,
        min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
        min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
        min_derivative: float = DEFAULT_MIN_DERIVATIVE,
    ) -> None:
        super().__init__()
        _check_minimums(int(bins), min_bin_width, min_bin_height, min_derivative)
        check_number(bound, "bound", where="RationalQuadraticSpline", positive=True, high=1e6)
        self.bins = int(bins)
        self.bound = float(bound)
        self.min_bin_width = float(min_bin_width)
        self.min_bin_height = float(min_bin_height)
        self.min_derivative = float(min_derivative)
        self.params_per_element = 3 * self.bins - 1

    @property
    def _layout(self) -> _Layout:
        return _Layout(
            self.bins, -self.bound, self.bound, self.min_bin_width, self.min_bin_height, self.min_derivative, False
        )

    def _knots(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """The reference knot table `(positions, derivatives)` of `_knots`."""
        return _layout_knots(params, self._layout)

    def _map(self, x: Tensor, params: Tensor, inverse: bool, derivative: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The spline (or its inverse) with its log-derivative and, if asked, that one's derivative."""
        return _evaluate(x, params, self._layout, inverse, derivative)

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._map(x, params, False, False)[:2]

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._map(y, params, True, False)[:2]

    def identity_params(self) -> Tensor:
        params = torch.zeros(self.params_per_element)
        params[2 * self.bins :] = _identity_derivative(self.min_derivative)
        return params

    def extra_repr(self) -> str:
        return f"bins={self.bins}, bound={self.bound}"


class CircularSpline(Transformer):
    r"""Circle diffeomorphism on `[-pi, pi)`: a rational-quadratic spline followed by a rotation.

    The spline maps `[-pi, pi]` onto itself with equal derivatives at both
    ends (`delta_0 = delta_K`), so it is a smooth map of the circle that fixes
    the point `-pi = pi`; a learned rotation `y \mapsto y + \phi` (wrapped
    back to `[-pi, pi)`) removes the fixed point. Parameters per element:
    `3K + 1`: `K` width logits, `K` height logits, `K` pre-softplus
    derivatives (the last one shared by both ends) and the angle `\phi`.

    Arguments:
        bins: number of bins `K`.
        min_bin_width: minimum bin width as a fraction of `2 pi`.
        min_bin_height: minimum bin height as a fraction of `2 pi`.
        min_derivative: minimum derivative at the knots.

    References:
        Rezende et al., *Normalizing flows on tori and spheres*, ICML 2020 (arXiv:2002.02428);
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    domain = Circle()

    def __init__(
        self,
        bins: int = 8,
        min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
        min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
        min_derivative: float = DEFAULT_MIN_DERIVATIVE,
    ) -> None:
        super().__init__()
        _check_minimums(int(bins), min_bin_width, min_bin_height, min_derivative)
        self.bins = int(bins)
        self.min_bin_width = float(min_bin_width)
        self.min_bin_height = float(min_bin_height)
        self.min_derivative = float(min_derivative)
        self.params_per_element = 3 * self.bins + 1

    @property
    def _layout(self) -> _Layout:
        return _Layout(self.bins, -math.pi, math.pi, self.min_bin_width, self.min_bin_height, self.min_derivative, True)

    def _knots_and_shift(self, params: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
        """The reference knot table of `_knots` and the rotation angle."""
        return _layout_knots(params, self._layout), params[..., 3 * self.bins]

    @staticmethod
    def _wrap(angle: Tensor) -> Tensor:
        return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi

    def _map(self, x: Tensor, params: Tensor, inverse: bool, derivative: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The circle map (or its inverse) with its log-derivative and, if asked, that one's derivative."""
        shift = params[..., 3 * self.bins]
        if inverse:
            return _evaluate(self._wrap(x - shift), params, self._layout, True, derivative)
        out, ladj, d = _evaluate(x, params, self._layout, False, derivative)
        return self._wrap(out + shift), ladj, d

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._map(x, params, False, False)[:2]

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._map(y, params, True, False)[:2]

    def identity_params(self) -> Tensor:
        params = torch.zeros(self.params_per_element)
        params[2 * self.bins : 3 * self.bins] = _identity_derivative(self.min_derivative)
        return params

    def extra_repr(self) -> str:
        return f"bins={self.bins}"
