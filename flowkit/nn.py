r"""Conditioners: the networks that emit the parameters of coupling and autoregressive layers.

A *conditioner* maps the part of the input a layer conditions on (the identity half of a coupling, all features of an
autoregressive layer) and the context to the transformer's parameters. [`Conditioner`][flowkit.nn.Conditioner] states
the contract in one place; [`MLP`][flowkit.nn.MLP] (optionally with a $(\cos x, \sin x)$ embedding for angles) and
[`MADE`][flowkit.nn.MADE] (masked, autoregressive) implement it, and any other module that does (a convolutional net for
images or lattices) plugs into [`Coupling`][flowkit.bijectors.Coupling] and
[`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] the same way. A
[`SharedTrunk`][flowkit.nn.SharedTrunk] with one [`SharedConditioner`][flowkit.nn.SharedConditioner] per layer lets
many layers share one network (NanoFlow).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._config import Configurable
from ._validation import check_number
from .utils import broadcast_shapes

__all__ = [
    "Conditioner",
    "MLP",
    "ConvNet",
    "MaskedLinear",
    "MADE",
    "SharedTrunk",
    "SharedConditioner",
    "KernelMachine",
    "MaskedKernelMachine",
    "VectorField",
    "PotentialField",
    "time_embedding",
    "activation",
    "broadcast_context",
    "check_conditioner",
]

_ACTIVATIONS = {
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU,
    "softplus": nn.Softplus,
}


def activation(name: str) -> nn.Module:
    """Build an activation module from its name (`relu`, `elu`, `tanh`, `silu`, `gelu`, `leaky_relu`, `softplus`)."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}") from None


def broadcast_context(h: Tensor, context: Tensor | None) -> Tensor:
    """Concatenate `context` to the conditioner input `h`, broadcasting batch dimensions."""
    if context is None:
        return h
    batch = broadcast_shapes(h.shape[:-1], context.shape[:-1])
    return torch.cat([h.expand(*batch, h.shape[-1]), context.expand(*batch, context.shape[-1])], dim=-1)


def _stack(sizes: Sequence[int], activation_name: str, layer: Callable[..., nn.Module] = nn.Linear) -> list[nn.Module]:
    """`layer(a, b)` for consecutive `sizes`, with the named activation between them."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers += [activation(activation_name), layer(a, b)] if i else [layer(a, b)]
    return layers


def _zero_linear(layer: nn.Linear | nn.Conv2d, bias: Tensor | None) -> None:
    with torch.no_grad():
        layer.weight.zero_()
        if bias is None:
            layer.bias.zero_()
        else:
            layer.bias.copy_(bias)


class Conditioner(Configurable, nn.Module):
    r"""The contract between a layer and the network that parametrises its transformer.

    A conditioner maps inputs `x` of shape `(..., in_features)` and an optional context `(..., context_features)` (batch
    dimensions broadcast) to `(..., out_features)` numbers, feature-major: the `params_per_element` parameters of
    transformed element `j` are the contiguous block `[j * params_per_element, (j + 1) * params_per_element)`. Layers
    call [`zero_last`][flowkit.nn.Conditioner.zero_last] once, so that they start as the identity.

    An *autoregressive* conditioner (for [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive]) has
    `in_features = D`, sets `order` (a permutation of `range(D)`), and its output block `i` depends only on
    the features before `i` in `order` and on the context; [`invert`][flowkit.nn.Conditioner.invert] solves
    the layer's inverse one feature at a time (`D` full passes here, incrementally in
    [`MADE.invert`][flowkit.nn.MADE.invert]). Subclasses are registered with [`flowkit.io`][flowkit.io].

    Attributes:
        in_features: size of the conditioning input `x`.
        out_features: number of outputs (transformed elements times parameters per element).
        context_features: size of the context (0 when unconditional).
        order: the autoregressive order, or `None` for a conditioner that is not autoregressive.
    """

    _flowkit_register = False
    in_features: int
    out_features: int
    context_features: int = 0
    order: Sequence[int] | None = None

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """The parameters `(..., out_features)` for inputs `x` and `context`."""
        raise NotImplementedError

    def zero_last(self, bias: Tensor | None = None) -> None:
        """Make the output constant, equal to `bias` (zeros when `None`), whatever the input."""
        raise NotImplementedError

    def invert(self, solve: Callable[[int, Tensor], Tensor], z: Tensor, context: Tensor | None = None) -> Tensor:
        """Solve an autoregressive layer's inverse feature by feature, in `order`.

        Arguments:
            solve: `solve(i, params_i)` returns feature `i` of the result (shape
                `z.shape[:-1]`) from its parameters `params_i` (shape `(*z.shape[:-1], params_per_element)`).
            z: `(..., D)`; fixes the batch shape (already broadcast with the context), dtype and device.
            context: the context, broadcastable to `z`'s batch shape.

        Returns:
            The features `(..., D)`, each computed once by `solve` after the ones before it.
        """
        if self.order is None:
            raise ValueError(f"{type(self).__name__} is not an autoregressive conditioner (its order is None)")
        columns = list(torch.zeros_like(z).unbind(-1))
        for i in self.order:
            out = self(torch.stack(columns, dim=-1), context)
            n = out.shape[-1] // len(columns)
            columns[i] = solve(i, out[..., i * n : (i + 1) * n])
        return torch.stack(columns, dim=-1)


def check_conditioner(
    conditioner: nn.Module, in_features: int, out_features: int, context: int, autoregressive: bool, where: str
) -> None:
    """Refuse a module that cannot serve as a layer's conditioner, or whose declared sizes do not fit.

    Arguments:
        conditioner: the module, a [`Conditioner`][flowkit.nn.Conditioner] (`forward(x, context)`, `zero_last`).
        in_features: the number of inputs the layer feeds it.
        out_features: the number of transformer parameters the layer needs from it.
        context: the number of context features.
        autoregressive: whether it must be autoregressive (an `order` and `invert`, as [`MADE`][flowkit.nn.MADE]).
        where: the layer's name, for the error message.

    Raises:
        ValueError: naming the missing method or the size that does not fit.
    """
    if not isinstance(conditioner, nn.Module) or not callable(getattr(conditioner, "zero_last", None)):
        raise ValueError(
            f"{where}: conditioner must be an nn.Module with forward(x, context) and zero_last(bias) "
            f"(see flowkit.nn.Conditioner), got {type(conditioner).__name__}"
        )
    if autoregressive and (getattr(conditioner, "order", None) is None or not hasattr(conditioner, "invert")):
        raise ValueError(
            f"{where}: conditioner must be autoregressive (an order and invert(solve, z, context), "
            f"e.g. flowkit.nn.MADE), got {type(conditioner).__name__}"
        )
    expected = {"in_features": in_features, "out_features": out_features, "context_features": context}
    for name, size in expected.items():
        declared = getattr(conditioner, name, None)
        if declared is not None and declared != size:
            raise ValueError(f"{where}: the conditioner has {name}={declared}, the layer needs {size}")


class MLP(Conditioner, nn.Sequential):
    r"""Multi-layer perceptron `in (+ context) -> hidden... -> out`, a [`Conditioner`][flowkit.nn.Conditioner].

    `nn.Linear` layers interleaved with activations (state-dict keys `0.weight`, `2.weight`, ...). With
    `periodic=True` the inputs are angles and enter as $(\cos x, \sin x)$ (circular couplings).

    Arguments:
        in_features: input size (before the periodic embedding).
        out_features: output size.
        hidden: sizes of the hidden layers.
        activation: name of the activation between layers (see [`activation`][flowkit.nn.activation]).
        context: number of context features, concatenated to the (embedded) input.
        periodic: embed the inputs as $(\cos x, \sin x)$.

    Examples:
        >>> import torch
        >>> net = MLP(3, 4, hidden=(8,), context=2)
        >>> net(torch.randn(5, 3), torch.randn(2)).shape
        torch.Size([5, 4])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        *,
        context: int = 0,
        periodic: bool = False,
    ) -> None:
        hidden = [int(h) for h in hidden]
        if (
            in_features < 0
            or context < 0
            or out_features < 1
            or in_features + context < 1
            or any(h < 1 for h in hidden)
        ):
            raise ValueError(
                f"MLP needs a non-empty input, out_features >= 1 and positive hidden sizes, got in_features="
                f"{in_features}, context={context}, out_features={out_features}, hidden={tuple(hidden)}"
            )
        super().__init__(*_stack([(2 if periodic else 1) * in_features + context, *hidden, out_features], activation))
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.context_features = int(context)
        self.periodic = bool(periodic)

    @property
    def last(self) -> nn.Linear:
        """The output layer."""
        return self[-1]  # type: ignore[return-value]

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if self.periodic:
            x = torch.cat([torch.cos(x), torch.sin(x)], dim=-1)
        h = broadcast_context(x, context)
        for layer in self:
            h = layer(h)
        return h

    def zero_last(self, bias: Tensor | None = None) -> None:
        _zero_linear(self.last, bias)


