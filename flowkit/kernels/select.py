r"""Which spline kernel runs: the one public rule, and the user's choice.

[`spline_kernel`][flowkit.kernels.spline_kernel] names the kernel a call takes, from the inputs and the
choice made with [`use_spline_kernel`][flowkit.kernels.use_spline_kernel]:

1. `"reference"` (plain autograd) where the fused node cannot serve: under `torch.compile` (which fuses
   the reference's elementwise maths itself), for dual tensors (forward-mode AD, also `torch.func.jvp`
   and `jacfwd`: `torch.autograd.forward_ad.unpack_dual` sees their tangents), which the fused node does
   not implement, for inputs and parameters of different dtypes (promoted by the reference), and wherever
   the choice is `"reference"`;
2. otherwise `"native"` (`flowkit.kernels.native`, one C++ operation per direction) where it applies: on
   the CPU, float32 or float64, at most 128 bins, built here, and the choice is `"auto"` or `"native"`;
3. otherwise `"pytorch"` (the fused node as a few dozen torch operations: CUDA, half precision, no compiler).

The other `torch.func` transforms need no rule here: the fused node carries its own (a `vmap` rule, a
`jvp` rule and a backward pass that records a graph, each on the reference), and the native forward
operation has a batching rule registered with `torch.library.register_vmap`. No private torch state is read.

All three give the same numbers (the fused tests check it to rounding). The environment variable
`FLOWKIT_NATIVE=0` makes `"auto"` skip the native kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from . import native

__all__ = ["SPLINE_KERNELS", "spline_kernel", "use_spline_kernel", "current_choice"]

#: The kernels, fastest last; a choice is one of these or `"auto"`.
SPLINE_KERNELS = ("reference", "pytorch", "native")

#: Bins the native kernel takes at most (its per-point tables live on the stack: `kMaxBins` in spline.cpp).
NATIVE_MAX_BINS = 128

_NATIVE_BY_DEFAULT = os.environ.get("FLOWKIT_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
_CHOICE: contextvars.ContextVar[str] = contextvars.ContextVar("flowkit_spline_kernel", default="auto")


def current_choice() -> str:
    """The kernel choice in effect (`"auto"` unless inside [`use_spline_kernel`][flowkit.kernels.use_spline_kernel])."""
    return _CHOICE.get()


@contextlib.contextmanager
def use_spline_kernel(name: str) -> Iterator[None]:
    """Run the splines in the `with` block on kernel `name` (`"auto"`, `"reference"`, `"pytorch"` or `"native"`).

    `"native"` where the native kernel does not apply (CUDA, no compiler) runs the PyTorch kernel; the
    reference still runs where the fused node cannot (see the module). The choice is per thread and task
    (a context variable), so it does not leak into other code.

    Examples:
        >>> import torch, flowkit
        >>> spline = flowkit.transformers.RationalQuadraticSpline(4, 2.0)
        >>> with flowkit.kernels.use_spline_kernel("reference"):
        ...     y, ladj = spline(torch.zeros(3), spline.identity_params().expand(3, -1))
    """
    if name != "auto" and name not in SPLINE_KERNELS:
        raise ValueError(f"use_spline_kernel: unknown kernel {name!r}; choose 'auto' or one of {SPLINE_KERNELS}")
    token = _CHOICE.set(name)
    try:
        yield
    finally:
        _CHOICE.reset(token)


def _is_dual(t: Tensor) -> bool:
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def native_applies(x: Tensor, bins: int) -> bool:
    """Whether the native kernel can take `x` (CPU, float32 or float64, at most 128 bins, built here)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or bins > NATIVE_MAX_BINS:
        return False
    return native.spline_ops() is not None


def spline_kernel(x: Tensor, params: Tensor, bins: int) -> str:
    """The kernel a spline with `bins` bins takes for inputs `x` and parameters `params` (see the module).

    Arguments:
        x: the points.
        params: the spline parameters `(..., P)`.
        bins: the number of bins.

    Returns:
        `"reference"`, `"pytorch"` or `"native"`.
    """
    if torch.compiler.is_compiling():  # first: Dynamo traces none of what follows
        return "reference"
    choice = _CHOICE.get()
    if choice == "reference" or x.dtype != params.dtype or _is_dual(x) or _is_dual(params):
        return "reference"
    if choice == "pytorch" or (choice == "auto" and not _NATIVE_BY_DEFAULT):
        return "pytorch"
    return "native" if native_applies(x, bins) else "pytorch"
