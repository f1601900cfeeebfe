r"""Rigid-body targets on unit quaternions with exact normalising constants, and rigid dipoles in a periodic box.

Configurations are unit quaternions $q \in S^3$ (scalar first) standing for rotations $R(q)$; energies depend on $R$
only, so the densities are antipodally symmetric. `log_Z` is the log normaliser of $e^{-u}$ against the *area measure*
of $S^3$ (total $2\pi^2$) per quaternion, which is what a flow over
[`SphereUniform`][flowkit.distributions.SphereUniform] estimates; against the unit Haar measure of SO(3) subtract
$\log 2\pi^2$ per body (the `log_normalizer` of [`MatrixFisher`][flowkit.targets.rigid.MatrixFisher] and
[`Octupole`][flowkit.targets.rigid.Octupole]).

References:
    Köhler, Invernizzi, de Haan & Noé, *Rigid body flows for sampling molecular
    crystal structures*, ICML 2023 (arXiv:2301.11355);
    Mardia & Jupp, *Directional Statistics*, Wiley 2000 (the matrix Fisher distribution);
    Kent, Ganeiber & Mardia, *A new method to simulate the Bingham and related
    distributions*, J. Comput. Graph. Stat. 27 (2018).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy import integrate, optimize, special
from torch import Tensor

from .._validation import check_number
from ..domains import Sphere, quaternion_to_matrix
from .base import Target

__all__ = [
    "MatrixFisher",
    "Octupole",
    "RigidDipoles",
    "WithAuxiliaries",
    "matrix_fisher_log_normalizer",
    "bingham_matrix",
    "TETRAHEDRON",
]

_LOG_AREA_S3 = Sphere(4).log_area

#: Unit vectors to the vertices of a regular tetrahedron (the bonds of methane).
TETRAHEDRON = (
    np.array([[1.0, 1.0, 1.0], [1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]]) / math.sqrt(3)
).tolist()


def _matrix(value: object, where: str) -> np.ndarray:
    try:
        f = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: F must be a 3 x 3 matrix of numbers, got {value!r}") from None
    if f.shape != (3, 3) or not np.isfinite(f).all():
        raise ValueError(f"{where}: F must be a finite 3 x 3 matrix, got shape {f.shape}")
    return f


def matrix_fisher_log_normalizer(F: Sequence[Sequence[float]] | np.ndarray) -> float:
    r"""$\log c(F)$, $c(F) = \int_{SO(3)} e^{\mathrm{tr}(F^\top R)}\, dR$ against the unit Haar measure.

    With the proper singular value decomposition $F = U \mathrm{diag}(s) V^\top$
    ($\det U V^\top = 1$, so $s_3$ may be negative),

    $$
    c(F) = \int_{-1}^{1} \tfrac12\, I_0\bigl(\tfrac12 (s_1 - s_2)(1 - u)\bigr)\,
    I_0\bigl(\tfrac12 (s_1 + s_2)(1 + u)\bigr)\, e^{s_3 u}\, du,
    $$

    integrated by `scipy.integrate.quad` with exponentially scaled Bessel functions
    (`scipy.special.i0e`) in log space: exact to quadrature accuracy, no Monte Carlo.
    """
    f = _matrix(F, "matrix_fisher_log_normalizer")
    u_, s, vt = np.linalg.svd(f)
    if np.linalg.det(u_ @ vt) < 0:
        s = s.copy()
        s[2] = -s[2]
    s1, s2, s3 = s
    shift = s1 + abs(s2 + s3)  # the largest exponent over u in [-1, 1]

    def integrand(u: float) -> float:
        a, b = 0.5 * (s1 - s2) * (1 - u), 0.5 * (s1 + s2) * (1 + u)
        return 0.5 * special.i0e(a) * special.i0e(b) * math.exp(a + b + s3 * u - shift)

    value, _ = integrate.quad(integrand, -1.0, 1.0, epsabs=0.0, epsrel=1e-13, limit=200)
    return shift + math.log(value)


def bingham_matrix(F: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    r"""The symmetric $4 \times 4$ matrix $A$ with $\mathrm{tr}(F^\top R(q)) = q^\top A q$ for unit quaternions $q$."""
    f = _matrix(F, "bingham_matrix")
    (f11, f12, f13), (f21, f22, f23), (f31, f32, f33) = f
    return np.array(
        [
            [f11 + f22 + f33, f32 - f23, f13 - f31, f21 - f12],
            [f32 - f23, f11 - f22 - f33, f12 + f21, f13 + f31],
            [f13 - f31, f12 + f21, -f11 + f22 - f33, f23 + f32],
            [f21 - f12, f13 + f31, f23 + f32, -f11 - f22 + f33],
        ]
    )


class MatrixFisher(Target):
    r"""The matrix Fisher distribution $p(R) \propto e^{\mathrm{tr}(F^\top R)}$ on SO(3), as a Bingham density on $S^3$.

    Energy $u(q) = -q^\top A q$ ([`bingham_matrix`][flowkit.targets.rigid.bingham_matrix]), `log_Z`
    $= \log c(F) + \log 2\pi^2$ exactly
    ([`matrix_fisher_log_normalizer`][flowkit.targets.rigid.matrix_fisher_log_normalizer]), `log_normalizer`
    $= \log c(F)$. Exact samples by rejection from an angular central Gaussian envelope (Kent, Ganeiber & Mardia 2018).

    $A$ is kept in float64, so a float64 target or input has the energy to float64 rounding, as `log_Z`.

    Arguments:
        F: the $3 \times 3$ parameter matrix (nested lists); its singular values set the concentration.

    Examples:
        >>> import torch
        >>> target = MatrixFisher([[10.0, 0, 0], [0, 8.0, 0], [0, 0, 6.0]])
        >>> q = target.sample(4)
        >>> q.shape, target.energy(q).shape
        (torch.Size([4, 4]), torch.Size([4]))
    """

    has_samples = True

    def __init__(self, F: Sequence[Sequence[float]]) -> None:
        super().__init__()
        f = _matrix(F, "MatrixFisher")
        self.F = f.tolist()
        self.event_shape = torch.Size([4])
        self.segments = ["quaternion"]
        self.log_normalizer = matrix_fisher_log_normalizer(f)
        self.log_Z = self.log_normalizer + _LOG_AREA_S3
        a = bingham_matrix(f)
        self.register_buffer("A", torch.as_tensor(a, dtype=torch.get_default_dtype()))
        self._A64 = a

    def _apply(self, fn: Callable, recurse: bool = True) -> MatrixFisher:
        # A dtype change re-reads the float64 matrix: converting the float32 buffer to float64 would keep its
        # rounding, and the energy would then disagree with the exact log_Z (by ~4e-7).
        super()._apply(fn, recurse)
        self.A = torch.as_tensor(self._A64).to(self.A)
        return self

    def _matrix_for(self, x: Tensor) -> Tensor:
        """`A` in the dtype of `x`, from the float64 matrix when the buffer's dtype is another."""
        return self.A if self.A.dtype == x.dtype else torch.as_tensor(self._A64).to(self.A.device, x.dtype)

    def _energy(self, x: Tensor) -> Tensor:
        return -torch.einsum("...i,ij,...j->...", x, self._matrix_for(x), x)

    def _force(self, x: Tensor) -> Tensor:
        return 2 * torch.einsum("ij,...j->...i", self._matrix_for(x), x)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        return torch.from_numpy(_bingham_samples(self._A64, n, generator))


