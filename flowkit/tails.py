"""Deprecated alias of [`flowkit.stats`][flowkit.stats]: the tail estimators and metrics moved there.

`flowkit.tails.estimate_tails` and the rest still work and warn; import them from `flowkit.stats`.
"""

from ._deprecation import moved_names
from .stats import tails as _tails

__all__: list[str] = []
__getattr__ = moved_names("flowkit.tails", "flowkit.stats", _tails)
