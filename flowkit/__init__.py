"""flowkit: normalizing flows in PyTorch, with the checks that make them trustworthy.

The subpackages load on first use (`flowkit.flows`, `from flowkit import train`), so that `import flowkit` and
`flowkit --help` do not import torch; `flowkit.io.load` imports them all before it builds a model from its config.
"""

import importlib as _importlib

__version__ = "0.1.0"

#: The subpackages, imported on first use; `flowkit.plot` (matplotlib) among them.
_SUBPACKAGES = (
    "bijectors",
    "data",
    "distributions",
    "flows",
    "inference",
    "interop",
    "io",
    "kernels",
    "lattice",
    "root_finding",
    "sampling",
    "stats",
    "targets",
    "testing",
    "train",
    "transformers",
)

#: Names of the package's namespace defined in a subpackage.
_DEFINED_IN = {"Flow": "flows", "set_validation": "_validation", "compile": "compiled"}


def __getattr__(name: str):
    if name in _SUBPACKAGES or name in ("plot", "stochastic"):
        return _importlib.import_module(f".{name}", __name__)
    if name in _DEFINED_IN:
        value = getattr(_importlib.import_module(f".{_DEFINED_IN[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flowkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "bijectors",
    "transformers",
    "distributions",
    "flows",
    "targets",
    "train",
    "sampling",
    "lattice",
    "stats",
    "kernels",
    "root_finding",
    "data",
    "plot",
    "testing",
    "io",
    "interop",
    "inference",
    "Flow",
    "set_validation",
    "compile",
]
