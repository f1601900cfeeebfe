r"""The fused spline node: the whole spline as one autograd node, on the PyTorch or the native kernel.

In eager mode a spline's whole map (knot construction, bin search, bin arithmetic, tails) is one autograd
node with a hand-written backward pass (`_FusedSpline`): it exponentiates and accumulates the logits once,
searches the bin, and then gathers only that bin's two knots and derivatives per point, where the
reference builds the full knot and derivative tables; the backward pass maps the bin's cotangents to the
logits in closed form (a cumulative sum of three spikes per row) and the inverse uses the
implicit-function rule. On the CPU the node runs that maths point by point in one C++ operation per
direction ([`flowkit.kernels.native`][flowkit.kernels.native]), elsewhere as a few dozen torch operations.
A backward pass that records a graph differentiates the reference instead.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..transformers.rational_quadratic import MAX_DERIVATIVE, SplineLayout, bin_forward, bin_pullback, reference_spline
from ..utils import broadcast_shapes
from . import native as _native
from .native import _batch_first
from .select import spline_kernel

__all__: list[str] = []

#: `log2(e)`: `exp(t) = 2^(t log2 e)`; torch's CPU `exp2` kernel is about three times faster than `exp`.
_LOG2E = 1.4426950408889634


def _fused_forward(v: Tensor, p: Tensor, layout: SplineLayout, inverse: bool, derivative: bool) -> tuple[Tensor, ...]:
    r"""The spline at `v` `(n,)` from parameters `p` `(n, P)`, touching only the bin each point falls in.

    Only a few passes need all `K` bins of a row: the exponentiated, shifted logits and their cumulative
    sum `C` (both rows, shifted by the row maximum), and the knots of the searched axis (`x` forward,
    `y` inverse) for `torch.searchsorted`, as in `SplineLayout.knots`. Everything else (the bin's two knots on both
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
    scale, offset = layout.scale_and_offset(total)
    axis = 1 if inverse else 0
    clamped = v.clamp(low, high)
    small = n * max(width, 2 * k) < 2**31  # int32 flat indices (half the memory traffic of int64)
    index = torch.int32 if small else torch.long
    if k > 1:
        # The interior knots of the searched axis as `SplineLayout.knots` computes them; the bin is the number of them
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
        d0, d1 = softened.clamp_max(MAX_DERIVATIVE)
    out, ladj, dlog, terms = bin_forward(clamped, x0, x1, y0, y1, d0, d1, inverse, derivative)
    inside = v == clamped
    if not layout.circular:
        out, ladj = torch.where(inside, out, v), torch.where(inside, ladj, 0.0)
        if dlog is not None:
            dlog = torch.where(inside, dlog, 0.0)
    saved = (*terms, d0, d1, inside, bin_, ends, exps, sums, total, scale, raw, softened, columns)
    return out, ladj, dlog, saved


def _fused_backward(
    saved: tuple[Tensor | None, ...],
    layout: SplineLayout,
    inverse: bool,
    width: int,
    g_out: Tensor,
    g_ladj: Tensor,
    need_params: bool = True,
) -> tuple[Tensor, Tensor | None]:
    r"""Cotangents of `(out, ladj)` `(n,)` pulled back to the input `(n,)` and the parameters `(n, P)`.

    The parameters' part is skipped (None) unless `need_params`.

    The bin's part is `bin_pullback`. Knot `j` of a row is `low + A F_j + j\,span\,m`, with
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
    g_v, g_x0, g_x1, g_y0, g_y1, g_d0, g_d1 = bin_pullback(tuple(terms), d0, d1, inverse, g_in, g_ladj_in)
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
        keep = softened <= MAX_DERIVATIVE
        if not layout.circular:
            keep &= ~ends
        g_raw = torch.ops.aten.softplus_backward(torch.stack([g_d0, g_d1]).mul_(keep), raw, 1.0, 20.0)
        g_params.view(-1).index_add_(0, columns.view(-1), g_raw.view(-1))
    return g_x, g_params


class _FusedSpline(torch.autograd.Function):
    """The whole spline (knots, bin search, bin, tails) as one autograd node with a hand-written backward.

    The native kernel saves the inputs and the exponentiated logits, and its backward pass recomputes each
    point's bin; the PyTorch one saves the per-point bin of the forward pass for `_fused_backward`. A backward
    pass that records a graph (`create_graph=True`) differentiates `reference_spline` on the saved inputs,
    so every order of derivative is that of the reference.

    The node follows torch's contract for `torch.func` (a `forward` without a context, `setup_context`, and
    a `vmap` rule), so the transforms need no query of their own: `vmap` batches through the rule (the
    reference on the batched points: the spline acts point by point), and `grad`, `vjp` and `jacrev`
    differentiate with a graph, which takes the reference backward above. Forward-mode AD (dual inputs,
    `jvp`, `jacfwd`) is routed to the reference before the node, by
    [`spline_kernel`][flowkit.kernels.spline_kernel]; where a transform wraps the node first (`hessian`,
    `jacfwd` of `jacrev`), the `jvp` rule gives the reference's tangents. The forward's fourth output holds
    what the backward pass needs (the kernel and the intermediate tensors);
    [`fused_spline`][flowkit.kernels.fused.fused_spline] drops it.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        x: Tensor, params: Tensor, layout: SplineLayout, inverse: bool, derivative: bool, native: bool
    ) -> tuple[Tensor, Tensor, Tensor | None, tuple]:
        batch = x.shape
        v, p = x.reshape(-1), params.reshape(-1, params.shape[-1])
        ops = _native.spline_ops() if native else None
        if ops is not None:  # one operation; it returns the exponentiated logits for `rqs_backward`
            out, ladj, dlog, exps = ops.rqs_forward(v, p, *layout, inverse, derivative)
            dlog = dlog if derivative else None
            # The flat views too: `x` may be a strided slice and `params` expanded, which `reshape` would copy
            # again.
            saved = (v, p, exps)
        else:
            out, ladj, dlog, saved = _fused_forward(v, p, layout, inverse, derivative)
        return out.view(batch), ladj.view(batch), None if dlog is None else dlog.view(batch), (ops, saved)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, params, layout, inverse = inputs[:4]
        _, _, dlog, (ops, saved) = output
        ctx.layout, ctx.inverse, ctx.native = layout, inverse, ops
        ctx.save_for_backward(x, params, *saved)  # None (no derivative columns) is saved as None
        ctx.save_for_forward(x, params)
        if dlog is not None:
            ctx.mark_non_differentiable(dlog)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: Tensor, params: Tensor, layout: SplineLayout, inverse: bool, *flags: Any):  # noqa: ANN205
        """`torch.func.vmap`'s rule: the reference on the batched points (the batch axis moved to the front)."""
        x, params = (_batch_first(t, dim, info.batch_size) for t, dim in zip((x, params), in_dims, strict=False))
        out, ladj, dlog = reference_spline(x, params, layout, inverse, flags[0])
        return (out, ladj, dlog, (None, ())), (0, 0, None if dlog is None else 0, None)

    @staticmethod
    def jvp(ctx: Any, t_x: Tensor | None, t_params: Tensor | None, *_: Any) -> tuple:
        """Forward mode under a transform that wraps the node (`hessian`, `jacfwd` of `jacrev`): the reference's."""
        x, params = ctx.saved_tensors[:2]
        tangents = (
            torch.zeros_like(x) if t_x is None else t_x,
            torch.zeros_like(params) if t_params is None else t_params,
        )
        layout, inverse = ctx.layout, ctx.inverse
        _, (t_out, t_ladj) = torch.func.jvp(
            lambda a, b: reference_spline(a, b, layout, inverse, False)[:2], (x, params), tangents
        )
        return t_out, t_ladj, None, None

    @staticmethod
    def backward(ctx: Any, g_out: Tensor, g_ladj: Tensor, *_: Any) -> tuple:  # type: ignore[override]
        x, params, *saved = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph (and every torch.func transform): the reference
            layout, inverse = ctx.layout, ctx.inverse
            _, pullback = torch.func.vjp(lambda a, b: reference_spline(a, b, layout, inverse, False)[:2], x, params)
            g_x, g_params = pullback((g_out, g_ladj))
            need_x, need_params = ctx.needs_input_grad[:2]
            return g_x if need_x else None, g_params if need_params else None, None, None, None, None
        need_params = ctx.needs_input_grad[1]
        if ctx.native is not None:
            g_x, g_params = ctx.native.rqs_backward(
                *saved, g_out.reshape(-1), g_ladj.reshape(-1), *ctx.layout, ctx.inverse, need_params
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
        return g_x.view(x.shape), None if g_params is None else g_params.view(params.shape), None, None, None, None


def fused_spline(
    x: Tensor, params: Tensor, layout: SplineLayout, inverse: bool, derivative: bool, native: bool | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """`(out, ladj, dlog)` of the fused node ([`_FusedSpline`][flowkit.kernels.fused._FusedSpline]).

    Without gradients (sampling, densities under `torch.no_grad`) the node's forward pass alone runs. With
    them the node runs even where nothing requires a gradient yet: under `torch.func.grad` of a `vmap` a
    traced input does not say it requires one, and only the node's rules carry the transforms.

    Arguments:
        x: the points (broadcast with the batch shape of `params`).
        params: the spline parameters `(..., P)`.
        layout: the spline's layout.
        inverse: evaluate the inverse map.
        derivative: also return the derivative of the log-derivative in the input (without a graph).
        native: run the native kernel (True), the PyTorch one (False), or ask the rule (None).
    """
    if native is None:
        native = spline_kernel(x, params, layout.bins) == "native"
    if x.shape != params.shape[:-1]:
        batch = broadcast_shapes(x.shape, params.shape[:-1])
        x, params = x.expand(batch), params.expand(*batch, params.shape[-1])
    node = _FusedSpline.apply if torch.is_grad_enabled() else _FusedSpline.forward
    return node(x, params, layout, inverse, derivative, native)[:3]


# `Function.apply` binds the arguments to `forward`'s signature at every call (a node with `setup_context`):
# the signature computed once, not per call.
_FusedSpline.forward.__signature__ = inspect.signature(_FusedSpline.forward)  # type: ignore[attr-defined]
