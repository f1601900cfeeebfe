r"""Z2 symmetry for lattice flows: conditioners that make a coupling layer odd, $f(-\phi) = -f(\phi)$.

[`Z2Equivariant`][flowkit.lattice.Z2Equivariant] makes a coupling layer commute with $\phi \to -\phi$ through its
conditioner, so that a flow over a symmetric base has the $Z_2$ symmetry of the action exactly.

References:
    Albergo et al., *Introduction to normalizing flows for lattice field theory*, arXiv:2101.08176 (2021).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..nn import Conditioner
from ..transformers import Affine, RationalQuadraticSpline, Transformer

__all__ = ["z2_reflection", "Z2Equivariant"]


def z2_reflection(transformer: Transformer) -> tuple[Tensor, Tensor]:
    r"""The signed permutation $P$ of a transformer's parameters with $\tau(-x; P\theta) = -\tau(x; \theta)$.

    For [`Affine`][flowkit.transformers.Affine] ($\theta = (t, s)$) the shift changes sign and
    the log-scale is kept; for a [`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline]
    on $[-B, B]$ the bin widths, heights and interior derivatives are each reversed.

    Returns:
        `(permutation, sign)`: the reflected parameters are `sign * theta[..., permutation]`.

    Raises:
        ValueError: for a transformer without a known reflection.
    """
    if isinstance(transformer, Affine):
        return torch.tensor([0, 1]), torch.tensor([-1.0, 1.0])
    if isinstance(transformer, RationalQuadraticSpline):
        k = transformer.bins
        blocks = [torch.arange(k).flip(0), k + torch.arange(k).flip(0), 2 * k + torch.arange(k - 1).flip(0)]
        return torch.cat(blocks), torch.ones(3 * k - 1)
    raise ValueError(
        f"z2_reflection: no known reflection for {type(transformer).__name__}; use Affine or RationalQuadraticSpline"
    )


class Z2Equivariant(Conditioner):
    r"""A grid conditioner symmetrised so that its coupling layer is odd: $f(-\phi) = -f(\phi)$.

    With $P$ the transformer's parameter reflection ([`z2_reflection`][flowkit.lattice.z2_reflection]),
    applied to each channel's block of output channels,

    $$\tilde c(h) = \tfrac12\big(c(h) + P\, c(-h)\big), \qquad \tilde c(-h) = P\,\tilde c(h),$$

    so that $\tau(-x; \tilde c(-h)) = -\tau(x; \tilde c(h))$ and the log-determinant is even.
    A flow of such layers over a symmetric base (a standard normal) has a $Z_2$-symmetric
    density. Costs two passes of the inner network (batched into one call).

    Arguments:
        conditioner: the inner grid conditioner, `(..., C, H, W) -> (..., C * P, H, W)`
            (e.g. a [`ConvNet`][flowkit.nn.ConvNet]).
        transformer: the coupling's transformer (fixes $P$).
        channels: the number of field channels `C`.

    Examples:
        >>> import torch
        >>> from flowkit.bijectors import MaskedCoupling
        >>> from flowkit.nn import ConvNet
        >>> from flowkit.transformers import Affine
        >>> net = Z2Equivariant(ConvNet(1, 2, (8,), padding_mode="circular"), Affine())
        >>> layer = MaskedCoupling(Affine(), (4, 4), conditioner=net)
    """

    def __init__(self, conditioner: nn.Module, transformer: Transformer, channels: int = 1) -> None:
        super().__init__()
        channels = check_number(channels, "channels", where="Z2Equivariant", integer=True, low=1)
        if not isinstance(conditioner, nn.Module) or not callable(getattr(conditioner, "zero_last", None)):
            raise ValueError(
                f"Z2Equivariant: conditioner must be a flowkit Conditioner, got {type(conditioner).__name__}"
            )
        if not isinstance(transformer, Transformer):
            raise ValueError(
                f"Z2Equivariant: transformer must be a flowkit Transformer, got {type(transformer).__name__}"
            )
        permutation, sign = z2_reflection(transformer)
        n = permutation.numel()
        self.conditioner = conditioner
        self.in_features = getattr(conditioner, "in_features", channels)
        self.out_features = getattr(conditioner, "out_features", channels * n)
        self.context_features = getattr(conditioner, "context_features", 0)
        offsets = (torch.arange(channels) * n)[:, None]
        self.register_buffer("permutation", (offsets + permutation).flatten(), persistent=False)
        self.register_buffer("sign", sign.repeat(channels)[:, None, None], persistent=False)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        both = self.conditioner(torch.stack([x, -x]), context)
        plus, minus = both[0], both[1]
        return 0.5 * (plus + self.sign.to(minus.dtype) * minus[..., self.permutation, :, :])

    def zero_last(self, bias: Tensor | None = None) -> None:
        self.conditioner.zero_last(bias)
