r"""The flow contract: what the fit loop, the samplers, the checks and `flowkit.io` may call on a model.

Every model flowkit trains or samples from implements
[`FlowModel`][flowkit.flows.base.FlowModel]: a [`Flow`][flowkit.flows.Flow] (a bijector over a base),
a [`StochasticFlow`][flowkit.stochastic.StochasticFlow] (bijectors and Markov kernels, a density on
path space only), [`Dequantized`][flowkit.flows.images.Dequantized] (a flow on `[0, 1]` images
as a model of integer images, whose `log_prob` is a variational lower bound) and the free-form models
[`FreeFormFlow`][flowkit.flows.FreeFormFlow] and [`InjectiveFlow`][flowkit.flows.InjectiveFlow] (an encoder
$f$ that gives the density and a decoder $g \approx f^{-1}$ that draws the samples). Callers are typed against
it and ask `exact_log_prob` and `samples_match_density` instead of testing for a class:

| member | `Flow` | `StochasticFlow` | `Dequantized` | `FreeFormFlow` | `InjectiveFlow` |
|---|---|---|---|---|---|
| `event_shape`, `context_features` | yes | yes | yes | yes | yes |
| `log_prob(x)` | exact | raises (no density) | a lower bound | exact, through $f$ | on the manifold, at $f(x)$ |
| `path_log_likelihood(x)` | `log_prob` | log-likelihood on path space (random) | the bound | `log_prob` | `log_prob` |
| `sample(shape)` | yes | yes | integer images | $g(z)$ | $g(z)$ |
| `rsample_and_log_prob(shape)` | yes | raises | no | $g(z)$, `log_prob` there | $g(z)$, `log_prob` there |
| `to_distribution()` | yes | no | no | yes | raises (no density on $\mathbb{R}^D$) |
| `sample_with_log_weights(n, target)` | $-u(x) - \log q(x)$ | path weights | no | raises | raises |
| `auxiliary_loss()` | the layers' regularisers | the layers' | the flow's | none | none |
| `exact_log_prob` | True[^random] | False | False | True | True |
| `samples_match_density` | True[^random] | True | False | False | False |
| `trains_by_likelihood` | True | True | True | False | False |
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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from .._config import Configurable

__all__ = ["FlowModel", "require_exact_weights"]


class FlowModel(Configurable, nn.Module, ABC):
    """The abstract base of flowkit's models (see the module's table).

    A subclass implements `event_shape`, `log_prob` (or raises a ValueError that says what to use
    instead), `path_log_likelihood`, `sample` and `auxiliary_loss`, and sets `exact_log_prob` and
    `samples_match_density` (with `sampler_mismatch` saying why, when False). A model that cannot offer
    `rsample_and_log_prob`, `to_distribution` or `sample_with_log_weights` either lacks it or raises an
    error that says why (see the module's table).
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

    #: Whether maximum likelihood (of `path_log_likelihood`) trains the whole model; the free-form models'
    #: decoders get no gradient from it, and they train by [`FreeFormLikelihood`][flowkit.train.FreeFormLikelihood].
    trains_by_likelihood: ClassVar[bool] = True

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

    @abstractmethod
    def path_log_likelihood(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """The log-likelihood that maximum likelihood maximises (see the module's table)."""

    @abstractmethod
    def sample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Samples of shape `(*shape, *context_batch, *event_shape)`, without gradients."""

    @abstractmethod
    def auxiliary_loss(self) -> Tensor | None:
        """The sum of the layers' regularisers, added to the objective by the fit loop (None: none)."""

    def with_base(self, base: nn.Module) -> FlowModel:
        """The same layers (shared) over the latent distribution `base`; a ValueError where there are none."""
        raise ValueError(f"{type(self).__name__} is not a bijector over a base distribution: its base stays")


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
