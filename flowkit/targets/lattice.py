r"""Lattice field theories: the 2-D $\phi^4$ model with periodic boundaries, in two parametrisations."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_number
from .base import Target

__all__ = ["Phi4", "Phi4Hopping"]


def _lattice_momenta(L: int) -> Tensor:
    r"""The lattice Laplacian's eigenvalues $\sum_\mu 4\sin^2(\pi k_\mu / L)$ on an `L x L` torus, shape `(L, L)`."""
    k = torch.arange(L, dtype=torch.float64)
    s = 4 * torch.sin(math.pi * k / L) ** 2
    return s[:, None] + s[None, :]


class Phi4(Target):
    r"""$\phi^4$ theory on an `L x L` periodic lattice; event shape `(L, L)`.

    $$
    S(\phi) = \sum_x \Big[\sum_{\mu=1,2} (\phi_{x+\hat\mu} - \phi_x)^2 + m^2 \phi_x^2 + \lambda \phi_x^4\Big],
    $$

    (the form of Albergo et al.). For the free field (`lam = 0`, `m2 > 0`) the density is Gaussian with
    precision $2(-\Delta + m^2)$, diagonal in Fourier space, so $\log Z$ is exact at any `L`,

    $$
    \log Z = \frac V2 \log 2\pi - \frac12 \sum_k \log\Big[2\Big(m^2 + \sum_\mu 4\sin^2\frac{\pi k_\mu}{L}\Big)\Big],
    $$

    exact samples are filtered white noise, and the propagator is known
    ([`free_propagator`][flowkit.targets.lattice.Phi4.free_propagator]). The same theory in the hopping
    parametrisation is [`Phi4Hopping`][flowkit.targets.Phi4Hopping] ([`hopping`][flowkit.targets.lattice.Phi4.hopping]).

    Arguments:
        L: lattice size.
        m2: bare mass squared $m^2$ (negative near and in the broken phase; then `lam > 0`).
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
        return 2 * (self.m2 + _lattice_momenta(self.L))

    def free_propagator(self) -> Tensor:
        r"""The free field's exact two-point function $G(x) = \langle \phi_y \phi_{y+x} \rangle$, float64 `(L, L)`.

        $G(x) = \frac1V \sum_k e^{2\pi i k\cdot x / L} / \big(2(m^2 + \sum_\mu 4\sin^2(\pi k_\mu/L))\big)$;
        $G(0) = \langle\phi^2\rangle$ and $\sum_x G(x) = 1/(2m^2) = \chi_2$. Only for `lam = 0`.
        """
        if self.lam != 0:
            raise ValueError(f"Phi4.free_propagator: only the free field (lam = 0) has one, got lam = {self.lam}")
        return torch.fft.ifft2(1 / self._precision_eigenvalues()).real

    def hopping(self) -> tuple[float, float]:
        r"""The couplings `(kappa, lam)` of the same theory in the hopping form, with $\phi = \sqrt\kappa\,\tilde\phi$.

        $\kappa$ is the positive root of $2\lambda_m\kappa^2 + (m^2 + 4)\kappa - 1 = 0$ and
        $\lambda = \lambda_m \kappa^2$ (see [`Phi4Hopping`][flowkit.targets.Phi4Hopping]).
        """
        a = self.m2 + 4
        if self.lam == 0:
            if a <= 0:
                raise ValueError(f"Phi4.hopping: m2 + 4 must be positive when lam = 0, got m2 = {self.m2}")
            kappa = 1 / a
        else:
            kappa = (math.sqrt(a * a + 8 * self.lam) - a) / (4 * self.lam)
        return kappa, self.lam * kappa * kappa

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
        return torch.fft.ifft2(torch.fft.fft2(noise) / self._precision_eigenvalues().sqrt()).real

    @staticmethod
    def magnetization(x: Tensor) -> Tensor:
        """Mean field over the lattice, `M = mean_x phi_x` (batch shape)."""
        return x.mean((-1, -2))

    def extra_repr(self) -> str:
        return f"L={self.L}, m2={self.m2}, lam={self.lam}"


class Phi4Hopping(Target):
    r"""$\phi^4$ theory in the hopping parametrisation, on the rescaled field $\tilde\phi$; event shape `(L, L)`.

    $$
    S(\tilde\phi) = \sum_x \Big[-2\kappa \sum_{\mu=1,2} \tilde\phi_x \tilde\phi_{x+\hat\mu}
    + (1 - 2\lambda)\tilde\phi_x^2 + \lambda \tilde\phi_x^4\Big].
    $$

    With $\phi = \sqrt\kappa\,\tilde\phi$ this is the action of [`Phi4`][flowkit.targets.Phi4] at
    $m^2 = (1 - 2\lambda)/\kappa - 4$, $\lambda_m = \lambda / \kappa^2$: `Phi4Hopping(L, kappa, lam).energy(phi_t)`
    equals `Phi4(L, m2, lam_m).energy(sqrt(kappa) * phi_t)`
    ([`mass_form`][flowkit.targets.lattice.Phi4Hopping.mass_form] builds that target). The densities differ by the
    Jacobian of the rescaling, so $\log Z = \log Z_m - \frac V2 \log\kappa$ (exact at `lam = 0`).

    Arguments:
        L: lattice size.
        kappa: hopping parameter $\kappa > 0$.
        lam: quartic coupling $\lambda \ge 0$ of the rescaled field.

    References:
        Albergo, Kanwar & Shanahan, PRD 100, 034515 (2019), eqs. (23)-(24) (arXiv:1904.12072).
    """

    def __init__(self, L: int = 8, kappa: float = 0.25, lam: float = 0.5) -> None:
        super().__init__()
        L = check_number(L, "L", where="Phi4Hopping", integer=True, low=2)
        kappa = check_number(kappa, "kappa", where="Phi4Hopping", low=0)
        lam = check_number(lam, "lam", where="Phi4Hopping", low=0)
        if kappa == 0:
            raise ValueError("Phi4Hopping: kappa must be positive, got 0")
        self.event_shape = torch.Size([L, L])
        self.L, self.kappa, self.lam = int(L), float(kappa), float(lam)
        mass = self.mass_form()  # refuses a free field without a normalisable density
        if mass.log_Z is not None:
            self.has_samples = True
            self.log_Z = mass.log_Z - 0.5 * L * L * math.log(self.kappa)

    def mass_form(self) -> Phi4:
        r"""The same theory as a [`Phi4`][flowkit.targets.Phi4] target on $\phi = \sqrt\kappa\,\tilde\phi$."""
        return Phi4(self.L, (1 - 2 * self.lam) / self.kappa - 4, self.lam / self.kappa**2)

    def _energy(self, x: Tensor) -> Tensor:
        hopping = sum(x * torch.roll(x, -1, dim) for dim in (-1, -2))
        x2 = x.square()
        return (-2 * self.kappa * hopping + x2 * ((1 - 2 * self.lam) + self.lam * x2)).sum((-1, -2))

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        return self.mass_form()._sample(n, generator) / math.sqrt(self.kappa)

    def extra_repr(self) -> str:
        return f"L={self.L}, kappa={self.kappa}, lam={self.lam}"