def _grid_input(x: Tensor, context: Tensor | None, channels: int, where: str) -> Tensor:
    """A grid `(..., channels, H, W)`, checked, with the context appended as constant planes (batch broadcast).

    Convolutions then run on it in channels-last (NHWC) layout, which oneDNN's CPU convolutions run natively.
    """
    if x.dim() < 3 or x.shape[-3] != channels:
        raise ValueError(f"{where} expects (..., {channels}, H, W) inputs, got shape {tuple(x.shape)}")
    if context is not None:
        batch = broadcast_shapes(x.shape[:-3], context.shape[:-1])
        x = x.expand(*batch, *x.shape[-3:])
        planes = context.expand(*batch, context.shape[-1])[..., None, None].expand(*batch, -1, *x.shape[-2:])
        x = torch.cat([x, planes], dim=-3)
    return x


class ConvNet(Conditioner):
    r"""Convolutional [`Conditioner`][flowkit.nn.Conditioner] on `(..., C, H, W)` grids (images and lattices).

    `Conv2d(kernel, same padding)` layers with activations in between keep the spatial size. With
    `padding_mode="circular"` the grid is a torus and the network commutes with every translation (lattice
    field theory); `"zeros"` is the usual image padding. A context vector enters as constant extra input
    channels. The output is channel-major for [`MaskedCoupling`][flowkit.bijectors.MaskedCoupling].

    Arguments:
        in_channels: channels of the input grid.
        out_channels: channels of the output grid.
        hidden: channels of the hidden layers.
        kernel: odd kernel size of every convolution.
        activation: name of the activation between layers (see [`activation`][flowkit.nn.activation]).
        padding_mode: `"zeros"` (images) or `"circular"` (periodic lattices).
        context: number of context features.

    Examples:
        >>> import torch
        >>> net = ConvNet(1, 2, hidden=(8,), padding_mode="circular")
        >>> x = torch.randn(5, 1, 6, 6)
        >>> torch.allclose(net(x.roll(1, -1)), net(x).roll(1, -1), atol=1e-6)
        True

    References:
        Albergo, Kanwar & Shanahan, *Flow-based generative models for Markov chain
        Monte Carlo in lattice field theory*, Phys. Rev. D 100, 034515 (2019).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden: Sequence[int] = (64, 64),
        kernel: int = 3,
        activation: str = "relu",
        padding_mode: str = "zeros",
        context: int = 0,
    ) -> None:
        super().__init__()
        hidden = [int(h) for h in hidden]
        if in_channels < 1 or out_channels < 1 or context < 0 or any(h < 1 for h in hidden):
            raise ValueError(
                f"ConvNet needs positive channel counts and hidden sizes, got in_channels={in_channels}, "
                f"out_channels={out_channels}, hidden={tuple(hidden)}, context={context}"
            )
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"ConvNet: kernel must be a positive odd size (same padding), got {kernel}")
        if padding_mode not in ("zeros", "circular"):
            raise ValueError(f"ConvNet: padding_mode must be 'zeros' or 'circular', got {padding_mode!r}")
        self.in_features = self.in_channels = int(in_channels)
        self.out_features = self.out_channels = int(out_channels)
        self.context_features = int(context)
        sizes = [self.in_channels + self.context_features, *hidden, self.out_channels]
        conv = partial(nn.Conv2d, kernel_size=kernel, padding=kernel // 2, padding_mode=padding_mode)
        self.net = nn.Sequential(*_stack(sizes, activation, conv))

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Outputs `(..., out_channels, H, W)` for a grid `(..., in_channels, H, W)` and the context."""
        x = _grid_input(x, context, self.in_channels, "ConvNet")
        h = self.net(x.reshape(-1, *x.shape[-3:]).contiguous(memory_format=torch.channels_last))
        return h.reshape(*x.shape[:-3], *h.shape[-3:])

    def zero_last(self, bias: Tensor | None = None) -> None:
        _zero_linear(self.net[-1], bias)


class MaskedLinear(nn.Linear):
    r"""Linear layer whose weight is multiplied by a fixed 0/1 mask, $y = x (W \odot M)^T + b$.

    Arguments:
        mask: `(out_features, in_features)` connectivity; a boolean buffer, so it follows `.to(device)`.
    """

    def __init__(self, mask: Tensor) -> None:
        super().__init__(mask.shape[1], mask.shape[0])
        self.register_buffer("mask", mask.bool(), persistent=False)

    def masked_weight(self) -> Tensor:
        r"""The effective weight $W \odot M$, a selection: masked entries get a zero gradient, never `inf * 0`."""
        return torch.where(self.mask, self.weight, 0.0)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight(), self.bias)


def _degrees(order: Sequence[int], context: int, hidden: Sequence[int]) -> tuple[Tensor, Tensor, list[Tensor]]:
    """MADE's degrees: each feature's rank in `order` (1..D), those of the inputs (context: 0), of the hidden units.

    Hidden degrees cycle through `[low, D - 1]`; degree-0 units (which see only the context) let the first
    feature's parameters depend on the context (`low = 0` with a context, 1 without).
    """
    features = len(order)
    rank = torch.empty(features, dtype=torch.long)
    rank[torch.tensor(order)] = torch.arange(1, features + 1)
    degree_in = torch.cat([rank, torch.zeros(context, dtype=torch.long)])
    low = 0 if context else min(1, features - 1)
    return rank, degree_in, [torch.arange(int(width)) % max(1, features - low) + low for width in hidden]


