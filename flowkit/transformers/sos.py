r"""Sum-of-squares polynomial transformer (SOSPF): the integral of a sum of squared polynomials, in closed form.

On $[-B, B]$, with $t = x / B$ and $K$ polynomials $p_k(t) = \sum_{l=0}^{L} a_{kl}\, t^l$ of degree $L$,

$$
f'(x) = \delta + \frac{1}{K} \sum_{k=1}^{K} p_k(t)^2, \qquad
f(x) = c + \delta x + B \int_0^{t} \frac{1}{K} \sum_k p_k(s)^2\, ds
     = c + \delta x + B \sum_{m=0}^{2L} \frac{q_m}{m + 1}\, t^{m+1},
$$

with $q_m = \frac{1}{K} \sum_k \sum_{i + j = m} a_{ki} a_{kj}$ the coefficients of the averaged squares: the
integral is a polynomial of degree $2L + 1$, evaluated by Horner's rule. A sum of squares is non-negative, so
$f' \ge \delta > 0$ for every parameter value: $f$ is strictly increasing (Jaini et al.'s construction, which
covers every increasing polynomial as $K$ grows). $f'$ is evaluated as the squares themselves (positive in floating
point), not as the derivative of the expanded integral.

Outside $[-B, B]$ the map continues along its tangent (continuous with its first derivative), so that it is a
bijection of the real line whatever the degree; this replaces the soft clipping between layers that zuko's SOSPF
needs against the growth $|x|^{2L+1}$. The identity is $c = 0$, $a_{k0} = \sqrt{1 - \delta}$ and all other $a_{kl} = 0$.

*Inverse*: closed form in the tails, safeguarded Newton ([`monotone_inverse`][flowkit.root_finding.monotone_inverse])
on the bracket $[-B, B]$ inside, checked to the root finder's residual tolerance (else
[`ConvergenceError`][flowkit.root_finding.ConvergenceError]), with the implicit gradients.

References:
    Jaini, Selby & Yu, *Sum-of-Squares Polynomial Flow*, ICML 2019 (arXiv:1905.02325).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_number
from ._linear_tails import LinearTails

__all__ = ["SumOfSquares"]


def _horner(coefficients: Tensor, t: Tensor) -> Tensor:
    """`sum_m c_m t^m` for coefficients in the last dimension (`c_0` first)."""
    value = coefficients[..., -1]
    for m in range(coefficients.shape[-1] - 2, -1, -1):
        value = value * t + coefficients[..., m]
    return value


class SumOfSquares(LinearTails):
    r"""Sum-of-squares polynomial transformer: $f' = \delta + \frac1K \sum_k p_k(x / B)^2$, integrated in closed form.

    See [the module][flowkit.transformers.sos] for the maths. Parameters per element: `1 + K (L + 1)`, laid out as
    the offset $c$ then the coefficients $a_{kl}$, polynomial by polynomial, constant term first. The map has degree
    $2L + 1$ on `[-bound, bound]` and is linear outside; its slope is at least `min_slope`. The inverse is numerical
    (safeguarded Newton on `[-B, B]`, `iterations` steps, checked or
    [`ConvergenceError`][flowkit.root_finding.ConvergenceError]), closed form outside the bound.

    Arguments:
        degree: the degree $L \ge 1$ of each squared polynomial.
        polynomials: the number $K \ge 1$ of squared polynomials.
        bound: the half-width $B$ of the interval where the map is a polynomial.
        min_slope: the least slope $\delta \in (0, 1)$.
        iterations: safeguarded Newton steps of the inverse.

    Examples:
        >>> import torch
        >>> t = SumOfSquares(degree=3, polynomials=2)
        >>> x = 3 * torch.randn(5, dtype=torch.float64)
        >>> params = torch.randn(5, t.params_per_element, dtype=torch.float64)
        >>> y, ladj = t(x, params)
        >>> back, ladj_inv = t.inverse(y, params)
        >>> bool(torch.allclose(back, x, atol=1e-10)), bool(torch.allclose(ladj, -ladj_inv))
        (True, True)

    References:
        Jaini, Selby & Yu, *Sum-of-Squares Polynomial Flow*, ICML 2019 (arXiv:1905.02325).
    """

    def __init__(
        self, degree: int = 4, polynomials: int = 3, bound: float = 5.0, min_slope: float = 1e-3, iterations: int = 100
    ) -> None:
        super().__init__(bound, min_slope, iterations)
        self.degree = check_number(degree, "degree", where="SumOfSquares", integer=True, low=1)
        self.polynomials = check_number(polynomials, "polynomials", where="SumOfSquares", integer=True, low=1)
        self.params_per_element = 1 + self.polynomials * (self.degree + 1)
        # (i, j) -> m = i + j, weighted 1 / (m + 1): the coefficients of the integral from the products a_i a_j.
        n = self.degree + 1
        index = torch.arange(n)
        sums = (index[:, None] + index[None, :]).flatten()
        table = torch.zeros(n * n, 2 * n - 1, dtype=torch.float64)
        table[torch.arange(n * n), sums] = 1.0 / (sums + 1).double()
        self.register_buffer("_integral", table, persistent=False)

    def _constrain(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = params[..., 1:].unflatten(-1, (self.polynomials, self.degree + 1))
        products = (a.unsqueeze(-1) * a.unsqueeze(-2)).mean(-3).flatten(-2)
        return params[..., 0], a, products @ self._integral.to(params.dtype)

    def _on_bound(self, x: Tensor, coefficients: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        offset, a, integral = coefficients
        t = x / self.bound
        squares = _horner(a, t.unsqueeze(-1)).square().mean(-1)
        y = offset + self.min_slope * x + self.bound * t * _horner(integral, t)
        return y, torch.log(self.min_slope + squares)

    def identity_params(self) -> Tensor:
        params = torch.zeros(self.params_per_element)
        params[1 :: self.degree + 1] = math.sqrt(1 - self.min_slope)
        return params

    def extra_repr(self) -> str:
        return f"degree={self.degree}, polynomials={self.polynomials}, bound={self.bound}"
