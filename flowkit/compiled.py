r"""An opt-in compiled path: [`compile`][flowkit.compiled.compile] wraps a flow in `torch.compile`.

`flowkit.compile(flow)` returns a [`CompiledFlow`][flowkit.compiled.CompiledFlow]
that shares the flow's parameters (an optimiser built on either trains both)
and whose density and sampling methods run through `torch.compile` (TorchInductor
by default): the spline's knot construction, bin arithmetic and the
conditioners' elementwise tails fuse into a few kernels, and the per-layer
Python overhead is paid once, at tracing.

The input checks of flowkit's entry points (shapes, dtypes, the domain, the
context; see `flowkit.set_validation`) stay eager: `CompiledFlow` runs them
on its arguments *before* it enters the compiled region, and inside that
region they are off (`torch.compiler.is_compiling()`), so the graph holds no
host synchronisation and a bad input still raises the same `ValueError`.

Compilation happens on the first call of each method and again whenever an
input's shape changes (a new batch size, say); pass `dynamic=True` to trace
with symbolic shapes instead. The compiled numbers equal the eager ones up to
the reordering of floating-point sums that kernel fusion implies; the
`aot_eager` backend (graph capture with eager kernels, no C++ build) gives
the eager numbers exactly and is what the test suite uses.

References:
    Ansel et al., *PyTorch 2: Faster machine learning through dynamic Python
    bytecode transformation and graph compilation*, ASPLOS 2024.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ._validation import check_context, check_point, module_dtype, validation_enabled
from .flows.base import FlowModel

__all__ = ["CompiledFlow", "compile"]


def _forwarded(name: str) -> property:
    """A read-only property that is the wrapped flow's attribute `name`."""
    return property(lambda self: getattr(self.flow, name), doc=f"The wrapped flow's `{name}`.")


class CompiledFlow(FlowModel):
    """A flow whose `log_prob`, `rsample` and `rsample_and_log_prob` run compiled, with eager input checks.

    Build it with [`flowkit.compile`][flowkit.compiled.compile]. The wrapped flow
    is `self.flow`; its parameters are this module's, so `parameters()`,
    `state_dict()` and optimisers see the same tensors. It implements the
    [flow contract][flowkit.flows.base.FlowModel] with the flow's abilities
    (`exact_log_prob`, `samples_match_density`, `bijective`, ...) and its
    `latent_to_data` (eager); other attributes a `CompiledFlow` does not define
    (`base`, `bijector`, ...) are the flow's.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow] (anything with its methods).
        options: keyword arguments of `torch.compile` (`backend`, `mode`,
            `dynamic`, `fullgraph`).
    """

    _flowkit_register = False  # saved as the flow it wraps

    event_shape = _forwarded("event_shape")
    context_features = _forwarded("context_features")
    exact_log_prob = _forwarded("exact_log_prob")
    samples_match_density = _forwarded("samples_match_density")
    sampler_mismatch = _forwarded("sampler_mismatch")
    bijective = _forwarded("bijective")
    free_form = _forwarded("free_form")

    def __init__(self, flow: nn.Module, **options: Any) -> None:
        super().__init__()
        self.flow = flow
        self.options = dict(options)
        self._log_prob = torch.compile(flow.log_prob, **options)
        self._rsample = torch.compile(flow.rsample, **options)
        self._rsample_and_log_prob = torch.compile(flow.rsample_and_log_prob, **options)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("flow"), name)

    def _check_data(self, x: Tensor, context: Tensor | None, where: str) -> None:
        if validation_enabled():
            check_point(self.flow, x, context, "forward", f"CompiledFlow.{where}")

    def _check_context(self, context: Tensor | None, where: str) -> None:
        if validation_enabled():
            check_context(
                context, self.flow.context_features, None, dtype=module_dtype(self.flow), where=f"CompiledFlow.{where}"
            )

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log density `log p(x)`, compiled; the input is checked first, eagerly."""
        self._check_data(x, context, "log_prob")
        return self._log_prob(x, context)

    def rsample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Reparameterised samples, compiled."""
        self._check_context(context, "rsample")
        return self._rsample(shape, context)

    def rsample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Reparameterised samples and their log density in one compiled pass."""
        self._check_context(context, "rsample_and_log_prob")
        return self._rsample_and_log_prob(shape, context)

    def latent_to_data(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The flow's [`latent_to_data`][flowkit.flows.base.FlowModel.latent_to_data], eager."""
        return self.flow.latent_to_data(z, context)

    def auxiliary_loss(self) -> Tensor | None:
        """The flow's regularisers."""
        return self.flow.auxiliary_loss()


def compile(  # noqa: A001 - the public name, as torch.compile
    flow: nn.Module,
    *,
    backend: str | Callable = "inductor",
    mode: str | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
) -> CompiledFlow:
    """Compile a flow's density and sampling with `torch.compile`, keeping its input checks eager.

    Arguments:
        flow: the [`Flow`][flowkit.flows.Flow] to compile (it is not copied:
            training either trains both).
        backend: the `torch.compile` backend: `"inductor"` (fused kernels; the
            first call of each method builds them, which takes seconds to
            minutes) or `"aot_eager"` (graph capture with eager kernels: the
            eager numbers exactly, for tests).
        mode: `torch.compile`'s mode (`"reduce-overhead"` uses CUDA graphs on a GPU).
        dynamic: trace with symbolic shapes (`True`), or recompile per new shape (`None`, `False`).
        fullgraph: fail instead of falling back to eager at a graph break.

    Returns:
        A [`CompiledFlow`][flowkit.compiled.CompiledFlow] sharing the flow's parameters.

    Example:
        ```python
        flow = flowkit.flows.NSF(8, transforms=5)
        fast = flowkit.compile(flow)
        loss = -fast.log_prob(x).mean()  # compiled forward and backward
        ```
    """
    if not isinstance(flow, nn.Module) or not callable(getattr(flow, "log_prob", None)):
        raise ValueError(f"flowkit.compile: expected a flow (a module with log_prob), got {type(flow).__name__}")
    if isinstance(flow, CompiledFlow):
        raise ValueError("flowkit.compile: the flow is already compiled")
    return CompiledFlow(flow, backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph)
