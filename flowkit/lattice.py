r"""Lattice field theory: observables of scalar fields on `L x L` tori with blocked-jackknife errors, and Z2 symmetry.

For configurations $\phi$ of a periodic `L x L` lattice ($V = L^2$):

- magnetisation $M = \frac1V \sum_x \phi_x$ and its modulus $|M|$;
- the connected two-point function $G(x) = \frac1V \sum_y \langle \phi_y \phi_{y+x} \rangle - \langle M \rangle^2$
  (per configuration by FFT);
- the two-point susceptibility $\chi_2 = \sum_x G(x) = V(\langle M^2 \rangle - \langle M \rangle^2)$;
- the zero-momentum correlator $C(t) = \sum_{x_1} G(x_1, t)$, the effective mass
  $m_{eff}(t) = \operatorname{arccosh}\frac{C(t-1) + C(t+1)}{2C(t)}$ and the pole mass, their mean over a
  plateau, with the correlation length $\xi = 1/m_p$.

Chains are correlated in time, so errors come from a *blocked jackknife*
([`jackknife`][flowkit.lattice.jackknife]): the chain is cut into contiguous
blocks (all chains of a batch together), each left out in turn. Blocks much
longer than the integrated autocorrelation time give honest errors.

[`Z2Equivariant`][flowkit.lattice.Z2Equivariant] makes a coupling layer commute
with $\phi \to -\phi$ through its conditioner, so that a flow over a symmetric base
has the $Z_2$ symmetry of the action exactly.

References:
    Albergo, Kanwar & Shanahan, PRD 100, 034515 (2019) (observables, arXiv:1904.12072);
    Albergo et al., *Introduction to normalizing flows for lattice field theory*, arXiv:2101.08176 (2021);
    Efron, *The jackknife, the bootstrap and other resampling plans* (1982).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ._validation import check_number
from .nn import Conditioner
from .transformers import Affine, RationalQuadraticSpline, Transformer

__all__ = [
    "magnetization",
    "two_point",
    "zero_momentum_correlator",
    "effective_mass",
    "jackknife",
    "measure",
    "z2_reflection",
    "Z2Equivariant",
]


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

    Each series has time as its first axis (any further axes, such as chains or
    lattice sites, are averaged together with time). The `n` time steps are cut
    into `blocks` contiguous blocks (a remainder at the start is dropped); with
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
    m = magnetization(x).double().mean(1)  # chain-averaged per time step
    m2 = magnetization(x).double().square().mean(1)
    m_abs = magnetization(x).double().abs().mean(1)
    G = two_point(x.double()).mean(1)

    def connected(G_mean: Tensor, m_mean: Tensor) -> Tensor:
        return G_mean - m_mean.square()

    def mass(G_mean: Tensor, m_mean: Tensor) -> Tensor:
        return effective_mass(zero_momentum_correlator(connected(G_mean, m_mean)))

    out = {
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
    return out


# ---- Z2 symmetry


def z2_reflection(transformer: Transformer) -> tuple[Tensor, Tensor]:
    r"""The signed permutation $P$ of a transformer's parameters with $\tau(-x; P\theta) = -\tau(x; \theta)$.

    For [`Affine`][flowkit.transformers.Affine] ($\theta = (t, s)$) the shift changes sign and
    the log-scale is kept; for a [`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline]
    on $[-B, B]$ the bin widths, heights and interior derivatives are each reversed.

    Returns:
        `(permutation, sign)`: the reflected parameters are `sign * theta[..., permutation]`.

    Raises:
        ValueError: for a transformer without a known reflection.
    """
    if isinstance(transformer, Affine):
        return torch.tensor([0, 1]), torch.tensor([-1.0, 1.0])
    if isinstance(transformer, RationalQuadraticSpline):
        k = transformer.bins
        blocks = [torch.arange(k).flip(0), k + torch.arange(k).flip(0), 2 * k + torch.arange(k - 1).flip(0)]
        return torch.cat(blocks), torch.ones(3 * k - 1)
    raise ValueError(
        f"z2_reflection: no known reflection for {type(transformer).__name__}; use Affine or RationalQuadraticSpline"
    )


class Z2Equivariant(Conditioner):
    r"""A grid conditioner symmetrised so that its coupling layer is odd: $f(-\phi) = -f(\phi)$.

    With $P$ the transformer's parameter reflection ([`z2_reflection`][flowkit.lattice.z2_reflection]),
    applied to each channel's block of output channels,

    $$\tilde c(h) = \tfrac12\big(c(h) + P\, c(-h)\big), \qquad \tilde c(-h) = P\,\tilde c(h),$$

    so that $\tau(-x; \tilde c(-h)) = -\tau(x; \tilde c(h))$ and the log-determinant is even.
    A flow of such layers over a symmetric base (a standard normal) has a $Z_2$-symmetric
    density. Costs two passes of the inner network (batched into one call).

    Arguments:
        conditioner: the inner grid conditioner, `(..., C, H, W) -> (..., C * P, H, W)`
            (e.g. a [`ConvNet`][flowkit.nn.ConvNet]).
        transformer: the coupling's transformer (fixes $P$).
        channels: the number of field channels `C`.

    Examples:
        >>> import torch
        >>> from flowkit.bijectors import MaskedCoupling
        >>> from flowkit.nn import ConvNet
        >>> from flowkit.transformers import Affine
        >>> net = Z2Equivariant(ConvNet(1, 2, (8,), padding_mode="circular"), Affine())
        >>> layer = MaskedCoupling(Affine(), (4, 4), conditioner=net)
    """

    def __init__(self, conditioner: nn.Module, transformer: Transformer, channels: int = 1) -> None:
        super().__init__()
        channels = check_number(channels, "channels", where="Z2Equivariant", integer=True, low=1)
        if not isinstance(conditioner, nn.Module) or not callable(getattr(conditioner, "zero_last", None)):
            raise ValueError(
                f"Z2Equivariant: conditioner must be a flowkit Conditioner, got {type(conditioner).__name__}"
            )
        if not isinstance(transformer, Transformer):
            raise ValueError(
                f"Z2Equivariant: transformer must be a flowkit Transformer, got {type(transformer).__name__}"
            )
        permutation, sign = z2_reflection(transformer)
        n = permutation.numel()
        self.conditioner = conditioner
        self.in_features = getattr(conditioner, "in_features", channels)
        self.out_features = getattr(conditioner, "out_features", channels * n)
        self.context_features = getattr(conditioner, "context_features", 0)
        offsets = (torch.arange(channels) * n)[:, None]
        self.register_buffer("permutation", (offsets + permutation).flatten(), persistent=False)
        self.register_buffer("sign", sign.repeat(channels)[:, None, None], persistent=False)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        both = self.conditioner(torch.stack([x, -x]), context)
        plus, minus = both[0], both[1]
        return 0.5 * (plus + self.sign.to(minus.dtype) * minus[..., self.permutation, :, :])

    def zero_last(self, bias: Tensor | None = None) -> None:
        self.conditioner.zero_last(bias)
