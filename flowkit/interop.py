"""Interoperation with zuko and nflows: their transforms as flowkit bijectors, flowkit flows as zuko-style lazy flows.

Both libraries share flowkit's direction convention: a flow's transform maps data
`x` to latent `z`, and `log p(x) = log p_Z(z) + log|det dz/dx|`. So a wrapped
transform is a flowkit [`Bijector`][flowkit.bijectors.Bijector] with no change of
sign: [`ZukoBijector`][flowkit.interop.ZukoBijector] takes a zuko transform
(`zuko.transforms.Transform`, or any `torch.distributions.Transform`) or a lazy
transform (`zuko.lazy.LazyTransform`, such as `zuko.flows.MAF(...).transform`, called
with the context to build the transform), and
[`NflowsBijector`][flowkit.interop.NflowsBijector] an `nflows.transforms.Transform`.
The wrapped module's parameters are the bijector's, so it trains inside
[`Chain`][flowkit.bijectors.Chain], [`Flow`][flowkit.flows.Flow] and
[`fit`][flowkit.train.fit] with any objective, and
[`check_bijector`][flowkit.testing.check_bijector] checks it.

The other way, [`ZukoStyleFlow`][flowkit.interop.ZukoStyleFlow] is a flowkit flow as a
zuko lazy distribution: `lazy(c)` returns a `torch.distributions.Distribution` with
`log_prob`, `sample`, `rsample` and `rsample_and_log_prob`, so code written for zuko
flows (`flow(c).log_prob(x)`) runs on a flowkit flow.

Neither library is imported here: the wrappers only call the objects they are given.
Wrapped bijectors are not saved by [`flowkit.io`][flowkit.io] (their constructor
arguments are another library's objects); save the flow's `state_dict` with torch.

Examples:
    >>> import torch, zuko, flowkit
    >>> from flowkit.interop import ZukoBijector
    >>> maf = zuko.flows.MAF(features=3, context=0, transforms=2, hidden_features=(16,))
    >>> flow = flowkit.flows.Flow(ZukoBijector(maf.transform, (3,)), flowkit.distributions.StandardNormal((3,)))
    >>> x = torch.randn(5, 3)
    >>> torch.allclose(flow.log_prob(x), maf().log_prob(x), atol=1e-5)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import Transform as TorchTransform

from .bijectors import Bijector
from .domains import Domain, Real
from .flows import Flow, FlowDistribution

__all__ = ["ZukoBijector", "NflowsBijector", "ZukoStyleFlow", "ZukoStyleDistribution", "to_zuko"]


def _shape(shape: int | Sequence[int], name: str, where: str) -> torch.Size:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(f"{where}: {name} must be a positive integer or a tuple of them, got {shape!r}")
    return torch.Size(dims)


def _context_features(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: context_features must be a non-negative integer, got {value!r}")
    return value


def _set_shapes(
    bijector: Bijector,
    event_shape: int | Sequence[int],
    context_features: int,
    latent_shape: int | Sequence[int] | None,
    domain: Domain | None,
    where: str,
) -> None:
    """Check and set a wrapper's event and latent shapes, context size and domain."""
    bijector.context_features = _context_features(context_features, where)
    bijector.event_shape = _shape(event_shape, "event_shape", where)
    if latent_shape is not None:
        bijector.latent_shape = _shape(latent_shape, "latent_shape", where)
    bijector.domain = domain if domain is not None else Real()
    if not isinstance(bijector.domain, Domain):
        raise ValueError(f"{where}: domain must be a flowkit Domain, got {type(bijector.domain).__name__}")


def _to_batch(ladj: Tensor, x: Tensor, event_dims: int, where: str) -> Tensor:
    """The log-determinant summed over the event dimensions (a univariate transform gives one per element)."""
    batch = x.shape[: x.dim() - event_dims]
    if ladj.shape == batch:
        return ladj
    extra = ladj.dim() - len(batch)
    if extra < 0 or ladj.shape[: len(batch)] != batch:
        raise ValueError(
            f"{where}: the wrapped transform returned a log-determinant of shape {tuple(ladj.shape)} "
            f"for inputs of shape {tuple(x.shape)}; expected the batch shape {tuple(batch)} or the input's"
        )
    return ladj.flatten(len(batch)).sum(-1) if extra else ladj


