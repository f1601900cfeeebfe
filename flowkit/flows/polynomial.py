"""Polynomial presets: BPF (Bernstein polynomials) and SOSPF (sum-of-squares polynomials), as zuko has them.

Each is [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] layers with a
[`Bernstein`][flowkit.transformers.Bernstein] or [`SumOfSquares`][flowkit.transformers.SumOfSquares] transformer,
reversals in between and a standard normal base. Both transformers are linear outside `[-bound, bound]`, so no
clipping is needed between layers. Densities take one pass per layer; sampling solves numerically.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..distributions import Distribution
from ..transformers import Bernstein, SumOfSquares
from .flow import Flow
from .presets import ConditionerFactory, _checked, _reversed_autoregressive_stack
from .registry import preset

__all__ = ["BPF", "SOSPF"]


@preset(
    "bpf",
    "Bernstein polynomial flow: MADEs emitting monotone Bernstein polynomials",
    transforms=3,
    hidden=(64, 64),
    degree=18,
)
class BPF(Flow):
    """Bernstein polynomial flow: MADE layers emitting [`Bernstein`][flowkit.transformers.Bernstein] polynomials.

    Arguments:
        features: number of features `D`.
        transforms: number of autoregressive layers.
        hidden: hidden sizes of each MADE.
        degree: the degree `M` of each polynomial (18: 17 parameters per feature, as many as zuko's BPF of its
            degree 16, whose four end increments are fixed).
        bound: the half-width of the interval where each map is a polynomial (linear outside).
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks.
        activation: conditioner activation.
        conditioner: a factory `conditioner(features, params_per_feature, context=context)` of
            autoregressive conditioners (`hidden`, `residual` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.BPF(2, transforms=2, hidden=(16,), degree=8)
        >>> flow.log_prob(torch.randn(3, 2)).shape
        torch.Size([3])

    References:
        Arpogaus et al., *Bernstein-polynomial normalizing flows*, 2022 (arXiv:2204.13939).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        degree: int = 18,
        bound: float = 5.0,
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        *,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("BPF", None, conditioner, {**sizes, "degree": (degree, 1)}, hidden)
        transformer = Bernstein(degree, bound)
        args = (features, transforms, hidden, context, residual, activation, conditioner, base)
        super().__init__(*_reversed_autoregressive_stack(transformer, *args))


@preset(
    "sospf",
    "sum-of-squares polynomial flow: MADEs emitting SOS maps",
    transforms=3,
    hidden=(64, 64),
    degree=4,
    polynomials=3,
)
class SOSPF(Flow):
    """Sum-of-squares polynomial flow: MADE layers emitting [`SumOfSquares`][flowkit.transformers.SumOfSquares] maps.

    Arguments:
        features: number of features `D`.
        transforms: number of autoregressive layers.
        hidden: hidden sizes of each MADE.
        degree: the degree `L` of each squared polynomial (each map has degree `2 L + 1`).
        polynomials: the number `K` of squared polynomials.
        bound: the half-width of the interval where each map is a polynomial (linear outside).
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks.
        activation: conditioner activation.
        conditioner: a factory `conditioner(features, params_per_feature, context=context)` of
            autoregressive conditioners (`hidden`, `residual` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.SOSPF(2, transforms=2, hidden=(16,))
        >>> flow.log_prob(torch.randn(3, 2)).shape
        torch.Size([3])

    References:
        Jaini, Selby & Yu, *Sum-of-Squares Polynomial Flow*, ICML 2019 (arXiv:1905.02325).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        degree: int = 4,
        polynomials: int = 3,
        bound: float = 5.0,
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        *,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("SOSPF", None, conditioner, {**sizes, "degree": (degree, 1), "polynomials": (polynomials, 1)}, hidden)
        transformer = SumOfSquares(degree, polynomials, bound)
        args = (features, transforms, hidden, context, residual, activation, conditioner, base)
        super().__init__(*_reversed_autoregressive_stack(transformer, *args))