def _bingham_samples(a: np.ndarray, n: int, generator: torch.Generator | None) -> np.ndarray:
    """`n` samples of the Bingham density `exp(q^T A q)` on S^3 by rejection from an angular central Gaussian."""
    lam, vec = np.linalg.eigh(a)
    lam = lam.max() - lam  # exp(-q' diag(lam) q'), lam >= 0, in the eigenbasis
    q = 4

    def root(b: float) -> float:
        return float(np.sum(1.0 / (b + 2.0 * lam)) - 1.0)

    b = float(q) if np.allclose(lam, 0) else optimize.brentq(root, 1e-12, q)
    omega = 1.0 + 2.0 * lam / b
    log_m = -0.5 * (q - b) + 0.5 * q * math.log(q / b)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    count = 0
    while count < n:
        y = rng.standard_normal((max(2 * (n - count), 64), q)) / np.sqrt(omega)
        x = y / np.linalg.norm(y, axis=1, keepdims=True)
        quad, acg = (x**2 * lam).sum(1), (x**2 * omega).sum(1)
        log_ratio = -quad + 0.5 * q * np.log(acg) - log_m
        keep = np.log(rng.random(len(x))) < log_ratio
        out.append(x[keep])
        count += int(keep.sum())
    return np.concatenate(out)[:n] @ vec.T


