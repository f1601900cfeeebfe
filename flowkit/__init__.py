"""flowkit: normalizing flows in PyTorch, with the checks that make them trustworthy."""

from . import (
    bijectors,
    data,
    distributions,
    flows,
    interop,
    io,
    lattice,
    mcmc,
    sampling,
    stochastic,
    targets,
    testing,
    train,
    transformers,
)
from ._validation import set_validation
from .flows import Flow

__version__ = "0.1.0"


def __getattr__(name: str):
    # flowkit.plot imports matplotlib: load it on first use, not with flowkit.
    if name == "plot":
        import importlib

        return importlib.import_module(".plot", __name__)
    raise AttributeError(f"module 'flowkit' has no attribute {name!r}")


__all__ = [
    "bijectors",
    "transformers",
    "distributions",
    "flows",
    "stochastic",
    "targets",
    "train",
    "sampling",
    "mcmc",
    "lattice",
    "data",
    "plot",
    "testing",
    "io",
    "interop",
    "Flow",
    "set_validation",
]
