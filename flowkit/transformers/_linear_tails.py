r"""The shared frame of the polynomial transformers: a monotone map on `[-B, B]`, continued linearly outside.

A subclass gives the map on the bound, $f(x)$ and $\log f'(x)$ for $|x| \le B$, from constrained parameters.
Outside the bound the map continues along its tangent at the nearer end,

$$
f(x) = f(\pm B) + f'(\pm B)\,(x \mp B), \qquad |x| > B,
$$

so that it is a bijection of the real line, continuous with its first derivative. Evaluated as
$f(\bar x) + f'(\bar x)(x - \bar x)$ with $\bar x$ the input clamped to the bound (the same expression inside).

*Inverse.* Outside $[f(-B), f(B)]$ the tails invert in closed form; inside, safeguarded Newton
([`monotone_inverse`][flowkit.root_finding.monotone_inverse]) on the bracket $[-B, B]$ with the clamped target,
checked to the root finder's residual tolerance (else [`ConvergenceError`][flowkit.root_finding.ConvergenceError]),
with the implicit gradients $\partial x / \partial y = 1 / f'(x)$.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_number
from ..root_finding import monotone_inverse
from .base import Transformer

__all__ = ["LinearTails"]


class LinearTails(Transformer):
    r"""Base of the transformers that are a monotone map on `[-B, B]` and linear outside (see the module).

    Subclasses implement `_constrain(params)` (the constrained coefficients, as a tuple of tensors with a trailing
    coefficient dimension) and `_on_bound(x, coefficients)` (`(f(x), log f'(x))` for `|x| <= B`).

    Arguments:
        bound: the half-width `B` of the interval where the map is a polynomial.
        min_slope: the least slope $\delta$ of the map, in `(0, 1)`.
        iterations: safeguarded Newton steps of the inverse.
    """

    _flowkit_register = False

    def __init__(self, bound: float, min_slope: float, iterations: int) -> None:
        super().__init__()
        where = type(self).__name__
        self.bound = check_number(bound, "bound", where=where, positive=True, high=1e6)
        self.min_slope = check_number(min_slope, "min_slope", where=where, positive=True, below=1)
        self.iterations = check_number(iterations, "iterations", where=where, integer=True, low=1, high=10_000)

    def _constrain(self, params: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def _on_bound(self, x: Tensor, coefficients: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        inside = x.clamp(-self.bound, self.bound)
        y, log_slope = self._on_bound(inside, self._constrain(params))
        return y + log_slope.exp() * (x - inside), log_slope

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        coefficients = self._constrain(params)
        ends = torch.tensor([-self.bound, self.bound], dtype=y.dtype, device=y.device)
        end_values = self._on_bound(ends.reshape(2, *[1] * y.dim()).expand(2, *y.shape), coefficients)[0]
        target = torch.minimum(torch.maximum(y, end_values[0]), end_values[1])

        def value(x: Tensor) -> Tensor:
            return self._on_bound(x, coefficients)[0]

        def slope(x: Tensor) -> Tensor:
            return self._on_bound(x, coefficients)[1].exp()

        low, high = -ends[1].expand_as(y), ends[1].expand_as(y)
        where = f"{type(self).__name__}.inverse"
        root = monotone_inverse(value, slope, target, low, high, self.iterations, where=where)
        log_slope = self._on_bound(root, coefficients)[1]
        return root + (y - target) * torch.exp(-log_slope), -log_slope
