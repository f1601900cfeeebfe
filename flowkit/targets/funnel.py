r"""Neal's funnel and a weighted two-mode Gaussian: the targets of the flow-MCMC study (Grenioux et al. 2023)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_number
from .base import Target

__all__ = ["NealFunnel", "BimodalGaussian"]


class NealFunnel(Target):
    r"""Neal's funnel in `dim` dimensions, normalised ($\log Z = 0$), with exact samples.

    $$
    v \sim \mathcal N(0, \sigma^2), \qquad x_i \mid v \sim \mathcal N(0, e^{v}), \quad i = 1, \dots, d - 1,
    $$

    the first coordinate is $v$. The neck ($v \ll 0$) is narrow and the mouth wide: no single step size fits
    both, the classical hard case for gradient-based MCMC.

    Arguments:
        dim: dimension `d` (at least 2).
        scale: the standard deviation $\sigma$ of $v$ (3 in Neal's paper).

    Examples:
        >>> import torch, flowkit
        >>> target = flowkit.targets.NealFunnel(4)
        >>> target.energy(torch.zeros(2, 4)).shape
        torch.Size([2])

    References:
        Neal, *Slice sampling*, Annals of Statistics 31 (2003).
    """

    has_samples = True
    log_Z = 0.0

    def __init__(self, dim: int = 10, scale: float = 3.0) -> None:
        super().__init__()
        self.dim = check_number(dim, "dim", where="NealFunnel", integer=True, low=2)
        self.scale = check_number(scale, "scale", where="NealFunnel", positive=True)
        self.event_shape = torch.Size([self.dim])

    def _spread(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""`(v, |x_{2:}|^2, e^{-v})`, $e^{-v}$ read as 1 where $|x_{2:}| = 0$ (so $0 \cdot \infty$ never arises)."""
        v, squares = x[..., 0], x[..., 1:].square().sum(-1)
        inner = squares > 0
        return v, squares, torch.exp(-torch.where(inner, v, torch.zeros_like(v)))

    def _energy(self, x: Tensor) -> Tensor:
        # u = v^2 / (2 s^2) + k v / 2 + |x|^2 e^{-v} / 2 + const, written without inf - inf or 0 * inf: the first two
        # terms as one product (at least -k^2 s^2 / 8), the last zero where |x| = 0, so that u is never NaN; where it
        # exceeds the dtype's range (the density underflows to exactly 0, e.g. v = -1e38) it is +inf.
        v, squares, decay = self._spread(x)
        k = self.dim - 1
        const = math.log(self.scale) + 0.5 * self.dim * math.log(2 * math.pi)
        return 0.5 * v * (v / self.scale**2 + k) + 0.5 * squares * decay + const

    def _force(self, x: Tensor) -> Tensor:
        v, squares, decay = self._spread(x)
        rest = x[..., 1:]
        pull = rest * decay.unsqueeze(-1)
        pull = torch.where(rest == 0, torch.zeros_like(pull), pull)  # x_i e^{-v} with 0 * inf read as 0
        d_v = v / self.scale**2 + 0.5 * (self.dim - 1) - 0.5 * squares * decay
        return -torch.cat([d_v.unsqueeze(-1), pull], -1).detach()

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        z = torch.randn(n, self.dim, generator=generator, dtype=torch.float64)
        v = self.scale * z[:, :1]
        return torch.cat([v, z[:, 1:] * torch.exp(0.5 * v)], -1)


class BimodalGaussian(Target):
    r"""Two unit-variance Gaussians at $\pm a\,\mathbf 1/\sqrt d$ with weights $(w, 1 - w)$, normalised.

    $$
    p(x) = w\,\mathcal N(x; \mu, I) + (1 - w)\,\mathcal N(x; -\mu, I), \qquad \mu = \frac{a}{\sqrt d}\mathbf 1,
    $$

    so the modes are $2a$ apart in every dimension. Which mode a point is nearest to is the sign of
    $\sum_i x_i$ (see [`mode_of`][flowkit.targets.funnel.BimodalGaussian.mode_of]): the estimate of $w$ is the
    fraction of samples with a positive sum.

    Arguments:
        dim: dimension `d`.
        separation: the distance $a$ of each mode from the origin.
        weight: the weight $w \in (0, 1)$ of the mode at $+\mu$.

    Examples:
        >>> import torch, flowkit
        >>> target = flowkit.targets.BimodalGaussian(3, separation=4.0, weight=2 / 3)
        >>> float(target.mode_of(target.sample(4000)).double().mean().round(decimals=1))
        0.7
    """

    has_samples = True
    log_Z = 0.0

    def __init__(self, dim: int = 2, separation: float = 4.0, weight: float = 2 / 3) -> None:
        super().__init__()
        where = "BimodalGaussian"
        self.dim = check_number(dim, "dim", where=where, integer=True, low=1)
        self.separation = check_number(separation, "separation", where=where, positive=True)
        self.weight = check_number(weight, "weight", where=where, positive=True, below=1)
        self.event_shape = torch.Size([self.dim])

    def mode_of(self, x: Tensor) -> Tensor:
        r"""Whether each point `(..., d)` lies on the side of the mode at $+\mu$ (boolean, batch-shaped)."""
        return x.sum(-1) > 0

    def _energy(self, x: Tensor) -> Tensor:
        offset = self.separation / math.sqrt(self.dim)
        half = 0.5 * self.dim * math.log(2 * math.pi)
        plus = -0.5 * (x - offset).square().sum(-1) + math.log(self.weight)
        minus = -0.5 * (x + offset).square().sum(-1) + math.log1p(-self.weight)
        return -(torch.logaddexp(plus, minus) - half)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        plus = torch.rand(n, 1, generator=generator, dtype=torch.float64) < self.weight
        offset = self.separation / math.sqrt(self.dim)
        centre = torch.where(plus, offset, -offset)
        return centre + torch.randn(n, self.dim, generator=generator, dtype=torch.float64)
