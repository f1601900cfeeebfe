r"""flowkit flows inside lampe: the `build(features, context, **kwargs)` that `lampe.inference.NPE` takes.

lampe builds its estimator as `NPE(theta_dim, x_dim, build=...)`, calling `build(theta_dim, x_dim, **kwargs)`, and
evaluates $\log q(\theta \mid x)$ as `flow(x).log_prob(theta)`: the flow called on a condition returns a
distribution. [`lampe_flow`][flowkit.inference.lampe_flow] is such a `build`, for any flowkit preset:

```python
from lampe.inference import NPE, NPELoss
import flowkit

estimator = NPE(3, 5, build=flowkit.inference.lampe_flow, preset="nsf", transforms=3, hidden=(64, 64))
loss = NPELoss(estimator)(theta, x)
samples = estimator.flow(x_star).sample((1000,))
```
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..embeddings import ConditionEmbedding, StandardizedEmbedding
from ..flows import PRESETS, EmbeddedFlow, FlowDistribution, FlowModel, bounded

__all__ = ["lampe_flow", "ConditionedFlow"]


class ConditionedFlow(EmbeddedFlow):
    r"""A conditional flowkit model that, called on a condition `x`, returns the distribution $q(\cdot \mid x)$.

    The contract of lampe's flows (and zuko's): `flow(x).log_prob(theta)`, `flow(x).sample(shape)`,
    `flow(x).rsample(shape)`. It is an [`EmbeddedFlow`][flowkit.flows.EmbeddedFlow] (the embedding may be any
    [`ConditionEmbedding`][flowkit.embeddings.ConditionEmbedding]), so `log_prob(theta, x)` and `sample(shape, x)`
    work as on every flowkit model, and it saves and loads with [`flowkit.io`][flowkit.io].

    Arguments:
        flow: a conditional flow whose context is the embedding's output.
        embedding: the embedding of the condition.
    """

    def forward(self, x: Tensor, context: Tensor | None = None) -> FlowDistribution:  # type: ignore[override]
        """The distribution `q(. | x)` for conditions `x` `(..., *condition_shape)` (batch shape `...`)."""
        return FlowDistribution(self.flow, self.embed(x, "ConditionedFlow"))


def lampe_flow(
    features: int,
    context: int,
    preset: str = "nsf",
    *,
    embedding: ConditionEmbedding | None = None,
    prior: Any = None,
    **sizes: Any,
) -> ConditionedFlow:
    r"""A conditional flow of `features` parameters given `context` condition features, as lampe's `build` takes.

    Arguments:
        features: the number of parameters $D$.
        context: the size of the condition $x$ (lampe's `x_dim`): the last size of the embedding's condition.
        preset: a name of `flowkit.flows.PRESETS`.
        embedding: an embedding of the condition (None: the condition vector is the context).
        prior: bound the flow to this prior's support ([`bounded`][flowkit.flows.bounded]).
        **sizes: the preset's sizes (`transforms`, `hidden`, `bins`).

    Raises:
        ValueError: for an unknown preset, or an embedding whose condition is not of size `context`.

    Examples:
        >>> import torch
        >>> flow = lampe_flow(2, 3, transforms=2, hidden=(16,))
        >>> flow(torch.randn(5, 3)).log_prob(torch.randn(5, 2)).shape
        torch.Size([5])
    """
    if preset not in PRESETS:
        raise ValueError(f"lampe_flow: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if embedding is None:  # the condition itself: a z-score with mean 0 and deviation 1
        embedding = StandardizedEmbedding([0.0] * context, [1.0] * context, (context,))
    if embedding.condition_shape[-1] != context:
        raise ValueError(
            f"lampe_flow: the embedding takes conditions of shape {embedding.condition_shape}, "
            f"whose last size is not context={context}"
        )
    flow: FlowModel = PRESETS[preset](features, context=embedding.out_features, **sizes)
    if prior is not None:
        flow = bounded(flow, prior)
    return ConditionedFlow(flow, embedding)
