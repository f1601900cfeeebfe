"""Residual, planar and Sylvester presets: i-ResNet / residual-flow blocks with ActNorm, stacks of planar layers.

[`ResidualFlow`][flowkit.flows.ResidualFlow] alternates [`ActNorm`][flowkit.bijectors.ActNorm] and
[`Residual`][flowkit.bijectors.Residual] blocks (the layout of Chen et al. 2019);
[`PlanarFlow`][flowkit.flows.PlanarFlow] stacks [`Planar`][flowkit.bijectors.Planar] layers and
[`SylvesterFlow`][flowkit.flows.SylvesterFlow] [`Sylvester`][flowkit.bijectors.Sylvester] layers. All have a
standard normal base by default; densities take one pass, sampling solves each layer numerically.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..bijectors import ActNorm, Chain, Planar, Residual, Sylvester
from ..distributions import Distribution
from .flow import Flow
from .presets import _base, _checked
from .registry import preset

__all__ = ["ResidualFlow", "PlanarFlow", "SylvesterFlow"]


class ResidualFlow(Flow):
    r"""Residual flow: `transforms` pairs of ActNorm and a spectral-normalised residual block.

    Arguments:
        features: number of features `D`.
        transforms: number of residual blocks.
        hidden: hidden sizes of each block's network $g$.
        coefficient: spectral-norm bound of every linear layer, in (0, 1).
        activation: `"lipswish"`, `"tanh"` or `"elu"`.
        logdet: `"exact"` (the Jacobian's determinant: exact gradients, for small `D`) or `"series"`
            (the unbiased Russian-roulette estimate with the Neumann gradient, for larger `D`); in eval
            mode the log-density is always exact.
        base: the latent distribution (a standard normal by default).

    Every linear layer is normalised by its exact largest singular value at every call, so each block's
    $\mathrm{Lip}(g) \le c^L < 1$ holds at every training step; the LipSwish activations start at
    $\beta = 32$ (see [`Residual`][flowkit.bijectors.Residual], "Initialisation").

    References:
        Chen, Behrmann, Duvenaud & Jacobsen, *Residual Flows for Invertible Generative Modeling*,
        NeurIPS 2019 (arXiv:1906.02735); Behrmann et al., *Invertible Residual Networks*, ICML 2019.
    """

    def __init__(
        self,
        features: int,
        transforms: int = 5,
        hidden: Sequence[int] = (64, 64),
        coefficient: float = 0.97,
        activation: str = "lipswish",
        logdet: str = "exact",
        *,
        base: Distribution | None = None,
    ) -> None:
        _checked("ResidualFlow", None, None, {"features": (features, 1), "transforms": (transforms, 1)}, hidden)
        layers = []
        for _ in range(transforms):
            layers += [ActNorm(features), Residual(features, hidden, coefficient, activation, logdet)]
        super().__init__(Chain(*layers), _base(base, features))


@preset("planar", "planar flow: a stack of planar layers", transforms=16)
class PlanarFlow(Flow):
    """Planar flow: `transforms` planar layers.

    Arguments:
        features: number of features `D`.
        transforms: number of planar layers.
        base: the latent distribution (a standard normal by default).

    References:
        Rezende & Mohamed, *Variational Inference with Normalizing Flows*, ICML 2015 (arXiv:1505.05770).
    """

    def __init__(self, features: int, transforms: int = 16, *, base: Distribution | None = None) -> None:
        _checked("PlanarFlow", None, None, {"features": (features, 1), "transforms": (transforms, 1)}, ())
        super().__init__(Chain(*(Planar(features) for _ in range(transforms))), _base(base, features))


@preset("residual", "residual flow (exact log-det up to 4 features)", transforms=5, hidden=(64, 64))
def _residual_flow(features: int, **sizes: object) -> ResidualFlow:
    return ResidualFlow(features, logdet="exact" if features <= 4 else "series", **sizes)


@preset("sylvester", "Sylvester flow: a stack of Sylvester layers with Householder rotations", transforms=8)
class SylvesterFlow(Flow):
    r"""Sylvester flow: a stack of `transforms` [`Sylvester`][flowkit.bijectors.Sylvester] layers.

    Each layer is $x + Q R \tanh(\tilde R Q^\top x + b)$ with triangular $R, \tilde R$. Its $Q$ is made as `variant`
    says: a product of `D` Householder reflections by default (the paper's H-SNF); `"triangular"` alternates the
    identity and the reversal between layers (the T-SNF). The log-density takes one pass; sampling inverts each
    layer by checked back substitution (see the bijector).

    Arguments:
        features: number of features `D`.
        transforms: number of Sylvester layers.
        variant: `"householder"`, `"orthogonal"` or `"triangular"`.
        base: the latent distribution (a standard normal by default).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.SylvesterFlow(3, transforms=2)
        >>> flow.log_prob(torch.randn(4, 3)).shape
        torch.Size([4])

    References:
        van den Berg, Hasenclever, Tomczak & Welling, *Sylvester Normalizing Flows for Variational Inference*,
        UAI 2018 (arXiv:1803.05649).
    """

    def __init__(
        self, features: int, transforms: int = 8, variant: str = "householder", *, base: Distribution | None = None
    ) -> None:
        _checked("SylvesterFlow", None, None, {"features": (features, 1), "transforms": (transforms, 1)}, ())
        options = [{"reverse": i % 2 == 1} if variant == "triangular" else {} for i in range(transforms)]
        layers = (Sylvester(features, variant, **option) for option in options)
        super().__init__(Chain(*layers), _base(base, features))