class ZukoBijector(Bijector):
    r"""A zuko transform or lazy transform as a flowkit bijector.

    `forward(x, context)` builds the transform (`transform(context)` for a lazy one, the
    transform itself otherwise) and returns its `call_and_ladj(x)`; `inverse` uses
    `transform.inv`. A univariate transform's elementwise log-determinant (zuko's
    `ExpTransform`, `SoftclipTransform`, ...) is summed over the event dimensions:

    $$
    \log|\det \partial z / \partial x| = \sum_i \log|\partial z_i / \partial x_i| .
    $$

    Any `torch.distributions.Transform` works (through `log_abs_det_jacobian` when it
    has no `call_and_ladj`). A lazy transform is a module: its parameters train with the
    flow. A plain transform holding tensors keeps their dtype (float64 checks need a
    lazy transform or one without tensors).

    Arguments:
        transform: a `zuko.transforms.Transform` (any `torch.distributions.Transform`), or a
            lazy transform (`zuko.lazy.LazyTransform`, any module called as `transform(context)`
            that returns one; `transform()` when unconditional).
        event_shape: shape of one data event, e.g. `(D,)`.
        context_features: size of the context vector a lazy transform is called with (0: none).
        latent_shape: shape of one latent event (default: `event_shape`).
        domain: the set the data live in (default [`Real`][flowkit.domains.Real]).

    References:
        Rozet et al., *Zuko: Normalizing flows in PyTorch* (2022), https://github.com/probabilists/zuko.
    """

    _flowkit_register = False  # its arguments are zuko objects: not saved by flowkit.io

    def __init__(
        self,
        transform: Any,
        event_shape: int | Sequence[int],
        context_features: int = 0,
        latent_shape: int | Sequence[int] | None = None,
        domain: Domain | None = None,
    ) -> None:
        super().__init__()
        where = "ZukoBijector"
        if isinstance(transform, TorchTransform):
            self.lazy = False
            self._fixed = transform
        elif isinstance(transform, nn.Module) and callable(transform):
            self.lazy = True
            self.transform = transform
        else:
            raise ValueError(
                f"{where}: transform must be a zuko (torch.distributions) Transform or a lazy transform module, "
                f"got {type(transform).__name__}"
            )
        _set_shapes(self, event_shape, context_features, latent_shape, domain, where)
        if self.context_features and not self.lazy:
            raise ValueError(f"{where}: a fixed transform takes no context; pass a lazy transform for context")

    def build(self, context: Tensor | None = None) -> TorchTransform:
        """The transform at `context`: `transform(context)` for a lazy transform, else the transform."""
        if not self.lazy:
            return self._fixed
        built = self.transform(context) if self.context_features else self.transform()
        if not isinstance(built, TorchTransform):
            raise ValueError(f"ZukoBijector: the lazy transform returned a {type(built).__name__}, not a Transform")
        return built

    @staticmethod
    def _call_and_ladj(transform: TorchTransform, x: Tensor) -> tuple[Tensor, Tensor]:
        if hasattr(transform, "call_and_ladj"):
            return transform.call_and_ladj(x)
        y = transform(x)
        return y, transform.log_abs_det_jacobian(x, y)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, ladj = self._call_and_ladj(self.build(context), x)
        return z, _to_batch(ladj, x, len(self.event_shape), "ZukoBijector.forward")

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, ladj = self._call_and_ladj(self.build(context).inv, z)
        return x, _to_batch(ladj, z, len(self.latent_shape), "ZukoBijector.inverse")

    def extra_repr(self) -> str:
        kind = "lazy" if self.lazy else type(self._fixed).__name__
        return f"event_shape={tuple(self.event_shape)}, {kind}"


