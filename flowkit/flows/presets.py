"""Presets: common flows built from a few arguments.

Every preset takes, besides its sizes, three keyword-only arguments:

- `transformer=`: a [`Transformer`][flowkit.transformers.Transformer] used (copied) in every layer instead of the
  preset's own;
- `conditioner=`: a factory that builds each layer's [`Conditioner`][flowkit.nn.Conditioner] instead of the default
  network from `hidden=` and `activation=`. Coupling layers call it as
  `conditioner(in_features, out_features, context=context)` (the signature of [`MLP`][flowkit.nn.MLP]), autoregressive
  layers as `conditioner(features, params_per_feature, context=context)` (that of [`MADE`][flowkit.nn.MADE]; it must
  build an autoregressive conditioner). A registered class or a `functools.partial` of one with keyword arguments, such
  as `functools.partial(flowkit.nn.MLP, hidden=(256, 256))`, saves and loads with [`flowkit.io`][flowkit.io];
- `base=`: the latent distribution, any flowkit [`Distribution`][flowkit.distributions.Distribution] with event shape
  `(features,)` (a [`StandardNormal`][flowkit.distributions.StandardNormal] by default).

`RealNVP`, `MAF` and `NSF` also take `shared=` (NanoFlow, see [`SharedTrunk`][flowkit.nn.SharedTrunk]): `True` gives
all layers one conditioner trunk, told apart by a per-step embedding, gates and output projection; `"output"` shares
the output layer too (embedding and gates per step); `"naive"` is one conditioner for all layers (the ablation). The
preset builds the sharing from its arguments, so a saved model loads with its trunk shared.

Example:
    ```python
    import functools
    import flowkit

    flow = flowkit.flows.RealNVP(
        4,
        transformer=flowkit.transformers.RationalQuadraticSpline(8, bound=4.0),
        conditioner=functools.partial(flowkit.nn.MLP, hidden=(256, 256), activation="silu"),
        base=flowkit.distributions.DiagNormal(4),
    )
    ```
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._validation import check_number
from ..bijectors import Bijector, Chain, Coupling, MaskedAutoregressive, Permutation, Reverse
from ..bijectors.coupling import coupling_mask
from ..distributions import Distribution, StandardNormal
from ..nn import SharedConditioner, SharedTrunk
from ..transformers import Affine, RationalQuadraticSpline, Transformer
from .flow import Flow
from .registry import preset

__all__ = ["RealNVP", "MAF", "NSF"]

#: Builds one layer's conditioner: `(in_features, out_features, context=...)` for couplings,
#: `(features, params_per_feature, context=...)` for autoregressive layers.
ConditionerFactory = Callable[..., nn.Module]


#: The values of the presets' `shared=`: independent conditioners, NanoFlow's sharing (per-step embedding, gates and
#: output projection), the output layer shared too, one conditioner for all layers.
SHARING = (False, True, "output", "naive")

#: The size of each step's flow indication embedding in the presets' shared conditioners.
EMBEDDING = 8


#: How `NSF(coupling=True)` permutes the features between layers (`"auto"`, the default: `"alternate"` at
#: `D = 2`, `"random"` above).
PERMUTATIONS = ("auto", "alternate", "random")

#: Where `NSF` starts its layers (`start=`): exactly at the identity, near it, or at a random point around it.
STARTS = ("identity", "near", "random")


def _default_start(coupling: bool, features: int) -> str:
    """The start of `NSF(start=None, near_identity=None)`, as measured against zuko (see the benchmarks page)."""
    if not coupling:
        return "near"
    return "random" if features == 2 else "identity"


def _half_mask(features: int, parity: int) -> list[int]:
    """The mask transforming the second half of the features (parity 0) or the first (parity 1), contiguous."""
    first = features // 2 if parity == 0 else features - features // 2
    return [parity] * first + [1 - parity] * (features - first)


def _checked(
    where: str,
    transformer: Transformer | None,
    conditioner: ConditionerFactory | None,
    sizes: dict[str, tuple[int, int]],
    hidden: Sequence[int],
) -> None:
    """Check a preset's arguments: its sizes (`{name: (value, minimum)}`), hidden sizes and parts."""
    for name, (value, minimum) in sizes.items():
        check_number(value, name, where=where, integer=True, low=minimum)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"{where}: hidden must be a sequence of layer sizes, got {hidden!r}")
    for size in hidden:
        check_number(size, "every hidden size", where=where, integer=True, low=1)
    if transformer is not None and not isinstance(transformer, Transformer):
        raise ValueError(f"{where}: transformer must be a flowkit Transformer, got {type(transformer).__name__}")
    if conditioner is not None and (isinstance(conditioner, nn.Module) or not callable(conditioner)):
        raise ValueError(
            f"{where}: conditioner must be a factory that builds one conditioner per layer, such as "
            f"functools.partial(flowkit.nn.MLP, hidden=(256, 256)); got {type(conditioner).__name__}"
        )


