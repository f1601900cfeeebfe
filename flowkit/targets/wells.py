r"""Double-well energies: the 2-D double well of Boltzmann generators and FAB's many-well.

One well is $u(x_1, x_2) = c x_1^4 + b x_1^2 + a x_1 + \tfrac12 x_2^2$. Its normalising constant factorises into a 1-D
integral over $x_1$, done here by quadrature, times $\sqrt{2\pi}$; exact samples of $x_1$ come from rejection sampling
with a two-Gaussian proposal.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from .base import Target

__all__ = ["DoubleWell", "ManyWell"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _quartic(x: Any, a: float, b: float, c: float) -> Any:
    """`c x^4 + b x^2 + a x` in Horner form: far out it overflows to `+inf`, never to `inf - inf = NaN`."""
    return x * (x * (c * x * x + b) + a)


class _QuarticWell:
    """The 1-D density `exp(-(c x^4 + b x^2 + a x))`: log normaliser and an exact rejection sampler."""

    def __init__(self, a: float, b: float, c: float) -> None:
        self.a = check_number(a, "a", where="DoubleWell")
        self.b = check_number(b, "b", where="DoubleWell")
        self.c = check_number(c, "the quartic coefficient c", where="DoubleWell", positive=True)
        # The density is negligible beyond |x| = reach (u > 60 above its minimum there).
        grid = np.linspace(-50.0, 50.0, 200_001)
        u = self.energy_np(grid)
        inside = grid[u < u.min() + 60.0]
        reach = max(abs(inside[0]), abs(inside[-1])) + 1.0
        grid = np.linspace(-reach, reach, 400_001)
        u = self.energy_np(grid)
        shift = u.min()
        density = np.exp(-(u - shift))
        self.log_Z = float(np.log(np.trapezoid(density, grid)) - shift)
        # Proposal: equal mixture of two Gaussians at the minima of each half line,
        # widened so that the envelope bound M = max p/q is attained inside the grid.
        left = grid[grid <= 0][np.argmin(u[grid <= 0])]
        right = grid[grid >= 0][np.argmin(u[grid >= 0])]
        curvature = max(12 * c * max(left**2, right**2) + 2 * b, 1e-2)
        self.locs = (float(left), float(right))
        self.scale = 2.0 / math.sqrt(curvature) + 0.25
        log_q = self._log_proposal_np(grid)
        self.log_M = float(np.max(-(u - shift) - log_q) - shift) + 0.01

    def energy_np(self, x: np.ndarray) -> np.ndarray:
        return _quartic(x, self.a, self.b, self.c)

    def _log_proposal_np(self, x: np.ndarray) -> np.ndarray:
        comps = [-0.5 * ((x - m) / self.scale) ** 2 for m in self.locs]
        return np.logaddexp(*comps) - math.log(2) - math.log(self.scale) - _HALF_LOG_2PI

    def sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        out = torch.empty(0, dtype=torch.float64)
        locs = torch.tensor(self.locs, dtype=torch.float64)
        while out.numel() < n:
            m = 2 * (n - out.numel()) + 16
            pick = torch.randint(0, 2, (m,), generator=generator)
            x = locs[pick] + self.scale * torch.randn(m, generator=generator, dtype=torch.float64)
            log_q = torch.logaddexp(*[-0.5 * ((x - loc) / self.scale) ** 2 for loc in self.locs])
            log_q = log_q - math.log(2) - math.log(self.scale) - _HALF_LOG_2PI
            log_p = -(self.c * x**4 + self.b * x**2 + self.a * x)
            u = torch.rand(m, generator=generator, dtype=torch.float64)
            out = torch.cat([out, x[u.log() < log_p - log_q - self.log_M]])
        return out[:n]


class DoubleWell(Target):
    r"""2-D double well $u(x) = c x_1^4 + b x_1^2 + a x_1 + \tfrac12 x_2^2$.

    The defaults (`a = -0.5, b = -6, c = 1`) are the target of Boltzmann generators and stochastic
    normalizing flows, with $\log Z = 10.2935$ (quadrature). Exact samples by rejection sampling.

    Arguments:
        a: linear coefficient (tilts the wells).
        b: quadratic coefficient (negative for two wells).
        c: quartic coefficient (positive).

    References:
        Noé, Olsson, Köhler & Wu, *Boltzmann generators*, Science 2019;
        Wu, Köhler & Noé, *Stochastic normalizing flows*, NeurIPS 2020 (arXiv:2002.06707).
    """

    has_samples = True

    def __init__(self, a: float = -0.5, b: float = -6.0, c: float = 1.0) -> None:
        super().__init__()
        self.event_shape = torch.Size([2])
        self._well = _QuarticWell(a, b, c)
        self.a, self.b, self.c = self._well.a, self._well.b, self._well.c
        self.log_Z = self._well.log_Z + _HALF_LOG_2PI

    def _energy(self, x: Tensor) -> Tensor:
        x1, x2 = x[..., 0], x[..., 1]
        return _quartic(x1, self.a, self.b, self.c) + 0.5 * x2**2

    def _force(self, x: Tensor) -> Tensor:
        x1, x2 = x[..., 0], x[..., 1]
        return -torch.stack([x1 * (4 * self.c * x1 * x1 + 2 * self.b) + self.a, x2], dim=-1)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        x1 = self._well.sample(n, generator)
        x2 = torch.randn(n, generator=generator, dtype=torch.float64)
        return torch.stack([x1, x2], -1)

    def extra_repr(self) -> str:
        return f"a={self.a}, b={self.b}, c={self.c}"


class ManyWell(Target):
    r"""FAB's many-well: `dim / 2` independent [`DoubleWell`][flowkit.targets.DoubleWell] copies on coordinate pairs.

    Coordinates `(x_{2i}, x_{2i+1})` form copy `i`: $2^{dim/2}$ modes, $\log Z = (dim/2) \log Z_{DW}$
    (164.6957 at `dim = 32`). Exact samples.

    Arguments:
        dim: even number of coordinates.
        a: the double well's linear coefficient.
        b: its quadratic coefficient.
        c: its quartic coefficient (positive).

    References:
        Midgley et al., *Flow annealed importance sampling bootstrap*, ICLR 2023 (arXiv:2208.01893).
    """

    has_samples = True

    def __init__(self, dim: int = 32, a: float = -0.5, b: float = -6.0, c: float = 1.0) -> None:
        super().__init__()
        dim = check_number(dim, "dim", where="ManyWell", integer=True, low=2)
        if dim % 2:
            raise ValueError(f"ManyWell: dim must be a positive even number, got {dim}")
        self.event_shape = torch.Size([dim])
        self.well = DoubleWell(a, b, c)
        self.log_Z = dim // 2 * self.well.log_Z

    def _pairs(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (-1, 2))

    def _energy(self, x: Tensor) -> Tensor:
        return self.well._energy(self._pairs(x)).sum(-1)

    def _force(self, x: Tensor) -> Tensor:
        return self.well._force(self._pairs(x)).flatten(-2)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        return self.well._sample(n * (self.event_shape[0] // 2), generator).reshape(n, -1)

    def extra_repr(self) -> str:
        return f"dim={self.event_shape[0]}"
