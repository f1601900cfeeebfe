r"""Ferumal flows: coupling flows whose conditioners are kernel machines, for little data and few parameters.

[`KernelCouplingFlow`][flowkit.flows.KernelCouplingFlow] is RealNVP with each coupling's network replaced by a
[`KernelMachine`][flowkit.nn.KernelMachine], $\theta(x_A) = \sum_m \alpha_m k(x_A, z_m) + b$;
[`init_inducing`][flowkit.flows.init_inducing] puts the inducing points of any flow's kernel conditioners on data.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ..bijectors import Bijector, Chain
from ..distributions import Distribution
from ..nn import KernelMachine
from ..transformers import Affine, Transformer
from .flow import Flow
from .presets import _base, _checked, _coupling
from .registry import preset

__all__ = ["KernelCouplingFlow", "init_inducing"]


def _layers(bijector: Bijector) -> list[Bijector]:
    """The leaves of a (nested) chain, data side first."""
    if isinstance(bijector, Chain):
        return [leaf for layer in bijector for leaf in _layers(layer)]
    return [bijector]


def init_inducing(
    model: Flow | Bijector, x: Tensor, context: Tensor | None = None, generator: torch.Generator | None = None
) -> int:
    """Put the inducing points of every kernel conditioner of `model` on the data that reach it.

    `x` is pushed through the layers in turn (data side first); before each coupling or masked autoregressive layer
    whose conditioner has `init_inducing` (a [`KernelMachine`][flowkit.nn.KernelMachine] or
    [`MaskedKernelMachine`][flowkit.nn.MaskedKernelMachine]), that conditioner draws its points from the layer's
    conditioning input: the kept features of a coupling, all features of an autoregressive layer (with the context).
    A layer at the identity (as built) passes the data unchanged, so every layer then sees the data themselves.

    Arguments:
        model: a [`Flow`][flowkit.flows.Flow] or a bijector (a chain of layers).
        x: data `(N, D)`.
        context: the context of each row, if the model is conditional.
        generator: the random generator for the rows drawn (torch's global one when None).

    Returns:
        The number of conditioners initialised.

    Raises:
        ValueError: for data the conditioners refuse (see
            [`KernelMachine.init_inducing`][flowkit.nn.KernelMachine.init_inducing]).
    """
    bijector = model.bijector if isinstance(model, Flow) else model
    layers = _layers(bijector)
    kernels = [callable(getattr(getattr(layer, "conditioner", None), "init_inducing", None)) for layer in layers]
    count = 0
    with torch.no_grad():
        for layer, kernel in zip(layers, kernels, strict=True):
            if count == sum(kernels):  # no kernel conditioner further on: the data need not go further
                break
            if kernel:
                identity = getattr(layer, "identity_idx", None)  # a coupling's kept features
                layer.conditioner.init_inducing(x if identity is None else x[..., identity], context, generator)
                count += 1
            x = layer(x, context)[0]
    return count


@preset(
    "kernel-coupling",
    "Ferumal flow: affine couplings with kernel-machine conditioners",
    one_pass=True,
    transforms=8,
    inducing=64,
)
class KernelCouplingFlow(Flow):
    r"""Ferumal flow: affine couplings (RealNVP's alternating masks) whose conditioners are kernel machines.

    Layer $l$ keeps the features $x_A$ and transforms the others by $z_B = x_B\, e^{s(x_A)} + t(x_A)$ (or any
    `transformer=`), with the parameters from a [`KernelMachine`][flowkit.nn.KernelMachine],

    $$(s, t)(x_A) = \sum_{m=1}^{M} \alpha_m\, k(x_A, z_m) + b,$$

    learnable inducing points $z_m$, lengthscales and weights $\alpha_m$ (zero at the start, so the flow starts as the
    identity). A layer with `a` kept and `B = D - a` transformed features, `P = B * params` outputs (`params = 2` for
    the affine map) and `L = a + context` lengthscales (`ard=True`, else 1) has $M (a + \text{context} + P) + L + P$
    parameters: a few hundred where an MLP conditioner has tens of thousands.

    The inducing points start from a standard normal, the scale of standardised data (`flowkit fit` standardises);
    [`from_data`][flowkit.flows.KernelCouplingFlow.from_data] builds the flow with them drawn from training data
    instead ([`init_inducing`][flowkit.flows.init_inducing]).

    Arguments:
        features: number of features `D` (at least 2).
        transforms: number of coupling layers.
        inducing: inducing points `M` of each layer's kernel machine.
        kernel: `"squared_exponential"`, `"matern32"` or `"matern52"`.
        lengthscale: the starting lengthscale of every kernel (positive).
        ard: one lengthscale per conditioning input instead of one shared per layer.
        context: number of context features (0 for an unconditional flow), concatenated to each kernel's input.
        transformer: the coupling transformer instead of [`Affine`][flowkit.transformers.Affine].
        base: the latent distribution (a standard normal by default).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.KernelCouplingFlow(2, transforms=4, inducing=16)
        >>> flow.log_prob(torch.randn(3, 2)).shape
        torch.Size([3])
        >>> flowkit.flows.registry.count_parameters(flow) == 4 * (16 * (1 + 2) + 1 + 2)
        True

    References:
        English, Kirchler & Lippert, *Kernelised Normalising Flows* (Ferumal flows), ICLR 2024 (arXiv:2307.14839).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 8,
        inducing: int = 64,
        kernel: str = "squared_exponential",
        lengthscale: float = 1.0,
        ard: bool = True,
        context: int = 0,
        *,
        transformer: Transformer | None = None,
        base: Distribution | None = None,
    ) -> None:
        sizes = {"features": (features, 2), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("KernelCouplingFlow", transformer, None, sizes, ())
        transformer = Affine() if transformer is None else transformer
        machine = partial(KernelMachine, inducing=inducing, kernel=kernel, lengthscale=lengthscale, ard=ard)
        layers = [
            _coupling(transformer, features, None, i % 2, (), context, "relu", machine) for i in range(transforms)
        ]
        super().__init__(Chain(*layers), _base(base, features))

    @classmethod
    def from_data(
        cls, x: Tensor, context: Tensor | None = None, generator: torch.Generator | None = None, **kwargs: object
    ) -> KernelCouplingFlow:
        """The flow on `x.shape[-1]` features with its inducing points drawn from the rows of `x` (and the context).

        Arguments:
            x: training data `(N, D)`, on the scale the flow will see (standardise first if the flow will).
            context: the context of each row (give `context=` in `kwargs` too).
            generator: the random generator for the rows drawn.
            **kwargs: the other arguments of `KernelCouplingFlow`.
        """
        flow = cls(x.shape[-1], **kwargs)  # type: ignore[arg-type]
        init_inducing(flow, x, context, generator)
        return flow
