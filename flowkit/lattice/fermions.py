r"""Staggered fermions on `L x L` lattices: the Dirac operator with a Yukawa term, conjugate gradient, observables.

Sites are $x = (x_0, x_1)$ with $x_0$ the **time** coordinate (the second-to-last axis of an `(..., L, L)`
field) and $x_1$ the space coordinate (the last axis). The Kogut-Susskind staggered operator of one
fermion coupled to a real scalar field $\phi$ is

$$
D_{xy}[\phi] = \frac12 \sum_{\mu=0,1} \eta_\mu(x)\big[b_\mu(x)\,\delta_{y,x+\hat\mu}
  - b_\mu(x-\hat\mu)\,\delta_{y,x-\hat\mu}\big] + (m + g\,\phi_x)\,\delta_{xy}
  = K_{xy} + M_x \delta_{xy},
$$

with the phases $\eta_0(x) = 1$, $\eta_1(x) = (-1)^{x_0}$ and the boundary signs $b_\mu(x) = -1$ on the
time links that wrap around ($\mu = 0$, $x_0 = L - 1$: antiperiodic in time), $+1$ elsewhere
(`boundary="periodic"`: $+1$ everywhere). $D$ is a **real** matrix: the hopping part $K$ is antisymmetric
($K^T = -K$) and the Yukawa part $M = m + g\phi$ is diagonal, so

- $D^\dagger = D^T = -K + M$ and $\epsilon D \epsilon = D^\dagger$ with $\epsilon_x = (-1)^{x_0 + x_1}$
  ($\gamma_5$-hermiticity, since $K$ only links sites of opposite parity);
- $\det D$ is real (non-real eigenvalues come in conjugate pairs) but **not** positive in general (for $K \to 0$ it is
  $\prod_x (m + g\phi_x)$): one flavour has a sign problem. Two degenerate flavours have the weight
  $\det D^2 = |\det D|^2 = \det(D D^\dagger) \ge 0$, the convention of
  [`YukawaStaggered`][flowkit.targets.YukawaStaggered];
- $D D^\dagger = M^2 - K^2 + [K, M]$ is symmetric positive definite when $D$ is invertible; for constant $M = m$ (the
  free theory, $g = 0$) its eigenvalues are $m^2 + \sin^2 p_0 + \sin^2 p_1$ with $p_0 = 2\pi(n_0 + \frac12)/L$
  (antiperiodic) and $p_1 = 2\pi n_1/L$ ([`free_spectrum`][flowkit.lattice.fermions.free_spectrum]).

The operator is applied matrix-free by shifts of the field
([`StaggeredDirac.apply`][flowkit.lattice.StaggeredDirac.apply], $O(V)$ per vector);
[`StaggeredDirac.dense`][flowkit.lattice.StaggeredDirac.dense] builds the $V \times V$ matrix for exact determinants and
propagators. Linear systems with $D D^\dagger$ are solved by [`conjugate_gradient`][flowkit.lattice.conjugate_gradient].

Observables from the exact propagator $D^{-1}$, per flavour and configuration:

- the chiral condensate $\Sigma = \frac1V \operatorname{Tr} D^{-1} = \frac1V \partial_m \log\det D$;
- the fermion correlator $C_f(t) = \frac1V \sum_y \sum_{x_1} D^{-1}_{(y_0 + t,\, y_1 + x_1),\, y}$
  (zero spatial momentum, averaged over all sources; antiperiodic in $t$);
- the pion (Goldstone) correlator $C_\pi(t) = \frac1V \sum_y \sum_{x_1} |D^{-1}_{(y_0 + t,\, y_1 + x_1),\, y}|^2$.

[`measure_fermions`][flowkit.lattice.measure_fermions] gives them with blocked-jackknife errors.

References:
    Kogut & Susskind, *Hamiltonian formulation of Wilson's lattice gauge theories*, PRD 11, 395 (1975);
    Albergo, Kanwar, Racanière, Rezende, Urban, Boyda, Cranmer, Hackett & Shanahan, *Flow-based sampling for
    fermionic lattice field theories*, PRD 104, 114507 (2021) (arXiv:2106.05934);
    Hestenes & Stiefel, *Methods of conjugate gradients for solving linear systems*, J. Res. NBS 49 (1952).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .._validation import check_number
from ..root_finding import ConvergenceError
from .observables import jackknife

__all__ = [
    "StaggeredDirac",
    "staggered_phases",
    "parity_sign",
    "free_spectrum",
    "conjugate_gradient",
    "chiral_condensate",
    "fermion_correlator",
    "pion_correlator",
    "measure_fermions",
]

BOUNDARIES = ("antiperiodic-time", "periodic")


def staggered_phases(L: int, dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> Tensor:
    r"""The Kogut-Susskind phases $\eta_\mu(x)$, shape `(2, L, L)`: $\eta_0 = 1$, $\eta_1(x) = (-1)^{x_0}$."""
    t = torch.arange(L, device=device)
    eta1 = (1 - 2 * (t % 2)).to(dtype)[:, None].expand(L, L)
    return torch.stack([torch.ones(L, L, dtype=dtype, device=device), eta1])


def parity_sign(L: int, dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> Tensor:
    r"""$\epsilon_x = (-1)^{x_0 + x_1}$, shape `(L, L)` (the staggered $\gamma_5$)."""
    k = torch.arange(L, device=device)
    return (1 - 2 * ((k[:, None] + k[None, :]) % 2)).to(dtype)


def free_spectrum(L: int, mass: float = 0.0, boundary: str = "antiperiodic-time") -> Tensor:
    r"""The eigenvalues $m^2 + \sin^2 p_0 + \sin^2 p_1$ of $D D^\dagger$ at $g = 0$, sorted, float64 `(L * L,)`."""
    n = torch.arange(L, dtype=torch.float64)
    shift = 0.5 if boundary == "antiperiodic-time" else 0.0
    s0 = torch.sin(2 * math.pi * (n + shift) / L).square()
    s1 = torch.sin(2 * math.pi * n / L).square()
    return (mass * mass + s0[:, None] + s1[None, :]).flatten().sort().values


class StaggeredDirac:
    r"""The staggered Dirac operator $D[\phi] = K + m + g\phi$ on an `L x L` lattice (see the module page).

    Arguments:
        L: the lattice extent, even (staggered phases need even extents).
        g: the Yukawa coupling.
        mass: the bare fermion mass $m$ (0: massless, as in Albergo et al. 2021).
        boundary: `"antiperiodic-time"` (fermions antiperiodic in $x_0$, periodic in $x_1$) or `"periodic"`.

    Fields are real floating `(..., L, L)` tensors; `apply(phi, psi)` broadcasts `phi` against `psi`
    (`phi[:, None]` against `psi` of shape `(batch, flavours, L, L)`).
    """

    def __init__(self, L: int, g: float, mass: float = 0.0, boundary: str = "antiperiodic-time") -> None:
        where = "StaggeredDirac"
        L = check_number(L, "L", where=where, integer=True, low=2)
        if L % 2:
            raise ValueError(f"{where}: L must be even (staggered fermions need even extents), got {L}")
        if boundary not in BOUNDARIES:
            raise ValueError(f"{where}: boundary must be one of {BOUNDARIES}, got {boundary!r}")
        self.L = int(L)
        self.g = check_number(g, "g", where=where)
        self.mass = check_number(mass, "mass", where=where)
        self.boundary = boundary
        self._cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    def _hopping_coefficients(self, like: Tensor) -> tuple[Tensor, Tensor]:
        r"""`(fwd, bwd)`, `(2, L, L)`: $\frac12\eta_\mu(x) b_\mu(x)$ and $\frac12\eta_\mu(x) b_\mu(x-\hat\mu)$."""
        key = (like.dtype, like.device)
        if key not in self._cache:
            L = self.L
            eta = staggered_phases(L, like.dtype, like.device)
            fwd = torch.ones(2, L, L, dtype=like.dtype, device=like.device)
            bwd = torch.ones(2, L, L, dtype=like.dtype, device=like.device)
            if self.boundary == "antiperiodic-time":
                fwd[0, L - 1] = -1  # the link from x0 = L - 1 to x0 = 0 wraps around
                bwd[0, 0] = -1  # the link from x0 = 0 back to x0 = L - 1
            self._cache[key] = (0.5 * eta * fwd, 0.5 * eta * bwd)
        return self._cache[key]

    def hop(self, psi: Tensor) -> Tensor:
        r"""The hopping part $K\psi$ (antisymmetric), for vectors `(..., L, L)`."""
        fwd, bwd = self._hopping_coefficients(psi)
        out = None
        for mu, dim in ((0, -2), (1, -1)):
            term = fwd[mu] * torch.roll(psi, -1, dim) - bwd[mu] * torch.roll(psi, 1, dim)
            out = term if out is None else out + term
        return out

    def check_field(self, phi: object, where: str = "StaggeredDirac") -> None:
        """Raise `ValueError` unless `phi` is a real floating tensor `(..., L, L)` (no host synchronisation)."""
        if not isinstance(phi, Tensor):
            raise ValueError(f"{where}: the field phi must be a torch.Tensor, got {type(phi).__name__}")
        if not phi.is_floating_point():
            raise ValueError(
                f"{where}: the field phi must be real floating point (float32 or float64), got {phi.dtype}; "
                "the Yukawa field is real, so D[phi] is a real matrix"
            )
        if phi.dim() < 2 or tuple(phi.shape[-2:]) != (self.L, self.L):
            raise ValueError(f"{where}: the field phi must be (..., {self.L}, {self.L}), got {tuple(phi.shape)}")

    def diagonal(self, phi: Tensor) -> Tensor:
        r"""The Yukawa part $M_x = m + g\phi_x$, shape of `phi` (checked by `check_field`)."""
        self.check_field(phi)
        return self.mass + self.g * phi

    def apply(self, phi: Tensor, psi: Tensor) -> Tensor:
        r"""$D[\phi]\psi = K\psi + (m + g\phi)\psi$."""
        return self.hop(psi) + self.diagonal(phi) * psi

    def apply_dagger(self, phi: Tensor, psi: Tensor) -> Tensor:
        r"""$D^\dagger[\phi]\psi = -K\psi + (m + g\phi)\psi$ (D is real, $D^\dagger = D^T$)."""
        return self.diagonal(phi) * psi - self.hop(psi)

    def apply_normal(self, phi: Tensor, psi: Tensor) -> Tensor:
        r"""$D D^\dagger \psi$ (symmetric positive definite when $D$ is invertible)."""
        return self.apply(phi, self.apply_dagger(phi, psi))

    def dense(self, phi: Tensor) -> Tensor:
        r"""The matrices $D[\phi]$, `(..., V, V)` with $V = L^2$ and sites in row-major order ($x_0 L + x_1$)."""
        L, V = self.L, self.L * self.L
        basis = torch.eye(V, dtype=phi.dtype, device=phi.device).reshape(V, L, L)
        K = self.hop(basis).reshape(V, V).T  # column y is K e_y
        return K + torch.diag_embed(self.diagonal(phi).flatten(-2))

    def log_abs_det(self, phi: Tensor) -> Tensor:
        r"""$\log|\det D[\phi]|$ by dense LU (differentiable, exact), batch shape of `phi`."""
        return torch.linalg.slogdet(self.dense(phi))[1]

    def inverse(self, phi: Tensor, where: str = "StaggeredDirac.inverse") -> Tensor:
        r"""The dense inverses $D^{-1}[\phi]$, `(..., V, V)`.

        $D$ is taken as singular (a zero mode to working precision) when its LU factorisation meets a pivot
        no larger than $V \varepsilon$ times the largest one.

        Raises:
            ValueError: where $D[\phi]$ is singular ($\log|\det D| = -\infty$), naming the first one.
        """
        matrix = self.dense(phi)
        lu, pivots, info = torch.linalg.lu_factor_ex(matrix)
        u = lu.diagonal(dim1=-2, dim2=-1).abs()
        singular = (info != 0) | (u.amin(-1) <= u.shape[-1] * torch.finfo(u.dtype).eps * u.amax(-1))
        if bool(singular.any()):
            first = tuple(int(k) for k in singular.nonzero()[0]) if singular.dim() else ()
            zero_modes = (
                "; with boundary='periodic', g = 0 and mass = 0 every D[phi] is singular (zero modes of the hopping)"
                if self.boundary == "periodic" and self.g == 0 and self.mass == 0
                else ""
            )
            raise ValueError(
                f"{where}: D[phi] is singular for {int(singular.sum())} of {max(1, singular.numel())} configuration(s) "
                f"(the first at batch index {first}): log|det D| = -inf there, so the energy is +inf and D^-1 "
                f"(the force, the propagator) does not exist{zero_modes}"
            )
        identity = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device).expand_as(matrix)
        return torch.linalg.lu_solve(lu, pivots, identity)

    def propagator(self, phi: Tensor) -> Tensor:
        r"""The exact propagator $D^{-1}[\phi]$, `(..., L, L, L, L)` indexed `[x0, x1, y0, y1]`.

        Raises:
            ValueError: where $D[\phi]$ is singular (see [`inverse`][flowkit.lattice.StaggeredDirac.inverse]).
        """
        L = self.L
        return self.inverse(phi, "StaggeredDirac.propagator").unflatten(-1, (L, L)).unflatten(-3, (L, L))

    def __repr__(self) -> str:
        return f"StaggeredDirac(L={self.L}, g={self.g}, mass={self.mass}, boundary={self.boundary!r})"


def check_cg_tolerance(tol: object, name: str, where: str) -> float:
    r"""Check a relative CG residual tolerance: a finite number in `(0, 1)` (1 is met by $x = 0$); returns it.

    Raises:
        ValueError: naming `where`, `name` and the value.
    """
    rule = "a number in (0, 1) (x = 0 already meets a relative residual of 1)"
    return check_number(tol, name, where=where, positive=True, below=1, rule=rule)


def conjugate_gradient(
    operator: Callable[[Tensor], Tensor],
    b: Tensor,
    tol: float = 1e-10,
    max_iter: int | None = None,
    event_dims: int = 2,
) -> tuple[Tensor, int]:
    r"""Solve $A x = b$ for a symmetric positive-definite $A$ by conjugate gradient, batched.

    Every system (each index of the leading `b.dim() - event_dims` dimensions) is solved from $x = 0$ (a
    deterministic function of $b$ and $A$, as a reversible force needs) until
    $\|b - A x\| \le \text{tol}\,\|b\|$, then frozen; CG never returns an unconverged $x$.

    Arguments:
        operator: `v -> A v` on tensors shaped like `b`.
        b: right-hand sides `(..., *event)`.
        tol: the relative residual tolerance, in `(0, 1)`.
        max_iter: the most iterations (default: 10 times the event size, at least 100).
        event_dims: the trailing dimensions of one vector (2 for a lattice field).

    Returns:
        `(x, iterations)`.

    Raises:
        ValueError: when `tol` is not in `(0, 1)` or `max_iter` not a positive integer.
        ConvergenceError: ([`flowkit.root_finding.ConvergenceError`][flowkit.root_finding.ConvergenceError])
            when some system has not reached `tol` within `max_iter` iterations (or met a NaN), naming the worst.
    """
    tol = check_cg_tolerance(tol, "tol", "conjugate_gradient")
    size = math.prod(b.shape[b.dim() - event_dims :])
    if max_iter is None:
        max_iter = max(100, 10 * size)
    max_iter = check_number(max_iter, "max_iter", where="conjugate_gradient", integer=True, low=1)
    dims = tuple(range(b.dim() - event_dims, b.dim()))

    def dot(u: Tensor, v: Tensor) -> Tensor:
        return (u * v).sum(dims, keepdim=True)

    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = dot(r, r)
    threshold = (tol * tol) * rr
    active = rr > threshold
    iterations = 0
    while iterations < max_iter and bool(active.any()):
        Ap = operator(p)
        pAp = dot(p, Ap)
        alpha = torch.where(active, rr / torch.where(active, pAp, torch.ones_like(pAp)), torch.zeros_like(rr))
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = dot(r, r)
        beta = torch.where(active, rr_new / torch.where(active, rr, torch.ones_like(rr)), torch.zeros_like(rr))
        p = torch.where(active, r + beta * p, p)
        rr = torch.where(active, rr_new, rr)
        active = active & (rr > threshold)
        iterations += 1
    failed = ~(rr <= threshold)  # NaN residuals fail too
    if bool(failed.any()):
        relative = (rr / dot(b, b)).sqrt().reshape(-1)
        worst = int(torch.where(torch.isnan(relative), torch.full_like(relative, math.inf), relative).argmax())
        index = tuple(int(k) for k in torch.unravel_index(torch.tensor(worst), failed.shape[: b.dim() - event_dims]))
        raise ConvergenceError(
            f"conjugate_gradient: {int(failed.sum())} of {failed.numel()} system(s) did not reach the relative "
            f"residual {tol:g} in {iterations} iterations (max_iter = {max_iter}); the worst, system {index}, "
            f"stopped at {float(relative[worst]):.3g} (a singular or indefinite operator, or too few iterations)"
        )
    return x, iterations


def _propagators(phi: Tensor, dirac: StaggeredDirac) -> Tensor:
    """Dense propagators `(..., V, V)` (float64) of fields `(..., L, L)`."""
    if not isinstance(dirac, StaggeredDirac):
        raise ValueError(f"expected a flowkit.lattice.StaggeredDirac, got {type(dirac).__name__}")
    dirac.check_field(phi, "fermion observables")
    return dirac.inverse(phi.detach().double(), "fermion observables")


def _separations(dirac: StaggeredDirac, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    r"""Index arrays `(sink, source, sign)`, `(V, V)`, `[r, y]`: sink $y + r$, sign $-1$ across an antiperiodic edge."""
    L = dirac.L
    k = torch.arange(L, device=device)
    r0, r1 = (a.flatten() for a in torch.meshgrid(k, k, indexing="ij"))
    y0, y1 = r0.clone(), r1.clone()
    t0 = y0[None, :] + r0[:, None]
    sink = (t0 % L) * L + (y1[None, :] + r1[:, None]) % L
    source = (y0 * L + y1)[None, :].expand(L * L, L * L)
    sign = torch.ones(L * L, L * L, dtype=torch.float64, device=device)
    if dirac.boundary == "antiperiodic-time":
        sign = torch.where(t0 >= L, -sign, sign)
    return sink, source, sign


def _series(S: Tensor, dirac: StaggeredDirac) -> dict[str, Tensor]:
    """Per-configuration condensate `(...)`, fermion and pion correlators `(..., L)` from propagators `(..., V, V)`."""
    L = dirac.L
    sink, source, sign = _separations(dirac, S.device)
    relative = S[..., sink, source]  # (..., V_r, V_y)
    fermion = (sign * relative).mean(-1).unflatten(-1, (L, L)).sum(-1)
    pion = relative.square().mean(-1).unflatten(-1, (L, L)).sum(-1)
    condensate = S.diagonal(dim1=-2, dim2=-1).mean(-1)
    return {"chiral_condensate": condensate, "fermion_correlator": fermion, "pion_correlator": pion}


def chiral_condensate(phi: Tensor, dirac: StaggeredDirac) -> Tensor:
    r"""$\Sigma = \frac1V \operatorname{Tr} D^{-1}[\phi]$ per configuration and flavour (batch shape, float64)."""
    return _propagators(phi, dirac).diagonal(dim1=-2, dim2=-1).mean(-1)


def fermion_correlator(phi: Tensor, dirac: StaggeredDirac) -> Tensor:
    r"""$C_f(t) = \frac1V \sum_y \sum_{x_1} s\, D^{-1}_{(y_0 + t,\, y_1 + x_1),\, y}$, `(..., L)`, exact, float64.

    The sign $s = -1$ when $y_0 + t$ crosses the antiperiodic time boundary ($+1$ otherwise), so that the
    average over sources is the propagator at time separation $t$; $C_f(t + L) = -C_f(t)$.
    """
    return _series(_propagators(phi, dirac), dirac)["fermion_correlator"]


def pion_correlator(phi: Tensor, dirac: StaggeredDirac) -> Tensor:
    r"""$C_\pi(t) = \frac1V \sum_y \sum_{x_1} |D^{-1}_{(y_0 + t,\, y_1 + x_1),\, y}|^2$, `(..., L)`, exact, float64."""
    return _series(_propagators(phi, dirac), dirac)["pion_correlator"]


def measure_fermions(
    samples: Tensor, dirac: StaggeredDirac, blocks: int = 20, chunk: int = 256
) -> dict[str, tuple[Tensor, Tensor]]:
    r"""Fermion observables of a chain of scalar configurations, each with its blocked-jackknife error.

    Arguments:
        samples: configurations `(n_steps, L, L)` or `(n_steps, chains, L, L)`; the time axis is blocked
            (see [`jackknife`][flowkit.lattice.jackknife]), the chains of a time step stay together.
        dirac: the [`StaggeredDirac`][flowkit.lattice.StaggeredDirac] operator of the theory.
        blocks: the number of jackknife blocks.
        chunk: configurations inverted at once (memory: `chunk` dense $V \times V$ matrices).

    Returns:
        `{name: (estimate, error)}` (float64) for `"chiral_condensate"` ($\langle\Sigma\rangle$ per flavour,
        which vanishes by the $\phi \to -\phi$ symmetry at $m = 0$), `"abs_chiral_condensate"`
        ($\langle|\Sigma|\rangle$), `"fermion_correlator"` ($C_f(t)$, `(L,)`) and `"pion_correlator"`
        ($C_\pi(t)$, `(L,)`).
    """
    x = samples.detach() if isinstance(samples, Tensor) else samples
    if not isinstance(x, Tensor) or x.dim() not in (3, 4) or x.shape[0] < 2:
        raise ValueError(
            "measure_fermions: samples must be a tensor (n_steps, L, L) or (n_steps, chains, L, L) with n_steps >= 2"
        )
    if x.dim() == 3:
        x = x[:, None]
    chunk = check_number(chunk, "chunk", where="measure_fermions", integer=True, low=1)
    flat = x.flatten(0, 1)
    parts = [_series(_propagators(flat[i : i + chunk], dirac), dirac) for i in range(0, flat.shape[0], chunk)]
    series = {k: torch.cat([p[k] for p in parts]).unflatten(0, x.shape[:2]) for k in parts[0]}
    series = {**series, "abs_chiral_condensate": series["chiral_condensate"].abs()}
    names = ("chiral_condensate", "abs_chiral_condensate", "fermion_correlator", "pion_correlator")
    return {name: jackknife(lambda a: a, series[name].mean(1), blocks=blocks) for name in names}
