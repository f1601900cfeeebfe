"""Deprecated alias of [`flowkit.sampling`][flowkit.sampling]: the Markov chains moved to `flowkit.sampling.mcmc`.

`flowkit.mcmc.hmc` and the rest still work and warn once per name; import them from `flowkit.sampling`.
"""

import warnings as _warnings

from .sampling import mcmc as _mcmc

__all__: list[str] = []


def __getattr__(name: str):
    if name in _mcmc.__all__:
        _warnings.warn(
            f"flowkit.mcmc.{name} moved to flowkit.sampling.{name}; flowkit.mcmc will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_mcmc, name)
    raise AttributeError(f"module 'flowkit.mcmc' has no attribute {name!r}")
