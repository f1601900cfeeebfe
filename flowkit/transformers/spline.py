r"""Monotone rational-quadratic splines (Neural Spline Flows), with linear tails or on the circle.

The maths (one bin, its inverse without cancellation, the knots from unconstrained parameters as in nflows, the
clamping that keeps values and gradients finite far outside the bound) is in
[`flowkit.transformers.rational_quadratic`][flowkit.transformers.rational_quadratic]. The transformers evaluate it
through [`flowkit.kernels.rational_quadratic`][flowkit.kernels.rational_quadratic], which runs it on the fastest
kernel that applies (a fused node with a hand-written backward pass, in C++ on the CPU) and on the reference
where only it can serve (`torch.compile`, forward mode, higher derivatives); [`flowkit.kernels`][flowkit.kernels]
states the rule. They also return the derivative of their log-derivative in the input (their
`with_ladj_derivative(x, params, inverse=False)`), which the fast path-gradient rule of coupling layers uses.

References:
    Durkan, Bekasov, Murray & Papamakarios, *Neural Spline Flows*, NeurIPS 2019
    (arXiv:1906.04032); Rezende et al., *Normalizing flows on tori and spheres*, ICML 2020 (arXiv:2002.02428).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import kernels
from .._validation import check_number
from ..domains import Circle
from ..utils import broadcast_shapes
from .base import Transformer
from .rational_quadratic import SplineLayout, reference_spline

__all__ = [
    "RationalQuadraticSpline",
    "CircularSpline",
    "unconstrained_rqs",
    "DEFAULT_MIN_BIN_WIDTH",
    "DEFAULT_MIN_BIN_HEIGHT",
    "DEFAULT_MIN_DERIVATIVE",
]

DEFAULT_MIN_BIN_WIDTH = 1e-3
DEFAULT_MIN_BIN_HEIGHT = 1e-3
DEFAULT_MIN_DERIVATIVE = 1e-3


def _check_minimums(bins: int, min_bin_width: float, min_bin_height: float, min_derivative: float) -> None:
    if bins < 1:
        raise ValueError(f"a spline needs at least one bin, got bins={bins}")
    for name, value in (("min_bin_width", min_bin_width), ("min_bin_height", min_bin_height)):
        # Zero is refused: a bin whose logit underflows would get zero size and a 0/0 slope.
        if not 0 < value * bins < 1:
            raise ValueError(f"{name}={value} times bins={bins} must lie in (0, 1)")
    if min_derivative <= 0:
        raise ValueError(f"min_derivative must be positive, got {min_derivative}")


def unconstrained_rqs(
    x: Tensor,
    unnormalized_widths: Tensor,
    unnormalized_heights: Tensor,
    unnormalized_derivatives: Tensor,
    bound: float,
    inverse: bool = False,
    min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
    min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
    min_derivative: float = DEFAULT_MIN_DERIVATIVE,
) -> tuple[Tensor, Tensor]:
    """Rational-quadratic spline on `[-B, B]` with linear (identity) tails, from unconstrained parameters.

    The layout and defaults are those of nflows'
    `unconstrained_rational_quadratic_spline(..., tails="linear", tail_bound=B)`,
    so the outputs agree number for number; unlike it, this function has no
    data-dependent branches or boolean-mask indexing and gives finite values
    and gradients for every finite input.

    Arguments:
        x: inputs of any shape `S`.
        unnormalized_widths: `(*S, K)` bin-width logits.
        unnormalized_heights: `(*S, K)` bin-height logits.
        unnormalized_derivatives: `(*S, K - 1)` pre-softplus interior derivatives.
        bound: the half-width `B` of the spline's interval.
        inverse: evaluate the inverse map instead.
        min_bin_width: minimum bin width, as a fraction of `2B`.
        min_bin_height: minimum bin height, as a fraction of `2B`.
        min_derivative: minimum derivative at the knots.

    Returns:
        `(y, ladj)`, both of shape `S`: the output and the elementwise
        `log|dy/dx|` (`log|dx/dy|` when `inverse`).
    """
    bins = unnormalized_widths.shape[-1]
    _check_minimums(bins, min_bin_width, min_bin_height, min_derivative)
    if unnormalized_heights.shape[-1] != bins or unnormalized_derivatives.shape[-1] != bins - 1:
        raise ValueError(
            "unconstrained_rqs: expected K widths, K heights and K - 1 derivatives, got "
            f"{unnormalized_widths.shape[-1]}, {unnormalized_heights.shape[-1]} "
            f"and {unnormalized_derivatives.shape[-1]}"
        )
    parts = (x, unnormalized_widths, unnormalized_heights, unnormalized_derivatives)
    batch = broadcast_shapes(x.shape, *(t.shape[:-1] for t in parts[1:]))
    params = torch.cat([t.expand(*batch, t.shape[-1]) for t in parts[1:]], dim=-1)
    layout = SplineLayout(bins, -float(bound), float(bound), min_bin_width, min_bin_height, min_derivative, False)
    return reference_spline(x.expand(batch), params, layout, inverse, False)[:2]


class _Spline(Transformer):
    """What the two splines share: the map, its inverse and the log-derivative's derivative, all from `_map`."""

    layout: SplineLayout

    def __init__(
        self, bins: int, min_bin_width: float, min_bin_height: float, min_derivative: float, extra_params: int
    ) -> None:
        super().__init__()
        _check_minimums(int(bins), min_bin_width, min_bin_height, min_derivative)
        self.bins = int(bins)
        self.min_bin_width = float(min_bin_width)
        self.min_bin_height = float(min_bin_height)
        self.min_derivative = float(min_derivative)
        self.params_per_element = 3 * self.bins + extra_params

    def identity_params(self) -> Tensor:
        """Equal logits and the derivatives 1 (`m_d + softplus(log(e^{1 - m_d} - 1))`): the identity map."""
        params = torch.zeros(self.params_per_element)
        params[2 * self.bins : 3 * self.bins] = math.log(math.expm1(1 - self.min_derivative))
        return params

    def _map(self, x: Tensor, params: Tensor, inverse: bool, derivative: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The spline (or its inverse) with its log-derivative and, if asked, that one's derivative."""
        return kernels.rational_quadratic(x, params, self.layout, inverse, derivative)

    def knots(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """The knot positions `(..., 2, K + 1)` (rows `x_k`, `y_k`) and derivatives `(..., K + 1)` of `params`."""
        return self.layout.knots(params)

    def with_ladj_derivative(self, x: Tensor, params: Tensor, inverse: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """The map (or its inverse) at `x`, its log-derivative, and that one's derivative in `x` (without a graph).

        Returns `(y, L, dL/dx)` with `L = log|dy/dx|` (the inverse's `log|dx/dy|` and its derivative in
        `y` when `inverse`); the fast path-gradient rule of coupling layers carries a score through with it.
        """
        out, ladj, d = self._map(x, params, inverse, True)
        assert d is not None
        return out, ladj, d

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._map(x, params, False, False)[:2]

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._map(y, params, True, False)[:2]


class RationalQuadraticSpline(_Spline):
    """Monotone rational-quadratic spline with `K` bins on `[-B, B]` and linear tails.

    Parameters per element: `3K - 1`, laid out as `K` width logits, `K`
    height logits and `K - 1` pre-softplus interior derivatives (nflows'
    layout, see [`unconstrained_rqs`][flowkit.transformers.unconstrained_rqs]). Outside `[-B, B]` the map is the
    identity. The identity parameters (equal logits, derivatives 1) make the
    whole map the identity.

    Arguments:
        bins: number of bins `K`.
        bound: half-width `B` of the interval.
        min_bin_width: minimum bin width as a fraction of `2B`.
        min_bin_height: minimum bin height as a fraction of `2B`.
        min_derivative: minimum derivative at the knots.

    References:
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    def __init__(
        self,
        bins: int = 8,
        bound: float = 5.0,
        min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
        min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
        min_derivative: float = DEFAULT_MIN_DERIVATIVE,
    ) -> None:
        super().__init__(bins, min_bin_width, min_bin_height, min_derivative, -1)
        check_number(bound, "bound", where="RationalQuadraticSpline", positive=True, high=1e6)
        self.bound = float(bound)

    @property
    def layout(self) -> SplineLayout:
        """What the parameter vector means (bins, interval, minimums, linear tails)."""
        return SplineLayout(
            self.bins, -self.bound, self.bound, self.min_bin_width, self.min_bin_height, self.min_derivative, False
        )

    def extra_repr(self) -> str:
        return f"bins={self.bins}, bound={self.bound}"


class CircularSpline(_Spline):
    r"""Circle diffeomorphism on `[-pi, pi)`: a rational-quadratic spline followed by a rotation.

    The spline maps `[-pi, pi]` onto itself with equal derivatives at both
    ends (`delta_0 = delta_K`), so it is a smooth map of the circle that fixes
    the point `-pi = pi`; a learned rotation `y \mapsto y + \phi` (wrapped
    back to `[-pi, pi)`) removes the fixed point. Parameters per element:
    `3K + 1`: `K` width logits, `K` height logits, `K` pre-softplus
    derivatives (the last one shared by both ends) and the angle `\phi`.

    Arguments:
        bins: number of bins `K`.
        min_bin_width: minimum bin width as a fraction of `2 pi`.
        min_bin_height: minimum bin height as a fraction of `2 pi`.
        min_derivative: minimum derivative at the knots.

    References:
        Rezende et al., *Normalizing flows on tori and spheres*, ICML 2020 (arXiv:2002.02428);
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    domain = Circle()

    def __init__(
        self,
        bins: int = 8,
        min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
        min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
        min_derivative: float = DEFAULT_MIN_DERIVATIVE,
    ) -> None:
        super().__init__(bins, min_bin_width, min_bin_height, min_derivative, 1)

    @property
    def layout(self) -> SplineLayout:
        """What the parameter vector means (bins, the interval `[-pi, pi]`, minimums, circular)."""
        return SplineLayout(
            self.bins, -math.pi, math.pi, self.min_bin_width, self.min_bin_height, self.min_derivative, True
        )

    @staticmethod
    def _wrap(angle: Tensor) -> Tensor:
        return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi

    def _map(self, x: Tensor, params: Tensor, inverse: bool, derivative: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The circle map (or its inverse) with its log-derivative and, if asked, that one's derivative."""
        shift = params[..., 3 * self.bins]
        if inverse:
            return super()._map(self._wrap(x - shift), params, True, derivative)
        out, ladj, d = super()._map(x, params, False, derivative)
        return self._wrap(out + shift), ladj, d

    def extra_repr(self) -> str:
        return f"bins={self.bins}"