def _shared(
    where: str,
    shared: bool | str,
    conditioner: ConditionerFactory | None,
    sizes: tuple[int, int],
    hidden: Sequence[int],
    context: int,
    activation: str,
    autoregressive: bool,
    **options: Any,
) -> ConditionerFactory | None:
    """The factory of the layers' conditioners for `shared=` (None when they are independent), on one trunk.

    `sizes` are the largest conditioning input and the output of the layers (the shared output layer's size);
    `options` go to the [`SharedTrunk`][flowkit.nn.SharedTrunk] (a convolutional `kernel`).
    """
    if not (shared is False or shared is True or (isinstance(shared, str) and shared in SHARING)):
        raise ValueError(f"{where}: shared must be one of {SHARING}, got {shared!r}")
    if shared is False:
        return None
    if conditioner is not None:
        raise ValueError(f"{where}: give either conditioner= or shared=, not both")
    trunk = SharedTrunk(
        sizes[0],
        hidden,
        activation,
        context=context,
        embedding=0 if shared == "naive" else EMBEDDING,
        gates=shared != "naive",
        out_features=None if shared is True else sizes[1],
        autoregressive=autoregressive,
        **options,
    )

    def build(in_features: int, out_features: int, context: int = 0) -> SharedConditioner:
        if autoregressive:  # called as (features, params_per_feature, context=...)
            out_features *= in_features
        if shared is not True and out_features != sizes[1]:
            raise ValueError(
                f"{where}: shared={shared!r} shares the output layer, which needs layers of one size; these have "
                f"{sizes[1]} and {out_features} outputs (an odd number of features): use shared=True"
            )
        return SharedConditioner(trunk, in_features, out_features)

    return build


def _base(base: Distribution | None, features: int) -> Distribution:
    return StandardNormal(features) if base is None else base


def _coupling(
    transformer: Transformer,
    features: int,
    mask: Sequence[int] | None,
    parity: int,
    hidden: Sequence[int],
    context: int,
    activation: str,
    conditioner: ConditionerFactory | None,
) -> Coupling:
    """A coupling layer with a copy of `transformer` and, when a factory is given, a conditioner built by it."""
    net = None
    if conditioner is not None:
        transformed = int(coupling_mask(features, mask, parity).sum())
        net = conditioner(features - transformed, transformed * transformer.params_per_element, context=context)
    return Coupling(copy.deepcopy(transformer), features, mask, parity, hidden, context, activation, net)


def _autoregressive(
    transformer: Transformer,
    features: int,
    hidden: Sequence[int],
    context: int,
    residual: bool,
    activation: str,
    conditioner: ConditionerFactory | None,
) -> MaskedAutoregressive:
    """An autoregressive layer with a copy of `transformer` and, when a factory is given, a conditioner built by it."""
    net = None if conditioner is None else conditioner(features, transformer.params_per_element, context=context)
    return MaskedAutoregressive(
        copy.deepcopy(transformer), features, hidden, context, residual, activation, conditioner=net
    )


