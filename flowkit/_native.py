"""Native (C++) kernels, built once on first use with torch's extension loader.

The spline kernel (`csrc/spline.cpp`) evaluates a rational-quadratic spline and its backward pass as one
CPU operation per direction (`torch.ops.flowkit_native.rqs_forward` and `rqs_backward`). It is compiled
the first time a spline runs on the CPU (10-30 s, once: torch caches the build under
`TORCH_EXTENSIONS_DIR`, by default `~/.cache/torch_extensions`, one build per torch version, rebuilt when
the source changes). The build needs a C++ compiler and ninja (a dependency of flowkit). Where it cannot
be built flowkit warns once and keeps to its PyTorch path, which gives the same numbers more slowly;
`FLOWKIT_NATIVE=0` in the environment turns the kernel off.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["spline_ops", "native_enabled"]

_SOURCE = Path(__file__).with_name("csrc") / "spline.cpp"
_LOCK = threading.Lock()
_OPS: object | None = None
_TRIED = False

#: Switch for the native kernel (tests compare it with the PyTorch path by turning it off).
ENABLED = os.environ.get("FLOWKIT_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")

_log = logging.getLogger("flowkit")


def native_enabled() -> bool:
    """Whether the native kernels are switched on (`FLOWKIT_NATIVE`, default on)."""
    return ENABLED


def _build() -> object | None:
    from torch.utils import cpp_extension

    _log.info("flowkit: building the native spline kernel (once; cached by torch)")
    # One build per torch version: the binary is tied to torch's C++ ABI.
    version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    cpp_extension.load(
        name=f"flowkit_native_torch{version}",
        sources=[str(_SOURCE)],
        # No contraction into fused multiply-adds: the kernel rounds as the PyTorch path does.
        extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=False,
    )
    return torch.ops.flowkit_native


def spline_ops() -> object | None:
    """The `torch.ops.flowkit_native` namespace, built on the first call; None where it is unavailable."""
    global _OPS, _TRIED
    if not ENABLED:
        return None
    if _TRIED:
        return _OPS
    with _LOCK:
        if not _TRIED:
            try:
                _OPS = _build()
            except Exception as error:  # no compiler, no write access to the cache, ...
                warnings.warn(
                    f"flowkit: the native spline kernel could not be built ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''}); using the PyTorch path, which "
                    "gives the same numbers more slowly. Set FLOWKIT_NATIVE=0 to skip the attempt.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                _OPS = None
            _TRIED = True
    return _OPS