class Octupole(Target):
    r"""A tetrahedral "octupole" in a field: $u(R) = -\kappa \sum_{i=1}^4 ((R b_i) \cdot \hat e)^3$, four modes.

    The $b_i$ are the unit bonds of a regular tetrahedron (`TETRAHEDRON`), $\hat e$ the field axis (`axis`, $\hat y$ by
    default). The energy depends on $v = R^\top \hat e$ alone and is lowest when a bond points along the field: four
    modes of equal mass, each a circle of rotations about the field axis ([`mode`][flowkit.targets.rigid.Octupole.mode]
    says which). Since $v$ is uniform on $S^2$ when $R$ is Haar distributed,

    $$
    c = \int_{SO(3)} e^{-u(R)}\, dR = \frac1{4\pi} \int_0^{2\pi}\!\!\int_0^\pi
    e^{\kappa \sum_i (b_i \cdot v(\beta, \alpha))^3} \sin\beta\, d\beta\, d\alpha,
    $$

    `log_Z` by Gauss–Legendre quadrature in $\cos\beta$ and the trapezoid rule in $\alpha$ (`points` nodes
    each), converged to machine precision at the defaults.

    Arguments:
        kappa: the field strength $\kappa$ (in units of $k_B T$).
        axis: the field direction (normalised).
        points: quadrature nodes per angle.
    """

    def __init__(self, kappa: float = 8.0, axis: Sequence[float] = (0.0, 1.0, 0.0), points: int = 400) -> None:
        super().__init__()
        where = "Octupole"
        self.kappa = check_number(kappa, "kappa", where=where, low=0)
        e = np.asarray(axis, dtype=np.float64)
        if e.shape != (3,) or not np.isfinite(e).all() or np.linalg.norm(e) == 0:
            raise ValueError(f"{where}: axis must be a non-zero 3-vector, got {axis!r}")
        self.axis = (e / np.linalg.norm(e)).tolist()
        self.points = check_number(points, "points", where=where, integer=True, low=8)
        self.event_shape = torch.Size([4])
        self.segments = ["quaternion"]
        self.register_buffer("bonds", torch.tensor(TETRAHEDRON, dtype=torch.get_default_dtype()))
        self.register_buffer("field", torch.tensor(self.axis, dtype=torch.get_default_dtype()))
        self.log_normalizer = self.log_haar_integral(self.kappa, self.points)
        self.log_Z = self.log_normalizer + _LOG_AREA_S3

    @staticmethod
    def log_haar_integral(kappa: float, points: int = 400) -> float:
        r"""$\log \int e^{-u} dR$ against the unit Haar measure, by quadrature over the field direction $v$."""
        cos_b, weights = np.polynomial.legendre.leggauss(points)
        alpha = 2 * math.pi * np.arange(points) / points
        sin_b = np.sqrt(1 - cos_b**2)
        v = np.stack(
            [np.outer(sin_b, np.cos(alpha)), np.outer(sin_b, np.sin(alpha)), np.outer(cos_b, np.ones(points))], -1
        )
        exponent = kappa * ((v @ np.asarray(TETRAHEDRON).T) ** 3).sum(-1)
        top = exponent.max()
        integral = (weights[:, None] * np.exp(exponent - top)).sum() * (2 * math.pi / points) / (4 * math.pi)
        return float(top + math.log(integral))

    def direction(self, x: Tensor) -> Tensor:
        r"""The field axis in the body frame, $v = R(q)^\top \hat e$, `(..., 3)`."""
        return torch.einsum("...ji,j->...i", quaternion_to_matrix(x), self.field.to(x))

    def _energy(self, x: Tensor) -> Tensor:
        return -self.kappa * (self.direction(x) @ self.bonds.to(x).T).pow(3).sum(-1)

    def mode(self, x: Tensor) -> Tensor:
        """Index (0 to 3) of the bond closest to the field direction: which of the four modes `x` is in."""
        return (self.direction(x) @ self.bonds.to(x).T).argmax(-1)


class WithAuxiliaries(Target):
    r"""A target extended by independent standard normal auxiliary coordinates (augmented flows).

    $u(x, a) = u(x) + \tfrac12 |a|^2 + \tfrac m2 \log 2\pi$ over events `(D + m,)` (the target's
    coordinates first, then `m` `"real"` segments), so `log_Z`, importance weights, ESS and $\hat Z$ are
    the target's exactly; the auxiliaries give couplings of a single rigid body something to condition on.

    Arguments:
        target: the target, with events `(D,)`.
        auxiliaries: the number `m` of auxiliary coordinates.
    """

    def __init__(self, target: Target, auxiliaries: int) -> None:
        super().__init__()
        if not isinstance(target, Target) or len(target.event_shape) != 1:
            raise ValueError("WithAuxiliaries: target must be a flowkit Target with vector events")
        self.target = target
        self.auxiliaries = check_number(auxiliaries, "auxiliaries", where="WithAuxiliaries", integer=True, low=1)
        self.dim = target.event_shape[0]
        self.event_shape = torch.Size([self.dim + self.auxiliaries])
        self.log_Z = target.log_Z
        self.has_samples = target.has_samples
        segments = getattr(target, "segments", None)
        self.segments = None if segments is None else [*segments] + ["real"] * self.auxiliaries

    def _energy(self, x: Tensor) -> Tensor:
        a = x[..., self.dim :]
        u = self.target._energy(x[..., : self.dim])
        return u + 0.5 * a.square().sum(-1) + 0.5 * a.shape[-1] * math.log(2 * math.pi)

    def _force(self, x: Tensor) -> Tensor:
        return torch.cat([self.target._force(x[..., : self.dim]), -x[..., self.dim :]], -1)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        x = self.target._sample(n, generator).to(self.dtype)
        return torch.cat([x, torch.randn(n, self.auxiliaries, generator=generator, dtype=x.dtype)], -1)