def _with_permutations(layers: list[Bijector], features: int, random: bool, identity: bool = False) -> Chain:
    """Chain `layers` with a permutation between consecutive ones (seeded random, the identity, or reversal).

    `identity` keeps a [`Permutation`][flowkit.bijectors.Permutation] module (its `perm` is a buffer, so
    models saved with random permutations load theirs into the same structure) set to `0, ..., D - 1`.
    """
    chain: list[Bijector] = []
    for i, layer in enumerate(layers):
        if i:
            if random:
                permutation = Permutation(features, seed=i)
                if identity:
                    permutation.perm.copy_(torch.arange(features))
            else:
                permutation = Reverse(features)
            chain.append(permutation)
        chain.append(layer)
    return Chain(*chain)


def _reversed_autoregressive_stack(
    transformer: Transformer,
    features: int,
    transforms: int,
    hidden: Sequence[int],
    context: int,
    residual: bool,
    activation: str,
    conditioner: ConditionerFactory | None,
    base: Distribution | None,
) -> tuple[Chain, Distribution]:
    """`transforms` autoregressive layers of `transformer` with reversals in between, and the base: the NAF layout."""
    layers = [
        _autoregressive(transformer, features, hidden, context, residual, activation, conditioner)
        for _ in range(transforms)
    ]
    return _with_permutations(layers, features, random=False), _base(base, features)


def _move_start(layers: Sequence[Bijector], start: str) -> None:
    """Move each default conditioner's last layer off the identity, by `U(-1/sqrt(n), 1/sqrt(n))` for `n` inputs.

    `"near"` adds these offsets to the last biases only (the weights stay zero: off the symmetric point where
    all bins are equal); `"random"` also draws the last weights so (a fresh `nn.Linear`, zuko's start). Both
    draw from torch's global generator, layer by layer.
    """
    with torch.no_grad():
        for layer in layers:
            last = getattr(getattr(layer, "conditioner", None), "last", None)
            if isinstance(last, nn.Linear) and last.bias is not None:
                bound = 1.0 / math.sqrt(max(1, last.in_features))
                if start == "random":
                    last.weight.uniform_(-bound, bound)
                    last.bias.add_(torch.empty_like(last.bias).uniform_(-bound, bound))
                else:
                    noise = torch.rand(last.bias.shape, dtype=last.bias.dtype)
                    last.bias.add_(bound * (2 * noise - 1).to(last.bias.device))


