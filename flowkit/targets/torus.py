r"""A periodic two-dimensional double well on the torus $[-\pi, \pi)^2$, for smooth flows and force matching.

$$
u(x_1, x_2) = b \cos^2 x_1 + \tau \sin x_1 + k\,\big(1 - \cos(x_2 - c \sin x_1)\big).
$$

In $x_1$ two wells at $\pm\pi/2$ (the second deeper by $2\tau$) are separated by barriers of height
$\approx b$; in $x_2$ a von Mises well of stiffness $k$ whose centre $c \sin x_1$ moves with $x_1$, so the
density does not factorise. Forces are analytic; the normaliser is a periodic trapezoid rule on a grid
(spectrally accurate; exactly, $Z = 2\pi e^{-k} I_0(k) \int e^{-b\cos^2 x_1 - \tau \sin x_1} dx_1$), and
exact samples come by rejection from the uniform distribution ($u \ge -|\tau|$).

References:
    Köhler, Krämer & Noé, *Smooth normalizing flows*, NeurIPS 2021 (arXiv:2110.00351), whose toy
    examples are densities on the interval and the torus.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_number
from ..domains import Circle
from .base import Target

__all__ = ["TorusDoubleWell", "torus_grid"]


def torus_grid(n: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, float]:
    r"""The `n x n` grid of cell centres on $[-\pi, \pi)^2$, `(n * n, 2)`, and the area of one cell.

    Sums over it are the periodic trapezoid rule; a KL divergence or a normaliser on the
    grid is `(p * (log p - log q)).sum() * area`.

    Arguments:
        n: points per angle.
        dtype: dtype of the grid.
    """
    n = check_number(n, "n", where="torus_grid", integer=True, low=2)
    axis = -math.pi + (torch.arange(n, dtype=dtype) + 0.5) * (2 * math.pi / n)
    x1, x2 = torch.meshgrid(axis, axis, indexing="ij")
    return torch.stack([x1.flatten(), x2.flatten()], -1), (2 * math.pi / n) ** 2


class TorusDoubleWell(Target):
    r"""Periodic 2-D double well $u = b\cos^2 x_1 + \tau \sin x_1 + k(1 - \cos(x_2 - c\sin x_1))$ on the torus.

    Angles live in $[-\pi, \pi)$ (any real angle is accepted: the energy is periodic).
    See the module [`flowkit.targets.torus`][flowkit.targets.torus] for the maths.

    Arguments:
        barrier: $b \ge 0$, the height of the barriers between the wells in $x_1$.
        tilt: $\tau$, half the depth difference of the two wells.
        stiffness: $k \ge 0$, the stiffness of the well in $x_2$.
        coupling: $c$, how far the $x_2$ well moves with $x_1$.
        grid: points per angle of the quadrature that gives `log_Z`.

    Attributes:
        log_Z: the log normaliser on the grid.
        domain: the torus, `Circle()` in each coordinate.

    Examples:
        >>> import torch
        >>> target = TorusDoubleWell()
        >>> target.sample(4).shape
        torch.Size([4, 2])
        >>> round(target.log_Z, 4)
        1.5953
    """

    has_samples = True
    domain = Circle()

    def __init__(
        self, barrier: float = 3.0, tilt: float = 0.5, stiffness: float = 2.0, coupling: float = 1.0, grid: int = 512
    ) -> None:
        super().__init__()
        where = "TorusDoubleWell"
        self.barrier = check_number(barrier, "barrier", where=where, low=0, high=500)
        self.tilt = check_number(tilt, "tilt", where=where, low=-50, high=50)
        self.stiffness = check_number(stiffness, "stiffness", where=where, low=0, high=500)
        self.coupling = check_number(coupling, "coupling", where=where, low=-10, high=10)
        self.grid = check_number(grid, "grid", where=where, integer=True, low=16)
        self.event_shape = torch.Size([2])
        points, area = torus_grid(self.grid)
        u = self._energy(points)
        self.log_Z = float(torch.logsumexp(-u, 0) + math.log(area))

    def _energy(self, x: Tensor) -> Tensor:
        x1, x2 = x[..., 0], x[..., 1]
        cos1, sin1 = torch.cos(x1), torch.sin(x1)
        well = self.stiffness * (1 - torch.cos(x2 - self.coupling * sin1))
        return self.barrier * cos1 * cos1 + self.tilt * sin1 + well

    def _force(self, x: Tensor) -> Tensor:
        x = x.detach()
        x1, x2 = x[..., 0], x[..., 1]
        cos1, sin1 = torch.cos(x1), torch.sin(x1)
        pull = self.stiffness * torch.sin(x2 - self.coupling * sin1)
        du1 = -self.barrier * 2 * sin1 * cos1 + self.tilt * cos1 - self.coupling * cos1 * pull
        return -torch.stack([du1, pull], -1)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        floor = -abs(self.tilt)  # u >= -|tau|
        out = torch.empty(0, 2, dtype=torch.float64)
        while out.shape[0] < n:
            m = 4 * (n - out.shape[0]) + 64
            x = (2 * torch.rand(m, 2, generator=generator, dtype=torch.float64) - 1) * math.pi
            accept = torch.rand(m, generator=generator, dtype=torch.float64).log() < -(self._energy(x) - floor)
            out = torch.cat([out, x[accept]])
        return out[:n]

    def extra_repr(self) -> str:
        return f"barrier={self.barrier}, tilt={self.tilt}, stiffness={self.stiffness}, coupling={self.coupling}"
