r"""The flow contract: what the fit loop, the samplers, the checks and `flowkit.io` may call on a model.

Every model flowkit trains or samples from implements
[`FlowModel`][flowkit.flows.base.FlowModel]: a [`Flow`][flowkit.flows.Flow] (a bijector over a base),
a [`StochasticFlow`][flowkit.flows.StochasticFlow] (bijectors and Markov kernels, a density on
path space only), [`Dequantized`][flowkit.flows.images.Dequantized] (a flow on `[0, 1]` images
as a model of integer images, whose `log_prob` is a variational lower bound) and the free-form models
[`FreeFormFlow`][flowkit.flows.FreeFormFlow] and [`InjectiveFlow`][flowkit.flows.InjectiveFlow] (an encoder
$f$ that gives the density and a decoder $g \approx f^{-1}$ that draws the samples). Callers are typed against
it and ask its abilities (`exact_log_prob`, `samples_match_density`, `bijective`, `free_form`,
`latent_to_data`) instead of testing for a class; no module outside `flows/` and `io` does:

| member | `Flow` | `StochasticFlow` | `Dequantized` | `FreeFormFlow` | `InjectiveFlow` |
|---|---|---|---|---|---|
| `event_shape`, `context_features` | yes | yes | yes | yes | yes |
| `log_prob(x)` | exact | raises (no density) | a lower bound | exact, through $f$ | on the manifold, at $f(x)$ |
| `path_log_likelihood(x)` | `log_prob` | log-likelihood on path space (random) | the bound | `log_prob` | `log_prob` |
| `sample(shape)` | yes | yes | integer images | $g(z)$ | $g(z)$ |
| `rsample_and_log_prob(shape)` | yes | raises | no | $g(z)$, `log_prob` there | $g(z)$, `log_prob` there |
| `latent_to_data(z)` | $f^{-1}(z)$, $\log q$ | path end, path density | raises | $g(z)$, `log_prob` | the same |
| `to_distribution()` | yes | no | no | yes | raises (no density on $\mathbb{R}^D$) |
| `auxiliary_loss()` | the layers' regularisers | the layers' | the flow's | none | none |
| `path_log_likelihood_with_integrals` | with its ODE layers' integrals | none | none | none | none |
| `standardized(x)`, `standardize_(x)` | yes | raises | raises | `standardized` | raises |
| `spline_bound` | unless its first layer scales the data | its splines' | its splines' | none | none |
| `exact_log_prob` | True[^random] | False | False | True | True |
| `samples_match_density` | True[^random] | True | False | False | False |
| `bijective` | True | False | False | False | False |
| `free_form` | False | False | False | True | True |
| `with_base(base)` | yes | raises | raises | raises | raises |

[^random]: False when a layer's log-determinant is a random estimate (`ladj_is_exact` False: a
    [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow] with Hutchinson's trace), unbiased for training
    but no exact density for an importance weight.

`path_log_likelihood` is what maximum likelihood maximises on any of them: the exact log density of a
flow, the path-space likelihood of a stochastic flow, the dequantisation bound of an integer model.

Importance weighting needs more than a density: the weight of a sample $x \sim q$ is
$\log w = -u(x) - \log q(x)$, and $E_q[w] = Z$ only when $q$ is the law the samples are drawn from.
`samples_match_density` says that it is: a `Flow` samples by the exact inverse of the one bijection whose
change of variables is its `log_prob`; a `StochasticFlow`'s samples are the end points of the paths whose
exact weights `sample_with_log_weights` returns. A free-form flow's samples come from its decoder and its
density from its encoder; they agree only as far as training made $g = f^{-1}$, so its weights, and the
log Z, ESS, AIS, FAB, IMH, NeuTra and reverse-KL estimates built on them, would be wrong without any
sign of it (with $f = I$, $g = 3I$, AIS on a target with $\log Z = 3.22$ returned $15.8 \pm 0.8$).
Every importance-weighting path asks [`require_exact_weights`][flowkit.flows.base.require_exact_weights],
which refuses such a model with a `ValueError` that names it and says why; AIS, FAB and path-gradient
training, which also evaluate `log_prob` along the way, ask it for an exact density too.

[`flowkit.sampling`][flowkit.sampling] computes the weights $\log w = -u(x) - \log q$ from the
latent-to-data map `latent_to_data(z)`: $x = T(z)$ and $\log q$ (a stochastic flow's path density).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_context, module_dtype, outermost
from ..utils import as_shape

__all__ = ["FlowModel", "require_exact_weights"]


class FlowModel(Configurable, nn.Module, ABC):
    """The abstract base of flowkit's models (see the table of [the flow contract][flowkit.flows.base]).

    A subclass implements `event_shape`, `log_prob` (or raises a ValueError that says what to use
    instead), `rsample` (or `sample`) and, where they differ from the defaults, `path_log_likelihood`,
    `rsample_and_log_prob`, `auxiliary_loss` and `latent_to_data`, and
    sets the abilities `exact_log_prob`, `samples_match_density` (with `sampler_mismatch` saying why, when
    False), `bijective` and `free_form`. A model that cannot offer `rsample_and_log_prob` or
    `to_distribution` either lacks it or raises an error that says why (see the contract's table).
    """

    _flowkit_register: ClassVar[bool] = False  # abstract: nothing to save by itself

    #: Whether `log_prob` is the model's exact normalised log density (objectives that need one check this).
    exact_log_prob: ClassVar[bool] = True

    #: Whether samples are drawn from exactly the law the model's weights describe: the inverse of the one
    #: bijection whose change of variables is `log_prob`, or the paths whose weights `sample_with_log_weights`
    #: returns. Importance weights, log Z, ESS, AIS, FAB, IMH and reverse KL need it.
    samples_match_density: ClassVar[bool] = True

    #: Why the samples do not match the density, for error messages (where `samples_match_density` is False).
    sampler_mismatch: ClassVar[str] = ""

    #: Whether the model is one bijector `bijector` (data to latent) over a base `base`, sampled by its exact
    #: inverse: what walks its layers needs it (the path-gradient score rules of the `"fast"` and `"standard"`
    #: reverse-KL estimators and of the forward KL, score matching's constant log-dets, `check_flow`).
    bijective: ClassVar[bool] = False

    #: Whether the model is a free-form pair of an encoder `f` and a decoder `g` (`encode`, `decode`,
    #: `preprocess`, `features`, `latent_features`), trained by `FreeFormLikelihood` to make `g` invert `f`.
    free_form: ClassVar[bool] = False

    @property
    @abstractmethod
    def event_shape(self) -> torch.Size:
        """The shape of one event (data point)."""

    @property
    def context_features(self) -> int:
        """The number of context features a conditional model takes (0: unconditional)."""
        return 0

    @abstractmethod
    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log density of events `x` `(..., *event_shape)`, with the batch shape."""

    def path_log_likelihood(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """The log-likelihood that maximum likelihood maximises (see the contract's table; default `log_prob`)."""
        return self.log_prob(x, context)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Same as `log_prob`."""
        return self.log_prob(x, context)

    @torch.no_grad()
    def sample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Samples of shape `(*shape, *context_batch, *event_shape)`, without gradients (the model's `rsample`)."""
        return self.rsample(shape, context)

    @torch.no_grad()
    def sample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Samples and their log density, without gradients (the model's `rsample_and_log_prob`)."""
        return self.rsample_and_log_prob(shape, context)

    def auxiliary_loss(self) -> Tensor | None:
        """The sum of the layers' regularisers, added to the objective by the fit loop (None: none, the default)."""
        return None

    def latent_to_data(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""The latent-to-data map: samples $x = T(z)$ of latent points `z` of the base, and $\log q$ there.

        $\log q$ is the log density of the samples' law at $x$ (for a stochastic flow, the path density
        $\log p_Z(z) - \sum_t \Delta S_t$), so that $-u(x) - \log q$ is the importance weight of $x$ for a
        target $e^{-u}$ where `samples_match_density` holds
        ([`log_weights_at`][flowkit.sampling.importance.log_weights_at]). Reparameterised.

        Arguments:
            z: latent points `(*batch, *base.event_shape)`.
            context: context for conditional models (broadcast to the batch).

        Returns:
            `(x, log_q)` of shapes `(*batch, *event_shape)` and `batch`; a model without such a map raises.
        """
        raise ValueError(f"{type(self).__name__}.latent_to_data: the model has no map from latent points to data")

    def sample_with_log_weights(
        self, n: int | Sequence[int], target: Any, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Deprecated: [`sampling.sample_with_log_weights`][flowkit.sampling.importance.sample_with_log_weights]."""
        z = draw_latent(self, n, context, "sample_with_log_weights")
        return self._weights("sample_with_log_weights", z, target, context)

    def log_weights_at(self, z: Tensor, target: Any, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Deprecated: [`flowkit.sampling.log_weights_at`][flowkit.sampling.importance.log_weights_at]."""
        return self._weights("log_weights_at", z, target, context)

    def _weights(self, name: str, z: Tensor, target: Any, context: Tensor | None) -> tuple[Tensor, Tensor]:
        """The deprecated methods' `x` and `-u(x) - log q` (the energy `target.energy(x)` or `-target.log_prob(x)`)."""
        where = f"{type(self).__name__}.{name}"
        warnings.warn(f"{where} moved to flowkit.sampling.{name}(flow, ...)", DeprecationWarning, stacklevel=3)
        require_exact_weights(self, where)
        x, log_q = self.latent_to_data(z, context)
        return x, -(target.energy(x) if hasattr(target, "energy") else -target.log_prob(x)) - log_q

    def path_log_likelihood_with_integrals(
        self, x: Tensor, context: Tensor | None = None, names: Sequence[str] = ()
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """`path_log_likelihood` and the integrals `names` of each solve of its ODE layers (none by default)."""
        return self.path_log_likelihood(x, context), []

    def standardized(self, x: Tensor, robust: bool = False) -> FlowModel:
        """This model's layers behind a fixed standardisation of the data `x` (see `flowkit.data.standardize`)."""
        raise ValueError(f"standardize: {type(self).__name__} cannot put a standardisation first")

    def standardize_(self, x: Tensor, robust: bool = False) -> None:
        """Put `standardized`'s standardisation first, in place, unless the model's data are standardised already."""
        raise ValueError(f"standardize: {type(self).__name__} cannot standardise its data in place; use a Flow")

    @property
    def spline_bound(self) -> float | None:
        """The largest bound `B` of the splines the data meet unscaled (the identity outside `[-B, B]`), else None."""
        bounds = [float(m.bound) for m in self.modules() if isinstance(getattr(m, "bound", None), (int, float))]
        return max(bounds) if bounds else None

    def with_base(self, base: nn.Module) -> FlowModel:
        """The same layers (shared) over the latent distribution `base`; a ValueError where there are none."""
        raise ValueError(f"{type(self).__name__} is not a bijector over a base distribution: its base stays")


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


def require_exact_weights(flow: object, where: str, *, density: bool = False) -> None:
    r"""Refuse a model whose importance weights $-u(x) - \log q(x)$ of its own samples would be wrong.

    The one check every importance-weighting path makes (importance sampling, IMH, AIS, FAB, NeuTra and
    flow HMC, reverse-KL training): the model's samples must come from the law its weights describe
    (`samples_match_density`), and, with `density=True`, `log_prob` must be that law's exact density
    (`exact_log_prob`; a stochastic flow has path weights but no density).

    Arguments:
        flow: the model (a [`FlowModel`][flowkit.flows.base.FlowModel], or anything that forwards its attributes).
        where: the caller's name, which starts the message.
        density: also require an exact `log_prob`.

    Raises:
        ValueError: naming the model and what it lacks.
    """
    name = type(flow).__name__
    use = "use a Flow (an exact bijection)" + ("" if density else " or a StochasticFlow")
    if not getattr(flow, "samples_match_density", False):
        why = getattr(flow, "sampler_mismatch", "") or "it does not declare samples_match_density"
        raise ValueError(
            f"{where}: {name}'s samples do not come from the density it reports ({why}); importance weights "
            f"-u(x) - log q(x) of its samples, and the log Z, ESS, AIS and IMH built on them, would be wrong; {use}"
        )
    if density and not getattr(flow, "exact_log_prob", False):
        raise ValueError(
            f"{where}: needs a flow with an exact density, and {name}.log_prob is not one "
            f"(exact_log_prob is False); {use}"
        )
