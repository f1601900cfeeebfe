"""Native (C++) kernels, built once on first use with torch's extension loader.

The spline kernel (`csrc/spline.cpp`) evaluates a rational-quadratic spline and its backward pass as one
CPU operation per direction (`torch.ops.flowkit_native.rqs_forward` and `rqs_backward`). It is compiled
the first time a spline runs on the CPU (10-30 s, once: torch caches the build under
`TORCH_EXTENSIONS_DIR`, by default `~/.cache/torch_extensions`, one build per torch version, rebuilt when
the source changes). The build needs a C++ compiler and ninja (a dependency of flowkit). Where it cannot
be built flowkit warns once and keeps to its PyTorch path, which gives the same numbers more slowly;
`FLOWKIT_NATIVE=0` in the environment keeps `"auto"` off it ([`flowkit.kernels.select`][flowkit.kernels.select]).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["spline_ops"]

_SOURCE = Path(__file__).with_name("csrc") / "spline.cpp"
_LOCK = threading.Lock()
_OPS: object | None = None
_TRIED = False
_FAKES_REGISTERED = False

_log = logging.getLogger("flowkit")


#: A build lock older than this is left over from a build that was killed: torch's loader would wait on it
#: for ever (a build takes 10-30 s).
_STALE_LOCK_S = 600.0


def _extension_name() -> str:
    """`flowkit_native_<torch version>_<source hash>`: the binary is tied to torch's C++ ABI and to its source."""
    version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    return f"flowkit_native_torch{version}_{digest}"


def _remove_stale_lock(name: str) -> None:
    from torch.utils import cpp_extension

    lock = Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"
    with contextlib.suppress(OSError):
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()
            _log.warning("flowkit: removed a stale build lock %s", lock)


def _batch_first(t: Tensor, dim: int | None, size: int) -> Tensor:
    """`t` with the `torch.func.vmap` batch axis `dim` in front (expanded to `size` if `t` is not batched)."""
    return t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)


def _register_fakes() -> None:
    """Shape-only implementations (fake-tensor tracing: `make_fx`, export) and the forward's `vmap` rule."""
    global _FAKES_REGISTERED
    if _FAKES_REGISTERED:  # once per process: torch refuses a second registration
        return
    _FAKES_REGISTERED = True

    @torch.library.register_fake("flowkit_native::rqs_forward")
    def _(v, params, bins, low, high, min_width, min_height, min_derivative, circular, inverse, derivative):  # noqa: ANN001, ANN202
        n = v.shape[0]
        return v.new_empty(n), v.new_empty(n), v.new_empty(n if derivative else 0), v.new_empty(n, 2 * bins)

    @torch.library.register_fake("flowkit_native::rqs_backward")
    def _(v, params, exps, g_out, g_ladj, bins, *layout_and_flags):  # noqa: ANN001, ANN002, ANN202
        need_params = layout_and_flags[-1]
        return v.new_empty(v.shape[0]), params.new_empty(params.shape[0] if need_params else 0, params.shape[1])

    @torch.library.register_vmap("flowkit_native::rqs_forward")
    def _(info, in_dims, v, params, *layout_and_flags):  # noqa: ANN001, ANN002, ANN202
        # The spline acts point by point: the batched points are more points.
        size = info.batch_size
        v, params = (_batch_first(t, dim, size) for t, dim in zip((v, params), in_dims, strict=False))
        n, width = v.shape[1], params.shape[-1]
        out, ladj, dlog, exps = torch.ops.flowkit_native.rqs_forward(
            v.reshape(-1), params.reshape(-1, width), *layout_and_flags
        )
        derivative = layout_and_flags[-1]
        batched = (out.view(size, n), ladj.view(size, n), dlog.view(size, n) if derivative else dlog)
        return (*batched, exps.view(size, n, -1)), (0, 0, 0 if derivative else None, 0)


def _built(name: str) -> bool:
    """Whether torch's cache already holds the compiled library `name` (then loading it takes a moment)."""
    from torch.utils import cpp_extension

    directory = Path(cpp_extension._get_build_directory(name, verbose=False))
    return any(directory.glob(f"{name}*.so")) or any(directory.glob(f"{name}*.pyd"))


def _announce(message: str) -> None:
    """Log `message` to the `flowkit` logger; where no handler would show it, also print it on stderr.

    Printed through `tqdm.write`, so that it lands above a running progress bar instead of through it.
    """
    _log.info(message)
    if not (_log.isEnabledFor(logging.INFO) and _log.hasHandlers()):
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)


def _compile(name: str) -> None:
    """Build (or load from torch's cache) the extension `name`, saying so when it compiles (10-30 s)."""
    from torch.utils import cpp_extension

    fresh = not _built(name)
    if fresh:
        _announce(
            f"flowkit: compiling the native spline kernel {name} (first use, about 15 s; cached afterwards under "
            f"{Path(cpp_extension._get_build_directory(name, verbose=False)).parent})"
        )
    start = time.perf_counter()
    _remove_stale_lock(name)
    cpp_extension.load(
        name=name,
        sources=[str(_SOURCE)],
        # No contraction into fused multiply-adds: the kernel rounds as the PyTorch path does.
        extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=False,
    )
    if fresh:
        _announce(f"flowkit: compiled the native spline kernel in {time.perf_counter() - start:.1f} s")


def _build() -> object | None:
    _compile(_extension_name())
    _register_fakes()
    return torch.ops.flowkit_native


def spline_ops() -> object | None:
    """The `torch.ops.flowkit_native` namespace, built on the first call; None where it is unavailable."""
    global _OPS, _TRIED
    if _TRIED:
        return _OPS
    with _LOCK:
        if not _TRIED:
            try:
                _OPS = _build()
            except Exception as error:  # no compiler, no write access to the cache, ...
                # The first line names the failure, the last ones hold the compiler's own message.
                lines = [line for line in str(error).splitlines() if line.strip()]
                shown = "; ".join(lines[:1] + (["..."] if len(lines) > 6 else []) + lines[1:][-5:])
                warnings.warn(
                    f"flowkit: the native spline kernel could not be built ({type(error).__name__}: {shown}); "
                    "using the PyTorch path, which gives the same numbers more slowly. Set FLOWKIT_NATIVE=0 "
                    "to skip the attempt.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                _OPS = None
            _TRIED = True
    return _OPS
