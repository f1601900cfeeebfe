"""Deprecated alias of [`flowkit.sampling`][flowkit.sampling]: the Markov chains moved to `flowkit.sampling.mcmc`.

`flowkit.mcmc.hmc` and the rest still work and warn; import them from `flowkit.sampling`.
"""

from ._deprecation import moved_names
from .sampling import mcmc as _mcmc

__all__: list[str] = []
__getattr__ = moved_names("flowkit.mcmc", "flowkit.sampling", _mcmc)
