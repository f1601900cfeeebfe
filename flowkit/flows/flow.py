r"""The flow: a bijector over a base distribution.

`Flow(bijector, base)` models `x = f^{-1}(z)`, `z ~ base`, with density

$$
\log p(x) = \log p_Z(f(x)) + \log |\det J_f(x)|.
$$
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.distributions import constraints

from .._validation import check_point, outermost
from ..bijectors import Bijector, Chain, Standardization
from ..distributions import Distribution
from ..domains import Domain
from ..utils import aggregates_auxiliary_loss, auxiliary_loss
from .base import FlowModel, draw_latent, expand_context

__all__ = ["Flow", "FlowDistribution"]


class Flow(FlowModel):
    """Normalizing flow: a [`Bijector`][flowkit.bijectors.Bijector] (data -> latent) over a base distribution.

    Arguments:
        bijector: the transform, data to latent in its forward direction.
        base: the latent distribution; its event shape must be the bijector's latent shape.

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.RealNVP(features=2, transforms=2)
        >>> flow.log_prob(torch.randn(5, 2)).shape
        torch.Size([5])
    """

    bijective = True

    def __init__(self, bijector: Bijector, base: Distribution) -> None:
        super().__init__()
        if not isinstance(bijector, Bijector):
            raise ValueError(f"Flow: bijector must be a flowkit Bijector, got {type(bijector).__name__}")
        if not isinstance(base, Distribution):
            raise ValueError(f"Flow: base must be a flowkit Distribution, got {type(base).__name__}")
        if tuple(base.event_shape) != tuple(bijector.latent_shape):
            raise ValueError(
                f"Flow: the base's event shape {tuple(base.event_shape)} differs from the bijector's "
                f"latent shape {tuple(bijector.latent_shape)}"
            )
        self.bijector = bijector
        self.base = base

    @property
    def event_shape(self) -> torch.Size:
        return self.bijector.event_shape

    def _random_layers(self) -> list[str]:
        """The layers whose log-determinant is a random estimate (`ladj_is_exact` False)."""
        return [type(m).__name__ for m in self.bijector.modules() if not getattr(m, "ladj_is_exact", True)]

    @property
    def exact_log_prob(self) -> bool:  # type: ignore[override]
        """True unless a layer's log-determinant is a random estimate (Hutchinson's trace), which no weight may use."""
        return not self._random_layers()

    samples_match_density = exact_log_prob  # type: ignore[assignment]

    @property
    def sampler_mismatch(self) -> str:  # type: ignore[override]
        layers = self._random_layers()
        return (
            f"the log-determinant of {', '.join(sorted(set(layers)))} is a random estimate (trace='hutchinson'), "
            "unbiased for training but not the exact density of the samples; use trace='exact'"
            if layers
            else ""
        )

    @property
    def context_features(self) -> int:
        return self.bijector.context_features

    @property
    def domain(self) -> Domain:
        """The set the data live in: the bijector's."""
        return self.bijector.domain

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log density `log p(x)` of events `x` of shape `(..., *event_shape)`; returns the batch shape."""
        return self._log_density(x, context, "Flow.log_prob")

    def _log_density(self, x: Tensor, context: Tensor | None, where: str) -> Tensor:
        with outermost() as check:
            if check:
                check_point(self, x, context, "forward", where)
            z, ladj = self.bijector(x, context)
            return self.base.log_prob(z) + ladj

    def path_log_likelihood(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """The log-likelihood of data on path space, which for a flow is [`log_prob`][flowkit.flows.Flow.log_prob].

        Objectives that also train stochastic flows
        ([`StochasticFlow`][flowkit.flows.StochasticFlow]) call this one
        method on either kind.
        """
        return self._log_density(x, context, "Flow.path_log_likelihood")

    def path_log_likelihood_with_integrals(
        self, x: Tensor, context: Tensor | None = None, names: Sequence[str] = ()
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """`log_prob` and the integrals of its ODE layers' solves (`bijector.forward_with_integrals`)."""
        with outermost() as check:
            if check:
                check_point(self, x, context, "forward", "Flow.path_log_likelihood_with_integrals")
            z, ladj, integrals = self.bijector.forward_with_integrals(x, context, names=names)
            return self.base.log_prob(z) + ladj, integrals

    def rsample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Reparameterised samples and their log density in one pass through the bijector."""
        return self.latent_to_data(draw_latent(self, shape, context, "Flow.rsample_and_log_prob"), context)

    def latent_to_data(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""$x = f^{-1}(z)$ by `bijector.inverse` and $\log q(x) = \log p_Z(z) - \log |\det J_{f^{-1}}(z)|$."""
        context = expand_context(context, z, len(self.bijector.latent_shape))
        with outermost():  # the latent points are the base's own: nothing to check
            x, ladj = self.bijector.inverse(z, context)
            return x, self.base.log_prob(z) - ladj

    def rsample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Reparameterised samples of shape `(*shape, *context_batch, *event_shape)`."""
        z = draw_latent(self, shape, context, "Flow.rsample")
        context = expand_context(context, z, len(self.bijector.latent_shape))
        with outermost():
            return self.bijector.inverse(z, context)[0]

    def with_base(self, base: Distribution) -> Flow:  # type: ignore[override]
        return Flow(self.bijector, base)

    @aggregates_auxiliary_loss
    def auxiliary_loss(self) -> Tensor | None:
        """Regularisers of the bijector's layers (`None` when there are none)."""
        return auxiliary_loss(self.bijector)

    def standardized(self, x: Tensor, robust: bool = False) -> Flow:
        """`Flow(Chain(Standardization.from_data(x, robust), self.bijector), self.base)`."""
        return Flow(Chain(data_standardization(self, x, robust), self.bijector), self.base)

    def standardize_(self, x: Tensor, robust: bool = False) -> None:
        """Put the standardisation first in the bijector unless it starts with one; saved as a `Flow` of the chain."""
        if not self.bijector.standardizes_data:
            self.bijector = self.standardized(x, robust).bijector
            object.__setattr__(self, "_flowkit_config", (Flow, {"bijector": self.bijector, "base": self.base}))

    @property
    def spline_bound(self) -> float | None:
        return None if self.bijector.standardizes_data else super().spline_bound

    def to_distribution(self, context: Tensor | None = None) -> FlowDistribution:
        """Wrap the flow (at a fixed context) as a `torch.distributions.Distribution`."""
        return FlowDistribution(self, context)


