r"""A preset for scalar fields on periodic lattices: checkerboard couplings with circular convolutions.

[`LatticeFlow`][flowkit.flows.LatticeFlow] is the architecture of Albergo, Kanwar & Shanahan (2019): couplings on
alternating checkerboards of an `L x L` (or `C x L x L`) lattice, each conditioned by a small convolutional network with
circular padding, over a standard normal. The density is invariant under the translations by $(a, b)$ with $a + b$ even;
with `z2=True` ([`Z2Equivariant`][flowkit.lattice.Z2Equivariant]) also under $\phi \to -\phi$.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch

from .._validation import check_number
from ..bijectors import Chain, MaskedCoupling, Reshape
from ..distributions import Distribution, StandardNormal
from ..lattice.equivariance import Z2Equivariant
from ..nn import ConvNet
from ..transformers import Affine, Transformer
from .flow import Flow
from .presets import ConditionerFactory, _checked
from .registry import preset

__all__ = ["LatticeFlow"]


def _event_shape(lattice: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(lattice, Sequence) and not isinstance(lattice, (str, bytes)):
        shape = tuple(int(check_number(n, "lattice sizes", where="LatticeFlow", integer=True, low=2)) for n in lattice)
        if len(shape) not in (2, 3):
            raise ValueError(f"LatticeFlow: lattice must be L, (L, L) or (C, L, L), got {tuple(lattice)}")
        return shape
    L = check_number(lattice, "lattice", where="LatticeFlow", integer=True, low=2)
    return (L, L)


class LatticeFlow(Flow):
    r"""Checkerboard couplings with periodic convolutional conditioners on a lattice, over a standard normal.

    Layer `i` transforms the sites of parity `i % 2`. The defaults are the tutorial's (16 affine layers,
    hidden channels `(8, 8)`, kernel 3, leaky ReLUs; its final `tanh` is the
    [`Affine`][flowkit.transformers.Affine] soft clamp here). Every layer starts as the identity.

    Arguments:
        lattice: the lattice: `L` (an `L x L` scalar field), `(H, W)` or `(C, H, W)`.
        transforms: number of coupling layers.
        hidden: hidden channels of each conditioner.
        kernel: odd kernel size of the convolutions.
        activation: conditioner activation.
        z2: symmetrise every conditioner so that the flow is odd,
            $T(-z) = -T(z)$ ([`Z2Equivariant`][flowkit.lattice.Z2Equivariant]; needs an
            `Affine` or `RationalQuadraticSpline` transformer).
        transformer: the transformer of every layer instead of `Affine()`
            (e.g. a [`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline]).
        conditioner: a factory `conditioner(channels, channels * params_per_element, context=context)`
            for each layer's grid conditioner (`hidden`, `kernel` and `activation` are then unused).
        base: the latent distribution (a standard normal on the lattice by default).
        context: number of context features (0: unconditional), such as the couplings of the action: the
            conditioners take them as constant extra input planes (the flow stays odd with `z2`: the
            context is not reflected).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.LatticeFlow(6, transforms=4, hidden=(8,))
        >>> x = flow.sample((3,))
        >>> x.shape, flow.log_prob(x).shape
        (torch.Size([3, 6, 6]), torch.Size([3]))

    References:
        Albergo, Kanwar & Shanahan, *Flow-based generative models for Markov chain Monte Carlo in
        lattice field theory*, PRD 100, 034515 (2019) (arXiv:1904.12072); Albergo, Boyda, Hackett,
        Kanwar, Cranmer, Racanière, Rezende & Shanahan, *Introduction to normalizing flows for
        lattice field theory*, arXiv:2101.08176 (2021).
    """

    def __init__(
        self,
        lattice: int | Sequence[int] = 8,
        transforms: int = 16,
        hidden: Sequence[int] = (8, 8),
        kernel: int = 3,
        activation: str = "leaky_relu",
        z2: bool = False,
        *,
        transformer: Transformer | None = None,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
        context: int = 0,
    ) -> None:
        shape = _event_shape(lattice)
        _checked(
            "LatticeFlow", transformer, conditioner, {"transforms": (transforms, 1), "context": (context, 0)}, hidden
        )
        if not isinstance(z2, bool):
            raise ValueError(f"LatticeFlow: z2 must be True or False, got {z2!r}")
        transformer = Affine() if transformer is None else transformer
        channels = shape[0] if len(shape) == 3 else 1
        layers = []
        for i in range(transforms):
            tr = copy.deepcopy(transformer)
            net = None
            if conditioner is not None:
                net = conditioner(channels, channels * tr.params_per_element, context=context)
            if z2:
                if net is None:
                    out = channels * tr.params_per_element
                    net = ConvNet(channels, out, hidden, kernel, activation, "circular", context=context)
                net = Z2Equivariant(net, tr, channels)
            grid = (shape, "checkerboard", i % 2, hidden, kernel, "circular", context)
            layers.append(MaskedCoupling(tr, *grid, activation=activation, conditioner=net))
        super().__init__(Chain(*layers), StandardNormal(torch.Size(shape)) if base is None else base)


@preset("lattice", "checkerboard couplings", kind="lattice", one_pass=True, transforms=16, hidden=(8, 8), z2=False)
def _lattice_flow(lattice: int | Sequence[int], **arguments: object) -> Flow:
    """`LatticeFlow` on the `(L, L)` lattice `lattice`, or on vectors of `lattice = D = L^2` features."""
    if not isinstance(lattice, int):
        return LatticeFlow(lattice, **arguments)  # type: ignore[arg-type]
    L = math.isqrt(lattice)
    if L < 2 or L * L != lattice:
        raise ValueError(f"lattice needs a square number L * L of features with L >= 2, got {lattice}")
    flow = LatticeFlow(L, **arguments)  # type: ignore[arg-type]
    return Flow(Chain(Reshape((lattice,), (L, L)), flow.bijector), flow.base)
