"""Small tensor helpers shared across flowkit."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "as_shape",
    "broadcast_shapes",
    "sum_event",
    "TensorAnchor",
    "auxiliary_loss",
    "auxiliary_loss_modules",
    "sum_auxiliary_losses",
    "aggregates_auxiliary_loss",
    "into_open_unit_interval",
    "value_and_gradient",
]


def as_shape(shape: int | Sequence[int] | torch.Size) -> torch.Size:
    """Turn an int or a sequence of ints into a `torch.Size` (refusing other values and negative sizes).

    Raises:
        ValueError: when `shape` is not an integer nor a sequence of integers (`2.5`, `True`, `"3"`),
            or has a negative size.
    """
    sizes = tuple(shape) if isinstance(shape, Sequence) and not isinstance(shape, str) else (shape,)
    try:
        if any(isinstance(n, bool) for n in sizes):
            raise TypeError
        size = torch.Size(operator.index(n) for n in sizes)
    except TypeError:
        raise ValueError(f"a shape must be an integer or a sequence of integers, got {shape!r}") from None
    if any(n < 0 for n in size):
        raise ValueError(f"a shape cannot have negative sizes, got {tuple(size)}")
    return size


def broadcast_shapes(*shapes: Sequence[int]) -> torch.Size:
    """The broadcast of batch shapes, as `torch.broadcast_shapes`, with the common cases first.

    Where every non-empty shape is the same, that shape is the answer; otherwise `torch.broadcast_shapes`
    decides (and raises), which costs 10-30 us a call.

    Examples:
        >>> broadcast_shapes((4, 1), (), (4, 1))
        torch.Size([4, 1])
        >>> broadcast_shapes((4, 1), (3,))
        torch.Size([4, 3])
    """
    first = None
    for shape in shapes:
        if len(shape):
            if first is None:
                first = shape
            elif shape != first:
                return torch.broadcast_shapes(*shapes)
    return torch.Size(() if first is None else first)


def into_open_unit_interval(x: Tensor) -> Tensor:
    """Dequantised values `x` in `[0, 1]` moved into the open interval `(0, 1)` of their dtype.

    `(k + u) / K` is exactly 0 when `k = u = 0`, and can round to 1 in float32, where the plain logit of an
    image flow is infinite; those values become the nearest floats inside (the smallest normal, `1 - eps / 2`).
    """
    info = torch.finfo(x.dtype)
    return x.clamp(info.tiny, 1 - info.eps / 2)  # 1 - eps / 2: the largest float below 1


def value_and_gradient(function: Callable[[Tensor], Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
    r"""Values $f(x)$ and their gradient $\nabla_x \sum_b f(x_b)$ (per point), both without a graph.

    `function` maps points `(..., *event_shape)` to one value per point (an energy, a log density). A value
    that does not depend on `x` (a constant energy, a uniform density) has gradient 0, where autograd would
    raise "does not require grad".

    Returns:
        `(value, gradient)`: the detached values and a gradient of the shape of `x`.
    """
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        value = function(leaf)
        grad = None
        if value.requires_grad:
            (grad,) = torch.autograd.grad(value.sum(), leaf, allow_unused=True)
    return value.detach(), torch.zeros_like(leaf) if grad is None else grad


def sum_event(t: Tensor, event_dims: int) -> Tensor:
    """Sum the last `event_dims` dimensions (an elementwise log-density or log-determinant)."""
    return t.sum(dim=tuple(range(-event_dims, 0))) if event_dims else t


class TensorAnchor(nn.Module):
    """Module with a zero-size buffer, so that even a parameter-free module knows its dtype and device.

    The buffer follows `.to()`, `.double()` and `.cuda()` like any other.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self._anchor.dtype

    @property
    def device(self) -> torch.device:
        return self._anchor.device


def auxiliary_loss_modules(module: nn.Module) -> list[nn.Module]:
    """The submodules of `module` (itself included) whose `auxiliary_loss()` counts.

    Those that define one, less those whose method is marked with `aggregates_auxiliary_loss` (a flow's,
    which sums its own submodules'). The fit loop finds them once per run.
    """
    found = []
    for sub in module.modules():
        method = getattr(type(sub), "auxiliary_loss", None)
        if method is not None and not getattr(method, "_aggregates", False):
            found.append(sub)
    return found


def auxiliary_loss(module: nn.Module) -> Tensor | None:
    """Sum of `auxiliary_loss()` over `module` and its submodules that define one (`None` when none does).

    A layer with a regulariser (such as EIW's channel-weight penalty) defines a method
    `auxiliary_loss() -> Tensor | None`; the fit loop adds this sum to the objective.

    Arguments:
        module: the module whose tree is searched (see
            [`auxiliary_loss_modules`][flowkit.utils.auxiliary_loss_modules]).
    """
    return sum_auxiliary_losses(auxiliary_loss_modules(module))


def sum_auxiliary_losses(modules: Iterable[nn.Module]) -> Tensor | None:
    """The sum of `auxiliary_loss()` over `modules` themselves (found by `auxiliary_loss_modules`; None: none)."""
    total: Tensor | None = None
    for sub in modules:
        value = sub.auxiliary_loss()
        if value is not None:
            total = value if total is None else total + value
    return total


def aggregates_auxiliary_loss(method: Callable) -> Callable:
    """Mark an `auxiliary_loss` method that sums its submodules' (so that `auxiliary_loss` skips it)."""
    method._aggregates = True  # type: ignore[attr-defined]
    return method
