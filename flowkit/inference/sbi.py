r"""flowkit flows inside sbi: a density-estimator builder for `sbi.inference.NPE` and its estimator.

sbi trains a neural posterior estimator through its own loop from a *builder*, a callable
`builder(batch_theta, batch_x)` that it calls once with the first round's simulations and that returns a
`ConditionalDensityEstimator`. [`sbi_builder`][flowkit.inference.sbi_builder] makes one that builds a flowkit preset:

```python
from sbi.inference import NPE
import flowkit

inference = NPE(prior, density_estimator=flowkit.inference.sbi_builder("nsf", prior=prior))
estimator = inference.append_simulations(theta, x).train()
posterior = inference.build_posterior(estimator)
```

The estimator [`sbi_estimator`][flowkit.inference.sbi_estimator] follows sbi's own `ZukoFlow`: `log_prob` over
`(sample, batch)` shapes, `loss`, `sample`, `sample_and_log_prob`, `input_shape`, `condition_shape` and
`embedding_net`. As sbi does, it z-scores the parameters (a [`Standardization`][flowkit.bijectors.Standardization]
first in the flow, with the batch's mean and deviation) and the observations (a
[`StandardizedEmbedding`][flowkit.embeddings.StandardizedEmbedding] first in the embedding). With `prior=`, the flow
is mapped onto the prior's support ([`bounded`][flowkit.flows.bounded]): its samples never leave the prior's box,
so sbi's rejection of samples outside the support accepts them all, and the leakage correction of
`posterior.log_prob` is exactly zero. The flowkit model inside, `estimator.model` (an
[`EmbeddedFlow`][flowkit.flows.EmbeddedFlow]), gives the same `log_prob` and saves with [`flowkit.io`][flowkit.io].

sbi is imported when a builder is called (it is not a dependency of flowkit).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..bijectors import BoundedSupport, Chain, Standardization
from ..embeddings import ConditionEmbedding, StandardizedEmbedding
from ..flows import PRESETS, EmbeddedFlow, Flow

__all__ = ["sbi_builder", "sbi_estimator", "build_posterior_flow"]

#: sbi's options for z-scoring, that [`sbi_builder`][flowkit.inference.sbi_builder] takes.
Z_SCORES = ("none", "independent", "structured")


def build_posterior_flow(
    preset: str,
    theta: Tensor,
    x: Tensor,
    *,
    embedding: ConditionEmbedding | None = None,
    prior: Any = None,
    z_score_theta: str = "independent",
    z_score_x: str = "independent",
    **sizes: Any,
) -> EmbeddedFlow:
    r"""A conditional flow $q(\theta \mid x)$ of the preset `preset`, set up from simulations `(theta, x)`.

    The flow's first layers are, data side first: the map onto the prior's support (with `prior`), then the z-score
    of the (unbounded) parameters; the condition is z-scored before `embedding`. Both statistics come from `theta`
    and `x`, as sbi computes them from its first round.

    Arguments:
        preset: a name of `flowkit.flows.PRESETS` (`"nsf"`, `"maf"`, `"realnvp"`, ...).
        theta: parameters `(N, D)`.
        x: observations `(N, *condition_shape)`; a vector `(N, L)` without an embedding.
        embedding: a [`ConditionEmbedding`][flowkit.embeddings.ConditionEmbedding] of the observations (None: the
            z-scored vector itself is the flow's context).
        prior: a prior whose support bounds the flow (None: an unbounded flow).
        z_score_theta: `"independent"` (per parameter) or `"none"`.
        z_score_x: `"independent"` (per entry), `"structured"` (one scale for all entries) or `"none"`.
        **sizes: the preset's sizes (`transforms`, `hidden`, `bins`).

    Returns:
        An [`EmbeddedFlow`][flowkit.flows.EmbeddedFlow] whose `log_prob(theta, x)` is $\log q(\theta \mid x)$.

    Raises:
        ValueError: for shapes that do not fit, an unknown preset or z-score, a prior without bounds.
    """
    where = "build_posterior_flow"
    for name, value in (("z_score_theta", z_score_theta), ("z_score_x", z_score_x)):
        if value not in Z_SCORES:
            raise ValueError(f"{where}: {name} must be one of {', '.join(Z_SCORES)}, got {value!r}")
    if z_score_theta == "structured":
        raise ValueError(f"{where}: z_score_theta='structured' is for observations; use 'independent' or 'none'")
    if not isinstance(theta, Tensor) or theta.dim() != 2 or not theta.is_floating_point():
        raise ValueError(f"{where}: theta must be a floating tensor (N, D), got {_describe(theta)}")
    if not isinstance(x, Tensor) or x.dim() < 2 or len(x) != len(theta):
        raise ValueError(f"{where}: x must be a tensor (N, ...) with the N = {len(theta)} of theta, got {_describe(x)}")
    if embedding is not None and not isinstance(embedding, ConditionEmbedding):
        raise ValueError(f"{where}: embedding must be a flowkit ConditionEmbedding, got {type(embedding).__name__}")
    if embedding is None and x.dim() != 2:
        raise ValueError(f"{where}: observations of shape {tuple(x.shape[1:])} need an embedding to a vector")
    if z_score_x != "none":
        condition = StandardizedEmbedding.from_data(x, embedding, structured=z_score_x == "structured")
    elif embedding is not None:
        condition = embedding
    else:  # the identity: a z-score with mean 0 and deviation 1
        condition = StandardizedEmbedding([0.0] * x.shape[1], [1.0] * x.shape[1], (x.shape[1],)).to(x.dtype)
    key = preset.lower() if isinstance(preset, str) else preset
    if key not in PRESETS:
        raise ValueError(f"{where}: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    flow = PRESETS[key](theta.shape[1], context=condition.out_features, **sizes).to(theta.dtype)
    layers = []
    unbounded = theta.detach()
    if prior is not None:
        support = BoundedSupport.from_prior(prior, theta.shape[1]).to(theta.dtype)
        layers.append(support)
        with torch.no_grad():
            unbounded, ladj = support(unbounded)
        if not bool(torch.isfinite(ladj).all()):
            outside = int((~torch.isfinite(ladj)).sum())
            raise ValueError(f"{where}: {outside} of the simulated theta lie outside the prior's support")
    if z_score_theta == "independent":
        layers.append(Standardization.from_data(unbounded).to(theta.dtype))
    bijector = Chain(*layers, flow.bijector) if layers else flow.bijector
    return EmbeddedFlow(Flow(bijector, flow.base), condition)


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def sbi_builder(
    preset: str = "nsf",
    *,
    embedding: ConditionEmbedding | None = None,
    prior: Any = None,
    z_score_theta: str = "independent",
    z_score_x: str = "independent",
    **sizes: Any,
) -> Callable[[Tensor, Tensor], Any]:
    """A density-estimator builder for sbi: `NPE(prior, density_estimator=sbi_builder("nsf"))`.

    Arguments:
        preset: a name of `flowkit.flows.PRESETS`.
        embedding: a [`ConditionEmbedding`][flowkit.embeddings.ConditionEmbedding] of the observations, trained with
            the flow (a Deep Sets encoder for iid observations, a convolutional one for spectra).
        prior: bound the flow to this prior's support (see [`bounded`][flowkit.flows.bounded]); None: unbounded.
        z_score_theta: `"independent"` or `"none"` (sbi's default is `"independent"`).
        z_score_x: `"independent"`, `"structured"` or `"none"`.
        **sizes: the preset's sizes (`transforms`, `hidden`, `bins`).

    Returns:
        `builder(batch_theta, batch_x)`, which sbi calls with its first round's simulations and which returns
        the estimator (see [`sbi_estimator`][flowkit.inference.sbi_estimator]).

    Raises:
        ValueError: at once for an unknown preset or z-score option; when called, for simulations that do not fit.
    """
    if preset not in PRESETS:
        raise ValueError(f"sbi_builder: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    for name, value in (("z_score_theta", z_score_theta), ("z_score_x", z_score_x)):
        if value not in Z_SCORES:
            raise ValueError(f"sbi_builder: {name} must be one of {', '.join(Z_SCORES)}, got {value!r}")

    def builder(batch_theta: Tensor, batch_x: Tensor) -> Any:
        model = build_posterior_flow(
            preset,
            batch_theta,
            batch_x,
            embedding=embedding,
            prior=prior,
            z_score_theta=z_score_theta,
            z_score_x=z_score_x,
            **sizes,
        )
        return sbi_estimator(model, batch_theta[0].shape, batch_x[0].shape)

    return builder


def sbi_estimator(model: EmbeddedFlow, input_shape: Sequence[int], condition_shape: Sequence[int]) -> Any:
    """An sbi `ConditionalDensityEstimator` around a flowkit [`EmbeddedFlow`][flowkit.flows.EmbeddedFlow].

    A function that builds an instance of the class (the class derives from sbi's base class, so it is made when
    sbi is first used): `estimator.model` is the flowkit model, `estimator.net` its flow,
    `estimator.embedding_net` its embedding of the observations.

    Arguments:
        model: the conditional flow on parameters `input_shape` `(D,)` with its embedding of observations.
        input_shape: the parameters' event shape.
        condition_shape: the observations' event shape.
    """
    return _estimator_class()(model, torch.Size(input_shape), torch.Size(condition_shape))


def __getattr__(name: str) -> Any:
    # The estimator's class by its name, for pickle (sbi's posteriors are saved with pickle): made on first use.
    if name == "FlowkitEstimator":
        return _estimator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _estimator_class() -> type:
    from sbi.neural_nets.estimators.base import ConditionalDensityEstimator

    class FlowkitEstimator(ConditionalDensityEstimator):
        r"""A flowkit conditional flow as sbi's `ConditionalDensityEstimator` (see `flowkit.inference.sbi`)."""

        def __init__(self, model: EmbeddedFlow, input_shape: torch.Size, condition_shape: torch.Size) -> None:
            super().__init__(net=model.flow, input_shape=input_shape, condition_shape=condition_shape)
            self.model = model

        @property
        def embedding_net(self) -> nn.Module:
            return self.model.embedding

        def _context(self, condition: Tensor) -> Tensor:
            self._check_condition_shape(condition)  # sbi's check: a ValueError naming the shapes
            flat = condition.reshape(-1, *self.condition_shape)
            return self.model.embed(flat, "sbi_estimator").reshape(*condition.shape[: -len(self.condition_shape)], -1)

        def log_prob(self, input: Tensor, condition: Tensor, **kwargs: Any) -> Tensor:
            """`log q(input | condition)` for inputs `(sample, batch, D)` (or `(batch, D)`): `(sample, batch)`."""
            self._check_condition_shape(condition)
            self._check_input_shape(input)
            input, condition, _ = self._broadcast_and_align(input, condition)
            return self.model.flow.log_prob(input, self._context(condition))

        def loss(self, input: Tensor, condition: Tensor, **kwargs: Any) -> Tensor:
            """The negative log-likelihood `(batch,)` of inputs `(batch, D)` given conditions `(batch, ...)`."""
            return -self.log_prob(input.unsqueeze(0), condition)[0]

        def sample(self, sample_shape: torch.Size, condition: Tensor, **kwargs: Any) -> Tensor:
            """Samples `(*sample_shape, batch, D)` given conditions `(batch, *condition_shape)`."""
            return self.model.flow.sample(tuple(sample_shape), self._context(condition))

        def sample_and_log_prob(
            self, sample_shape: torch.Size, condition: Tensor, **kwargs: Any
        ) -> tuple[Tensor, Tensor]:
            """Samples `(*sample_shape, batch, D)` and their log density `(*sample_shape, batch)`."""
            return self.model.flow.sample_and_log_prob(tuple(sample_shape), self._context(condition))

    FlowkitEstimator.__qualname__ = "FlowkitEstimator"  # found again by pickle through the module's __getattr__
    return FlowkitEstimator
