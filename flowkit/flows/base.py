r"""The flow contract: what the fit loop, the samplers, the checks and `flowkit.io` may call on a model.

Every model flowkit trains or samples from implements
[`FlowModel`][flowkit.flows.base.FlowModel]: a [`Flow`][flowkit.flows.Flow] (a bijector over a base),
a [`StochasticFlow`][flowkit.stochastic.StochasticFlow] (bijectors and Markov kernels, a density on
path space only) and [`Dequantized`][flowkit.flows.images.Dequantized] (a flow on `[0, 1]` images
as a model of integer images, whose `log_prob` is a variational lower bound). Callers are typed against
it and ask `exact_log_prob` instead of testing for a class:

| member | `Flow` | `StochasticFlow` | `Dequantized` |
|---|---|---|---|
| `event_shape`, `context_features` | yes | yes | yes |
| `log_prob(x)` | exact | raises (no marginal density) | one-sample lower bound |
| `path_log_likelihood(x)` | `log_prob` | log-likelihood on path space (random) | the bound |
| `sample(shape)` | yes | yes | integer images |
| `auxiliary_loss()` | the layers' regularisers | the layers' | the flow's |
| `exact_log_prob` | True | False | False |

`path_log_likelihood` is what maximum likelihood maximises on any of them: the exact log density of a
flow, the path-space likelihood of a stochastic flow, the dequantisation bound of an integer model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from .._config import Configurable

__all__ = ["FlowModel"]


class FlowModel(Configurable, nn.Module, ABC):
    """The abstract base of flowkit's models (see the module's table).

    A subclass implements `event_shape`, `log_prob` (or raises a ValueError that says what to use
    instead), `path_log_likelihood`, `sample` and `auxiliary_loss`, and sets `exact_log_prob`.
    """

    _flowkit_register: ClassVar[bool] = False  # abstract: nothing to save by itself

    #: Whether `log_prob` is the model's exact normalised log density (objectives that need one check this).
    exact_log_prob: ClassVar[bool] = True

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
