"""Presets: common flows built from a few arguments."""

from __future__ import annotations

from collections.abc import Sequence

from ..bijectors import AffineCoupling, Bijector, Chain
from ..distributions import StandardNormal
from .flow import Flow

__all__ = ["RealNVP", "MAF", "NSF"]


def _half_mask(features: int, parity: int) -> list[int]:
    """Transform the second half of the features (parity 0) or the first half (parity 1).

    Contiguous halves split and merge by slicing; the random permutations
    between layers mix the features as alternating masks would.
    """
    first = features // 2 if parity == 0 else features - features // 2
    return [parity] * first + [1 - parity] * (features - first)


class RealNVP(Flow):
    """RealNVP: affine couplings with alternating masks over a standard normal.

    Arguments:
        features: number of features ``D`` (at least 2).
        transforms: number of coupling layers.
        hidden: hidden sizes of each conditioner MLP.
        context: number of context features (0 for an unconditional flow).
        activation: conditioner activation.

    References:
        Dinh, Sohl-Dickstein & Bengio, *Density estimation using Real NVP*, ICLR 2017 (arXiv:1605.08803).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        activation: str = "relu",
    ) -> None:
        layers = [
            AffineCoupling(features, parity=i % 2, hidden=hidden, context=context, activation=activation)
            for i in range(transforms)
        ]
        super().__init__(Chain(*layers), StandardNormal(features))


def _with_permutations(layers: list[Bijector], features: int, random: bool) -> Chain:
    """Chain ``layers`` with a permutation between consecutive ones (seeded random, or reversal)."""
    from ..bijectors import Permutation, Reverse

    chain: list[Bijector] = []
    for i, layer in enumerate(layers):
        if i:
            chain.append(Permutation(features, seed=i) if random else Reverse(features))
        chain.append(layer)
    return Chain(*chain)


class MAF(Flow):
    """Masked autoregressive flow: affine MADE layers with reversals in between, over a standard normal.

    Density evaluation is one pass per layer; sampling needs ``D`` passes per layer.

    Arguments:
        features: number of features ``D``.
        transforms: number of autoregressive layers.
        hidden: hidden sizes of each MADE.
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks.
        activation: conditioner activation.

    References:
        Papamakarios, Pavlakou & Murray, *Masked Autoregressive Flow for Density Estimation*,
        NeurIPS 2017 (arXiv:1705.07057).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 5,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
    ) -> None:
        from ..bijectors import MaskedAffineAutoregressive

        layers: list[Bijector] = [
            MaskedAffineAutoregressive(features, hidden, context, residual, activation) for _ in range(transforms)
        ]
        super().__init__(_with_permutations(layers, features, random=False), StandardNormal(features))


class NSF(Flow):
    """Neural spline flow: rational-quadratic spline layers (autoregressive or coupling) over a standard normal.

    Autoregressive layers (the default) are more expressive per layer and
    evaluate densities in one pass, but sample in ``D`` sequential steps;
    coupling layers (``coupling=True``, masks over contiguous halves and seeded random
    permutations in between) are fast both ways. Each spline has ``bins`` bins
    on ``[-bound, bound]`` and is the identity outside.

    Arguments:
        features: number of features ``D``.
        transforms: number of spline layers.
        bins: number of spline bins ``K``.
        hidden: hidden sizes of each conditioner.
        coupling: coupling layers instead of autoregressive ones.
        bound: the spline interval half-width ``B``.
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks (autoregressive layers only).
        activation: conditioner activation.

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.NSF(features=3, transforms=2, hidden=(16,))
        >>> flow.log_prob(torch.randn(4, 3)).shape
        torch.Size([4])

    References:
        Durkan, Bekasov, Murray & Papamakarios, *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 5,
        bins: int = 8,
        hidden: Sequence[int] = (128, 128),
        coupling: bool = False,
        bound: float = 5.0,
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
    ) -> None:
        from ..bijectors import MaskedSplineAutoregressive, SplineCoupling

        if coupling and residual:
            raise ValueError("NSF: residual applies to autoregressive layers only (coupling=False)")
        if coupling:
            layers: list[Bijector] = [
                SplineCoupling(
                    features, bins, bound, mask=_half_mask(features, i % 2), hidden=hidden, context=context,
                    activation=activation,
                )
                for i in range(transforms)
            ]
        else:
            layers = [
                MaskedSplineAutoregressive(features, bins, bound, hidden, context, residual, activation)
                for _ in range(transforms)
            ]
        super().__init__(_with_permutations(layers, features, random=coupling), StandardNormal(features))
