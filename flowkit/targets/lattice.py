r"""Lattice field theories: the 2-D $\phi^4$ model with periodic boundaries."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_number
from .base import Target

__all__ = ["Phi4"]


class Phi4(Target):
    r"""$\phi^4$ theory on an `L x L` periodic lattice; event shape `(L, L)`.

    $$
    S(\phi) = \sum_x \Big[\sum_{\mu=1,2} (\phi_{x+\hat\mu} - \phi_x)^2 + m^2 \phi_x^2 + \lambda \phi_x^4\Big],
    $$

    which equals the form $\sum_x \phi_x \sum_\mu(2\phi_x - \phi_{x+\hat\mu} - \phi_{x-\hat\mu}) + \dots$
    of Albergo et al. For the free field (`lam = 0`, `m2 > 0`) the density
    is Gaussian with precision $2(-\Delta + m^2)$, diagonal in Fourier
    space, so $\log Z$ is exact,

    $$
    \log Z = \frac V2 \log 2\pi - \frac12 \sum_k \log\Big[2\Big(m^2 + \sum_\mu 4\sin^2\frac{\pi k_\mu}{L}\Big)\Big],
    $$

    and exact samples are white noise filtered in Fourier space.

    Arguments:
        L: lattice size.
        m2: bare mass squared $m^2$ (negative for the broken phase; then `lam > 0`).
        lam: quartic coupling $\lambda \ge 0$.

    References:
        Albergo, Kanwar & Shanahan, *Flow-based generative models for Markov chain
        Monte Carlo in lattice field theory*, PRD 100, 034515 (2019) (arXiv:1904.12072).
    """

    def __init__(self, L: int = 8, m2: float = -4.0, lam: float = 8.0) -> None:
        super().__init__()
        L = check_number(L, "L", where="Phi4", integer=True, low=2)
        m2 = check_number(m2, "m2", where="Phi4")
        lam = check_number(lam, "lam", where="Phi4", low=0)
        if lam == 0 and m2 <= 0:
            raise ValueError(
                f"Phi4: with lam = 0 the mass squared must be positive, got m2 = {m2} (no normalisable density)"
            )
        self.event_shape = torch.Size([L, L])
        self.L, self.m2, self.lam = int(L), float(m2), float(lam)
        if self.lam == 0:
            self.has_samples = True
            self.log_Z = 0.5 * L * L * math.log(2 * math.pi) - 0.5 * float(self._precision_eigenvalues().log().sum())

    def _precision_eigenvalues(self) -> Tensor:
        """Eigenvalues `2(m^2 + sum_mu 4 sin^2(pi k_mu / L))` of the free field's precision, shape `(L, L)`."""
        k = torch.arange(self.L, dtype=torch.float64)
        s = 4 * torch.sin(math.pi * k / self.L) ** 2
        return 2 * (self.m2 + s[:, None] + s[None, :])

    def _energy(self, x: Tensor) -> Tensor:
        kinetic = sum((torch.roll(x, -1, dim) - x).square() for dim in (-1, -2))
        x2 = x.square()
        # x^2 (m^2 + lam x^2): far out it overflows to +inf, never to inf - inf = NaN.
        potential = x2 * (self.m2 + self.lam * x2) if self.lam else self.m2 * x2
        return (kinetic + potential).sum((-1, -2))

    def _force(self, x: Tensor) -> Tensor:
        # In float64 for lower precisions, so that no sum of neighbours overflows to inf - inf (then cast back).
        y = x.to(torch.promote_types(x.dtype, torch.float64))
        laplacian = sum((torch.roll(y, 1, dim) - y) + (torch.roll(y, -1, dim) - y) for dim in (-1, -2))
        return (2 * laplacian - y * (2 * self.m2 + 4 * self.lam * y * y)).to(x.dtype)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        noise = torch.randn(n, self.L, self.L, generator=generator, dtype=torch.float64)
        field = torch.fft.ifft2(torch.fft.fft2(noise) / self._precision_eigenvalues().sqrt()).real
        return field

    @staticmethod
    def magnetization(x: Tensor) -> Tensor:
        """Mean field over the lattice, `M = mean_x phi_x` (batch shape)."""
        return x.mean((-1, -2))

    def extra_repr(self) -> str:
        return f"L={self.L}, m2={self.m2}, lam={self.lam}"
