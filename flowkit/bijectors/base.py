"""The :class:`Bijector` base class and the ways to combine bijectors.

Direction convention (as in nflows and zuko): ``forward`` maps data ``x`` to
latent ``z`` and returns ``log|det dz/dx|`` summed over the event dimensions;
``inverse`` maps ``z`` back to ``x`` and returns ``log|det dx/dz|``, which is
minus the forward value at the matching point. A flow's density is
``log p(x) = log p_Z(f(x)) + log|det J_f(x)|``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_context, check_tensor, outermost
from ..domains import Domain, Real

__all__ = ["Bijector", "Chain", "Invert", "Reshape"]


def _module_dtype(module: nn.Module) -> torch.dtype | None:
    for tensor in module.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    for tensor in module.buffers():
        if tensor.is_floating_point():
            return tensor.dtype
    return None


#: Entry points whose input is checked at the outermost call, and the side of the bijector it lives on.
_CHECKED_METHODS = {"forward": "forward", "call": "forward", "inverse": "inverse", "inverse_call": "inverse"}
#: Entry points that carry a score along; their point and score are checked at the outermost call.
_SCORE_METHODS = {"forward_with_score": "forward", "inverse_with_score": "inverse"}


def _check_input(bijector: Bijector, x: Tensor, context: Tensor | None, direction: str, where: str) -> None:
    shape = bijector.event_shape if direction == "forward" else bijector.latent_shape
    dtype = _module_dtype(bijector)
    check_tensor(x, shape, name="x" if direction == "forward" else "z", dtype=dtype, where=where)
    batch = x.shape[: x.dim() - len(shape)]
    check_context(context, bijector.context_features, batch, dtype=dtype, where=where)


def _checked(method: Callable, name: str) -> Callable:
    direction = _CHECKED_METHODS[name]

    @functools.wraps(method)
    def wrapper(self: Bijector, x: Tensor, context: Tensor | None = None, **kwargs: Any):
        with outermost() as check:
            if check:
                _check_input(self, x, context, direction, f"{type(self).__name__}.{name}")
            return method(self, x, context, **kwargs)

    wrapper._flowkit_checked = True  # type: ignore[attr-defined]
    return wrapper


def _checked_with_score(method: Callable, name: str) -> Callable:
    direction = _SCORE_METHODS[name]

    @functools.wraps(method)
    def wrapper(self: Bijector, x: Tensor, score: Tensor, context: Tensor | None = None, **kwargs: Any):
        with outermost() as check:
            if check:
                where = f"{type(self).__name__}.{name}"
                _check_input(self, x, context, direction, where)
                check_tensor(score, (), name="score", dtype=x.dtype, where=where)
                event = self.event_shape if direction == "forward" else self.latent_shape
                batch = x.shape[: x.dim() - len(event)]
                if context is not None:
                    batch = torch.broadcast_shapes(batch, context.shape[:-1])
                if score.shape != (*batch, *event):
                    raise ValueError(
                        f"{where}: score has shape {tuple(score.shape)} but the point (broadcast with its "
                        f"context) has shape {(*batch, *event)}"
                    )
            return method(self, x, score, context, **kwargs)

    wrapper._flowkit_checked = True  # type: ignore[attr-defined]
    return wrapper


class Bijector(Configurable, nn.Module):
    r"""Invertible map between data ``x`` and latent ``z`` with its log-determinant.

    Subclasses set :attr:`event_shape` (and :attr:`latent_shape` when it
    differs) and implement :meth:`forward` and :meth:`inverse`. Inputs are
    checked at the outermost call (shape, dtype, finiteness, context), so an
    error names the problem instead of surfacing deep inside torch.

    Attributes:
        event_shape: shape of one data event (``(D,)``, ``(C, H, W)``, ``(L, L)``).
        latent_shape: shape of one latent event (default: ``event_shape``).
        context_features: size of the context vector (0 when unconditional).
        domain: the set the data live in (:class:`~flowkit.domains.Real`
            unless the bijector acts on an interval, circle or sphere).
        ladj_is_constant: ``True`` when ``log|det J|`` does not depend on the input
            (linear layers, permutations, ActNorm); score matching drops these terms.
        stochastic: ``True`` for stochastic blocks, whose second output is a
            path-weight increment rather than a log-determinant.
    """

    _flowkit_register = False
    event_shape: torch.Size
    context_features: int = 0
    domain: Domain = Real()
    ladj_is_constant: bool = False
    stochastic: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _wrap_entry_points(cls)

    @property
    def latent_shape(self) -> torch.Size:
        return self.__dict__.get("_latent_shape", self.event_shape)

    @latent_shape.setter
    def latent_shape(self, shape: Sequence[int]) -> None:
        self.__dict__["_latent_shape"] = torch.Size(shape)

    @property
    def event_dims(self) -> int:
        return len(self.event_shape)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Map data to latent: return ``(z, log|det dz/dx|)``, the latter of batch shape."""
        raise NotImplementedError

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Map latent to data: return ``(x, log|det dx/dz|)``, the latter of batch shape."""
        raise NotImplementedError

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Return ``z`` alone; layers whose log-determinant is costly override this."""
        return self.forward(x, context)[0]

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        """Return ``x`` alone (the inverse without its log-determinant); see :meth:`call`."""
        return self.inverse(z, context)[0]

    def auxiliary_loss(self) -> Tensor | None:
        """A regulariser the fit loop adds to the objective (``None`` when there is none)."""
        return None

    def forward_with_score(
        self, x: Tensor, score: Tensor, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""Map ``x`` to ``z`` and carry a score along: return ``(z, ladj, score_z)``.

        If ``score`` is :math:`\nabla_x \log r(x)` for some density ``r``, then
        ``score_z`` is the score of ``r`` pushed through the forward map,

        .. math:: \nabla_z \log r_Z(z) = J_{f^{-1}}(z)^\top \nabla_x \log r(x)
                  + \nabla_z \log|\det J_{f^{-1}}(z)|,

        i.e. the recursion :math:`g \leftarrow (g - \nabla \log|\det J|) J^{-1}` of
        Vaitl et al., *Fast and unified path gradient estimators for normalizing
        flows*, ICLR 2024 (arXiv:2403.15881). ``score_z`` carries no graph;
        ``z`` and ``ladj`` keep theirs. The default uses one vector-Jacobian
        product through :meth:`inverse` and works for any bijector; layers
        with structure (couplings, linear maps) override it.
        """
        z, ladj = self.forward(x, context)
        return z, ladj, _pulled_score(self.inverse, z, score, context)

    def inverse_with_score(
        self, z: Tensor, score: Tensor, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""Map ``z`` to ``x`` and carry a score along: return ``(x, ladj, score_x)``.

        The sampling-direction twin of :meth:`forward_with_score`:
        :math:`\nabla_x \log r_X(x) = J_f(x)^\top \nabla_z \log r(z) + \nabla_x \log|\det J_f(x)|`.
        """
        x, ladj = self.inverse(z, context)
        return x, ladj, _pulled_score(self.forward, x, score, context)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


def _pulled_score(back: Callable, y: Tensor, score: Tensor, context: Tensor | None) -> Tensor:
    """``J_back(y)^T score + grad_y ladj_back(y)`` by one autograd call, without a graph on the result."""
    with torch.enable_grad():
        leaf = y.detach().requires_grad_(True)
        y_back, ladj_back = back(leaf, context)
        if score.shape != y_back.shape:
            raise ValueError(f"score has shape {tuple(score.shape)} but the point has shape {tuple(y_back.shape)}")
        (pulled,) = torch.autograd.grad((y_back * score.detach()).sum() + ladj_back.sum(), leaf)
    return pulled


def _wrap_entry_points(cls: type) -> None:
    for name in (*_CHECKED_METHODS, *_SCORE_METHODS):
        method = cls.__dict__.get(name)
        if method is not None and not getattr(method, "_flowkit_checked", False):
            setattr(cls, name, _checked(method, name) if name in _CHECKED_METHODS else _checked_with_score(method, name))


_wrap_entry_points(Bijector)


class Chain(Bijector):
    r"""Composition of bijectors, applied in order in the forward direction.

    ``Chain(f1, f2, f3).forward(x)`` computes ``f3(f2(f1(x)))`` and adds the
    log-determinants; ``inverse`` runs the layers backwards. The layers are
    exposed in order through iteration and indexing, so that path-gradient
    estimators and stochastic flows can walk them one by one.

    Arguments:
        bijectors: the layers, data side first.
    """

    def __init__(self, *bijectors: Bijector) -> None:
        super().__init__()
        if not bijectors:
            raise ValueError("Chain needs at least one bijector")
        for i, b in enumerate(bijectors):
            if not isinstance(b, Bijector):
                raise ValueError(f"Chain: layer {i} is a {type(b).__name__}, not a flowkit Bijector")
        for i, (a, b) in enumerate(zip(bijectors[:-1], bijectors[1:])):
            if tuple(a.latent_shape) != tuple(b.event_shape):
                raise ValueError(
                    f"Chain: layer {i} outputs events of shape {tuple(a.latent_shape)} but layer {i + 1} "
                    f"expects {tuple(b.event_shape)}; insert a Reshape"
                )
        contexts = {b.context_features for b in bijectors if b.context_features}
        if len(contexts) > 1:
            raise ValueError(f"Chain: layers disagree on the number of context features: {sorted(contexts)}")
        self.layers = nn.ModuleList(bijectors)
        self.event_shape = bijectors[0].event_shape
        self.latent_shape = bijectors[-1].latent_shape
        self.context_features = contexts.pop() if contexts else 0
        self.domain = bijectors[0].domain
        self.ladj_is_constant = all(b.ladj_is_constant for b in bijectors)
        self.stochastic = any(b.stochastic for b in bijectors)

    def __iter__(self) -> Iterator[Bijector]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Bijector:
        return self.layers[i]

    def _ladj_zero(self, x: Tensor, event_shape: torch.Size) -> Tensor:
        return x.new_zeros(x.shape[: x.dim() - len(event_shape)])

    def forward(self, x, context=None):
        total = self._ladj_zero(x, self.event_shape)
        for layer in self.layers:
            x, ladj = layer(x, context)
            total = total + ladj
        return x, total

    def inverse(self, z, context=None):
        total = self._ladj_zero(z, self.latent_shape)
        for layer in reversed(self.layers):
            z, ladj = layer.inverse(z, context)
            total = total + ladj
        return z, total

    def call(self, x, context=None):
        for layer in self.layers:
            x = layer.call(x, context)
        return x

    def inverse_call(self, z, context=None):
        for layer in reversed(self.layers):
            z = layer.inverse_call(z, context)
        return z

    def forward_with_score(self, x, score, context=None):
        total = self._ladj_zero(x, self.event_shape)
        for layer in self.layers:
            x, ladj, score = layer.forward_with_score(x, score, context)
            total = total + ladj
        return x, total, score

    def inverse_with_score(self, z, score, context=None):
        total = self._ladj_zero(z, self.latent_shape)
        for layer in reversed(self.layers):
            z, ladj, score = layer.inverse_with_score(z, score, context)
            total = total + ladj
        return z, total, score

    def auxiliary_loss(self):
        losses = [l for l in (b.auxiliary_loss() for b in self.layers) if l is not None]
        return sum(losses) if losses else None  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return ""


class Invert(Bijector):
    """Swap the directions of a bijector: ``Invert(b).forward = b.inverse``.

    Arguments:
        bijector: the bijector to invert.
    """

    def __init__(self, bijector: Bijector) -> None:
        super().__init__()
        if bijector.stochastic:
            raise ValueError("Invert: a stochastic block has no inverse to swap to")
        self.bijector = bijector
        self.event_shape = bijector.latent_shape
        self.latent_shape = bijector.event_shape
        self.context_features = bijector.context_features
        self.ladj_is_constant = bijector.ladj_is_constant

    def forward(self, x, context=None):
        return self.bijector.inverse(x, context)

    def inverse(self, z, context=None):
        return self.bijector(z, context)

    def call(self, x, context=None):
        return self.bijector.inverse_call(x, context)

    def inverse_call(self, z, context=None):
        return self.bijector.call(z, context)

    def forward_with_score(self, x, score, context=None):
        return self.bijector.inverse_with_score(x, score, context)

    def inverse_with_score(self, z, score, context=None):
        return self.bijector.forward_with_score(z, score, context)

    def auxiliary_loss(self):
        return self.bijector.auxiliary_loss()

    def extra_repr(self) -> str:
        return ""


class Reshape(Bijector):
    """Volume-preserving reshape of the event, e.g. a flattened 8x8 lattice and back.

    Arguments:
        event_shape: input (data-side) event shape.
        latent_shape: output event shape; must hold as many elements.
    """

    ladj_is_constant = True

    def __init__(self, event_shape: Sequence[int], latent_shape: Sequence[int]) -> None:
        super().__init__()
        self.event_shape = torch.Size(event_shape)
        self.latent_shape = torch.Size(latent_shape)
        if math.prod(self.event_shape) != math.prod(self.latent_shape):
            raise ValueError(
                f"Reshape: {tuple(self.event_shape)} and {tuple(self.latent_shape)} hold different numbers of elements"
            )

    def forward(self, x, context=None):
        batch = x.shape[: x.dim() - len(self.event_shape)]
        return x.reshape(*batch, *self.latent_shape), x.new_zeros(batch)

    def inverse(self, z, context=None):
        batch = z.shape[: z.dim() - len(self.latent_shape)]
        return z.reshape(*batch, *self.event_shape), z.new_zeros(batch)

    def forward_with_score(self, x, score, context=None):
        z, ladj = self.forward(x, context)
        return z, ladj, score.reshape(z.shape)

    def inverse_with_score(self, z, score, context=None):
        x, ladj = self.inverse(z, context)
        return x, ladj, score.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{tuple(self.event_shape)} -> {tuple(self.latent_shape)}"
