"""Small networks used as conditioners."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["MLP", "activation"]

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
