"""Spline coupling layers: NSF's rational-quadratic coupling, and a circular one for angles on tori."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..nn import MLP
from ..transformers.spline import CircularSpline, RationalQuadraticSpline
from .coupling import Coupling

__all__ = ["SplineCoupling", "CircularSplineCoupling"]


class SplineCoupling(Coupling):
    """RQ-NSF coupling: :class:`~flowkit.bijectors.Coupling` with a :class:`~flowkit.transformers.RationalQuadraticSpline`.

    Arguments:
        features: number of features ``D``.
        bins: number of spline bins ``K``.
        bound: the spline's interval ``[-B, B]`` (identity outside).
        mask: transformed (1) / conditioning (0) features; alternating by default.
        parity: which alternating mask to use when ``mask`` is None.
        hidden: hidden sizes of the conditioner MLP.
        context: number of context features.
        activation: conditioner activation.

    References:
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    def __init__(
        self,
        features: int,
        bins: int = 8,
        bound: float = 5.0,
        mask: Sequence[int] | None = None,
        parity: int = 0,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        activation: str = "relu",
    ) -> None:
        super().__init__(RationalQuadraticSpline(bins, bound), features, mask, parity, hidden, context, activation)


class CircularSplineCoupling(Coupling):
    r"""Coupling layer on the torus ``[-pi, pi)^D`` with :class:`~flowkit.transformers.CircularSpline` transformers.

    The conditioning angles enter the conditioner as ``(cos x, sin x)``, so
    the spline parameters, and hence the map, are continuous across
    ``-pi = pi`` in every coordinate.

    Arguments:
        features: number of angles ``D`` (at least 2).
        bins: number of spline bins ``K``.
        mask: transformed (1) / conditioning (0) angles; alternating by default.
        parity: which alternating mask to use when ``mask`` is None.
        hidden: hidden sizes of the conditioner MLP.
        context: number of context features.
        activation: conditioner activation.

    References:
        Rezende et al., *Normalizing flows on tori and spheres*, ICML 2020 (arXiv:2002.02428).
    """

    def __init__(
        self,
        features: int,
        bins: int = 8,
        mask: Sequence[int] | None = None,
        parity: int = 0,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        activation: str = "relu",
    ) -> None:
        transformer = CircularSpline(bins)
        super().__init__(transformer, features, mask, parity, hidden, context, activation)
        n_id, n_tr = len(self.identity_idx), len(self.transformed_idx)
        self.conditioner = MLP(2 * n_id + self.context_features, n_tr * self._n_params, hidden, activation)
        self.conditioner.zero_last(transformer.identity_params().repeat(n_tr))

    def _params(self, x_id: Tensor, context: Tensor | None) -> Tensor:
        return super()._params(torch.cat([torch.cos(x_id), torch.sin(x_id)], dim=-1), context)