class MADE(Conditioner):
    r"""Masked autoencoder for distribution estimation: an autoregressive [`Conditioner`][flowkit.nn.Conditioner].

    Output block `i` depends only on the features before `i` in `order` and on the context, through masks
    built from degrees: inputs get their rank in `order` (1..D), context inputs 0, hidden units cycle through
    `1..D-1` (`0..D-1` with context, so that the first feature's parameters depend on it); a hidden unit sees
    inputs of lower or equal degree, an output hidden units of strictly lower degree. With `residual=True`
    each hidden layer is followed by a masked residual block $h + L_2(\sigma(L_1(\sigma(h))))$ (Durkan et al.).

    Arguments:
        features: number of features `D`.
        params_per_feature: number of outputs per feature.
        hidden: hidden layer sizes.
        context: number of context features, fed to every first-layer unit.
        residual: add a masked residual block after each hidden layer.
        activation: activation name (see [`activation`][flowkit.nn.activation]).
        order: the autoregressive order, a permutation of `range(D)` (natural order when None).

    References:
        Germain, Gregor, Murray & Larochelle, *MADE: Masked autoencoder for
        distribution estimation*, ICML 2015 (arXiv:1502.03509).
    """

    def __init__(
        self,
        features: int,
        params_per_feature: int,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        residual: bool = False,
        activation: str = "relu",
        order: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if features < 1 or params_per_feature < 1 or not hidden:
            raise ValueError(
                f"MADE needs features >= 1, params_per_feature >= 1 and at least one hidden layer, got "
                f"{features}, {params_per_feature}, {tuple(hidden)}"
            )
        order = list(range(features)) if order is None else [int(i) for i in order]
        if sorted(order) != list(range(features)):
            raise ValueError(f"MADE: order must be a permutation of range({features}), got {order}")
        self.features = features
        self.params_per_feature = params_per_feature
        self.in_features = features
        self.out_features = features * params_per_feature
        self.context_features = int(context)
        self.order = order
        rank, degree_in, self._hidden_degrees = _degrees(order, self.context_features, hidden)
        self.act = globals()["activation"](activation)
        self.hidden_layers = nn.ModuleList()
        self.residual_blocks = nn.ModuleList() if residual else None
        degree = degree_in
        for degree_h in self._hidden_degrees:
            self.hidden_layers.append(MaskedLinear(degree_h[:, None] >= degree[None, :]))
            if residual:
                square = degree_h[:, None] >= degree_h[None, :]
                self.residual_blocks.append(nn.ModuleList([MaskedLinear(square), MaskedLinear(square)]))
            degree = degree_h
        degree_out = rank.repeat_interleave(params_per_feature)
        self.last = MaskedLinear(degree_out[:, None] > degree[None, :])
        # For the incremental inverse: hidden units by increasing degree, and for each rank r = 1..D the
        # number of units of each layer with degree < r (a prefix once sorted), fixed at construction.
        self._unit_order = [torch.argsort(d, stable=True) for d in self._hidden_degrees]
        self._prefixes = [[int((d < r).sum()) for d in self._hidden_degrees] for r in range(1, features + 1)]

    def zero_last(self, bias: Tensor | None = None) -> None:
        _zero_linear(self.last, bias)

    def masked_weights(self) -> list[tuple[Tensor, Tensor]]:
        r"""$(W \odot M, b)$ of every layer in order of application (computed once, reused by loops)."""
        layers: list[MaskedLinear] = []
        for i, layer in enumerate(self.hidden_layers):
            layers.append(layer)
            if self.residual_blocks is not None:
                layers.extend(self.residual_blocks[i])
        layers.append(self.last)
        return [(layer.masked_weight(), layer.bias) for layer in layers]

    def trunk(self, pre: Tensor, weights: list[tuple[Tensor, Tensor]]) -> Tensor:
        """From the first layer's pre-activation to the last hidden activation, with precomputed `weights`."""
        h = pre
        residual = self.residual_blocks is not None
        step = 3 if residual else 1
        for i in range(len(self.hidden_layers)):
            if i:
                h = F.linear(self.act(h), *weights[i * step])
            if residual:
                h = h + F.linear(self.act(F.linear(self.act(h), *weights[i * step + 1])), *weights[i * step + 2])
        return self.act(h)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Outputs `(..., D * params_per_feature)`, feature-major, for inputs `(..., D)` and the context."""
        weights = self.masked_weights()
        return F.linear(self.trunk(F.linear(broadcast_context(x, context), *weights[0]), weights), *weights[-1])

    def _sorted_weights(self) -> tuple[Tensor, Tensor | None, list[tuple[Tensor, Tensor]]]:
        """[`masked_weights`][flowkit.nn.MADE.masked_weights] with hidden units by increasing degree.

        Returns the first layer's feature columns in rank order `(H_1, D)`, its context columns (None without a
        context), and every layer's `(W, b)` in order of application (the first layer's with an empty weight),
        each hidden layer's rows and columns (and the last layer's columns) sorted by degree.
        """
        weights = self.masked_weights()
        device = weights[0][0].device
        perms = [order.to(device) for order in self._unit_order]
        step = 3 if self.residual_blocks is not None else 1
        d = self.features
        w_first, b_first = weights[0]
        w_first = w_first.index_select(0, perms[0])
        ranked = torch.tensor(self.order, device=device)  # the feature of rank r + 1 is order[r]
        w_x = w_first.index_select(1, ranked)
        w_context = w_first[:, d:] if self.context_features else None
        out: list[tuple[Tensor, Tensor]] = [(w_x[:, :0], b_first.index_select(0, perms[0]))]
        for index, (w, b) in enumerate(weights[1:-1], start=1):
            layer, part = divmod(index, step)
            rows = perms[layer]
            cols = rows if part else perms[layer - 1]
            out.append((w.index_select(0, rows).index_select(1, cols), b.index_select(0, rows)))
        w_last, b_last = weights[-1]
        out.append((w_last.index_select(1, perms[-1]), b_last))
        return w_x, w_context, out

    def invert(self, solve: Callable[[int, Tensor], Tensor], z: Tensor, context: Tensor | None = None) -> Tensor:
        """The incremental version of [`Conditioner.invert`][flowkit.nn.Conditioner.invert].

        The masked weights are computed once, with the hidden units sorted by degree. A hidden unit of degree `k`
        depends on the features of rank `<= k` only, so it is final once those are known: the step that solves the
        feature of rank `r` computes only the units of degree `r - 1` of each layer (from the prefix of the layer
        below that they see) and the feature's output block (from the units of degree `< r`). Each unit is computed
        once per inverse: the whole inverse costs about one pass of the network, in `D` steps.

        Activations are kept unit-major, `(units, batch)`, so that a layer's known units are a contiguous prefix:
        without gradients they are written into preallocated tables, with gradients concatenated (no in-place
        writes into tensors autograd saved); both multiply the same contiguous prefixes, so both give the same
        numbers.
        """
        n, d = self.params_per_feature, self.features
        w_x, w_context, weights = self._sorted_weights()
        if w_context is not None and context is None:
            raise ValueError(f"MADE: the inverse needs a context of {self.context_features} features, got None")
        bias_first = weights[0][1]
        if w_context is not None:
            bias_first = F.linear(context, w_context, bias_first)  # (..., H_1): the context's share, once
        batch = broadcast_shapes(z.shape[:-1], bias_first.shape[:-1])
        size = math.prod(batch)
        # The first layer's bias, unit-major: (H_1, 1), or (H_1, N) with a batched context.
        bias_first = (
            bias_first.unsqueeze(-1) if bias_first.dim() == 1 else bias_first.expand(*batch, -1).reshape(size, -1).t()
        )
        w_last, b_last = weights[-1]
        residual = self.residual_blocks is not None
        step = 3 if residual else 1
        widths = [w.shape[0] for w, _ in weights[:-1:step]]
        # The known features (in rank order) and each hidden layer's activations (and its residual sublayers'),
        # unit-major: tables filled row by row, or (with gradients) grown by concatenation.
        grow = not torch.is_grad_enabled()
        new = z.new_empty if grow else (lambda *shape: z.new_zeros(shape[0] * 0, *shape[1:]))
        known = new(d, size)
        activations = [[new(width, size) for _ in range(3 if residual else 1)] for width in widths]

        def put(table: Tensor, low: int, rows: Tensor) -> Tensor:
            if grow:
                table[low : low + rows.shape[0]] = rows
                return table
            return torch.cat([table, rows], 0)

        columns: list[Tensor | None] = [None] * d
        previous = [0] * len(widths)
        for rank, i in enumerate(self.order):
            sizes = self._prefixes[rank]
            below = known[:rank]  # the layer below: the known features, all of them seen
            for layer, units in enumerate(sizes):
                low = previous[layer]
                acts = activations[layer]
                if units > low:  # the units of degree rank - 1: this layer's new ones
                    if layer:
                        w, b = weights[layer * step]
                        a = torch.addmm(b[low:units, None], w[low:units, : below.shape[0]], below)
                    else:
                        a = torch.addmm(bias_first[low:units], w_x[low:units, :rank], below)
                    if residual:
                        (w1, b1), (w2, b2) = weights[layer * step + 1], weights[layer * step + 2]
                        acts[1] = put(acts[1], low, self.act(a))
                        t = torch.addmm(b1[low:units, None], w1[low:units, :units], acts[1][:units])
                        acts[2] = put(acts[2], low, self.act(t))
                        a = a + torch.addmm(b2[low:units, None], w2[low:units, :units], acts[2][:units])
                    acts[0] = put(acts[0], low, self.act(a))
                    previous[layer] = units
                below = acts[0][:units]
            block = slice(i * n, (i + 1) * n)
            params = torch.addmm(b_last[block, None], w_last[block, : sizes[-1]], below)
            columns[i] = column = solve(i, params.t().reshape(*batch, n))
            known = put(known, rank, column.reshape(1, size))
        return torch.stack(columns, dim=-1)  # type: ignore[arg-type]


def _softplus_inverse(y: Tensor) -> Tensor:
    r"""$\log(e^y - 1)$, the raw value whose softplus is `y > 0`."""
    return y + torch.log(-torch.expm1(-y))


def _matern(r2: Tensor, nu_times_2: int) -> Tensor:
    r"""Matérn profile of a squared scaled distance: $\nu = 3/2$ (`3`) or $5/2$ (`5`).

    $\sqrt{r^2}$ is taken of $\max(r^2, \text{tiny})$: at $r = 0$ the gradient is 0 (both profiles are flat there), not
    `inf * 0`.
    """
    s = (nu_times_2 * r2.clamp_min(torch.finfo(r2.dtype).tiny)).sqrt()
    polynomial = 1 + s if nu_times_2 == 3 else 1 + s + s.square() / 3
    return polynomial * torch.exp(-s)


#: Stationary kernels as functions of the squared scaled distance $r^2 = \sum_j (u_j - z_j)^2 / \ell_j^2$.
_KERNELS: dict[str, Callable[[Tensor], Tensor]] = {
    "squared_exponential": lambda r2: torch.exp(-0.5 * r2),
    "matern32": partial(_matern, nu_times_2=3),
    "matern52": partial(_matern, nu_times_2=5),
}


class KernelMachine(Conditioner):
    r"""Kernel-machine [`Conditioner`][flowkit.nn.Conditioner] (Ferumal flows): parameters as sums of kernels.

    With inputs $u = [x, c]$ (the context $c$, when given, is concatenated to $x$ and has its own lengthscales),
    `M` learnable inducing points $z_m$, learnable lengthscales $\ell$ and weights $\alpha_m \in \mathbb R^{P}$,

    $$\theta(u) = \sum_{m=1}^{M} \alpha_m\, k(u, z_m) + b, \qquad k(u, z) = \kappa(r), \quad
    r^2 = \sum_j \frac{(u_j - z_j)^2}{\ell_j^2},$$

    a kernel machine of the form the representer theorem gives, with the points it is expanded on learnt (as inducing
    points are in sparse Gaussian processes). The kernels (`kernel=`):

    - `"squared_exponential"`: $\kappa(r) = e^{-r^2/2}$;
    - `"matern32"`: $\kappa(r) = (1 + \sqrt3\, r)\, e^{-\sqrt3\, r}$;
    - `"matern52"`: $\kappa(r) = (1 + \sqrt5\, r + \tfrac53 r^2)\, e^{-\sqrt5\, r}$.

    The lengthscales are $\ell = \operatorname{softplus}(\rho) > 0$ of free parameters $\rho$, one per input
    (`ard=True`) or one shared; the kernel's amplitude is the scale of $\alpha$. The inducing points start from a
    standard normal (the scale of standardised data), or on data with
    [`init_inducing`][flowkit.nn.KernelMachine.init_inducing]; the layer's `zero_last` sets $\alpha = 0$ and $b$ to the
    transformer's identity parameters, so a coupling layer starts as the identity.

    With `d = in_features + context` inputs, `P = out_features` outputs and `L = d` lengthscales (`ard=True`) or 1,
    the number of parameters is

    $$M\,(d + P) + L + P.$$

    Arguments:
        in_features: size of the conditioning input `x`.
        out_features: number of outputs `P`.
        inducing: number of inducing points `M` (at least 1).
        kernel: `"squared_exponential"`, `"matern32"` or `"matern52"`.
        lengthscale: the starting lengthscale(s), positive: one number, or with `ard=True` one per input.
        ard: one lengthscale per input (automatic relevance determination) instead of one shared.
        context: number of context features, concatenated to `x`.

    Examples:
        >>> import torch
        >>> net = KernelMachine(2, 4, inducing=16, kernel="matern52", context=1)
        >>> net(torch.randn(5, 2), torch.randn(5, 1)).shape
        torch.Size([5, 4])
        >>> sum(p.numel() for p in net.parameters()) == 16 * (3 + 4) + 3 + 4
        True

    References:
        English, Kirchler & Lippert, *Kernelised Normalising Flows* (Ferumal flows), ICLR 2024 (arXiv:2307.14839).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        inducing: int = 64,
        kernel: str = "squared_exponential",
        lengthscale: float | Sequence[float] = 1.0,
        ard: bool = True,
        *,
        context: int = 0,
    ) -> None:
        super().__init__()
        where = type(self).__name__
        if in_features < 0 or context < 0 or out_features < 1 or in_features + context < 1:
            raise ValueError(
                f"{where} needs a non-empty input and out_features >= 1, got in_features={in_features}, "
                f"context={context}, out_features={out_features}"
            )
        inputs = in_features + context
        if kernel not in _KERNELS:
            raise ValueError(f"{where}: unknown kernel {kernel!r}; choose one of {', '.join(_KERNELS)}")
        inducing = check_number(inducing, "inducing", where=where, integer=True, low=1, rule="at least one point")
        sizes = [lengthscale] if isinstance(lengthscale, (int, float)) else list(lengthscale)
        if len(sizes) not in (1, inputs if ard else 1):
            raise ValueError(
                f"{where}: lengthscale must be one number or, with ard=True, one per input ({inputs}); "
                f"got {lengthscale!r}"
            )
        for size in sizes:
            check_number(size, "lengthscale", where=where, positive=True)
        self.kernel = kernel
        self.inducing = inducing
        self.ard = bool(ard)
        self.inducing_points = nn.Parameter(torch.randn(inducing, inputs))
        initial = torch.as_tensor(sizes, dtype=torch.get_default_dtype()).expand(inputs if ard else 1).clone()
        self.raw_lengthscales = nn.Parameter(_softplus_inverse(initial))
        self.weight = nn.Parameter(torch.randn(inducing, out_features) / math.sqrt(inducing))  # zero_last zeroes it
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.context_features = int(context)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        gram = _KERNELS[self.kernel](self._squared_differences(x, context).sum(-1))  # (..., M)
        return gram @ self.weight + self.bias

    @property
    def lengthscales(self) -> Tensor:
        r"""The lengthscales $\ell = \operatorname{softplus}(\text{raw}) > 0$: one per input (`ard`) or one."""
        return F.softplus(self.raw_lengthscales)

    def _squared_differences(self, x: Tensor, context: Tensor | None) -> Tensor:
        r"""$((u_j - z_{mj}) / \ell_j)^2$ of shape `(..., M, d)` for the inputs $u = [x, \text{context}]$."""
        u = broadcast_context(x, context)
        return ((u.unsqueeze(-2) - self.inducing_points) / self.lengthscales).square()

    def zero_last(self, bias: Tensor | None = None) -> None:
        with torch.no_grad():
            self.weight.zero_()
            if bias is None:
                self.bias.zero_()
            else:
                self.bias.copy_(bias)

    def init_inducing(self, x: Tensor, context: Tensor | None = None, generator: torch.Generator | None = None) -> None:
        r"""Put the inducing points on data: `M` rows of $u = [x, \text{context}]$ drawn without replacement.

        With fewer rows than inducing points, every row is used and the rest are rows drawn again plus Gaussian noise
        of a tenth of each input's standard deviation (distinct points, so that their weights do not move together).

        Arguments:
            x: the conditioner's inputs `(..., in_features)` (batch dimensions are flattened).
            context: the context, broadcast against `x`'s batch shape.
            generator: the random generator (torch's global one when None).

        Raises:
            ValueError: for inputs of the wrong size, no rows, or non-finite values.
        """
        where = f"{type(self).__name__}.init_inducing"
        with torch.no_grad():
            u = broadcast_context(x, context)
            if u.shape[-1] != self.inducing_points.shape[1] or u.numel() == 0:
                raise ValueError(
                    f"{where}: needs rows of {self.in_features} inputs and {self.context_features} context features, "
                    f"got x of shape {tuple(x.shape)} and context of shape "
                    f"{None if context is None else tuple(context.shape)}"
                )
            u = u.reshape(-1, u.shape[-1]).to(self.inducing_points)
            if not bool(torch.isfinite(u).all()):
                raise ValueError(f"{where}: the data have non-finite values")
            n, m = u.shape[0], self.inducing
            rows = torch.randperm(n, generator=generator)
            index = rows.repeat(-(-m // n))[:m].to(u.device)
            points = u[index]
            if n < m:
                spread = u.std(0, unbiased=False) if n > 1 else torch.ones_like(u[0])
                noise = torch.randn(m - n, u.shape[1], generator=generator).to(u)
                points[n:] += 0.1 * spread.clamp_min(torch.finfo(u.dtype).eps) * noise
            self.inducing_points.copy_(points)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, context={self.context_features}, "
            f"inducing={self.inducing}, kernel={self.kernel!r}, ard={self.ard}"
        )


class MaskedKernelMachine(KernelMachine):
    r"""Autoregressive [`KernelMachine`][flowkit.nn.KernelMachine]: one kernel machine per feature, on masked inputs.

    For the feature of rank $r(i)$ in `order`, the kernel sees only the features before it and the context: with the
    mask $\mu_{ij} = [r(j) < r(i)]$ (1 on the context),

    $$\theta_i(u) = \sum_{m=1}^{M} \alpha_{m i}\, k_i(u, z_m) + b_i, \qquad k_i(u, z) = \kappa(r_i), \quad
    r_i^2 = \sum_j \mu_{ij} \frac{(u_j - z_j)^2}{\ell_j^2},$$

    which is the kernel $\kappa$ on the projection of $u$ onto the coordinates feature $i$ may depend on (a valid
    kernel for each $i$). The inducing points and lengthscales are shared by the `D` machines; each has its own
    weights $\alpha_{mi} \in \mathbb R^{P}$ and bias. So $\theta_i$ depends only on $x_{<i}$ (in `order`) and the
    context, and the Jacobian of a [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] layer is
    triangular; the first feature's parameters are constant (or a function of the context). The inverse is incremental
    ([`invert`][flowkit.nn.MaskedKernelMachine.invert]): each solved feature adds its term to a running $r^2$.

    With `d = D + context` inputs, `P = params_per_feature` and `L = d` lengthscales (`ard=True`) or 1, the number of
    parameters is

    $$M\,(d + D P) + L + D P.$$

    Arguments:
        features: number of features `D`.
        params_per_feature: number of outputs per feature `P`.
        inducing: number of inducing points `M` (at least 1).
        kernel: `"squared_exponential"`, `"matern32"` or `"matern52"` (see [`KernelMachine`][flowkit.nn.KernelMachine]).
        lengthscale: the starting lengthscale(s), positive: one number, or with `ard=True` one per input.
        ard: one lengthscale per input instead of one shared.
        context: number of context features, seen by every feature's machine.
        order: the autoregressive order, a permutation of `range(D)` (natural order when None).

    Examples:
        >>> import torch
        >>> net = MaskedKernelMachine(3, 2, inducing=8, order=[2, 0, 1])
        >>> net(torch.randn(5, 3)).shape
        torch.Size([5, 6])

    References:
        English, Kirchler & Lippert, *Kernelised Normalising Flows* (Ferumal flows), ICLR 2024 (arXiv:2307.14839).
    """

    def __init__(
        self,
        features: int,
        params_per_feature: int,
        inducing: int = 64,
        kernel: str = "squared_exponential",
        lengthscale: float | Sequence[float] = 1.0,
        ard: bool = True,
        *,
        context: int = 0,
        order: Sequence[int] | None = None,
    ) -> None:
        if features < 1 or params_per_feature < 1 or context < 0:
            raise ValueError(
                f"MaskedKernelMachine needs features >= 1, params_per_feature >= 1 and context >= 0, got "
                f"{features}, {params_per_feature}, {context}"
            )
        order = list(range(features)) if order is None else [int(i) for i in order]
        if sorted(order) != list(range(features)):
            raise ValueError(f"MaskedKernelMachine: order must be a permutation of range({features}), got {order}")
        super().__init__(features, features * params_per_feature, inducing, kernel, lengthscale, ard, context=context)
        self.features = int(features)
        self.params_per_feature = int(params_per_feature)
        self.order = order
        rank = torch.empty(features, dtype=torch.long)
        rank[torch.tensor(order)] = torch.arange(features)
        seen = torch.cat([rank[None, :] < rank[:, None], torch.ones(features, context, dtype=torch.bool)], dim=1)
        self.register_buffer("mask", seen, persistent=False)  # (D, d): the inputs feature i's machine sees

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        r2 = self._squared_differences(x, context) @ self.mask.to(self.weight.dtype).T  # (..., M, D)
        gram = _KERNELS[self.kernel](r2)
        weight = self.weight.view(self.inducing, self.features, self.params_per_feature)
        return torch.einsum("...mi,mip->...ip", gram, weight).flatten(-2) + self.bias

    def invert(self, solve: Callable[[int, Tensor], Tensor], z: Tensor, context: Tensor | None = None) -> Tensor:
        r"""The incremental version of [`Conditioner.invert`][flowkit.nn.Conditioner.invert].

        The feature of rank $r$ sees the features of rank $< r$ and the context, so its $r_i^2$ is the context's terms
        plus those of the features solved before it: a running sum of shape `(..., M)`, to which each solved feature
        adds its column. Step $r$ costs $O(M P)$ instead of a full pass's $O(M D (d + P))$; the result equals the
        generic inverse's up to the order of the floating-point sums.
        """
        d, p = self.features, self.params_per_feature
        points = self.inducing_points
        scales = self.lengthscales.expand(points.shape[1])  # one per input, also when shared
        weight = self.weight.view(self.inducing, d, p)
        bias = self.bias.view(d, p)
        if context is None:
            r2 = z.new_zeros(z.shape[:-1] + (self.inducing,))
        else:
            batch = broadcast_shapes(z.shape[:-1], context.shape[:-1])
            r2 = (((context.unsqueeze(-2) - points[:, d:]) / scales[d:]).square().sum(-1)).expand(*batch, -1)
        columns: list[Tensor | None] = [None] * d
        for i in self.order:
            params = _KERNELS[self.kernel](r2) @ weight[:, i] + bias[i]
            columns[i] = solve(i, params)
            r2 = r2 + ((columns[i].unsqueeze(-1) - points[:, i]) / scales[i]).square()
        return torch.stack(columns, dim=-1)  # type: ignore[arg-type]


class SharedTrunk(Configurable, nn.Module):
    r"""The hidden layers that the conditioners of $K$ flow steps share (NanoFlow).

    One network serves every step; step $k$ is told apart by its *flow indication embedding* $e_k \in \mathbb{R}^E$,
    concatenated to the input, by multiplicative gates $g_{k,l}$ on the hidden units of layer $l$, and by its own
    output projection $(W_k, b_k)$, zero at the start (so each step starts as the identity):

    $$
    h_1 = g_{k,1} \odot \sigma(A_1 [x, c, e_k] + a_1), \quad
    h_l = g_{k,l} \odot \sigma(A_l h_{l-1} + a_l), \quad
    \text{out}_k = W_k h_L + b_k .
    $$

    The trunk holds the $A_l, a_l$; the steps (the views) hold $e_k$, $g_{k,l}$ (ones at the start) and
    $W_k, b_k$. With hidden sizes $h_1, \dots, h_L$, input size $n$, context size $c$ and outputs $o_k$, the $K$
    steps hold

    $$
    \underbrace{(n + c + E + 1)\, h_1 + \sum_{l=2}^{L} (h_{l-1} + 1)\, h_l}_{\text{trunk, once}}
    + \sum_{k=1}^{K} \Big( E + \sum_{l=1}^{L} h_l + (h_L + 1)\, o_k \Big)
    $$

    parameters (without gates drop $\sum_l h_l$; with `out_features` the output layer is one, shared: $(h_L + 1)\, o$
    once instead of per step), against $K \big((n + c + 1) h_1 + \sum_{l \ge 2} (h_{l-1} + 1) h_l + (h_L + 1) o\big)$
    for $K$ independent [`MLP`][flowkit.nn.MLP]s: the hidden layers, the bulk for wide networks, are counted once.
    With `embedding=0`, `gates=False` and a shared output layer nothing tells the steps apart: every step computes the
    same function (NanoFlow's "naive" sharing, the ablation that fails).

    With `autoregressive=True` the layers are masked as [`MADE`][flowkit.nn.MADE]'s (degrees from `order`; the
    embedding, like the context, enters with degree 0: it is a constant, a per-step bias of the first layer that carries
    nothing across the order), and each step's projection is masked so that its output block `i` sees only hidden units
    of lower degree: every step is an autoregressive conditioner with the trunk's `order`.

    Arguments:
        in_features: size of the largest conditioning input a step feeds it (a step with fewer inputs, as the
            alternating couplings of an odd number of features, uses the first columns: as if zero-padded).
        hidden: sizes of the shared hidden layers (at least one).
        activation: name of the activation (see [`activation`][flowkit.nn.activation]).
        context: number of context features.
        embedding: size $E$ of each step's flow indication embedding (0: none).
        gates: per-step multiplicative gates on the hidden units.
        out_features: `None` (NanoFlow): each step has its own output projection; a number: one output layer of that
            size, shared by all steps.
        autoregressive: MADE masks, for [`MaskedAutoregressive`][flowkit.bijectors.MaskedAutoregressive] layers.
        order: the autoregressive order, a permutation of `range(in_features)` (natural order when `None`).
        kernel: `None` for the fully connected trunk above; an odd kernel size for a convolutional one on
            `(..., C, H, W)` grids, as [`ConvNet`][flowkit.nn.ConvNet] (features are then channels, the context
            enters as constant planes, the embedding as constant channels: a per-step bias $\sum_{u,v} A_1[:, e, u, v]
            e_k$ of the first convolution, exact away from zero-padded borders; weights count $k^2$ times).
        padding_mode: `"zeros"` (images) or `"circular"` (periodic lattices), for a convolutional trunk.

    Examples:
        >>> import torch
        >>> trunk = SharedTrunk(2, hidden=(16, 16), embedding=4)
        >>> steps = [SharedConditioner(trunk, 2, 6) for _ in range(3)]
        >>> sum(p.numel() for p in torch.nn.ModuleList(steps).parameters())  # 7 * 16 + 17 * 16 + 3 * (4 + 32 + 17 * 6)
        798
        >>> steps[0](torch.randn(5, 2)).shape
        torch.Size([5, 6])

    References:
        Lee, Kim & Yoon, *NanoFlow: Scalable normalizing flows with sublinear parameter complexity*,
        NeurIPS 2020 (arXiv:2006.06280).
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        *,
        context: int = 0,
        embedding: int = 8,
        gates: bool = True,
        out_features: int | None = None,
        autoregressive: bool = False,
        order: Sequence[int] | None = None,
        kernel: int | None = None,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__()
        hidden = [int(h) for h in hidden]
        if in_features < 1 or context < 0 or embedding < 0 or not hidden or any(h < 1 for h in hidden):
            raise ValueError(
                f"SharedTrunk needs in_features >= 1, context >= 0, embedding >= 0 and at least one hidden layer of "
                f"positive size, got in_features={in_features}, context={context}, embedding={embedding}, "
                f"hidden={tuple(hidden)}"
            )
        if out_features is not None and out_features < 1:
            raise ValueError(f"SharedTrunk: out_features must be None or positive, got {out_features}")
        if order is not None and not autoregressive:
            raise ValueError("SharedTrunk: order applies to an autoregressive trunk only (autoregressive=True)")
        if kernel is not None and (autoregressive or kernel < 1 or kernel % 2 == 0):
            raise ValueError(
                f"SharedTrunk: kernel must be a positive odd size (same padding) and the trunk not autoregressive, got "
                f"kernel={kernel}, autoregressive={autoregressive}"
            )
        if padding_mode not in ("zeros", "circular"):
            raise ValueError(f"SharedTrunk: padding_mode must be 'zeros' or 'circular', got {padding_mode!r}")
        self.kernel = None if kernel is None else int(kernel)
        self.padding_mode = padding_mode
        self.in_features = int(in_features)
        self.context_features = int(context)
        self.embedding = int(embedding)
        self.gates = bool(gates)
        self.hidden = hidden
        self.out_features = None if out_features is None else int(out_features)
        self.act = globals()["activation"](activation)
        self.order: list[int] | None = None
        sizes = [self.in_features + self.context_features + self.embedding, *hidden]
        if autoregressive:
            order = list(range(self.in_features)) if order is None else [int(i) for i in order]
            if sorted(order) != list(range(self.in_features)):
                raise ValueError(f"SharedTrunk: order must be a permutation of range({self.in_features}), got {order}")
            self.order = order
            rank, degree_in, self._degrees = _degrees(order, self.context_features, hidden)
            self._rank = rank
            degree = torch.cat([degree_in, torch.zeros(self.embedding, dtype=torch.long)])
            layers: list[nn.Linear] = []
            for degree_h in self._degrees:
                layers.append(MaskedLinear(degree_h[:, None] >= degree[None, :]))
                degree = degree_h
        else:
            layers = [self._layer(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        self.layers = nn.ModuleList(layers)
        self.last = None if self.out_features is None else self.output_layer(self.out_features)

    def _layer(self, a: int, b: int) -> nn.Linear | nn.Conv2d:
        if self.kernel is None:
            return nn.Linear(a, b)
        return nn.Conv2d(a, b, self.kernel, padding=self.kernel // 2, padding_mode=self.padding_mode)

    def output_layer(self, out_features: int) -> nn.Linear | nn.Conv2d:
        """A fresh output projection `h_L -> out_features` (masked when autoregressive: block `i` sees degrees < i)."""
        if self.order is None:
            return self._layer(self.hidden[-1], out_features)
        if out_features % self.in_features:
            raise ValueError(
                f"SharedTrunk: an autoregressive output of {out_features} is not a multiple of the "
                f"{self.in_features} features"
            )
        degree_out = self._rank.repeat_interleave(out_features // self.in_features)
        return MaskedLinear(degree_out[:, None] > self._degrees[-1][None, :])

    def weights(self) -> list[tuple[Tensor, Tensor]]:
        r"""$(A_l, a_l)$ of every hidden layer (masked when autoregressive), and the shared output layer's if any."""
        layers = [*self.layers, *([] if self.last is None else [self.last])]
        return [
            (layer.masked_weight() if isinstance(layer, MaskedLinear) else layer.weight, layer.bias) for layer in layers
        ]


class SharedConditioner(Conditioner):
    r"""One flow step's view of a [`SharedTrunk`][flowkit.nn.SharedTrunk]: a [`Conditioner`][flowkit.nn.Conditioner].

    Holds the step's own parameters (embedding $e_k$, gates $g_{k,l}$, output projection $W_k, b_k$) and a reference
    to the trunk, which several views share: a model's `parameters()` count the trunk once, and
    [`flowkit.io`][flowkit.io] saves and loads it once. The gates multiply the hidden units, which is the same as
    scaling the columns of the next layer's weight: one pass costs what a plain MLP's does. Autoregressive when the
    trunk is (`order` is the trunk's); its inverse runs the generic feature-by-feature solve.

    Arguments:
        trunk: the shared hidden layers.
        in_features: size of this step's conditioning input, at most the trunk's (its `in_features` by default;
            the trunk's exactly when autoregressive).
        out_features: number of outputs (the trunk's when it has a shared output layer).

    Examples:
        >>> import torch
        >>> from flowkit.bijectors import Coupling
        >>> from flowkit.transformers import Affine
        >>> trunk = SharedTrunk(2, hidden=(32, 32))
        >>> layers = [Coupling(Affine(), 4, parity=k % 2, conditioner=SharedConditioner(trunk, 2, 4)) for k in range(4)]
        >>> torch.allclose(layers[0](torch.randn(3, 4))[1], torch.zeros(3))  # every step starts as the identity
        True
    """

    def __init__(self, trunk: SharedTrunk, in_features: int | None = None, out_features: int | None = None) -> None:
        super().__init__()
        if not isinstance(trunk, SharedTrunk):
            raise ValueError(f"SharedConditioner: trunk must be a SharedTrunk, got {type(trunk).__name__}")
        self.in_features = trunk.in_features if in_features is None else int(in_features)
        if not 1 <= self.in_features <= trunk.in_features or (
            trunk.order is not None and self.in_features != trunk.in_features
        ):
            raise ValueError(
                f"SharedConditioner: in_features={in_features} does not fit a trunk of {trunk.in_features} inputs "
                f"(at most that many; exactly when autoregressive)"
            )
        if trunk.out_features is None:
            if out_features is None or out_features < 1:
                raise ValueError(
                    "SharedConditioner: out_features (positive) is needed when the trunk has no shared output layer"
                )
            self.out_features = int(out_features)
        else:
            if out_features is not None and out_features != trunk.out_features:
                raise ValueError(
                    f"SharedConditioner: out_features={out_features} differs from the trunk's shared output layer "
                    f"({trunk.out_features})"
                )
            self.out_features = trunk.out_features
        self.context_features = trunk.context_features
        self.order = trunk.order
        self.trunk = trunk
        self.embedding = nn.Parameter(torch.randn(trunk.embedding)) if trunk.embedding else None
        self.gates = nn.ParameterList([torch.ones(h) for h in trunk.hidden]) if trunk.gates else None
        self.last = trunk.output_layer(self.out_features) if trunk.out_features is None else None

    def zero_last(self, bias: Tensor | None = None) -> None:
        _zero_linear(self.trunk.last if self.last is None else self.last, bias)

    def weights(self) -> list[tuple[Tensor, Tensor]]:
        r"""This step's effective `(weight, bias)` per layer: embedding and gates folded into the trunk's weights."""
        trunk = self.trunk
        weights = trunk.weights()
        if self.last is not None:
            last = self.last
            weights.append((last.masked_weight() if isinstance(last, MaskedLinear) else last.weight, last.bias))
        w, b = weights[0]
        n, c = trunk.in_features, trunk.context_features
        if self.embedding is not None:  # a constant input: a bias (through every tap, for a convolution)
            taps = w[:, n + c :] if w.dim() == 2 else w[:, n + c :].sum((-2, -1))
            b = torch.addmv(b, taps, self.embedding)
        columns = w[:, : n + c] if self.in_features == n else torch.cat([w[:, : self.in_features], w[:, n : n + c]], 1)
        weights[0] = (columns, b)
        if self.gates is not None:
            for i, gate in enumerate(self.gates):
                w, b = weights[i + 1]
                weights[i + 1] = (w * gate.view(-1, *[1] * (w.dim() - 2)), b)
        return weights

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Outputs `(..., out_features)` for inputs `(..., in_features)` (grids `(..., C, H, W)` when convolutional)."""
        weights = self.weights()
        if self.trunk.kernel is None:
            h = F.linear(broadcast_context(x, context), *weights[0])
            for w, b in weights[1:]:
                h = F.linear(self.trunk.act(h), w, b)
            return h
        x = _grid_input(x, context, self.in_features, "SharedConditioner")
        conv = self.trunk.layers[0]._conv_forward  # the trunk's padding for every layer
        h = x.reshape(-1, *x.shape[-3:]).contiguous(memory_format=torch.channels_last)
        for i, (w, b) in enumerate(weights):
            h = conv(self.trunk.act(h) if i else h, w, b)
        return h.reshape(*x.shape[:-3], *h.shape[-3:])


def time_embedding(t: Tensor, frequencies: int) -> Tensor:
    r"""Embed times `t` of shape `(...)` as $(t, \cos \pi k t, \sin \pi k t)_{k=1..F}$, shape `(..., 1 + 2F)`."""
    t = t.unsqueeze(-1)
    k = _frequencies(frequencies, t.dtype, t.device)
    return torch.cat([t, torch.cos(k * t), torch.sin(k * t)], dim=-1)


@lru_cache(maxsize=32)
def _frequencies(frequencies: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    r"""$\pi k$ for $k = 1..F$, made once per size, dtype and device (a solve embeds hundreds of times)."""
    with torch.inference_mode(False):  # a normal tensor, that autograd may save, even when first made in inference
        return torch.arange(1, frequencies + 1, dtype=dtype, device=device) * math.pi


def _silu_derivative(a: Tensor, h: Tensor) -> Tensor:
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


#: Derivatives `sigma'(a)` of the activations, given the pre-activation `a` and `h = sigma(a)`, for which
#: VectorField propagates its Jacobian forward.
_DERIVATIVES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "softplus": lambda a, h: -torch.expm1(-h),  # = sigmoid(a); 1 - exp(-a) above nn.Softplus's threshold 20
    "tanh": lambda a, h: h.square().neg_().add_(1),  # 1 - h^2, without a wrapped scalar
    "elu": lambda a, h: h.clamp(max=0) + 1,
    "silu": _silu_derivative,
}


class _TimeField(Conditioner):
    """What the time-dependent fields share: the MLP `net`, `[x, time embedding, context] -> out`, and the sizes."""

    def __init__(
        self, features: int, hidden: Sequence[int], activation_name: str, context: int, frequencies: int, out: int
    ) -> None:
        super().__init__()
        hidden = [int(h) for h in hidden]
        if features < 1 or context < 0 or frequencies < 0 or any(h < 1 for h in hidden):
            raise ValueError(
                f"{type(self).__name__} needs features >= 1, context >= 0, frequencies >= 0 and positive hidden "
                f"sizes, got features={features}, context={context}, frequencies={frequencies}, hidden={tuple(hidden)}"
            )
        sizes = [int(features) + 1 + 2 * int(frequencies) + int(context), *hidden, out]
        self.net = nn.Sequential(*_stack(sizes, activation_name))
        self.in_features = self.out_features = self.features = int(features)
        self.context_features = int(context)
        self.frequencies = int(frequencies)


class VectorField(_TimeField):
    r"""Time-dependent MLP vector field $f(x, t, c)$ for [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow].

    A [`Conditioner`][flowkit.nn.Conditioner] with `in_features = out_features = D` whose `forward` also
    takes the time `t` (keyword; a number or a tensor broadcasting to the batch shape). The network sees
    $[x, \tau(t), c]$ with the Fourier time embedding $\tau(t) = (t, \cos \pi k t, \sin \pi k t)_{k=1}^{F}$
    ([`time_embedding`][flowkit.nn.time_embedding]). The default activation is smooth (`tanh`), as an ODE
    solver's error control assumes (softplus, the default until 2026-12, trained far more slowly).

    With a smooth activation (`softplus`, `tanh`, `elu`, `silu`),
    [`velocity_and_jacobian`][flowkit.nn.VectorField.velocity_and_jacobian] also returns the exact Jacobian,
    propagated forward, $J_1 = W_1^{(x)}$, $J_{k+1} = W_{k+1} \operatorname{diag}(\sigma'(a_k)) J_k$ (one
    batched product per layer), and [`velocity_and_divergence`][flowkit.nn.VectorField.velocity_and_divergence]
    its trace, for [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow]'s exact trace.

    Arguments:
        features: the event size `D` (input and output).
        hidden: sizes of the hidden layers.
        activation: name of the activation between layers (see [`activation`][flowkit.nn.activation]).
        context: number of context features.
        frequencies: number `F` of Fourier frequencies of the time embedding (0: `t` alone).

    Examples:
        >>> import torch
        >>> field = VectorField(2, hidden=(16,), context=3)
        >>> field(torch.randn(5, 2), torch.randn(5, 3), t=0.5).shape
        torch.Size([5, 2])
        >>> v, jacobian = field.velocity_and_jacobian(torch.randn(5, 2), torch.randn(5, 3), t=0.5)
        >>> jacobian.shape
        torch.Size([5, 2, 2])

    References:
        Grathwohl, Chen, Bettencourt, Sutskever & Duvenaud, *FFJORD: Free-form continuous
        dynamics for scalable reversible generative models*, ICLR 2019 (arXiv:1810.01367).
    """

    def __init__(
        self,
        features: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        *,
        context: int = 0,
        frequencies: int = 3,
    ) -> None:
        super().__init__(features, hidden, activation, context, frequencies, features)
        self.activation_name = activation

    @property
    def jacobian_available(self) -> bool:
        """Whether the activation is smooth with a known derivative, so that `velocity_and_jacobian` applies."""
        return self.activation_name in _DERIVATIVES

    def _first(self, x: Tensor, context: Tensor | None, t: Tensor | float) -> Tensor:
        r"""The first layer's pre-activation on $[x, \tau(t), c]$ without concatenating (one time: a bias)."""
        first = self.net[0]
        d, e = self.features, 1 + 2 * self.frequencies
        weight = first.weight
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        if t.dim() == 0:
            a = F.linear(
                x, weight[:, :d], torch.addmv(first.bias, weight[:, d : d + e], time_embedding(t, self.frequencies))
            )
        else:
            a = F.linear(x, weight[:, :d], first.bias) + F.linear(
                time_embedding(t, self.frequencies), weight[:, d : d + e]
            )
        if context is not None:
            a = a + F.linear(context, weight[:, d + e :])
        return a

    def forward(self, x: Tensor, context: Tensor | None = None, *, t: Tensor | float) -> Tensor:  # type: ignore[override]
        """The velocity `(..., D)` at points `x` `(..., D)`, time `t` and the context."""
        h = self._first(x, context, t)
        for layer in self.net[1:]:
            h = layer(h)
        if h.shape[:-1] != x.shape[:-1]:  # a time or context without the points' batch shape
            h = h.expand(*broadcast_shapes(h.shape[:-1], x.shape[:-1]), h.shape[-1])
        return h

    def _propagate(
        self, x: Tensor, context: Tensor | None, t: Tensor | float, directions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The last hidden activation `(..., H)`, its derivatives `(..., K, H)` along `directions` (default: units)."""
        if not self.jacobian_available:
            raise ValueError(
                f"VectorField: the forward Jacobian needs one of the activations {sorted(_DERIVATIVES)}, "
                f"got {self.activation_name!r}"
            )
        derivative = _DERIVATIVES[self.activation_name]
        linears = [m for m in self.net if isinstance(m, nn.Linear)]
        w_x = linears[0].weight[:, : self.features]
        transposed = w_x.T if directions is None else F.linear(directions, w_x)  # d(first pre-activation)
        h = x
        for i, layer in enumerate(linears[:-1]):
            if i == 0:
                a = self._first(x, context, t)
            else:
                a = layer(h)
                transposed = F.linear(transposed, layer.weight)  # one GEMM for the batch and all D directions
            h = self.net[2 * i + 1](a)
            transposed = transposed * derivative(a, h).unsqueeze(-2)
        return h, transposed

    def velocity_and_jacobian(
        self, x: Tensor, context: Tensor | None = None, *, t: Tensor | float
    ) -> tuple[Tensor, Tensor]:
        r"""The velocity `(..., D)` and its Jacobian `(..., D, D)` in `x`: entry `[i, j]` is $\partial_j f_i$.

        Raises:
            ValueError: for an activation without a registered derivative (see `jacobian_available`).
        """
        last = self.net[-1]
        if len(self.net) == 1:  # no hidden layer: a linear field
            v = self.forward(x, context, t=t)
            return v, last.weight[:, : self.features].expand(*v.shape, self.features)
        h, transposed = self._propagate(x, context, t)
        return last(h), F.linear(transposed, last.weight).transpose(-1, -2)

    def velocity_and_jvp(
        self, x: Tensor, direction: Tensor, context: Tensor | None = None, *, t: Tensor | float
    ) -> tuple[Tensor, Tensor]:
        r"""The velocity `(..., D)` and the Jacobian-vector product $(\partial f / \partial x)\, \epsilon$ `(..., D)`.

        Forward-mode: Hutchinson's estimate $\epsilon^\top (\partial f / \partial x) \epsilon$ needs no backward pass.
        """
        last = self.net[-1]
        if len(self.net) == 1:
            return self.forward(x, context, t=t), F.linear(direction, last.weight[:, : self.features])
        h, tangent = self._propagate(x, context, t, direction.unsqueeze(-2))
        return last(h), F.linear(tangent, last.weight).squeeze(-2)

    def velocity_and_divergence(
        self, x: Tensor, context: Tensor | None = None, *, t: Tensor | float
    ) -> tuple[Tensor, Tensor]:
        r"""The velocity `(..., D)` and its divergence $\operatorname{tr} \partial f / \partial x$ `(...)`, exactly.

        The trace $\sum_{i,h} (W_L)_{ih} (J_{L-1})_{hi}$ of the last layer needs no product of it with the
        Jacobian of the layers before.
        """
        last = self.net[-1]
        if len(self.net) == 1:
            v = self.forward(x, context, t=t)
            return v, last.weight[:, : self.features].diagonal().sum().expand(v.shape[:-1])
        h, transposed = self._propagate(x, context, t)
        return last(h), (transposed * last.weight).sum((-2, -1))

    def zero_last(self, bias: Tensor | None = None) -> None:
        _zero_linear(self.net[-1], bias)


class PotentialField(_TimeField):
    r"""The gradient field $f = -\nabla_x \Phi(x, t, c)$ of a scalar potential (OT-Flow's form).

    $\Phi$ is an MLP on $[x, \tau(t), c]$ (as [`VectorField`][flowkit.nn.VectorField]) plus a quadratic
    $\tfrac12 x^\top (L L^\top) x$ with learnable $L$ (zero at the start). Optimal-transport fields are of
    this form (Benamou–Brenier), with $\Phi$ solving $\partial_t \Phi - \tfrac12 \|\nabla_x \Phi\|^2 = 0$;
    [`RegularizedLikelihood`][flowkit.train.continuous.RegularizedLikelihood]`(hjb=...)` integrates that
    residual ([`hjb_residual`][flowkit.nn.PotentialField.hjb_residual]) along the trajectories. The field is
    computed with `create_graph=True` whatever the grad mode, so that the solve can differentiate it.

    Arguments:
        features: the event size `D`.
        hidden: sizes of the potential's hidden layers.
        activation: a smooth activation (the field is the potential's gradient).
        context: number of context features.
        frequencies: Fourier frequencies of the time embedding.

    Examples:
        >>> import torch
        >>> field = PotentialField(2, hidden=(16,))
        >>> field(torch.randn(5, 2), t=0.3).shape
        torch.Size([5, 2])

    References:
        Onken, Wu Fung, Li & Ruthotto, *OT-Flow: fast and accurate continuous normalizing
        flows via optimal transport*, AAAI 2021 (arXiv:2006.00104).
    """

    def __init__(
        self,
        features: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        *,
        context: int = 0,
        frequencies: int = 3,
    ) -> None:
        super().__init__(features, hidden, activation, context, frequencies, 1)
        self.quadratic = nn.Parameter(torch.zeros(self.features, self.features))

    def potential(self, x: Tensor, context: Tensor | None = None, *, t: Tensor | float) -> Tensor:
        r"""$\Phi(x, t, c)$ of shape `x.shape[:-1]`."""
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        h = torch.cat([x, time_embedding(t.expand(x.shape[:-1]), self.frequencies)], dim=-1)
        phi = self.net(broadcast_context(h, context)).squeeze(-1)
        return phi + 0.5 * (x @ self.quadratic).square().sum(-1)

    def _gradient(self, x: Tensor, context: Tensor | None, t: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
        with torch.enable_grad():
            if not x.requires_grad:
                x = x.detach().clone().requires_grad_(True)
            t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
            if not t.requires_grad:  # a time that depends on a learnt end time keeps its graph
                t = t.detach().clone().requires_grad_(True)
            phi = self.potential(x, context, t=t)
            grad_x, grad_t = torch.autograd.grad(phi.sum(), (x, t), create_graph=True)
        return phi, grad_x, grad_t

    def forward(self, x: Tensor, context: Tensor | None = None, *, t: Tensor | float) -> Tensor:  # type: ignore[override]
        r"""The velocity $-\nabla_x \Phi$ `(..., D)`."""
        return -self._gradient(x, context, t)[1]

    def hjb_residual(self, x: Tensor, context: Tensor | None = None, *, t: Tensor | float) -> Tensor:
        r"""$\partial_t \Phi - \tfrac12 \|\nabla_x \Phi\|^2$ at `(x, t)`, of shape `x.shape[:-1]`.

        For a time $t$ shared by the batch (a solve), $\partial_t \Phi$ is the derivative of the
        batch's sum, which is each point's own since points do not interact.
        """
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        if t.dim() == 0:
            t = t.expand(x.shape[:-1])
        _, grad_x, grad_t = self._gradient(x, context, t)
        return grad_t - 0.5 * grad_x.square().sum(-1)

    def zero_last(self, bias: Tensor | None = None) -> None:
        """Make the potential constant in `x` (a zero field); `bias` is ignored (the field has no offset)."""
        _zero_linear(self.net[-1], None)
        with torch.no_grad():
            self.quadratic.zero_()
