"""Deprecated alias of [`flowkit.stats`][flowkit.stats]: the tail estimators and metrics moved there.

`flowkit.tails.estimate_tails` and the rest still work and warn; import them from `flowkit.stats`.
"""

import warnings as _warnings

from .stats import tails as _tails

__all__: list[str] = []


def __getattr__(name: str):
    if name in _tails.__all__:
        _warnings.warn(
            f"flowkit.tails.{name} moved to flowkit.stats.{name}; flowkit.tails will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_tails, name)
    raise AttributeError(f"module 'flowkit.tails' has no attribute {name!r}")
