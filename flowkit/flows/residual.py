r"""Residual, planar and Sylvester presets: i-ResNet / residual-flow blocks with ActNorm, stacks of planar layers.

[`ResidualFlow`][flowkit.flows.ResidualFlow] alternates [`ActNorm`][flowkit.bijectors.ActNorm] and
[`Residual`][flowkit.bijectors.Residual] blocks (the layout of Chen et al. 2019);
[`PlanarFlow`][flowkit.flows.PlanarFlow] stacks [`Planar`][flowkit.bijectors.Planar] layers and
[`SylvesterFlow`][flowkit.flows.SylvesterFlow] [`Sylvester`][flowkit.bijectors.Sylvester] layers. All have a
standard normal base by default; densities take one pass, sampling solves each layer numerically.

**Context.** With `context=C > 0` each layer is followed by a conditional elementwise affine layer
$z_i \mapsto (z_i - \mu_i(c)) e^{-s_i(c)}$ ([`ElementwiseTransformer`][flowkit.bijectors.ElementwiseTransformer] of an
[`Affine`][flowkit.transformers.Affine], its parameters an MLP of the context that starts at the identity): the
residual, planar and Sylvester layers keep their invertibility constraints unchanged (they do not see the context),
and the context moves and scales the points between them, so each layer acts on a different region for each context
(conditional normalisation layers, as in conditional Glow). The log-determinant of the affine layers is
$-\sum_i s_i(c)$, and the inverse is closed form.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..bijectors import ActNorm, Bijector, Chain, ElementwiseTransformer, Planar, Radial, Residual, Sylvester
from ..distributions import Distribution
from ..transformers import Affine
from .flow import Flow
from .presets import _base, _checked
from .registry import preset

__all__ = ["ResidualFlow", "PlanarFlow", "SylvesterFlow"]

#: Hidden sizes of the networks from the context to the conditional affine layers (planar and Sylvester flows).
CONTEXT_HIDDEN = (64, 64)


def _conditioned(layers: list[Bijector], features: int, context: int, hidden: Sequence[int]) -> Chain:
    """`layers` with a conditional elementwise affine layer after each when `context > 0` (see the module)."""
    if not context:
        return Chain(*layers)
    chain: list[Bijector] = []
    for layer in layers:
        chain += [layer, ElementwiseTransformer(Affine(), features, context=context, hidden=tuple(hidden))]
    return Chain(*chain)


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
        context: number of context features (0: unconditional; see the module for how the context enters).

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
        context: int = 0,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("ResidualFlow", None, None, sizes, hidden)
        layers: list[Bijector] = []
        for _ in range(transforms):
            layers += [ActNorm(features), Residual(features, hidden, coefficient, activation, logdet)]
            if context:  # after each residual block (see the module)
                layers.append(ElementwiseTransformer(Affine(), features, context=context, hidden=tuple(hidden)))
        super().__init__(Chain(*layers), _base(base, features))


@preset("planar", "planar flow: a stack of planar layers", transforms=16)
class PlanarFlow(Flow):
    """Planar flow: `transforms` planar layers.

    Arguments:
        features: number of features `D`.
        transforms: number of planar layers.
        base: the latent distribution (a standard normal by default).
        context: number of context features (0: unconditional; see the module for how the context enters).
        context_hidden: hidden sizes of the networks from the context to the conditional affine layers.
        radial: radial layers ([`Radial`][flowkit.bijectors.Radial]) instead of planar ones.

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.PlanarFlow(2, transforms=3, context=4)
        >>> flow.log_prob(torch.randn(5, 2), torch.randn(5, 4)).shape
        torch.Size([5])

    References:
        Rezende & Mohamed, *Variational Inference with Normalizing Flows*, ICML 2015 (arXiv:1505.05770).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 16,
        *,
        base: Distribution | None = None,
        context: int = 0,
        context_hidden: Sequence[int] = CONTEXT_HIDDEN,
        radial: bool = False,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("PlanarFlow", None, None, sizes, context_hidden)
        if not isinstance(radial, bool):
            raise ValueError(f"PlanarFlow: radial must be True or False, got {radial!r}")
        layer = Radial if radial else Planar
        layers: list[Bijector] = [layer(features) for _ in range(transforms)]
        super().__init__(_conditioned(layers, features, context, context_hidden), _base(base, features))


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
        context: number of context features (0: unconditional; see the module for how the context enters).
        context_hidden: hidden sizes of the networks from the context to the conditional affine layers.

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
        self,
        features: int,
        transforms: int = 8,
        variant: str = "householder",
        *,
        base: Distribution | None = None,
        context: int = 0,
        context_hidden: Sequence[int] = CONTEXT_HIDDEN,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("SylvesterFlow", None, None, sizes, context_hidden)
        options = [{"reverse": i % 2 == 1} if variant == "triangular" else {} for i in range(transforms)]
        layers: list[Bijector] = [Sylvester(features, variant, **option) for option in options]
        super().__init__(_conditioned(layers, features, context, context_hidden), _base(base, features))
