"""The Gaussianization flow preset (GF): elementwise Gaussianization layers with Householder rotations in between.

Each layer maps every feature through its own trainable mixture CDF and the inverse normal CDF
([`Gaussianization`][flowkit.transformers.Gaussianization] in an
[`ElementwiseTransformer`][flowkit.bijectors.ElementwiseTransformer]); between layers a
[`Householder`][flowkit.bijectors.Householder] product of `D` reflections rotates the features, as Meng et al.
parametrise their rotations. Without a context there is no neural network: `transforms (3 K D) + (transforms - 1) D^2`
parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..bijectors import Bijector, Chain, ElementwiseTransformer, Householder
from ..distributions import Distribution
from ..transformers import Gaussianization
from .flow import Flow
from .presets import _base, _checked
from .registry import preset

__all__ = ["GF"]


@preset("gf", "Gaussianization flow: elementwise mixture CDFs and Householder rotations", transforms=3, components=8)
class GF(Flow):
    """Gaussianization flow: elementwise [`Gaussianization`][flowkit.transformers.Gaussianization] layers and rotations.

    Arguments:
        features: number of features `D`.
        transforms: number of elementwise layers.
        components: mixture components `K` of each feature's CDF.
        kernel: the mixture's kernel, `"logistic"` or `"normal"`.
        hidden: hidden sizes of the network from the context to the parameters (with a context only).
        context: number of context features (0 for an unconditional flow).
        base: the latent distribution (a standard normal by default).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.GF(2, transforms=2, components=4)
        >>> flow.log_prob(torch.randn(3, 2)).shape
        torch.Size([3])

    References:
        Meng, Song, Song & Ermon, *Gaussianization Flows*, AISTATS 2020 (arXiv:2003.01941).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 3,
        components: int = 8,
        kernel: str = "logistic",
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        *,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("GF", None, None, {**sizes, "components": (components, 1)}, hidden)
        transformer = Gaussianization(components, kernel)
        layers: list[Bijector] = []
        for i in range(transforms):
            if i:
                layers.append(Householder(features))
            layers.append(ElementwiseTransformer(transformer, features, context, hidden))
        super().__init__(Chain(*layers), _base(base, features))