@preset("realnvp", "affine couplings", one_pass=True, bench=True, transforms=8, hidden=(128, 128))
class RealNVP(Flow):
    """RealNVP: affine couplings with alternating masks, over a standard normal by default.

    Arguments:
        features: number of features `D` (at least 2).
        transforms: number of coupling layers.
        hidden: hidden sizes of each conditioner MLP.
        context: number of context features (0 for an unconditional flow).
        activation: conditioner activation.
        transformer: the coupling transformer instead of [`Affine`][flowkit.transformers.Affine]
            (e.g. a [`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline]).
        conditioner: a factory `conditioner(in_features, out_features, context=context)` for
            each layer's conditioner (`hidden` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).
        shared: share one conditioner trunk between the layers (NanoFlow; see the module's help): `False`, `True`,
            `"output"` or `"naive"`.

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
        *,
        transformer: Transformer | None = None,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
        shared: bool | str = False,
    ) -> None:
        sizes = {"features": (features, 2), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("RealNVP", transformer, conditioner, sizes, hidden)
        transformer = Affine() if transformer is None else transformer
        out = (features - features // 2) * transformer.params_per_element  # the first layer's (parity 0)
        conditioner = (
            _shared("RealNVP", shared, conditioner, (features - features // 2, out), hidden, context, activation, False)
            or conditioner
        )
        layers = [
            _coupling(transformer, features, None, i % 2, hidden, context, activation, conditioner)
            for i in range(transforms)
        ]
        super().__init__(Chain(*layers), _base(base, features))


@preset("maf", "masked autoregressive flow of affine MADE layers", bench=True, transforms=5, hidden=(64, 64))
class MAF(Flow):
    """Masked autoregressive flow: affine MADE layers with reversals in between, over a standard normal by default.

    Density evaluation is one pass per layer; sampling needs `D` passes per layer.

    Arguments:
        features: number of features `D`.
        transforms: number of autoregressive layers.
        hidden: hidden sizes of each MADE.
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks.
        activation: conditioner activation.
        transformer: the transformer instead of [`Affine`][flowkit.transformers.Affine] (any
            transformer on the real line).
        conditioner: a factory `conditioner(features, params_per_feature, context=context)` that builds an
            autoregressive conditioner for each layer, e.g. `functools.partial(flowkit.nn.MADE, hidden=(256, 256))`
            (`hidden`, `residual` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).
        shared: share one conditioner trunk between the layers (NanoFlow; see the module's help): `False`, `True`,
            `"output"` or `"naive"` (not with `residual`).

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
        *,
        transformer: Transformer | None = None,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
        shared: bool | str = False,
    ) -> None:
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("MAF", transformer, conditioner, sizes, hidden)
        transformer = Affine() if transformer is None else transformer
        if shared is not False and residual:
            raise ValueError("MAF: a shared conditioner has no residual blocks (residual=False)")
        out = features * transformer.params_per_element
        conditioner = (
            _shared("MAF", shared, conditioner, (features, out), hidden, context, activation, True) or conditioner
        )
        layers: list[Bijector] = [
            _autoregressive(transformer, features, hidden, context, residual, activation, conditioner)
            for _ in range(transforms)
        ]
        super().__init__(_with_permutations(layers, features, random=False), _base(base, features))


