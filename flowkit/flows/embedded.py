"""A conditional flow behind an embedding of its condition, both trained together: `EmbeddedFlow`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._validation import outermost
from ..embeddings import ConditionEmbedding
from ..utils import aggregates_auxiliary_loss, auxiliary_loss
from .base import FlowModel

__all__ = ["EmbeddedFlow"]


class EmbeddedFlow(FlowModel):
    r"""A conditional flow $q_\phi(x \mid e_\psi(y))$ whose context is the embedding $e_\psi(y)$ of a raw condition $y$.

    `log_prob(x, y)`, `sample(shape, y)` and every other method take the raw condition (a set of observations,
    a spectrum; see [`flowkit.embeddings`][flowkit.embeddings]), embed it, and pass the embedding on to the flow
    as its context. The embedding's parameters are the model's, so any objective on the model (maximum likelihood
    on pairs `(x, y)` with [`fit`][flowkit.train.fit]) trains both together. The model saves and loads with
    [`flowkit.io`][flowkit.io], embedding included. Its abilities (`exact_log_prob`, `samples_match_density`) are
    the flow's.

    Arguments:
        flow: a conditional flow model whose `context_features` is the embedding's `out_features`.
        embedding: a [`ConditionEmbedding`][flowkit.embeddings.ConditionEmbedding].

    Raises:
        ValueError: for a flow or embedding of the wrong kind, or sizes that do not match.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.embeddings import DeepSetEmbedding
        >>> embedding = DeepSetEmbedding(2, 4, hidden=(16,), set_features=8)
        >>> model = EmbeddedFlow(flowkit.flows.NSF(3, transforms=2, hidden=(16,), context=4), embedding)
        >>> y = torch.randn(5, 10, 2)  # five sets of ten observations
        >>> model.log_prob(torch.randn(5, 3), y).shape, model.sample((2,), y).shape
        (torch.Size([5]), torch.Size([2, 5, 3]))
    """

    def __init__(self, flow: FlowModel, embedding: ConditionEmbedding) -> None:
        super().__init__()
        if not isinstance(flow, FlowModel):
            raise ValueError(f"EmbeddedFlow: flow must be a flowkit flow model, got {type(flow).__name__}")
        if not isinstance(embedding, ConditionEmbedding):
            raise ValueError(
                "EmbeddedFlow: embedding must be a flowkit.embeddings.ConditionEmbedding, "
                f"got {type(embedding).__name__}"
            )
        if flow.context_features != embedding.out_features:
            raise ValueError(
                f"EmbeddedFlow: the flow takes {flow.context_features} context feature(s) but the embedding gives "
                f"{embedding.out_features}; build the flow with context={embedding.out_features}"
            )
        self.flow = flow
        self.embedding = embedding

    @property
    def event_shape(self) -> torch.Size:
        return self.flow.event_shape

    @property
    def context_features(self) -> int:
        """The last dimension of the raw condition (the full shape is `condition_shape`)."""
        return int(self.embedding.condition_shape[-1] or 0)

    @property
    def condition_shape(self) -> tuple[int | None, ...]:
        """The event shape of one raw condition (`None` for a set's number of observations)."""
        return self.embedding.condition_shape

    @property
    def base(self) -> torch.nn.Module:
        """The flow's latent distribution."""
        return self.flow.base

    @property
    def exact_log_prob(self) -> bool:  # type: ignore[override]
        return self.flow.exact_log_prob

    @property
    def samples_match_density(self) -> bool:  # type: ignore[override]
        return self.flow.samples_match_density

    @property
    def sampler_mismatch(self) -> str:  # type: ignore[override]
        return self.flow.sampler_mismatch

    def embed(self, condition: Tensor | None, where: str) -> Tensor:
        """The context `(..., out_features)` of raw conditions `(..., *condition_shape)`, checked."""
        if condition is None:
            shape = ", ".join("N" if s is None else str(s) for s in self.condition_shape)
            raise ValueError(f"{where}: this model needs a condition of shape (..., {shape}) but none was given")
        with outermost() as check:
            if check:
                self.embedding.check(condition, where)
        return self.embedding(condition)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """`log q(x | e(y))` for events `x` `(..., *event_shape)` and raw conditions `y` (`context`)."""
        return self.flow.log_prob(x, self.embed(context, "EmbeddedFlow.log_prob"))

    def path_log_likelihood(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self.flow.path_log_likelihood(x, self.embed(context, "EmbeddedFlow.path_log_likelihood"))

    def rsample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Samples `(*shape, *condition_batch, *event_shape)` given raw conditions `context`."""
        return self.flow.rsample(shape, self.embed(context, "EmbeddedFlow.rsample"))

    def rsample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        return self.flow.rsample_and_log_prob(shape, self.embed(context, "EmbeddedFlow.rsample_and_log_prob"))

    def latent_to_data(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.flow.latent_to_data(z, self.embed(context, "EmbeddedFlow.latent_to_data"))

    @aggregates_auxiliary_loss
    def auxiliary_loss(self) -> Tensor | None:
        """The flow's regularisers (`None` when there are none)."""
        return auxiliary_loss(self.flow)