class RigidDipoles(Target):
    r"""Rigid point dipoles in a periodic cubic box with a soft repulsion and a field: a small rigid-body system.

    Event: `n` bodies laid out as `["quaternion", "angle", "angle", "angle"] * n`
    (see [`RigidBase`][flowkit.distributions.RigidBase]); angles $\theta \in [-\pi, \pi)$
    are positions $L (\theta + \pi) / 2\pi$ in a box of side $L$. Body $i$ carries the
    dipole $\mu_i = R(q_i) \hat z$. With minimum-image separations $r_{ij}$,

    $$
    u = \sum_{i<j} \Bigl[\epsilon \Bigl(\frac{\sigma^2}{r_{ij}^2 + \delta^2}\Bigr)^{6}
    + \lambda\, \frac{\mu_i \cdot \mu_j - 3 (\mu_i \cdot \hat r_{ij})(\mu_j \cdot \hat r_{ij})}
    {r_{ij}^3 + \delta^3}\Bigr]
    - h \sum_i \mu_i \cdot \hat z,
    $$

    in units of $k_B T$. No exact `log_Z`; flowkit's random-walk Metropolis
    ([`flowkit.sampling.metropolis`][flowkit.sampling.metropolis]) gives reference observables.

    Arguments:
        n: the number of bodies.
        box: the box side $L$.
        sigma: the repulsion diameter $\sigma$.
        epsilon: the repulsion strength $\epsilon$.
        coupling: the dipole coupling $\lambda$.
        field: the field $h$ along $\hat z$.
        softening: the core softening $\delta$.
    """

    def __init__(
        self,
        n: int = 3,
        box: float = 3.0,
        sigma: float = 1.0,
        epsilon: float = 1.0,
        coupling: float = 1.0,
        field: float = 1.0,
        softening: float = 0.3,
    ) -> None:
        super().__init__()
        where = "RigidDipoles"
        self.n = check_number(n, "n", where=where, integer=True, low=1)
        self.box = check_number(box, "box", where=where, positive=True)
        self.sigma = check_number(sigma, "sigma", where=where, positive=True)
        self.epsilon = check_number(epsilon, "epsilon", where=where, low=0)
        self.coupling = check_number(coupling, "coupling", where=where)
        self.field = check_number(field, "field", where=where)
        self.softening = check_number(softening, "softening", where=where, positive=True)
        self.segments = ["quaternion", "angle", "angle", "angle"] * self.n
        self.event_shape = torch.Size([7 * self.n])

    def split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Quaternions `(..., n, 4)` and positions `(..., n, 3)` in the box."""
        rows = x.unflatten(-1, (self.n, 7))
        return rows[..., :4], self.box * (rows[..., 4:] + math.pi) / (2 * math.pi)

    def dipoles(self, x: Tensor) -> Tensor:
        r"""The dipoles $\mu_i = R(q_i) \hat z$, `(..., n, 3)`."""
        return quaternion_to_matrix(self.split(x)[0])[..., :, 2]

    def _energy(self, x: Tensor) -> Tensor:
        _, pos = self.split(x)
        mu = self.dipoles(x)
        u = -self.field * mu[..., 2].sum(-1)
        if self.n == 1:
            return u
        i, j = torch.triu_indices(self.n, self.n, 1, device=x.device)
        d = pos[..., i, :] - pos[..., j, :]
        d = d - self.box * torch.round(d / self.box)
        r2 = d.square().sum(-1)
        r = torch.sqrt(r2 + 1e-12)
        rhat = d / r.unsqueeze(-1)
        repulsion = self.epsilon * (self.sigma**2 / (r2 + self.softening**2)) ** 6
        mi, mj = mu[..., i, :], mu[..., j, :]
        dd = (mi * mj).sum(-1) - 3 * (mi * rhat).sum(-1) * (mj * rhat).sum(-1)
        return u + (repulsion + self.coupling * dd / (r**3 + self.softening**3)).sum(-1)
