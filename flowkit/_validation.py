"""Input checks shared by bijectors, distributions and flows.

The checks run at the *public* entry point only (a bijector called by another bijector is not re-checked), and are
skipped while `torch.compile` traces. The finiteness check synchronises with the device; turn all checks off with
`set_validation` in production loops that need every microsecond.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
import operator
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from .utils import broadcast_shapes

__all__ = [
    "set_validation",
    "validation_enabled",
    "check_tensor",
    "check_context",
    "check_point",
    "check_number",
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


def _rule(integer: bool, low: float | None, high: float | None, positive: bool, below: float | None) -> str:
    """What `check_number` asks for, in words: "a positive integer", "a number in (0, 1]", ..."""
    kind = "integer" if integer else "number"
    if high is None and below is None and ((positive and low is None) or (integer and low == 1)):
        return f"a positive {kind}" if integer else "a positive finite number"
    if low == 0 and not positive and high is None and below is None:
        return f"a non-negative {kind}" if integer else "a non-negative finite number"
    left = "(0" if positive else f"[{low:g}" if low is not None else None
    right = f"{below:g})" if below is not None else f"{high:g}]" if high is not None else None
    if left and right:
        return f"a {kind} in {left}, {right}"
    article = "an" if integer else "a finite"
    if left:
        return f"{article} {kind} of at least {low:g}"
    if right:
        return f"{article} {kind} below {below:g}" if below is not None else f"{article} {kind} of at most {high:g}"
    return f"{article} {kind}"


def check_number(
    value: object,
    name: str,
    *,
    where: str,
    positive: bool = False,
    integer: bool = False,
    low: float | None = None,
    high: float | None = None,
    below: float | None = None,
    rule: str | None = None,
) -> float:
    """Check a constructor's number and return it as a Python `float` (an `int` when `integer`).

    Every check refuses booleans, non-numbers and non-finite values (NaN, inf).

    Arguments:
        value: the number to check.
        name: the argument's name, for the error.
        where: the class or function, for the error.
        positive: require `value > 0`.
        integer: require an integer (anything with `__index__`, e.g. `int` or a NumPy integer).
        low: require `value >= low`.
        high: require `value <= high`.
        below: require `value < below`.
        rule: what the value must be, in words, for the error (default: the range's own words,
            e.g. "a positive integer", "a number in (0, 1]").

    Raises:
        ValueError: naming `where`, `name`, the range and the value.
    """
    message = f"{where}: {name} must be {rule or _rule(integer, low, high, positive, below)}, got {value!r}"
    if isinstance(value, bool):
        raise ValueError(message)
    if integer:
        try:
            number: float = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(message) from None
    elif isinstance(value, numbers.Real) or (isinstance(value, Tensor) and value.numel() == 1):
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number):
            raise ValueError(message)
    else:
        raise ValueError(message)
    if (
        (positive and not number > 0)
        or (low is not None and number < low)
        or (high is not None and number > high)
        or (below is not None and not number < below)
    ):
        raise ValueError(message)
    return number


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def check_tensor(
    x: object, event_shape: Sequence[int], *, name: str = "input", dtype: torch.dtype | None = None, where: str = ""
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
            broadcast_shapes(tuple(context.shape[:-1]), tuple(batch_shape))
        except RuntimeError:
            raise ValueError(
                f"{prefix}context batch shape {_shape_str(context.shape[:-1])} does not match "
                f"the input batch shape {_shape_str(batch_shape)}"
            ) from None


def module_dtype(module: nn.Module) -> torch.dtype | None:
    """The floating dtype of a module's first floating parameter (else buffer), or None."""
    tensors = (t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point())
    return next((t.dtype for t in tensors), None)


def check_point(bijector: nn.Module, x: object, context: object, direction: str, where: str) -> None:
    """Check an input of a bijector's `direction` side (`"forward"`: data, `"inverse"`: latent) and its context.

    `bijector` is anything with the shapes, `domain` and `context_features` of a bijector
    (a bijector, a stochastic block, a flow); data are also checked against the domain.
    """
    shape = bijector.event_shape if direction == "forward" else bijector.latent_shape
    dtype = module_dtype(bijector)
    check_tensor(x, shape, name="x" if direction == "forward" else "z", dtype=dtype, where=where)
    assert isinstance(x, Tensor)
    if direction == "forward":
        domain = bijector.domain
        inside = domain.admits(x)
        if inside is not None and not bool(inside.all()):
            advice = f"; {domain.advice}" if getattr(domain, "advice", "") else ""
            raise ValueError(
                f"{where}: x has {int((~inside).sum())} value(s) outside {domain!r}, the domain of the bijector"
                + advice
            )
    batch = x.shape[: x.dim() - len(shape)]
    check_context(context, bijector.context_features, batch, dtype=dtype, where=where)


def file_in_the_way(directory: Path) -> str | None:
    """How `directory`, meant to be a folder, is blocked by an existing file, as words for an error; None if not.

    `"is"` when `directory` itself is a file, `"is inside F, which is"` when a folder above it is the file `F`.
    """
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if existing is None or existing.is_dir():
        return None
    return "is" if existing == directory else f"is inside {existing}, which is"
