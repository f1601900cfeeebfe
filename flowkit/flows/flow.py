r"""The flow: a bijector over a base distribution.

`Flow(bijector, base)` models `x = f^{-1}(z)`, `z ~ base`, with density

$$
\log p(x) = \log p_Z(f(x)) + \log |\det J_f(x)|.
$$
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import constraints

from .._validation import check_context, check_point, module_dtype, outermost
from ..bijectors import Bijector
from ..distributions import Distribution
from ..domains import Domain
from ..targets.evaluate import energy_of
from ..utils import aggregates_auxiliary_loss, as_shape, auxiliary_loss
from .base import FlowModel

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
        """True unless a layer's log-determinant is a random estimate (Hutchinson's trace)."""
        return not self._random_layers()

    @property
    def samples_match_density(self) -> bool:  # type: ignore[override]
        """True unless a layer's log-determinant is a random estimate, which no importance weight may use."""
        return not self._random_layers()

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
        ([`StochasticFlow`][flowkit.stochastic.StochasticFlow]) call this one
        method on either kind.
        """
        return self._log_density(x, context, "Flow.path_log_likelihood")

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Same as [`log_prob`][flowkit.flows.Flow.log_prob]."""
        return self.log_prob(x, context)

    def rsample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Reparameterised samples and their log density in one pass through the bijector."""
        z = draw_latent(self, shape, context, "Flow.rsample_and_log_prob")
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

    @torch.no_grad()
    def sample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Samples without gradients (see [`rsample`][flowkit.flows.Flow.rsample])."""
        return self.rsample(shape, context)

    @torch.no_grad()
    def sample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Samples and their log density, without gradients."""
        return self.rsample_and_log_prob(shape, context)

    def sample_with_log_weights(
        self, n: int | Sequence[int], target: Any, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""Reparameterised samples with their log importance weights for `target`.

        Draws `z` from the base, runs the sampling path `z -> x` through
        `bijector.inverse` and returns `x` with

        $$
        \log w = -u_X(x) - \log p_Z(z) + \sum_t \Delta S_t,
        $$

        where the layers' second outputs $\Delta S_t$ are `log|det dx/dz|` for
        bijections and the path-weight increments of stochastic blocks. Then
        `logsumexp(log_w) - log n` estimates `log Z_X` and `-mean(log_w)` is the
        reverse KL divergence on path space up to `log Z_X`. For a deterministic flow
        `log w = -u_X(x) - log q(x)`. Works with gradients (reparameterised): minimise
        `-log_w.mean()` to train by reverse KL.

        Arguments:
            n: number of samples (or a sample shape).
            target: anything with `energy(x)` (negative unnormalised log density), or a
                flowkit Distribution.
            context: context for conditional flows.

        Returns:
            `(x, log_w)` of shapes `(*n, *event_shape)` and `(*n,)` (times the context batch).
        """
        z = draw_latent(self, n, context, "Flow.sample_with_log_weights")
        return self.log_weights_at(z, target, context)

    def log_weights_at(self, z: Tensor, target: Any, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """[`sample_with_log_weights`][flowkit.flows.Flow.sample_with_log_weights] from given latent points `z`."""
        context = expand_context(context, z, len(self.bijector.latent_shape))
        with outermost():
            x, ladj = self.bijector.inverse(z, context)
            u = energy_of(target, x, len(self.event_shape), "Flow.sample_with_log_weights")
            return x, -u - self.base.log_prob(z) + ladj

    @aggregates_auxiliary_loss
    def with_base(self, base: Distribution) -> Flow:  # type: ignore[override]
        return Flow(self.bijector, base)

    def auxiliary_loss(self) -> Tensor | None:
        """Regularisers of the bijector's layers (`None` when there are none)."""
        return auxiliary_loss(self.bijector)

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


def draw_latent(flow: nn.Module, shape: int | Sequence[int], context: Tensor | None, where: str) -> Tensor:
    """Reparameterised latent points of shape `(*shape, *context_batch, *latent_shape)` from `flow.base`."""
    shape = as_shape(shape)
    with outermost() as check:
        if check:
            check_context(context, flow.context_features, None, dtype=module_dtype(flow), where=where)
    if context is not None:
        shape = shape + context.shape[:-1]
    return flow.base.rsample(shape)


def expand_context(context: Tensor | None, z: Tensor, latent_dims: int) -> Tensor | None:
    """The context broadcast to the batch shape of the latent points `z`."""
    if context is None:
        return None
    return context.expand(*z.shape[: z.dim() - latent_dims], context.shape[-1])
