"""Input checks shared by bijectors, distributions and flows.

The checks run at the *public* entry point only (a bijector called by another
bijector is not re-checked), and are skipped while `torch.compile` traces.
The finiteness check synchronises with the device; turn all checks off with
`set_validation` in production loops that need every microsecond.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "set_validation",
    "validation_enabled",
    "check_tensor",
    "check_context",
    "check_point",
    "module_dtype",
    "outermost",
]

_state = threading.local()
_enabled = True


def set_validation(enabled: bool) -> None:
    """Turn the input checks of every flowkit entry point on or off (default on)."""
    global _enabled
    _enabled = bool(enabled)


def validation_enabled() -> bool:
    """Whether input checks run (on by default, off while compiling)."""
    if torch.compiler.is_compiling():
        return False
    return _enabled


@contextlib.contextmanager
def outermost() -> Iterator[bool]:
    """Context that yields True only for the outermost flowkit call on this thread."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield depth == 0 and validation_enabled()
    finally:
        _state.depth = depth


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def check_tensor(
    x: object,
    event_shape: Sequence[int],
    *,
    name: str = "input",
    dtype: torch.dtype | None = None,
    where: str = "",
) -> None:
    """Raise `ValueError` unless `x` is a finite floating tensor ending in `event_shape`."""
    where = f"{where}: " if where else ""
    if not isinstance(x, Tensor):
        raise ValueError(f"{where}{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{where}{name} must have a floating dtype, got {x.dtype}")
    if dtype is not None and x.dtype != dtype:
        raise ValueError(
            f"{where}{name} has dtype {x.dtype} but the model's parameters are {dtype}; "
            f"convert one of them (e.g. x.to({dtype}) or model.to({x.dtype}))"
        )
    event_shape = tuple(event_shape)
    n = len(event_shape)
    if x.dim() < n or tuple(x.shape[x.dim() - n :]) != event_shape:
        raise ValueError(
            f"{where}{name} has shape {_shape_str(x.shape)} but the event shape is "
            f"{_shape_str(event_shape)}; expected (..., {', '.join(map(str, event_shape))})"
        )
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{where}{name} contains {bad} non-finite value(s) (NaN or inf)")


def check_context(
    context: object,
    features: int,
    batch_shape: Sequence[int] | None,
    *,
    dtype: torch.dtype | None = None,
    where: str = "",
) -> None:
    """Check a context tensor against the number of context features the model expects."""
    prefix = f"{where}: " if where else ""
    if features == 0:
        if context is not None:
            raise ValueError(f"{prefix}this model is unconditional but a context was given")
        return
    if context is None:
        raise ValueError(f"{prefix}this model needs a context with {features} feature(s) but none was given")
    check_tensor(context, (features,), name="context", dtype=dtype, where=where)
    assert isinstance(context, Tensor)
    if batch_shape is not None:
        try:
            torch.broadcast_shapes(tuple(context.shape[:-1]), tuple(batch_shape))
        except RuntimeError:
            raise ValueError(
                f"{prefix}context batch shape {_shape_str(context.shape[:-1])} does not match "
                f"the input batch shape {_shape_str(batch_shape)}"
            ) from None


def module_dtype(module: nn.Module) -> torch.dtype | None:
    """The floating dtype of a module's first floating parameter (else buffer), or None."""
    for tensor in module.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    for tensor in module.buffers():
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def check_point(bijector: nn.Module, x: object, context: object, direction: str, where: str) -> None:
    """Check an input of a bijector's `direction` side (`"forward"`: data, `"inverse"`: latent) and its context."""
    shape = bijector.event_shape if direction == "forward" else bijector.latent_shape
    dtype = module_dtype(bijector)
    check_tensor(x, shape, name="x" if direction == "forward" else "z", dtype=dtype, where=where)
    assert isinstance(x, Tensor)
    batch = x.shape[: x.dim() - len(shape)]
    check_context(context, bijector.context_features, batch, dtype=dtype, where=where)
