"""Neural autoregressive presets: NAF (deep sigmoidal flows), UNAF (integrals of positive networks) and BNAF.

Each is a few lines over the layers: [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] with a
[`MonotonicMLP`][flowkit.transformers.MonotonicMLP] or an
[`UnconstrainedMonotonic`][flowkit.transformers.UnconstrainedMonotonic] transformer, or
[`BlockNeuralAutoregressive`][flowkit.bijectors.BlockNeuralAutoregressive] layers, with reversals in between
and a standard normal base. Densities take one pass per layer; sampling solves numerically (see the layers).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..bijectors import BlockNeuralAutoregressive
from ..distributions import Distribution
from ..transformers import MonotonicMLP, UnconstrainedMonotonic
from .flow import Flow
from .presets import ConditionerFactory, _base, _checked, _reversed_autoregressive_stack, _with_permutations
from .registry import preset

__all__ = ["NAF", "UNAF", "BNAF"]


@preset("naf", "neural autoregressive flow: deep sigmoidal flows from MADEs", transforms=3, hidden=(64, 64))
class NAF(Flow):
    """Neural autoregressive flow: MADE layers emitting deep sigmoidal flows, reversals in between.

    Arguments:
        features: number of features `D`.
        transforms: number of autoregressive layers.
        hidden: hidden sizes of each MADE.
        units: sigmoidal units per layer of each [`MonotonicMLP`][flowkit.transformers.MonotonicMLP].
        layers: sigmoidal layers of each `MonotonicMLP`.
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks.
        activation: conditioner activation.
        conditioner: a factory `conditioner(features, params_per_feature, context=context)` of
            autoregressive conditioners (`hidden`, `residual` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).

    References:
        Huang, Krueger, Lacoste & Courville, *Neural Autoregressive Flows*, ICML 2018 (arXiv:1804.00779).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        units: int = 16,
        layers: int = 1,
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        *,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("NAF", None, conditioner, {**sizes, "units": (units, 1), "layers": (layers, 1)}, hidden)
        transformer = MonotonicMLP(units, layers)
        args = (features, transforms, hidden, context, residual, activation, conditioner, base)
        super().__init__(*_reversed_autoregressive_stack(transformer, *args))


@preset("unaf", "unconstrained NAF: integrals of positive networks", transforms=3, hidden=(64, 64))
class UNAF(Flow):
    """Unconstrained neural autoregressive flow: MADE layers emitting integrals of positive networks (UMNN).

    Arguments:
        features: number of features `D`.
        transforms: number of autoregressive layers.
        hidden: hidden sizes of each MADE.
        units: hidden units of each integrand network
            ([`UnconstrainedMonotonic`][flowkit.transformers.UnconstrainedMonotonic]).
        nodes: grid cells on each side of 0 of each integral (the integrand is resolved at `bound / nodes`).
        bound: half-width of the window outside which each map is linear.
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks.
        activation: conditioner activation.
        conditioner: a factory `conditioner(features, params_per_feature, context=context)` of
            autoregressive conditioners (`hidden`, `residual` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).

    References:
        Wehenkel & Louppe, *Unconstrained Monotonic Neural Networks*, NeurIPS 2019 (arXiv:1908.05164).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        units: int = 8,
        nodes: int = 16,
        bound: float = 10.0,
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        *,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("UNAF", None, conditioner, {**sizes, "units": (units, 1), "nodes": (nodes, 1)}, hidden)
        transformer = UnconstrainedMonotonic(units, nodes, bound)
        args = (features, transforms, hidden, context, residual, activation, conditioner, base)
        super().__init__(*_reversed_autoregressive_stack(transformer, *args))


@preset("bnaf", "block neural autoregressive flow (hidden: per feature)", transforms=3, hidden=(16,))
class BNAF(Flow):
    """BNAF: [`BlockNeuralAutoregressive`][flowkit.bijectors.BlockNeuralAutoregressive] layers, reversals in between.

    Arguments:
        features: number of features `D`.
        transforms: number of block autoregressive layers.
        hidden: units per feature of each layer's hidden layers.
        context: number of context features (0 for an unconditional flow).
        leak: slope of the leaky tanh activation.
        base: the latent distribution (a standard normal by default).

    References:
        De Cao, Aziz & Titov, *Block Neural Autoregressive Flow*, UAI 2019 (arXiv:1904.04676).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 3,
        hidden: Sequence[int] = (16,),
        context: int = 0,
        leak: float = 0.01,
        *,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("BNAF", None, None, sizes, hidden)
        chain = [BlockNeuralAutoregressive(features, hidden, context, leak) for _ in range(transforms)]
        super().__init__(_with_permutations(list(chain), features, random=False), _base(base, features))
