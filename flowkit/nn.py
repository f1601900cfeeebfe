"""Small networks used as conditioners."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MLP", "MaskedLinear", "MADE", "activation"]

_ACTIVATIONS = {
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU,
}


def activation(name: str) -> nn.Module:
    """Build an activation module from its name (``relu``, ``elu``, ``tanh``, ``silu``, ``gelu``, ``leaky_relu``)."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}") from None


class MLP(nn.Sequential):
    """Multi-layer perceptron ``in -> hidden... -> out``.

    Arguments:
        in_features: input size.
        out_features: output size.
        hidden: sizes of the hidden layers.
        activation: name of the activation between layers.
    """

    def __init__(
        self, in_features: int, out_features: int, hidden: Sequence[int] = (64, 64), activation: str = "relu"
    ) -> None:
        sizes = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i:
                layers.append(globals()["activation"](activation))
            layers.append(nn.Linear(a, b))
        super().__init__(*layers)

    @property
    def last(self) -> nn.Linear:
        return self[-1]  # type: ignore[return-value]

    def zero_last(self, bias: Tensor | None = None) -> None:
        """Zero the last layer's weights and set its bias, so the output starts constant."""
        with torch.no_grad():
            self.last.weight.zero_()
            if bias is None:
                self.last.bias.zero_()
            else:
                self.last.bias.copy_(bias)


class MaskedLinear(nn.Linear):
    """Linear layer whose weight is multiplied by a fixed 0/1 mask, ``y = x (W \\odot M)^T + b``.

    Arguments:
        mask: ``(out_features, in_features)`` connectivity; a buffer, so it follows ``.to()``.
    """

    def __init__(self, mask: Tensor) -> None:
        super().__init__(mask.shape[1], mask.shape[0])
        self.register_buffer("mask", mask.to(self.weight.dtype), persistent=False)

    def masked_weight(self) -> Tensor:
        return self.weight * self.mask

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight(), self.bias)


class MADE(nn.Module):
    r"""Masked autoencoder for distribution estimation: an autoregressive conditioner.

    Output block ``i`` (``params_per_feature`` numbers for feature ``i``)
    depends only on the features that come before ``i`` in ``order`` and on the
    context, through masks built from degrees: inputs get their rank in
    ``order`` (1..D), context inputs degree 0, hidden units cycle through
    ``1..D-1`` (``0..D-1`` with context, so that the first feature's
    parameters depend on the context too; nflows' MADE leaves them constant);
    a hidden unit sees inputs of lower or equal degree and an output sees
    hidden units of strictly lower degree.

    With ``residual=True`` each hidden layer is followed by a residual block
    ``h + L_2(\sigma(L_1(\sigma(h))))`` with masks that keep the degrees (the
    residual MADE of Durkan et al.).

    Arguments:
        features: number of features ``D``.
        params_per_feature: number of outputs per feature.
        hidden: hidden layer sizes.
        context: number of context features, fed to every first-layer unit.
        residual: add a masked residual block after each hidden layer.
        activation: activation name (see :func:`activation`).
        order: the autoregressive order, a permutation of ``range(D)`` (natural order when None).

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
        self.context_features = int(context)
        self.order = order
        rank = torch.empty(features, dtype=torch.long)
        rank[torch.tensor(order)] = torch.arange(1, features + 1)
        degree_in = torch.cat([rank, torch.zeros(self.context_features, dtype=torch.long)])
        # Hidden degrees cycle through [low, D - 1]; degree-0 units (which see only
        # the context) let the first feature's parameters depend on the context.
        low = 0 if self.context_features else min(1, features - 1)
        self.act = globals()["activation"](activation)
        self.hidden_layers = nn.ModuleList()
        self.residual_blocks = nn.ModuleList() if residual else None
        degree = degree_in
        for width in hidden:
            degree_h = torch.arange(width) % max(1, features - low) + low
            self.hidden_layers.append(MaskedLinear(degree_h[:, None] >= degree[None, :]))
            if residual:
                square = degree_h[:, None] >= degree_h[None, :]
                self.residual_blocks.append(nn.ModuleList([MaskedLinear(square), MaskedLinear(square)]))
            degree = degree_h
        degree_out = rank.repeat_interleave(params_per_feature)
        self.last = MaskedLinear(degree_out[:, None] > degree[None, :])

    zero_last = MLP.zero_last  # uses only ``self.last``

    def masked_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W \\odot M, b)`` of every layer in order of application (computed once, reused by loops)."""
        layers: list[MaskedLinear] = []
        for i, layer in enumerate(self.hidden_layers):
            layers.append(layer)
            if self.residual_blocks is not None:
                layers.extend(self.residual_blocks[i])
        layers.append(self.last)
        return [(layer.masked_weight(), layer.bias) for layer in layers]

    def trunk(self, pre: Tensor, weights: list[tuple[Tensor, Tensor]]) -> Tensor:
        """From the first layer's pre-activation to the last hidden activation, with precomputed ``weights``."""
        h = pre
        residual = self.residual_blocks is not None
        step = 3 if residual else 1
        for i in range(len(self.hidden_layers)):
            if i:
                h = F.linear(self.act(h), *weights[i * step])
            if residual:
                h = h + F.linear(self.act(F.linear(self.act(h), *weights[i * step + 1])), *weights[i * step + 2])
        return self.act(h)

    def forward(self, x: Tensor) -> Tensor:
        """Outputs ``(..., D * params_per_feature)`` for inputs ``(..., D + context)`` (features, then context).

        The output is feature-major: the block of feature ``i`` is contiguous.
        """
        weights = self.masked_weights()
        return F.linear(self.trunk(F.linear(x, *weights[0]), weights), *weights[-1])
