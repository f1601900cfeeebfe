r"""Observables of scalar fields on `L x L` tori, with blocked-jackknife errors.

For configurations $\phi$ of a periodic `L x L` lattice ($V = L^2$):

- magnetisation $M = \frac1V \sum_x \phi_x$ and its modulus $|M|$;
- the connected two-point function $G(x) = \frac1V \sum_y \langle \phi_y \phi_{y+x} \rangle - \langle M \rangle^2$
  (per configuration by FFT);
- the two-point susceptibility $\chi_2 = \sum_x G(x) = V(\langle M^2 \rangle - \langle M \rangle^2)$;
- the zero-momentum correlator $C(t) = \sum_{x_1} G(x_1, t)$, the effective mass
  $m_{eff}(t) = \operatorname{arccosh}\frac{C(t-1) + C(t+1)}{2C(t)}$ and the pole mass, their mean over a
  plateau, with the correlation length $\xi = 1/m_p$.

Chains are correlated in time, so errors come from a *blocked jackknife* ([`jackknife`][flowkit.lattice.jackknife]): the
chain is cut into contiguous blocks (all chains of a batch together), each left out in turn. Blocks much longer than the
integrated autocorrelation time give honest errors.

References:
    Albergo, Kanwar & Shanahan, PRD 100, 034515 (2019) (observables, arXiv:1904.12072);
    Albergo et al., *Introduction to normalizing flows for lattice field theory*, arXiv:2101.08176 (2021);
    Efron, *The jackknife, the bootstrap and other resampling plans* (1982).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .._validation import check_number

__all__ = ["magnetization", "two_point", "zero_momentum_correlator", "effective_mass", "jackknife", "measure"]


def _field(phi: Tensor, where: str) -> Tensor:
    if not isinstance(phi, Tensor) or phi.dim() < 2 or not phi.is_floating_point():
        raise ValueError(f"{where}: expected floating configurations (..., L, L)")
    return phi


def magnetization(phi: Tensor) -> Tensor:
    r"""The magnetisation $M = \frac1V \sum_x \phi_x$ of configurations `(..., L, L)`; returns the batch shape."""
    return _field(phi, "magnetization").mean((-1, -2))


def two_point(phi: Tensor) -> Tensor:
    r"""The two-point product of each configuration, $\frac1V \sum_y \phi_y \phi_{y+x}$, shape `(..., L, L)`.

    Averaged over configurations it is the full (not connected) two-point function
    $G(x)$; computed by FFT in the input's dtype.
    """
    phi = _field(phi, "two_point")
    spectrum = torch.fft.rfft2(phi)
    return torch.fft.irfft2(spectrum.abs().square(), s=phi.shape[-2:]) / phi.shape[-1] / phi.shape[-2]


def zero_momentum_correlator(G: Tensor) -> Tensor:
    r"""$C(t) = \sum_{x_1} G(x_1, t)$: the two-point function `(..., L, L)` summed over its last axis; `(..., L)`."""
    return _field(G, "zero_momentum_correlator").sum(-1)


def effective_mass(C: Tensor) -> Tensor:
    r"""$m_{eff}(t) = \operatorname{arccosh}\frac{C(t-1) + C(t+1)}{2C(t)}$ for $t = 1, \dots, L - 2$; `(..., L - 2)`.

    For $C(t) \propto \cosh(m(t - L/2))$ on a periodic lattice this is $m$ at every $t$.
    Ratios below 1 (noise) give NaN.
    """
    if not isinstance(C, Tensor) or C.dim() < 1 or C.shape[-1] < 3:
        raise ValueError("effective_mass: C must be a tensor (..., L) with L >= 3")
    return torch.arccosh((C[..., :-2] + C[..., 2:]) / (2 * C[..., 1:-1]))


def jackknife(estimator: Callable[..., Tensor], *series: Tensor, blocks: int = 20) -> tuple[Tensor, Tensor]:
    r"""Blocked-jackknife estimate and standard error of a function of means.

    Each series has time as its first axis (any further axes, such as chains or lattice sites, are averaged together
    with time). The `n` time steps are cut into `blocks` contiguous blocks (a remainder at the start is dropped); with
    $\hat\theta_{-b}$ the estimator on the means without block $b$,

    $$\sigma^2 = \frac{B - 1}{B} \sum_b (\hat\theta_{-b} - \bar\theta)^2,$$

    and the estimate is the estimator on the full means.

    Arguments:
        estimator: `estimator(*means) -> Tensor`, where `means[i]` is the mean of
            `series[i]` over its first (time) axis.
        series: per-sample values `(n_steps, ...)`; the estimator sees each mean with the
            trailing shape `(...)` (average chains first, as [`measure`][flowkit.lattice.measure] does).
        blocks: number of jackknife blocks `B` (at least 2).

    Returns:
        `(estimate, error)` as float64 tensors of the estimator's shape.

    Examples:
        >>> import torch
        >>> x = torch.randn(1000)
        >>> mean, err = jackknife(lambda m: m, x)
        >>> bool(abs(err - x.std() / 1000**0.5) < 0.01)
        True
    """
    blocks = check_number(blocks, "blocks", where="jackknife", integer=True, low=2)
    if not series or any(not isinstance(s, Tensor) for s in series):
        raise ValueError("jackknife: give at least one tensor series")
    n = series[0].shape[0]
    if any(s.shape[0] != n for s in series) or n < blocks:
        raise ValueError(
            f"jackknife: every series needs the same length, at least blocks = {blocks}; got lengths "
            f"{[s.shape[0] for s in series]}"
        )
    size = n // blocks
    sums = [s.detach().double()[n - size * blocks :].unflatten(0, (blocks, size)).sum(1) for s in series]
    totals = [s.sum(0) for s in sums]
    full = estimator(*(t / (size * blocks) for t in totals))
    loo = torch.stack(
        [
            estimator(*((t - s[b]) / (size * (blocks - 1)) for t, s in zip(totals, sums, strict=True)))
            for b in range(blocks)
        ]
    )
    error = ((blocks - 1) / blocks * (loo - loo.mean(0)).square().sum(0)).sqrt()
    return full.double(), error


def _chains(samples: Tensor) -> Tensor:
    """Configurations as `(n_steps, chains, L, L)`."""
    x = _field(samples, "measure").detach()
    if x.dim() == 3:
        x = x[:, None]
    if x.dim() != 4 or x.shape[0] < 2:
        raise ValueError(f"measure: samples must be (n_steps, L, L) or (n_steps, chains, L, L), got {tuple(x.shape)}")
    return x


def measure(
    samples: Tensor, blocks: int = 20, plateau: Sequence[int] | None = None
) -> dict[str, tuple[Tensor, Tensor]]:
    r"""The standard observables of a chain of lattice configurations, each with its blocked-jackknife error.

    Arguments:
        samples: configurations `(n_steps, L, L)` or `(n_steps, chains, L, L)`; the
            time axis is blocked, the chains of a time step stay together.
        blocks: number of jackknife blocks.
        plateau: the times $t$ (from 1 to `L - 2`) whose effective masses are averaged into the pole mass;
            default `1, ..., L // 2 - 1`.

    Returns:
        `{name: (estimate, error)}` (float64 tensors) for `"M"`, `"abs_M"`, `"phi2"`
        ($\langle\phi_x^2\rangle$), `"chi2"`, `"G"` (`(L, L)`), `"C"` (`(L,)`),
        `"m_eff"` (`(L - 2,)`), `"pole_mass"` and `"correlation_length"`.
    """
    x = _chains(samples)
    L = x.shape[-1]
    V = x.shape[-1] * x.shape[-2]
    times = list(range(1, L // 2)) if plateau is None else [int(t) for t in plateau]
    if not times or any(not 1 <= t <= L - 2 for t in times):
        raise ValueError(f"measure: plateau times must lie in 1..{L - 2}, got {times}")
    index = torch.tensor(times) - 1
    M = magnetization(x).double()
    m, m2, m_abs = M.mean(1), M.square().mean(1), M.abs().mean(1)  # chain-averaged per time step
    G = two_point(x.double()).mean(1)

    def connected(G_mean: Tensor, m_mean: Tensor) -> Tensor:
        return G_mean - m_mean.square()

    def mass(G_mean: Tensor, m_mean: Tensor) -> Tensor:
        return effective_mass(zero_momentum_correlator(connected(G_mean, m_mean)))

    return {
        "M": jackknife(lambda a: a, m, blocks=blocks),
        "abs_M": jackknife(lambda a: a, m_abs, blocks=blocks),
        "phi2": jackknife(lambda g: g[0, 0], G, blocks=blocks),
        "chi2": jackknife(lambda a, b: V * (a - b.square()), m2, m, blocks=blocks),
        "G": jackknife(connected, G, m, blocks=blocks),
        "C": jackknife(lambda g, a: zero_momentum_correlator(connected(g, a)), G, m, blocks=blocks),
        "m_eff": jackknife(mass, G, m, blocks=blocks),
        "pole_mass": jackknife(lambda g, a: mass(g, a)[index].mean(), G, m, blocks=blocks),
        "correlation_length": jackknife(lambda g, a: 1 / mass(g, a)[index].mean(), G, m, blocks=blocks),
    }
