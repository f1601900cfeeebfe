r"""Spline kernels behind one door: the reference, the fused PyTorch node and the native C++ kernel.

[`rational_quadratic`][flowkit.kernels.rational_quadratic] is the one entry point of the spline
transformers ([`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline],
[`CircularSpline`][flowkit.transformers.CircularSpline]); [`spline_kernel`][flowkit.kernels.spline_kernel]
is the one rule that picks the kernel, and [`use_spline_kernel`][flowkit.kernels.use_spline_kernel]
the one switch a user (or a test, or a benchmark) turns. The kernels:

- `reference` (`flowkit.kernels.reference`): the maths in plain autograd, one node per bin; it runs
  under `torch.compile` and forward-mode AD, for every derivative of order two and more, and inside the
  fused node's `torch.func` rules (`vmap`, `jvp`);
- `pytorch` (`flowkit.kernels.fused`): the whole spline as one autograd node that touches only each
  point's bin, with a hand-written backward pass;
- `native` (`flowkit.kernels.native`): the same node as one C++ operation per direction on the CPU
  (`torch.ops.flowkit_native.rqs_forward` / `rqs_backward`, torch.library operations with fake kernels
  and a batching rule), built on first use.

The fused node's autograd is a `torch.autograd.Function` in torch's `torch.func` form (`setup_context`,
`vmap`, `jvp`), not an autograd kernel registered on the operations with `torch.library.register_autograd`:
in torch 2.13 a custom operation's registered autograd refuses `torch.func.grad` and `jacrev` ("must
override the setup_context staticmethod") and gives zero Jacobians under `jacfwd`, and its dispatch costs
about 25 us more per call and backward than the Function's.
"""

from __future__ import annotations

import torch
from torch import Tensor as _Tensor

from ..utils import broadcast_shapes as _broadcast_shapes
from .fused import _fused_forward, _native_forward
from .fused import fused_spline as _fused_spline
from .native import spline_ops as _spline_ops
from .reference import _Layout, _reference_map
from .select import SPLINE_KERNELS, current_choice, native_applies, spline_kernel, use_spline_kernel

__all__ = [
    "SPLINE_KERNELS",
    "rational_quadratic",
    "spline_kernel",
    "use_spline_kernel",
    "current_choice",
    "native_applies",
]


def rational_quadratic(
    x: _Tensor, params: _Tensor, layout: _Layout, inverse: bool, derivative: bool = False
) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """The spline (or its inverse) at `x` with its log-derivative and, if asked, that one's derivative in `x`.

    Runs on the kernel [`spline_kernel`][flowkit.kernels.spline_kernel] picks; every kernel gives the same
    numbers.

    Arguments:
        x: the points, of the batch shape.
        params: the spline parameters `(..., P)`, laid out as `layout` says.
        layout: the spline's layout (bins, interval, minimums, linear tails or circle).
        inverse: evaluate the inverse map.
        derivative: also return the derivative of the log-derivative in the input (without a graph).

    Returns:
        `(out, ladj, d)`, `d` None unless `derivative`.
    """
    kernel = spline_kernel(x, params, layout.bins)
    if kernel == "reference":
        return _reference_map(x, params, layout, inverse, derivative)
    native = kernel == "native"
    batch = x.shape
    if batch != params.shape[:-1]:
        batch = _broadcast_shapes(batch, params.shape[:-1])
        x, params = x.expand(batch), params.expand(*batch, params.shape[-1])
    if torch.is_grad_enabled():
        # Through the node even where nothing requires a gradient yet: under `torch.func.grad` of a `vmap` a
        # traced input does not say it requires one, and only the node's rules carry the transforms.
        return _fused_spline(x, params, layout, inverse, derivative, native)
    # No gradients (sampling, densities under `torch.no_grad`): the forward pass alone.
    v, p = x.reshape(-1), params.reshape(-1, params.shape[-1])
    if native:
        out, ladj, dlog, _ = _native_forward(_spline_ops(), v, p, layout, inverse, derivative)
    else:
        out, ladj, dlog, _ = _fused_forward(v, p, layout, inverse, derivative)
    return out.view(batch), ladj.view(batch), None if dlog is None else dlog.view(batch)
