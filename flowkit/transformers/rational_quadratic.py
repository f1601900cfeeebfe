r"""The rational-quadratic spline in plain autograd: the maths, and the reference every spline kernel agrees with.

A rational-quadratic spline with `K` bins maps `[low, high]` onto itself through knots `(x_k, y_k)` with
derivatives `\delta_k` at the knots. In bin `k`, with `s = \Delta y / \Delta x`, `\xi = (x - x_k) / \Delta x` and
`\text{den} = s + (\delta_k + \delta_{k+1} - 2s)\,\xi(1-\xi)`:

$$
y = y_k + \Delta y \, \frac{s\xi^2 + \delta_k \xi(1-\xi)}{\text{den}}, \qquad
\frac{dy}{dx} = \frac{s^2\left[\delta_{k+1}\xi^2 + 2s\xi(1-\xi) + \delta_k(1-\xi)^2\right]}{\text{den}^2}.
$$

The inverse solves the quadratic `a\xi^2 + b\xi + c = 0` in the bin found on the `y` knots, through the root
`\xi = 2c / (-b - \sqrt{b^2 - 4ac})` for `b >= 0` and its equal `(-b + \sqrt{b^2 - 4ac}) / (2a)` for `b < 0`,
each free of cancellation where it is used. Unconstrained parameters map to knots as in nflows
([`SplineLayout`][flowkit.transformers.rational_quadratic.SplineLayout]): bin widths
`m_w + (1 - K m_w)\,\mathrm{softmax}(\hat w)` scaled to `high - low` (heights alike), derivatives
`m_d + \mathrm{softplus}(\hat\delta)`, capped at `10^{12}`.

Robustness: inputs are clamped to `[low, high]` *before* the spline maths, the bin is found by
`torch.searchsorted` on the interior knots (so the ends and points exactly on knots land in a valid bin),
the bin-relative coordinate `\xi` is clamped to `[0, 1]` (rounding moves it out at the knots, in float32, and
in a steep bin the log-derivative of a point just outside is the log of a negative number) and linear tails
are selected with `torch.where`. Values and gradients are therefore finite everywhere, also far outside the
bound, and nothing synchronises with the device, so the code runs under `torch.compile`.

Each call is one autograd node per bin (`_RationalQuadraticBin`: a hand-written backward pass, forward mode
and `torch.func` rules) and autograd's chain rule for the knots. This module imports no kernel: the fast
kernels ([`flowkit.kernels`][flowkit.kernels]) build on its bin maths (`bin_forward`, `bin_pullback`) and
fall back on [`reference_spline`][flowkit.transformers.rational_quadratic.reference_spline];
[`spline_through_knots`][flowkit.transformers.rational_quadratic.spline_through_knots] is the entry for a
spline through fixed knots.

References:
    Durkan, Bekasov, Murray & Papamakarios, *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032);
    Gregory & Delbourgo, *Piecewise rational quadratic interpolation to monotonic data*, IMA J. Numer.
    Anal. 1982.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["MAX_DERIVATIVE", "SplineLayout", "bin_forward", "bin_pullback", "reference_spline", "spline_through_knots"]

#: Derivatives at the knots are capped here: the squares in the bin maths stay finite in
#: float32 for bounds up to 1e6 (a conditioner fed inputs of 1e30 outputs 1e32, say).
MAX_DERIVATIVE = 1e12


def _bin_shape(x0: Tensor, x1: Tensor, y0: Tensor, y1: Tensor, d0: Tensor, d1: Tensor) -> tuple[Tensor, ...]:
    """Width `w`, height `h`, slope `s = h / w` and curvature `c = d0 + d1 - 2s` of a bin."""
    w = x1 - x0
    h = y1 - y0
    s = h / w
    return w, h, s, d0 + d1 - (s + s)


def _xi_terms(xi: Tensor, shape: tuple[Tensor, ...], d0: Tensor, d1: Tensor) -> tuple[Tensor, ...]:
    """The pieces of the forward map in one bin at the bin-relative coordinate `xi`, which must lie in `[0, 1]`.

    Returns `(w, h, s, c, xi, 1 - xi, q, den, N, P)` with `(w, h, s, c)` from `_bin_shape`, `q = xi (1 - xi)`,
    `den = s + c q`, `N = s xi^2 + d0 q` and `P = d1 xi^2 + 2 s q + d0 (1 - xi)^2`, so that
    `y = y0 + h N / den` and `log dy/dx = log(s^2 P / den^2)`. Outside `[0, 1]` (by rounding, `x` on a knot)
    `P` can turn negative in a steep bin, and its log NaN: `_point_terms` clamps.
    """
    w, h, s, c = shape
    one_m_xi = 1 - xi
    xi_sq = xi * xi
    q = xi * one_m_xi
    den = s + c * q
    n = s * xi_sq + d0 * q
    p = d1 * xi_sq + (s + s) * q + d0 * one_m_xi * one_m_xi
    return w, h, s, c, xi, one_m_xi, q, den, n, p


def _point_terms(x: Tensor, x0: Tensor, shape: tuple[Tensor, ...], d0: Tensor, d1: Tensor) -> tuple[Tensor, ...]:
    """`_xi_terms` at the point `x`: `xi = (x - x0) / w`, clamped to `[0, 1]`."""
    return _xi_terms(((x - x0) / shape[0]).clamp(0, 1), shape, d0, d1)


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


def bin_pullback(
    terms: tuple[Tensor, ...], d0: Tensor, d1: Tensor, inverse: bool, g_out: Tensor, g_ladj: Tensor
) -> tuple[Tensor, ...]:
    """Cotangents of `(out, ladj)` pulled back to `(v, x0, x1, y0, y1, d0, d1)`, from the bin's `terms`.

    `terms` are those of `_xi_terms` where the forward map is evaluated (`bin_forward` returns them).
    """
    dp = _dp_dxi(terms, d0, d1)
    if not inverse:
        return _bin_vjp(terms, dp, d0, d1, g_out, g_ladj)
    # x = tau^{-1}(v; theta), ladj = -L(x; theta): the cotangent on x picks up -g_ladj dL/dx,
    # and dx/dv = e^{-L}, dx/dtheta = -e^{-L} dtau/dtheta.
    _, _, s, _, _, _, _, den, _, p = terms
    g_v = (g_out - g_ladj * _dlog_dx(terms, dp)) * (den * den / (s * s * p))
    return (g_v, *_bin_vjp(terms, dp, d0, d1, -g_v, -g_ladj)[1:])


def _pullback_at(
    point: Tensor, knots: tuple[Tensor, ...], inverse: bool, g_out: Tensor, g_ladj: Tensor
) -> tuple[Tensor, ...]:
    """`bin_pullback` at `point`, where the forward map is evaluated (the input forward, the solved output inverse)."""
    x0, x1, y0, y1, d0, d1 = knots
    terms = _point_terms(point, x0, _bin_shape(x0, x1, y0, y1, d0, d1), d0, d1)
    return bin_pullback(terms, d0, d1, inverse, g_out, g_ladj)


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


def bin_forward(
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
        terms = _point_terms(point, x0, shape, d0, d1)
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
        return bin_forward(v, x0, x1, y0, y1, d0, d1, inverse, derivative)[:3]

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
        return (*_pullback_at(point, tuple(knots), ctx.inverse, g_out, g_ladj), None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Tensor) -> tuple:  # type: ignore[override]
        point, *knots = ctx.saved_tensors
        ones, zeros = torch.ones_like(point), torch.zeros_like(point)
        # Everything is elementwise, so unit cotangents give every partial derivative at once.
        d_out = _pullback_at(point, tuple(knots), ctx.inverse, ones, zeros)
        d_ladj = _pullback_at(point, tuple(knots), ctx.inverse, zeros, ones)
        pairs = [(i, t) for i, t in enumerate(tangents[:7]) if t is not None]
        t_out = sum(d_out[i] * t for i, t in pairs)
        t_ladj = sum(d_ladj[i] * t for i, t in pairs)
        return t_out, t_ladj, None


# `autograd.Function.apply` binds its arguments with `inspect.signature(forward)` on every call
# (some 15 us, about 1% of a small flow's step): give it the signature ready-made.
_RationalQuadraticBin.forward.__signature__ = inspect.signature(_RationalQuadraticBin.forward)  # type: ignore[attr-defined]


def spline_through_knots(
    x: Tensor, knots: Tensor, derivatives: Tensor, inverse: bool = False, derivative: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    r"""The monotone rational-quadratic spline through fixed knots (or its inverse) at `x`, with its log-derivative.

    The bin of each point is the number of interior knots strictly below it on the searched axis (`x_k`
    forward, `y_k` inverse), and the bin's map (module docstring) runs as one autograd node per call with a
    hand-written backward pass (the plain maths under `torch.compile`). A point outside the knots maps as the
    nearest end of the spline: clamp first, and choose the tails, as `reference_spline` does.
    With $L = \log|dy/dx| = \log(s^2 P) - 2\log \text{den}$,
    $P = \delta_{k+1}\xi^2 + 2s\xi(1-\xi) + \delta_k(1-\xi)^2$, the derivative of the log-derivative is
    $dL/dx = (P'/P - 2\,\text{den}'/\text{den}) / \Delta x$, and the inverse's is $-(dL/dx)\, e^{-L}$.
    Derivatives are capped at `MAX_DERIVATIVE`.

    Arguments:
        x: points `(..., N)` in `[x_0, x_K]` (`[y_0, y_K]` inverse); the `N` points of a row share its knots.
        knots: increasing knot positions `(..., 2, K + 1)`: the rows `x_k` and `y_k`.
        derivatives: positive derivatives `(..., K + 1)` at the knots.
        inverse: evaluate the inverse map.
        derivative: also return the derivative of the log-derivative in `x` (without a graph).

    Returns:
        `(out, ladj, d)` of the shape of `x`: `ladj` is `log|dy/dx|` (`log|dx/dy|` inverse), `d` None unless
        `derivative`.

    References:
        Gregory & Delbourgo, *Piecewise rational quadratic interpolation to monotonic data*, IMA J. Numer.
        Anal. 1982; Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """
    bin_ = torch.searchsorted(knots[..., 1 if inverse else 0, 1:-1].contiguous(), x)
    ends = bin_, bin_ + 1
    x0, x1 = (knots[..., 0, :].gather(-1, e) for e in ends)
    y0, y1 = (knots[..., 1, :].gather(-1, e) for e in ends)
    d0, d1 = (derivatives.gather(-1, e).clamp_max(MAX_DERIVATIVE) for e in ends)
    if torch.compiler.is_compiling():
        # Dynamo cannot trace an autograd.Function with a custom jvp; the compiler
        # differentiates and fuses the same elementwise maths itself.
        out, ladj, dlog = _RationalQuadraticBin.forward(x, x0, x1, y0, y1, d0, d1, inverse, derivative)
        return out, ladj, None if dlog is None else dlog.detach()
    return _RationalQuadraticBin.apply(x, x0, x1, y0, y1, d0, d1, inverse, derivative)


class SplineLayout(NamedTuple):
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

    def knots(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """The knot positions `(..., 2, K + 1)` (rows `x_k`, `y_k`) and derivatives `(..., K + 1)` of `params`.

        With `e = exp(logits)` and `C` its cumulative sum, knot `k >= 1` sits at
        `low + span ((1 - K m) C_k / C_K + k m)`: the cumulative softmax, with the minimum bin size `m` added to
        every bin. For the few bins of a spline (K ~ 8) and many rows, torch's fused softmax (and even a sum
        over the bins) is several times slower on CPU than this cumulative sum. Slices of the parameters are
        copied first (torch's CPU kernels are many times slower on strided slices); the max is taken on
        detached logits (any shift is exact).
        """
        k = self.bins
        if self.circular:  # K derivatives, the last one also at knot 0
            derivatives = F.softplus(params[..., 2 * k : 3 * k].contiguous()) + self.min_derivative
            derivatives = torch.cat([derivatives[..., -1:], derivatives], dim=-1)
        else:  # K - 1 interior derivatives, the boundary ones 1
            derivatives = F.softplus(params[..., 2 * k : 3 * k - 1].contiguous()) + self.min_derivative
            derivatives = F.pad(derivatives, (1, 1), value=1.0)
        logits = params[..., : 2 * k].unflatten(-1, (2, k)).contiguous()
        cumulative = torch.cumsum(torch.exp(logits - logits.detach().amax(dim=-1, keepdim=True)), dim=-1)
        scale, offset = self.scale_and_offset(cumulative[..., -1:])
        # The last knot is high up to rounding; the bin search uses the interior knots only, inputs are clamped
        # to [low, high] and the bin-relative coordinate to [0, 1], so a point in a rounding gap at the end (an
        # angle just below pi, say) lands in the last bin, at its end.
        positions = F.pad(torch.addcmul(offset, cumulative, scale), (1, 0), value=self.low)
        return positions, derivatives

    def scale_and_offset(self, total: Tensor) -> tuple[Tensor, Tensor]:
        """`scale = span (1 - K m) / C_K`, shaped like `total`, and `offset_k = k span m + low`.

        `total` holds `C_K` with the rows (widths, heights) in dim -2: `(..., 2, 1)` for the reference, `(2, n)`
        in the fused kernel. `offset` is `(K,)` when both minimums agree, else `(2, K)` (rows for the widths
        and the heights). Knot `k >= 1` on either axis sits at `offset_{k-1} + C_{k-1} scale`: the reference
        and the fused knot constructions share this arithmetic.
        """
        span, bins, low = self.high - self.low, self.bins, self.low
        ramp = torch.arange(1, bins + 1, dtype=total.dtype, device=total.device)
        if self.min_bin_width == self.min_bin_height:
            return span * (1 - bins * self.min_bin_width) / total, ramp * (span * self.min_bin_width) + low
        minimum = total.new_tensor([[self.min_bin_width], [self.min_bin_height]])
        return span * (1 - bins * minimum) / total, ramp * (span * minimum) + low


def reference_spline(
    x: Tensor, params: Tensor, layout: SplineLayout, inverse: bool, derivative: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The spline of parameters `params` `(..., P)` (or its inverse) at `x`, through the full knot table.

    The reference of every kernel. Points are clamped to `[low, high]` before the maths, so that values
    and gradients are finite everywhere; with linear tails the map is the identity (log-derivative 0)
    where the clamp moved a point, selected without host synchronisation.

    Returns:
        `(out, ladj, d)` with `d` the derivative of `ladj` in the input (None unless `derivative`).
    """
    positions, derivatives = layout.knots(params)
    clamped = x.clamp(layout.low, layout.high)
    out, ladj, d = (
        None if t is None else t.squeeze(-1)
        for t in spline_through_knots(clamped.unsqueeze(-1), positions, derivatives, inverse, derivative)
    )
    if layout.circular:
        return out, ladj, d
    inside = x == clamped
    return (
        torch.where(inside, out, x),
        torch.where(inside, ladj, 0.0),
        None if d is None else torch.where(inside, d, 0.0),
    )
