r"""Masked autoregressive layers (MAF, autoregressive NSF) with any elementwise transformer.

Feature $i$ (in the layer's order) is transformed with parameters that
depend on the features before it and on the context,

$$z_i = \tau(x_i; c_i(x_{<i}, \text{context})), \qquad \log|\det J| = \sum_i \log|\tau'(x_i)|,$$

where the conditioner $c$ is one pass of an autoregressive [`Conditioner`][flowkit.nn.Conditioner]
([`MADE`][flowkit.nn.MADE] by default). The forward (density) direction is one pass; the inverse (sampling) direction
needs $D$ sequential steps, which the conditioner runs ([`MADE.invert`][flowkit.nn.MADE.invert], incrementally).

References:
    Papamakarios, Pavlakou & Murray, *Masked Autoregressive Flow for Density
    Estimation*, NeurIPS 2017 (arXiv:1705.07057); Germain et al., *MADE*, ICML
    2015 (arXiv:1502.03509); Durkan et al., *Neural Spline Flows*, NeurIPS 2019
    (arXiv:1906.04032).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..nn import MADE, check_conditioner
from ..transformers.affine import Affine
from ..transformers.base import Transformer
from ..transformers.spline import RationalQuadraticSpline
from ..utils import broadcast_shapes
from .base import Bijector

__all__ = ["MaskedAutoregressive", "MaskedAffineAutoregressive", "MaskedSplineAutoregressive"]


class MaskedAutoregressive(Bijector):
    """Masked autoregressive layer: an autoregressive conditioner emits the transformer's parameters.

    Arguments:
        transformer: the elementwise map (e.g. [`Affine`][flowkit.transformers.Affine],
            [`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline]).
        features: number of features `D`.
        hidden: hidden sizes of the default [`MADE`][flowkit.nn.MADE].
        context: number of context features (0 for an unconditional layer).
        residual: residual MADE blocks (see [`MADE`][flowkit.nn.MADE]).
        activation: activation of the default MADE.
        order: autoregressive order of the features (natural order when None).
        conditioner: an autoregressive [`Conditioner`][flowkit.nn.Conditioner] from the `D` features and
            the context to `D * transformer.params_per_element` numbers; `hidden`, `residual` and
            `activation` are unused when it is given, and `order` is the conditioner's.

    The conditioner's last layer starts at zero weights and the transformer's
    identity parameters, so the layer starts as the identity.

    Examples:
        >>> import torch
        >>> from flowkit.nn import MADE
        >>> from flowkit.transformers import Affine
        >>> layer = MaskedAutoregressive(Affine(), 3, conditioner=MADE(3, 2, hidden=(16,), order=[2, 0, 1]))
        >>> x, ladj = layer.inverse(torch.randn(5, 3))
        >>> x.shape, ladj.shape
        (torch.Size([5, 3]), torch.Size([5]))
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
        conditioner: nn.Module | None = None,
    ) -> None:
        super().__init__()
        features = check_number(features, "features", where="MaskedAutoregressive", integer=True, low=1)
        self.event_shape = torch.Size([features])
        self.context_features = check_number(context, "context", where="MaskedAutoregressive", integer=True, low=0)
        self.transformer = transformer
        self.domain = transformer.domain
        self._n_params = transformer.params_per_element
        if conditioner is None:
            conditioner = MADE(features, self._n_params, hidden, context, residual, activation, order)
        else:
            n_out = features * self._n_params
            check_conditioner(conditioner, features, n_out, self.context_features, True, "MaskedAutoregressive")
            if order is not None and [int(i) for i in order] != [int(i) for i in conditioner.order]:
                raise ValueError(
                    f"MaskedAutoregressive: order {list(order)} differs from the conditioner's "
                    f"{list(conditioner.order)}"
                )
        self.conditioner = conditioner
        self.conditioner.zero_last(transformer.identity_params().repeat(features))

    def _get_name(self) -> str:
        return _NAMES.get(type(self.transformer), "MaskedAutoregressive")

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        params = self.conditioner(x, context).unflatten(-1, (-1, self._n_params))
        z, ladj = self.transformer(x.expand(params.shape[:-1]), params)
        return z, ladj.sum(-1)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if context is not None:
            z = z.expand(*broadcast_shapes(z.shape[:-1], context.shape[:-1]), z.shape[-1])
        z_columns = z.unbind(-1)
        ladjs: list[Tensor] = []

        def solve(i: int, params: Tensor) -> Tensor:
            x_i, ladj = self.transformer.inverse(z_columns[i], params)
            ladjs.append(ladj)
            return x_i

        x = self.conditioner.invert(solve, z, context)
        return x, sum(ladjs, z.new_zeros(z.shape[:-1]))

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, context={self.context_features}"


def MaskedAffineAutoregressive(
    features: int,
    hidden: Sequence[int] = (64, 64),
    context: int = 0,
    residual: bool = False,
    activation: str = "relu",
    order: Sequence[int] | None = None,
    clamp: float = 5.0,
    *,
    conditioner: nn.Module | None = None,
) -> MaskedAutoregressive:
    """MAF layer: a [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] with an affine transformer.

    Arguments:
        features: number of features `D`.
        hidden: hidden sizes of the default MADE.
        context: number of context features.
        residual: residual MADE blocks.
        activation: activation of the default MADE.
        order: autoregressive order (natural when None).
        clamp: soft bound on the log-scale (see [`Affine`][flowkit.transformers.Affine]).
        conditioner: an autoregressive conditioner (see
            [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive]).
    """
    return MaskedAutoregressive(Affine(clamp), features, hidden, context, residual, activation, order, conditioner)


def MaskedSplineAutoregressive(
    features: int,
    bins: int = 8,
    bound: float = 5.0,
    hidden: Sequence[int] = (64, 64),
    context: int = 0,
    residual: bool = False,
    activation: str = "relu",
    order: Sequence[int] | None = None,
    *,
    conditioner: nn.Module | None = None,
) -> MaskedAutoregressive:
    """Autoregressive NSF layer: a [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] with a spline.

    Arguments:
        features: number of features `D`.
        bins: number of spline bins `K`.
        bound: the spline's interval `[-B, B]` (identity outside).
        hidden: hidden sizes of the default MADE.
        context: number of context features.
        residual: residual MADE blocks.
        activation: activation of the default MADE.
        order: autoregressive order (natural when None).
        conditioner: an autoregressive conditioner (see
            [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive]).
    """
    transformer = RationalQuadraticSpline(bins, bound)
    return MaskedAutoregressive(transformer, features, hidden, context, residual, activation, order, conditioner)


#: The names autoregressive layers show (in reprs and error messages), by transformer type: those of their factories.
_NAMES: dict[type, str] = {Affine: "MaskedAffineAutoregressive", RationalQuadraticSpline: "MaskedSplineAutoregressive"}
