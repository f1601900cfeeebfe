r"""Spline kernels behind one door: the reference, the fused PyTorch node and the native C++ kernel.

[`rational_quadratic`][flowkit.kernels.rational_quadratic] is the one entry point of the spline
transformers ([`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline],
[`CircularSpline`][flowkit.transformers.CircularSpline]); [`spline_kernel`][flowkit.kernels.spline_kernel]
is the one rule that picks the kernel, and [`use_spline_kernel`][flowkit.kernels.use_spline_kernel]
the one switch a user (or a test, or a benchmark) turns. The kernels:

- `reference` ([`flowkit.transformers.rational_quadratic`][flowkit.transformers.rational_quadratic], below
  the kernels, which build on its bin maths): the maths in plain autograd, one node per bin; it runs
  under `torch.compile` and forward-mode AD, for every derivative of order two and more, and inside the
  fused node's `torch.func` rules (`vmap`, `jvp`);
- `pytorch` (`flowkit.kernels.fused`): the whole spline as one autograd node that touches only each
  point's bin, with a hand-written backward pass;
- `native` (`flowkit.kernels.native`): the same node as one C++ operation per direction on the CPU
  (`torch.ops.flowkit_native.rqs_forward` / `rqs_backward`, torch.library operations with fake kernels
  and a batching rule), built on first use.

The fused node's autograd is a `torch.autograd.Function` in torch's `torch.func` form, not one registered
with `torch.library.register_autograd`, which in torch 2.13 refuses `torch.func.grad` and `jacrev`, gives zero
Jacobians under `jacfwd` and costs about 25 us more per call.
"""

from __future__ import annotations

from torch import Tensor as _Tensor

from ..transformers.rational_quadratic import SplineLayout as _SplineLayout
from ..transformers.rational_quadratic import reference_spline as _reference_spline
from .fused import fused_spline as _fused_spline
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
    x: _Tensor, params: _Tensor, layout: _SplineLayout, inverse: bool, derivative: bool = False
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
        return _reference_spline(x, params, layout, inverse, derivative)
    return _fused_spline(x, params, layout, inverse, derivative, kernel == "native")