class FlowDistribution(torch.distributions.Distribution):
    """A [`Flow`][flowkit.flows.Flow] seen as a `torch.distributions.Distribution` (for Pyro or torch code).

    Built by a model's `to_distribution` (a `Flow`'s, or a [`FreeFormFlow`][flowkit.flows.FreeFormFlow]'s).

    Arguments:
        flow: the flow (any model with `log_prob`, `rsample`, `sample` and `event_shape`).
        context: the context the distribution is conditioned on (batch shape = its leading shape).
    """

    arg_constraints: dict = {}
    has_rsample = True
    support = constraints.real

    def __init__(self, flow: FlowModel, context: Tensor | None = None) -> None:
        self.flow = flow
        self.context = context
        batch = context.shape[:-1] if context is not None else torch.Size()
        super().__init__(batch_shape=batch, event_shape=flow.event_shape, validate_args=False)

    def log_prob(self, value: Tensor) -> Tensor:
        return self.flow.log_prob(value, self.context)

    def rsample(self, sample_shape: torch.Size | Sequence[int] = torch.Size()) -> Tensor:
        return self.flow.rsample(sample_shape, self.context)

    def sample(self, sample_shape: torch.Size | Sequence[int] = torch.Size()) -> Tensor:
        return self.flow.sample(sample_shape, self.context)


def data_standardization(flow: FlowModel, x: Tensor, robust: bool) -> Standardization:
    """`Standardization.from_data(x, robust)` in the dtype and device of `flow.base`, for data `(N, D)` that fit it."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        kind = f"a {x.dtype} tensor" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"standardize: x must be a floating-point torch.Tensor, got {kind}")
    if len(flow.event_shape) != 1 or x.dim() != 2 or x.shape[1] != flow.event_shape[0]:
        raise ValueError(
            f"standardize: data of shape {tuple(x.shape)} do not fit a flow on events of shape "
            f"{tuple(flow.event_shape)}"
        )
    # The layer takes the flow's dtype and device (the statistics are exact in float64).
    return Standardization.from_data(x, robust=robust).to(device=flow.base.device, dtype=flow.base.dtype)
