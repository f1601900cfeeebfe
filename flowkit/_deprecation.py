"""Deprecated aliases: a module whose names moved elsewhere keeps serving them, with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def moved_names(old: str, new: str, module: ModuleType, names: Any = None) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `old` that serves `module`'s public names, warning that they live in `new`."""
    served = set(module.__all__ if names is None else names)

    def __getattr__(name: str) -> Any:
        if name in served:
            warnings.warn(
                f"{old}.{name} moved to {new}.{name}; {old} will be removed", DeprecationWarning, stacklevel=2
            )
            return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__
