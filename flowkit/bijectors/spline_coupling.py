"""Spline coupling layers: NSF's rational-quadratic coupling, and a circular one for angles on tori."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..nn import MLP
from ..transformers.spline import CircularSpline, RationalQuadraticSpline
from .coupling import Coupling, coupling_mask

__all__ = ["SplineCoupling", "CircularSplineCoupling"]


def SplineCoupling(
    features: int,
    bins: int = 8,
    bound: float = 5.0,
    mask: Sequence[int] | None = None,
    parity: int = 0,
    hidden: Sequence[int] = (64, 64),
    context: int = 0,
    activation: str = "relu",
    *,
    conditioner: nn.Module | None = None,
) -> Coupling:
    """RQ-NSF coupling: a [`Coupling`][flowkit.bijectors.Coupling] with a rational-quadratic spline transformer.

    Arguments:
        features: number of features `D`.
        bins: number of spline bins `K`.
        bound: the spline's interval `[-B, B]` (identity outside).
        mask: transformed (1) / conditioning (0) features; alternating by default.
        parity: which alternating mask to use when `mask` is None.
        hidden: hidden sizes of the default conditioner MLP.
        context: number of context features.
        activation: activation of the default conditioner MLP.
        conditioner: the conditioner module (see [`Coupling`][flowkit.bijectors.Coupling]).

    References:
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """
    transformer = RationalQuadraticSpline(bins, bound)
    return Coupling(transformer, features, mask, parity, hidden, context, activation, conditioner)


def CircularSplineCoupling(
    features: int,
    bins: int = 8,
    mask: Sequence[int] | None = None,
    parity: int = 0,
    hidden: Sequence[int] = (64, 64),
    context: int = 0,
    activation: str = "relu",
    *,
    conditioner: nn.Module | None = None,
) -> Coupling:
    r"""Coupling layer on the torus $[-\pi, \pi)^D$ with circular spline transformers.

    The transformer is a [`CircularSpline`][flowkit.transformers.CircularSpline]; the default conditioner is
    a periodic [`MLP`][flowkit.nn.MLP], so the map is continuous across $-\pi = \pi$ in every coordinate.

    Arguments:
        features: number of angles `D` (at least 2).
        bins: number of spline bins `K`.
        mask: transformed (1) / conditioning (0) angles; alternating by default.
        parity: which alternating mask to use when `mask` is None.
        hidden: hidden sizes of the default conditioner MLP.
        context: number of context features.
        activation: activation of the default conditioner MLP.
        conditioner: the conditioner module (see [`Coupling`][flowkit.bijectors.Coupling]);
            it should be periodic in its inputs.

    References:
        Rezende et al., *Normalizing flows on tori and spheres*, ICML 2020 (arXiv:2002.02428).
    """
    transformer = CircularSpline(bins)
    if conditioner is None:
        n_transformed = int(coupling_mask(features, mask, parity).sum())
        n_out = n_transformed * transformer.params_per_element
        conditioner = MLP(features - n_transformed, n_out, hidden, activation, context=context, periodic=True)
    return Coupling(transformer, features, mask, parity, hidden, context, activation, conditioner)