@preset(
    "nanoflow",
    "coupling NSF whose layers share one conditioner, told apart by per-step embeddings (NanoFlow)",
    one_pass=True,
    transforms=8,
    hidden=(128, 128),
    bins=8,
    coupling=True,
    shared=True,
)
@preset("nsf", "autoregressive NSF (neural spline flow)", bench=True, transforms=5, hidden=(128, 128), bins=8)
@preset(
    "nsf-coupling", "coupling NSF", one_pass=True, bench=True, transforms=5, hidden=(128, 128), bins=8, coupling=True
)
class NSF(Flow):
    r"""Neural spline flow: rational-quadratic spline layers (autoregressive or coupling) over a standard normal.

    Autoregressive layers (the default) are more expressive per layer and evaluate densities in one pass, but sample in
    `D` sequential steps; coupling layers (`coupling=True`, masks over contiguous halves that alternate from layer to
    layer, as in zuko's and RealNVP's couplings) are fast both ways. Each spline has `bins` bins on `[-bound, bound]`
    and is the identity outside.

    The default starts, measured against zuko (see the benchmarks page): autoregressive layers start near the identity
    (`"near"`: zero last weights, last biases the spline's identity parameters plus $U(-1/\sqrt{n}, 1/\sqrt{n})$ offsets
    for `n` inputs, off the symmetric point that training escapes slowly); coupling layers at `D = 2` where zuko's start
    (`"random"`: last weights and offsets as a fresh `nn.Linear`'s), exactly at the identity above (`"identity"`). All
    but `"identity"` draw from torch's global generator, and move only default conditioners and splines.

    Arguments:
        features: number of features `D`.
        transforms: number of spline layers.
        bins: number of spline bins `K`.
        hidden: hidden sizes of each conditioner.
        coupling: coupling layers instead of autoregressive ones.
        bound: the spline interval half-width `B`.
        context: number of context features (0 for an unconditional flow).
        residual: residual MADE blocks (autoregressive layers only).
        activation: conditioner activation.
        transformer: the transformer instead of the rational-quadratic spline (`bins` and
            `bound` are then unused), e.g. one with other minimum bin sizes.
        conditioner: a factory for each layer's conditioner: called as
            `conditioner(in_features, out_features, context=context)` for coupling layers,
            `conditioner(features, params_per_feature, context=context)` for autoregressive ones, where it must build an
            autoregressive conditioner (`hidden`, `residual` and `activation` are then unused).
        base: the latent distribution (a standard normal by default).
        permutations: between coupling layers, `"auto"` (the default: `"alternate"` at `D = 2`, `"random"` above),
            `"random"` (seeded random permutations; at `D = 2` the swaps cancel the alternating masks) or `"alternate"`
            (the identity, as in zuko and RealNVP); saved [`Permutation`][flowkit.bijectors.Permutation] modules either
            way. Unused by autoregressive layers (reversals in between).
        near_identity: `True` for `start="near"`, `False` for `start="identity"`; `None` (the
            default) leaves the choice to `start`.
        start: where every layer starts: `"identity"`, `"near"`, `"random"` (see above) or `None` (the defaults above).
        shared: share one conditioner trunk between the layers (NanoFlow; see the module's help): `False`, `True`,
            `"output"` or `"naive"` (not with `residual`). `start` then moves the per-step output projections
            (`shared=True`) and leaves a shared output layer at the identity.

    Examples:
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
        *,
        transformer: Transformer | None = None,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
        permutations: str = "auto",
        near_identity: bool | None = None,
        start: str | None = None,
        shared: bool | str = False,
    ) -> None:
        if permutations not in PERMUTATIONS:
            raise ValueError(f"NSF: permutations must be one of {', '.join(PERMUTATIONS)}; got {permutations!r}")
        if permutations == "auto":  # at D = 2 a random permutation is the identity or the swap, which cancels
            permutations = "alternate" if features == 2 else "random"
        if start is not None and start not in STARTS:
            raise ValueError(f"NSF: start must be one of {', '.join(STARTS)} or None; got {start!r}")
        if near_identity is not None:
            implied = "near" if near_identity else "identity"
            if start is not None and start != implied:
                raise ValueError(f"NSF: near_identity={near_identity} and start={start!r} disagree; give one of them")
            start = implied
        if start is None:
            start = _default_start(coupling, features)
        if coupling and residual:
            raise ValueError("NSF: residual applies to autoregressive layers only (coupling=False)")
        sizes = {"features": (features, 2 if coupling else 1), "transforms": (transforms, 1), "context": (context, 0)}
        _checked("NSF", transformer, conditioner, {**sizes, "bins": (bins, 1)}, hidden)
        spline = transformer is None or isinstance(transformer, RationalQuadraticSpline)
        transformer = RationalQuadraticSpline(bins, bound) if transformer is None else transformer
        if shared is not False and residual:
            raise ValueError("NSF: a shared conditioner has no residual blocks (residual=False)")
        sizes_in = features // 2 if coupling else features  # the identity halves all have D // 2 features
        out = (features - sizes_in if coupling else features) * transformer.params_per_element
        factory = _shared("NSF", shared, conditioner, (sizes_in, out), hidden, context, activation, not coupling)
        default = conditioner is None
        conditioner = factory or conditioner
        if coupling:
            layers: list[Bijector] = [
                _coupling(
                    transformer, features, _half_mask(features, i % 2), 0, hidden, context, activation, conditioner
                )
                for i in range(transforms)
            ]
        else:
            layers = [
                _autoregressive(transformer, features, hidden, context, residual, activation, conditioner)
                for _ in range(transforms)
            ]
        if spline and default and start != "identity":
            _move_start(layers, start)
        chain = _with_permutations(layers, features, random=coupling, identity=permutations == "alternate")
        super().__init__(chain, _base(base, features))
