r"""A transformer applied to every feature with its own parameters: free ones, or a function of the context alone.

$z_i = \tau(x_i; \theta_i)$ with $\log|\det \partial z / \partial x| = \sum_i \log \tau'(x_i; \theta_i)$: no feature
conditions another (the elementwise layers of Gaussianization flows, between rotations). Unconditional, the
$\theta_i$ are parameters of the layer; with a context $c$, $\theta = \mathrm{MLP}(c)$ (zuko's
`ElementWiseTransform`). Both start at the transformer's `identity_params`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..nn import MLP
from ..transformers import Transformer
from .base import Bijector

__all__ = ["ElementwiseTransformer"]


class ElementwiseTransformer(Bijector):
    r"""Apply a [`Transformer`][flowkit.transformers.Transformer] to each of `features`, parameters per feature.

    See [the module][flowkit.bijectors.elementwise]. The inverse is the transformer's (closed form or numerical,
    as it states). The parameters go to the transformer unexpanded, `(D, P)` against points `(..., D)`, so that its
    constraints (a softmax, a softplus) run once per feature rather than once per point: the transformer broadcasts
    them (every flowkit transformer does; `tests/transformers/test_base.py`).

    Arguments:
        transformer: the elementwise map (copied).
        features: number of features `D`.
        context: number of context features (0: the parameters are free, `D x params_per_element` of them).
        hidden: hidden sizes of the network from the context to the parameters (with a context only).
        activation: that network's activation.

    Examples:
        >>> import torch
        >>> from flowkit.transformers import Gaussianization
        >>> layer = ElementwiseTransformer(Gaussianization(4), 3)
        >>> z, ladj = layer(torch.randn(5, 3))
        >>> z.shape, ladj.shape
        (torch.Size([5, 3]), torch.Size([5]))
    """

    def __init__(
        self,
        transformer: Transformer,
        features: int,
        context: int = 0,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if not isinstance(transformer, Transformer):
            raise ValueError(f"ElementwiseTransformer: transformer must be a Transformer, got {type(transformer)}")
        features = check_number(features, "features", where="ElementwiseTransformer", integer=True, low=1)
        self.context_features = check_number(context, "context", where="ElementwiseTransformer", integer=True, low=0)
        self.transformer = copy.deepcopy(transformer)
        self.event_shape = torch.Size((features,))
        self.domain = transformer.domain
        identity = transformer.identity_params().repeat(features, 1)
        if self.context_features:
            self.hyper = MLP(self.context_features, identity.numel(), hidden, activation)
            self.hyper.zero_last(identity.flatten())
        else:
            self.params = nn.Parameter(identity)

    def _params(self, context: Tensor | None) -> Tensor:
        """`(D, P)` free parameters, or `(..., D, P)` from the context; not expanded to the points' batch shape."""
        if context is None:
            return self.params
        return self.hyper(context).unflatten(-1, (self.event_shape[0], -1))

    def _run(self, method: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], x: Tensor, context: Tensor | None):
        params = self._params(context)
        shape = torch.broadcast_shapes(x.shape, params.shape[:-1])
        y, ladj = method(x.expand(shape), params)
        return y, torch.broadcast_to(ladj, shape).sum(-1)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(self.transformer.forward, x, context)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(self.transformer.inverse, z, context)

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        params = self._params(context)
        return self.transformer.value(x.expand(torch.broadcast_shapes(x.shape, params.shape[:-1])), params)

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, context={self.context_features}"
