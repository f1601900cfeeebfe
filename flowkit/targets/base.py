"""The [`Target`][flowkit.targets.Target] interface (a density known through its energy) and a wrapper for user code."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .._config import Configurable
from .._validation import check_tensor, outermost
from ..utils import TensorAnchor, as_shape, value_and_gradient

__all__ = ["Target", "Energy"]


class Target(Configurable, TensorAnchor):
    r"""An unnormalised density $p(x) = e^{-u(x)} / Z$ known through its energy `u`.

    Subclasses set `event_shape` and implement `_energy`; they may override `_force` with an analytic
    gradient, set `log_Z` when known, and implement `_sample` for exact samples. Constants live in buffers,
    so `.to()` moves them; energies are computed in the dtype of their input.

    Attributes:
        event_shape: shape of one configuration (`(D,)` or a lattice `(L, L)`).
        log_Z: $\log \int e^{-u(x)} dx$ when known, else `None`.
        has_samples: whether [`sample`][flowkit.targets.base.Target.sample] draws exact samples.
    """

    _flowkit_register = False
    event_shape: torch.Size
    log_Z: float | None = None
    has_samples: bool = False

    def _check(self, x: Tensor, where: str) -> None:
        with outermost() as check:
            if check:
                check_tensor(x, self.event_shape, name="x", where=f"{type(self).__name__}.{where}")

    def energy(self, x: Tensor) -> Tensor:
        """Energy `u(x) = -log p(x) + const` of configurations `(..., *event_shape)`; returns the batch shape."""
        self._check(x, "energy")
        return self._energy(x)

    def force(self, x: Tensor) -> Tensor:
        r"""Force $-\nabla_x u(x)$ (the score of the target), without a graph; shape of `x`."""
        self._check(x, "force")
        return self._force(x)

    def energy_and_force(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Energy (with its graph, if `x` has one) and force (without), in one call."""
        self._check(x, "energy_and_force")
        return self._energy(x), self._force(x)

    def log_prob(self, x: Tensor) -> Tensor:
        """Normalised log density `-u(x) - log Z`; only when `log_Z` is known."""
        if self.log_Z is None:
            raise ValueError(f"{type(self).__name__}: log Z is not known, so log_prob is not available; use -energy(x)")
        return -self.energy(x) - self.log_Z

    def sample(self, n: int | Sequence[int], generator: torch.Generator | None = None) -> Tensor:
        """Exact samples of shape `(*n, *event_shape)` (only when `has_samples`)."""
        if not self.has_samples:
            raise ValueError(f"{type(self).__name__} cannot draw exact samples")
        shape = as_shape(n)
        x = self._sample(shape.numel(), generator).to(device=self.device, dtype=self.dtype)
        return x.reshape(*shape, *self.event_shape)

    def forward(self, x: Tensor) -> Tensor:
        """Same as [`energy`][flowkit.targets.base.Target.energy]."""
        return self.energy(x)

    def _energy(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _force(self, x: Tensor) -> Tensor:
        return -value_and_gradient(self._energy, x)[1]  # 0 for an energy that does not depend on x

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


class Energy(Target):
    """Wrap a Python energy function as a [`Target`][flowkit.targets.Target].

    Arguments:
        fn: `u(x)`, mapping a batch `(..., *event_shape)` to energies of the batch shape.
            It must be differentiable with torch autograd (for forces) unless `force` is given.
        event_shape: shape of one configuration (an int `D` or a shape).
        log_Z: the log normalising constant, if known.
        force: optional `-grad u(x)`, when cheaper than autograd.
        sampler: optional `sampler(n) -> Tensor` of exact samples, shape `(n, *event_shape)`.

    A wrapped function cannot be saved in a model file: rebuild the target from code.

    Examples:
        >>> import torch, flowkit
        >>> target = flowkit.targets.Energy(lambda x: 0.5 * x.square().sum(-1), 3)
        >>> target.energy(torch.zeros(4, 3)).shape
        torch.Size([4])
    """

    _flowkit_register = False

    def __init__(
        self,
        fn: Callable[[Tensor], Tensor],
        event_shape: int | Sequence[int],
        log_Z: float | None = None,
        force: Callable[[Tensor], Tensor] | None = None,
        sampler: Callable[[int], Tensor] | None = None,
    ) -> None:
        super().__init__()
        if not callable(fn):
            raise ValueError(f"Energy: fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.event_shape = as_shape(event_shape)
        self.log_Z = None if log_Z is None else float(log_Z)
        self.force_fn = force
        self.sampler = sampler
        self.has_samples = sampler is not None

    def _energy(self, x: Tensor) -> Tensor:
        u = self.fn(x)
        batch = x.shape[: x.dim() - len(self.event_shape)]
        if not isinstance(u, Tensor) or u.shape != batch:
            got = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
            raise ValueError(f"Energy: fn must return one energy per configuration, shape {tuple(batch)}; got {got}")
        return u

    def _force(self, x: Tensor) -> Tensor:
        return super()._force(x) if self.force_fn is None else self.force_fn(x).detach()

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        return self.sampler(n)
