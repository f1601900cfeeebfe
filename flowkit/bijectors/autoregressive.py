r"""Masked autoregressive layers (MAF, autoregressive NSF) with any elementwise transformer.

Feature ``i`` (in the layer's order) is transformed with parameters that
depend on the features before it and on the context,

.. math:: z_i = \tau(x_i; c_i(x_{<i}, \text{context})), \qquad \log|\det J| = \sum_i \log|\tau'(x_i)|,

where the conditioner ``c`` is one :class:`~flowkit.nn.MADE` pass. The forward
(density) direction is one pass; the inverse (sampling) direction needs ``D``
sequential steps. The inverse here reuses the masked weights across steps,
updates the first layer's pre-activation by one rank-one term per step (the
newly known feature) instead of a full matrix product, and evaluates only the
output block and the transformer of the feature being solved.

References:
    Papamakarios, Pavlakou & Murray, *Masked Autoregressive Flow for Density
    Estimation*, NeurIPS 2017 (arXiv:1705.07057); Germain et al., *MADE*, ICML
    2015 (arXiv:1502.03509); Durkan et al., *Neural Spline Flows*, NeurIPS 2019
    (arXiv:1906.04032).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..nn import MADE
from ..transformers.affine import Affine
from ..transformers.base import Transformer
from ..transformers.spline import RationalQuadraticSpline
from .base import Bijector
from .coupling import broadcast_context

__all__ = ["MaskedAutoregressive", "MaskedAffineAutoregressive", "MaskedSplineAutoregressive"]


class MaskedAutoregressive(Bijector):
    r"""Masked autoregressive layer: a MADE conditioner emits the transformer's parameters.

    Arguments:
        transformer: the elementwise map (e.g. :class:`~flowkit.transformers.Affine`,
            :class:`~flowkit.transformers.RationalQuadraticSpline`).
        features: number of features ``D``.
        hidden: hidden sizes of the MADE.
        context: number of context features (0 for an unconditional layer).
        residual: residual MADE blocks (see :class:`~flowkit.nn.MADE`).
        activation: conditioner activation.
        order: autoregressive order of the features (natural order when None).

    The conditioner's last layer starts at zero weights and the transformer's
    identity parameters, so the layer starts as the identity.
    """

    def __init__(
        self,
        transformer: Transformer,
        features: int,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        order: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.event_shape = torch.Size([features])
        self.context_features = int(context)
        self.transformer = transformer
        self.domain = transformer.domain
        self._n_params = transformer.params_per_element
        self.conditioner = MADE(features, self._n_params, hidden, context, residual, activation, order)
        self.conditioner.zero_last(transformer.identity_params().repeat(features))

    def forward(self, x, context=None):
        params = self.conditioner(broadcast_context(x, context)).unflatten(-1, (-1, self._n_params))
        z, ladj = self.transformer(x.expand(params.shape[:-1]), params)
        return z, ladj.sum(-1)

    def inverse(self, z, context=None):
        made = self.conditioner
        n, d = self._n_params, self.event_shape[0]
        weights = made.masked_weights()
        w_first, b_first = weights[0]
        w_x = w_first[:, :d]
        pre = broadcast_context(z.new_zeros(z.shape[:-1] + (0,)), context)
        pre = F.linear(pre, w_first[:, d:], b_first)
        batch = torch.broadcast_shapes(z.shape[:-1], pre.shape[:-1])
        pre = pre.expand(*batch, pre.shape[-1])
        z_cols = z.expand(*batch, d).unbind(-1)
        w_last, b_last = weights[-1]
        x_cols: list[Tensor | None] = [None] * d
        total = z.new_zeros(batch)
        previous = None
        for i in made.order:
            if previous is not None:
                # The newly known feature enters the first layer as a rank-one update.
                pre = torch.addcmul(pre, x_cols[previous].unsqueeze(-1), w_x[:, previous])
            params = F.linear(made.trunk(pre, weights), w_last[i * n : (i + 1) * n], b_last[i * n : (i + 1) * n])
            x_cols[i], ladj = self.transformer.inverse(z_cols[i], params)
            total = total + ladj
            previous = i
        return torch.stack(x_cols, dim=-1), total  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, context={self.context_features}"


class MaskedAffineAutoregressive(MaskedAutoregressive):
    """MAF layer: :class:`MaskedAutoregressive` with an :class:`~flowkit.transformers.Affine` transformer.

    Arguments:
        features: number of features ``D``.
        hidden: hidden sizes of the MADE.
        context: number of context features.
        residual: residual MADE blocks.
        activation: conditioner activation.
        order: autoregressive order (natural when None).
        clamp: soft bound on the log-scale (see :class:`~flowkit.transformers.Affine`).
    """

    def __init__(
        self,
        features: int,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        order: Sequence[int] | None = None,
        clamp: float = 5.0,
    ) -> None:
        super().__init__(Affine(clamp), features, hidden, context, residual, activation, order)


class MaskedSplineAutoregressive(MaskedAutoregressive):
    """Autoregressive NSF layer: :class:`MaskedAutoregressive` with a :class:`~flowkit.transformers.RationalQuadraticSpline`.

    Arguments:
        features: number of features ``D``.
        bins: number of spline bins ``K``.
        bound: the spline's interval ``[-B, B]`` (identity outside).
        hidden: hidden sizes of the MADE.
        context: number of context features.
        residual: residual MADE blocks.
        activation: conditioner activation.
        order: autoregressive order (natural when None).
    """

    def __init__(
        self,
        features: int,
        bins: int = 8,
        bound: float = 5.0,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        order: Sequence[int] | None = None,
    ) -> None:
        super().__init__(RationalQuadraticSpline(bins, bound), features, hidden, context, residual, activation, order)
