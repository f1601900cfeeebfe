"""The [`Bijector`][flowkit.bijectors.Bijector] base class and the ways to combine bijectors.

Direction convention (as in nflows and zuko): `forward` maps data `x` to latent `z` and returns `log|det dz/dx|` summed
over the event dimensions; `inverse` maps `z` back to `x` and returns `log|det dx/dz|`, which is minus the forward value
at the matching point. A flow's density is `log p(x) = log p_Z(f(x)) + log|det J_f(x)|`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_point, outermost
from ..domains import Domain, Real
from ..utils import as_shape

__all__ = ["Bijector", "Chain", "Invert", "Reshape", "check_composition", "context_for"]


#: Entry points whose input is checked at the outermost call, and the side of the bijector it lives on.
_CHECKED_METHODS = {
    "forward": "forward",
    "forward_with_integrals": "forward",
    "call": "forward",
    "inverse": "inverse",
    "inverse_call": "inverse",
}


def _checked(method: Callable, name: str) -> Callable:
    direction = _CHECKED_METHODS[name]

    @functools.wraps(method)
    def wrapper(self: Bijector, x: Tensor, context: Tensor | None = None, **kwargs: Any):
        with outermost() as check:
            if check:
                check_point(self, x, context, direction, f"{self._get_name()}.{name}")
            return method(self, x, context, **kwargs)

    wrapper._flowkit_checked = True  # type: ignore[attr-defined]
    return wrapper


def _wrap_entry_points(cls: type) -> None:
    for name in _CHECKED_METHODS:
        method = cls.__dict__.get(name)
        if method is not None and not getattr(method, "_flowkit_checked", False):
            setattr(cls, name, _checked(method, name))


class Bijector(Configurable, nn.Module):
    """Invertible map between data `x` and latent `z` with its log-determinant.

    Subclasses set `event_shape` (and `latent_shape` when it differs) and implement
    [`forward`][flowkit.bijectors.base.Bijector.forward] and [`inverse`][flowkit.bijectors.base.Bijector.inverse]. A
    bijector knows its maps and nothing about training: objective-specific rules (the path-gradient score rules, for
    instance) are registered with the objectives, keyed by bijector type. Inputs are checked at the outermost call
    (shape, dtype, finiteness, context), so an error names the problem instead of surfacing deep inside torch.

    Attributes:
        event_shape: shape of one data event (`(D,)`, `(C, H, W)`, `(L, L)`).
        latent_shape: shape of one latent event (default: `event_shape`).
        context_features: size of the context vector (0 when unconditional).
        domain: the set the data live in ([`Real`][flowkit.domains.Real]
            unless the bijector acts on an interval, circle or sphere).
        ladj_is_constant: `True` when `log|det J|` does not depend on the input
            (linear layers, permutations, ActNorm); score matching drops these terms.
        ladj_is_exact: `False` when `log|det J|` is a random estimate (a continuous flow with
            Hutchinson's trace): unbiased for training, but not an importance weight's exact density.
        standardizes_data: `True` when the layer maps data of any location and scale to a standard range
            (a [`Standardization`][flowkit.bijectors.Standardization], fitted marginal CDFs), so that
            the layers after it need no standardisation of the data.
    """

    _flowkit_register = False
    event_shape: torch.Size
    context_features: int = 0
    domain: Domain = Real()
    ladj_is_constant: bool = False
    ladj_is_exact: bool = True
    standardizes_data: bool = False

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
        """Map data to latent: return `(z, log|det dz/dx|)`, the latter of batch shape."""
        raise NotImplementedError

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Map latent to data: return `(x, log|det dx/dz|)`, the latter of batch shape."""
        raise NotImplementedError

    def forward_with_integrals(
        self, x: Tensor, context: Tensor | None = None, *, names: Sequence[str] = ()
    ) -> tuple[Tensor, Tensor, list[dict[str, Tensor]]]:
        """`forward` and the integrals `names` of each solve of its ODE layers (`ContinuousFlow`'s; none here)."""
        return (*self(x, context), [])

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Return `z` alone; layers whose log-determinant is costly override this."""
        return self.forward(x, context)[0]

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        """Return `x` alone: the inverse without its log-determinant."""
        return self.inverse(z, context)[0]

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


_wrap_entry_points(Bijector)


def check_composition(layers: Sequence[Any], kinds: tuple[type, ...], where: str) -> int:
    """Check layers composed data side first (their kinds, chained shapes, one context size); return that size.

    Shared by [`Chain`][flowkit.bijectors.Chain] and the stochastic flows, whose layers may also be Markov kernels.

    Raises:
        ValueError: for no layers, a layer of another kind, a latent shape that is not the
            next layer's event shape, or layers that disagree on the number of context features.
    """
    if not layers:
        raise ValueError(f"{where} needs at least one layer")
    names = " or ".join(f"flowkit {kind.__name__}" for kind in kinds)
    for i, layer in enumerate(layers):
        if not isinstance(layer, kinds):
            raise ValueError(f"{where}: layer {i} is a {type(layer).__name__}, not a {names}")
    for i, (a, b) in enumerate(zip(layers[:-1], layers[1:], strict=False)):
        if tuple(a.latent_shape) != tuple(b.event_shape):
            raise ValueError(
                f"{where}: layer {i} outputs events of shape {tuple(a.latent_shape)} but layer {i + 1} "
                f"expects {tuple(b.event_shape)}; insert a Reshape"
            )
    contexts = {layer.context_features for layer in layers if layer.context_features}
    if len(contexts) > 1:
        raise ValueError(f"{where}: layers disagree on the number of context features: {sorted(contexts)}")
    return contexts.pop() if contexts else 0


def context_for(layer: Bijector, context: Tensor | None) -> Tensor | None:
    """The context a layer of a composition receives: the composition's, or `None` for an unconditional layer.

    A chain may mix conditional layers with unconditional ones (permutations, linear
    layers, couplings built without context); these must not see the context.
    """
    return context if layer.context_features else None


class Chain(Bijector):
    """Composition of bijectors, applied in order in the forward direction.

    `Chain(f1, f2, f3).forward(x)` computes `f3(f2(f1(x)))` and adds the log-determinants; `inverse` runs the layers
    backwards. The layers are exposed in order through iteration and indexing, so that path-gradient estimators and
    stochastic flows can walk them one by one.

    Arguments:
        bijectors: the layers, data side first.
    """

    def __init__(self, *bijectors: Bijector) -> None:
        super().__init__()
        self.context_features = check_composition(bijectors, (Bijector,), "Chain")
        self.layers = nn.ModuleList(bijectors)
        self.event_shape = bijectors[0].event_shape
        self.latent_shape = bijectors[-1].latent_shape
        self.domain = bijectors[0].domain
        self.ladj_is_constant = all(b.ladj_is_constant for b in bijectors)
        self.standardizes_data = bijectors[0].standardizes_data

    def __iter__(self) -> Iterator[Bijector]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Bijector:
        return self.layers[i]

    def _ladj_zero(self, x: Tensor, event_shape: torch.Size) -> Tensor:
        return x.new_zeros(x.shape[: x.dim() - len(event_shape)])

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        total = self._ladj_zero(x, self.event_shape)
        for layer in self.layers:
            x, ladj = layer(x, context_for(layer, context))
            total = total + ladj
        return x, total

    def forward_with_integrals(
        self, x: Tensor, context: Tensor | None = None, *, names: Sequence[str] = ()
    ) -> tuple[Tensor, Tensor, list[dict[str, Tensor]]]:
        total, integrals = self._ladj_zero(x, self.event_shape), []
        for layer in self.layers:
            x, ladj, more = layer.forward_with_integrals(x, context_for(layer, context), names=names)
            total, integrals = total + ladj, integrals + more
        return x, total, integrals

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        total = self._ladj_zero(z, self.latent_shape)
        for layer in reversed(self.layers):
            z, ladj = layer.inverse(z, context_for(layer, context))
            total = total + ladj
        return z, total

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer.call(x, context_for(layer, context))
        return x

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        for layer in reversed(self.layers):
            z = layer.inverse_call(z, context_for(layer, context))
        return z

    def extra_repr(self) -> str:
        return ""


class Invert(Bijector):
    """Swap the directions of a bijector: `Invert(b).forward = b.inverse`.

    Arguments:
        bijector: the bijector to invert.
    """

    def __init__(self, bijector: Bijector) -> None:
        super().__init__()
        if not isinstance(bijector, Bijector):
            raise ValueError(f"Invert: {type(bijector).__name__} is not a flowkit Bijector")
        self.bijector = bijector
        self.event_shape = bijector.latent_shape
        self.latent_shape = bijector.event_shape
        self.context_features = bijector.context_features
        self.ladj_is_constant = bijector.ladj_is_constant

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.bijector.inverse(x, context)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.bijector(z, context)

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self.bijector.inverse_call(x, context)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self.bijector.call(z, context)

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
        self.event_shape, self.latent_shape = as_shape(event_shape), as_shape(latent_shape)
        if math.prod(self.event_shape) != math.prod(self.latent_shape):
            raise ValueError(
                f"Reshape: {tuple(self.event_shape)} and {tuple(self.latent_shape)} hold different numbers of elements"
            )

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = x.shape[: x.dim() - len(self.event_shape)]
        return x.reshape(*batch, *self.latent_shape), x.new_zeros(batch)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = z.shape[: z.dim() - len(self.latent_shape)]
        return z.reshape(*batch, *self.event_shape), z.new_zeros(batch)

    def extra_repr(self) -> str:
        return f"{tuple(self.event_shape)} -> {tuple(self.latent_shape)}"