class NflowsBijector(Bijector):
    """An nflows transform as a flowkit bijector.

    nflows transforms map data to noise in `forward(inputs, context)` and return
    `(outputs, logabsdet)` of batch shape, as flowkit bijectors do; they expect a
    batch of one leading dimension, so other batch shapes are flattened and restored.
    The transform's parameters are the bijector's.

    Arguments:
        transform: an `nflows.transforms.Transform` (a module with `forward(inputs, context)`
            and `inverse(inputs, context)`, each returning `(outputs, logabsdet)`).
        event_shape: shape of one data event, e.g. `(D,)`.
        context_features: size of the context vector (0: none).
        latent_shape: shape of one latent event (default: `event_shape`).
        domain: the set the data live in (default [`Real`][flowkit.domains.Real]).

    References:
        Durkan et al., *nflows: normalizing flows in PyTorch* (2020), https://github.com/bayesiains/nflows.
    """

    _flowkit_register = False  # its argument is an nflows module: not saved by flowkit.io

    def __init__(
        self,
        transform: nn.Module,
        event_shape: int | Sequence[int],
        context_features: int = 0,
        latent_shape: int | Sequence[int] | None = None,
        domain: Domain | None = None,
    ) -> None:
        super().__init__()
        where = "NflowsBijector"
        if not (isinstance(transform, nn.Module) and callable(getattr(transform, "inverse", None))):
            raise ValueError(
                f"{where}: transform must be an nflows Transform (a module with forward and inverse), "
                f"got {type(transform).__name__}"
            )
        self.transform = transform
        _set_shapes(self, event_shape, context_features, latent_shape, domain, where)

    def _apply_flat(
        self, method: Callable[..., tuple[Tensor, Tensor]], x: Tensor, context: Tensor | None, shapes: tuple
    ) -> tuple[Tensor, Tensor]:
        inner, outer = shapes
        batch = x.shape[: x.dim() - len(inner)]
        flat = x.reshape(-1, *inner)
        if context is not None:
            context = context.expand(*batch, context.shape[-1]).reshape(-1, context.shape[-1])
        y, ladj = method(flat, context=context) if self.context_features else method(flat)
        return y.reshape(*batch, *outer), ladj.reshape(batch)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._apply_flat(self.transform.forward, x, context, (self.event_shape, self.latent_shape))

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._apply_flat(self.transform.inverse, z, context, (self.latent_shape, self.event_shape))


class ZukoStyleDistribution(FlowDistribution):
    """A flow at a fixed context as a `torch.distributions.Distribution`, with zuko's `rsample_and_log_prob`.

    Its batch shape is the context's leading shape; values of shape
    `(*sample_shape, *batch_shape, *event_shape)` are scored against the context
    broadcast to them, as in zuko.

    Arguments:
        flow: the flow.
        context: the context (None for an unconditional flow).
    """

    def _context_for(self, value: Tensor) -> Tensor | None:
        if self.context is None:
            return None
        batch = value.shape[: value.dim() - len(self.event_shape)]
        return self.context.expand(*batch, self.context.shape[-1])

    def log_prob(self, value: Tensor) -> Tensor:
        return self.flow.log_prob(value, self._context_for(value))

    def rsample_and_log_prob(self, sample_shape: torch.Size | Sequence[int] = torch.Size()) -> tuple[Tensor, Tensor]:
        """Reparameterised samples and their log density in one pass (zuko's `NormalizingFlow` method)."""
        return self.flow.rsample_and_log_prob(tuple(sample_shape), self.context)


class ZukoStyleFlow(nn.Module):
    """A flowkit flow as a zuko lazy distribution: `lazy(c)` is the distribution `p(x | c)`.

    Code written for zuko's flows runs unchanged: `lazy(c).log_prob(x)`,
    `lazy().sample((n,))`, `lazy(c).rsample_and_log_prob((n,))`. The flow's
    parameters are the module's, so `lazy.parameters()` trains it.

    Arguments:
        flow: a flowkit [`Flow`][flowkit.flows.Flow].
    """

    def __init__(self, flow: Flow) -> None:
        super().__init__()
        if not getattr(flow, "bijective", False):
            raise ValueError(f"ZukoStyleFlow: flow must be a flowkit Flow, got {type(flow).__name__}")
        self.flow = flow

    def forward(self, c: Tensor | None = None) -> ZukoStyleDistribution:
        """The distribution at context `c` (None for an unconditional flow)."""
        return ZukoStyleDistribution(self.flow, c)


def to_zuko(flow: Flow) -> ZukoStyleFlow:
    """`flow` as a zuko-style lazy distribution ([`ZukoStyleFlow`][flowkit.interop.ZukoStyleFlow])."""
    return ZukoStyleFlow(flow)
