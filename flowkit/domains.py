r"""Domains on which bijectors act, and the geometry of rigid bodies: quaternions and segment layouts.

A domain tells the correctness checks where to draw test points and, for
manifolds, which tangent space to take the Jacobian in: for a bijector between
`m`-dimensional manifolds embedded in `R^n` the log-determinant is
`log|det(E_out^T J E_in)|` with `E` orthonormal tangent bases.

A unit quaternion $q = (q_0, q_1, q_2, q_3) \in S^3$ (scalar first) gives the rotation
$R(q) \in SO(3)$ ([`quaternion_to_matrix`][flowkit.domains.quaternion_to_matrix]), and $R(q) = R(-q)$:
$S^3$ covers SO(3) twice. A *rigid-body layout* is a flat event vector made of segments, each a
`"quaternion"` (four coordinates on $S^3$), an `"angle"` (one coordinate on the circle $[-\pi, \pi)$, a
periodic position) or a `"real"` coordinate (an auxiliary variable);
[`rigid_domain`][flowkit.domains.rigid_domain] gives its [`Product`][flowkit.domains.Product] domain.

References:
    Köhler, Invernizzi, de Haan & Noé, *Rigid body flows for sampling molecular
    crystal structures*, ICML 2023 (arXiv:2301.11355).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "Domain",
    "Real",
    "Interval",
    "OpenInterval",
    "Box",
    "Circle",
    "Sphere",
    "Product",
    "SEGMENTS",
    "check_segments",
    "segment_slices",
    "rigid_domain",
    "quaternion_to_matrix",
    "matrix_to_quaternion",
]


class Domain:
    """Base domain: the whole space `R^n`."""

    is_manifold: bool = False
    #: What to do about a point the input checks refuse, added to their error ("" for nothing).
    advice: str = ""

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        """Test points, drawn so that they cover the interesting part of the domain."""
        return torch.randn(shape, dtype=dtype, generator=generator)

    def contains(self, x: Tensor) -> Tensor:
        """Elementwise membership (boolean tensor with the shape of `x`)."""
        return torch.isfinite(x)

    def admits(self, x: Tensor) -> Tensor | None:
        """Elementwise membership of the closure, which the input checks of bijectors test (None: no test).

        Unbounded domains and manifolds leave it to the finiteness check (None); an
        interval admits its end points, so data at exactly `0` or `1` (or an angle
        at exactly `pi`) pass, except an [`OpenInterval`][flowkit.domains.OpenInterval], for a map
        that is infinite at its ends.
        """
        return None

    def tangent_basis(self, x: Tensor) -> Tensor:
        """Orthonormal basis `(..., n, m)` of the tangent space at `x` (identity off manifolds)."""
        n = x.shape[-1]
        return torch.eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n, n)

    #: Coordinates one copy of the domain spans along the last dimension (a sphere's `n`; 1 elementwise).
    width: int = 1

    def log_volume(self, event_shape: tuple[int, ...]) -> float | None:
        """Log of the volume of the set of events of shape `event_shape` (None when infinite)."""
        return None

    def uniform(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        """Points drawn uniformly (against the volume measure); only for domains of finite volume."""
        raise ValueError(f"{self!r} has infinite volume: there is no uniform distribution on it")

    def propose(self, x: Tensor, step: float, generator: torch.Generator | None = None) -> Tensor:
        """A symmetric random-walk move from `x` (a Gaussian step of scale `step`), for Metropolis chains."""
        device = x.device if generator is None else generator.device  # the global generator of x's device
        return x + step * torch.randn(x.shape, dtype=x.dtype, generator=generator, device=device).to(x.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Real(Domain):
    """The real line or `R^n`, for unbounded bijectors."""


class Interval(Domain):
    """Open interval `(low, high)`, elementwise."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = float(low), float(high)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        u = torch.rand(shape, dtype=dtype, generator=generator)
        return self.low + (self.high - self.low) * (0.02 + 0.96 * u)

    def contains(self, x: Tensor) -> Tensor:
        return (x > self.low) & (x < self.high)

    def admits(self, x: Tensor) -> Tensor:
        return (x >= self.low) & (x <= self.high)

    def log_volume(self, event_shape: tuple[int, ...]) -> float:
        return math.prod(event_shape) * math.log(self.high - self.low)

    def uniform(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.low + (self.high - self.low) * torch.rand(shape, dtype=dtype, generator=generator)

    def propose(self, x: Tensor, step: float, generator: torch.Generator | None = None) -> Tensor:
        # a Gaussian step reflected at the ends (a symmetric move)
        width = self.high - self.low
        t = torch.remainder(super().propose(x, step, generator) - self.low, 2 * width)
        return self.low + torch.where(t > width, 2 * width - t, t)

    def __repr__(self) -> str:
        return f"Interval({self.low}, {self.high})"


class OpenInterval(Interval):
    r"""Open interval `(low, high)` whose end points the input checks refuse too: for a map infinite there.

    The plain logit ([`Logit`][flowkit.bijectors.Logit] with `alpha=0`) is $\pm\infty$ at 0 and 1, so a
    pixel at exactly 0 or 1 would give an infinite log-determinant, NaN densities and NaN gradients.

    Arguments:
        low: the lower end.
        high: the upper end.
        advice: what to do about a refused point, added to the error.
    """

    def __init__(self, low: float, high: float, advice: str = "") -> None:
        super().__init__(low, high)
        self.advice = advice

    def admits(self, x: Tensor) -> Tensor:
        return self.contains(x)

    def __repr__(self) -> str:
        return f"OpenInterval({self.low}, {self.high})"


class Box(Domain):
    r"""A box $\prod_i (a_i, b_i)$ with bounds per feature, each side possibly infinite (a half-line, the real line).

    The support of a prior in simulation-based inference. Its input check admits every finite point: a density on
    the box (a flow ending in [`BoundedSupport`][flowkit.bijectors.BoundedSupport]) is zero outside it, so its
    `log_prob` there is $-\infty$, not an error. Test points are drawn inside.

    Arguments:
        low: the lower bounds `(D,)` (`-inf` for none).
        high: the upper bounds `(D,)` (`inf` for none), above `low`.
    """

    def __init__(self, low: Sequence[float], high: Sequence[float]) -> None:
        self.low, self.high = tuple(float(a) for a in low), tuple(float(b) for b in high)
        if len(self.low) != len(self.high) or not all(a < b for a, b in zip(self.low, self.high, strict=True)):
            raise ValueError(f"Box: low {self.low} and high {self.high} must be bounds of equal length with low < high")

    def _bounds(self, like: Tensor) -> tuple[Tensor, Tensor]:
        low = torch.tensor(self.low, dtype=like.dtype, device=like.device)
        return low, torch.tensor(self.high, dtype=like.dtype, device=like.device)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        u = 0.02 + 0.96 * torch.rand(shape, dtype=dtype, generator=generator)
        low, high = self._bounds(u)
        half = 0.05 - torch.log1p(-u)  # on a half-line: a point 0.07 to 3.3 from the bound
        inside = torch.where(torch.isfinite(high), high - half, torch.randn(shape, dtype=dtype, generator=generator))
        inside = torch.where(torch.isfinite(low), low + half, inside)
        both = torch.isfinite(low) & torch.isfinite(high)
        return torch.where(both, torch.nan_to_num(low) + torch.nan_to_num(high - low, posinf=0.0) * u, inside)

    def contains(self, x: Tensor) -> Tensor:
        low, high = self._bounds(x)
        return (x > low) & (x < high)

    def log_volume(self, event_shape: tuple[int, ...]) -> float | None:
        if not all(math.isfinite(a) and math.isfinite(b) for a, b in zip(self.low, self.high, strict=True)):
            return None
        return float(sum(math.log(b - a) for a, b in zip(self.low, self.high, strict=True)))

    def uniform(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        if self.log_volume(tuple(shape[-1:])) is None:
            return super().uniform(shape, dtype=dtype, generator=generator)
        u = torch.rand(shape, dtype=dtype, generator=generator)
        low, high = self._bounds(u)
        return low + (high - low) * u

    def __repr__(self) -> str:
        return f"Box(low={list(self.low)}, high={list(self.high)})"


class Circle(Interval):
    """Angles in `[-pi, pi)`, elementwise (a torus when several)."""

    def __init__(self) -> None:
        super().__init__(-math.pi, math.pi)

    def propose(self, x: Tensor, step: float, generator: torch.Generator | None = None) -> Tensor:
        y = Domain.propose(self, x, step, generator)  # wrapped, not reflected
        return torch.remainder(y + math.pi, 2 * math.pi) - math.pi

    def __repr__(self) -> str:
        return "Circle()"


class Sphere(Domain):
    r"""Unit sphere `S^{n-1}` in `R^n` over the last dimension (`S^3` holds unit quaternions).

    Events `(..., k, n)` hold `k` points (one rigid body each); a flat vector of
    `k n` coordinates has the block-diagonal tangent basis of the product of spheres.
    The area of `S^{n-1}` is $2\pi^{n/2} / \Gamma(n/2)$ ($2\pi^2$ for `S^3`).
    """

    is_manifold = True

    def __init__(self, n: int = 4) -> None:
        self.n = self.width = int(n)

    @property
    def log_area(self) -> float:
        """Log of the area of `S^{n-1}`."""
        return math.log(2.0) + 0.5 * self.n * math.log(math.pi) - math.lgamma(0.5 * self.n)

    def log_volume(self, event_shape: tuple[int, ...]) -> float:
        return math.prod(event_shape) // self.n * self.log_area

    def uniform(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.sample(shape, dtype=dtype, generator=generator)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        x = torch.randn(shape, dtype=dtype, generator=generator)
        return x / x.norm(dim=-1, keepdim=True)

    def contains(self, x: Tensor) -> Tensor:
        return ((x.norm(dim=-1, keepdim=True) - 1).abs() < 1e-4).expand_as(x)

    def admits(self, x: Tensor) -> Tensor:
        """Points of unit norm (every block of `n` coordinates), to `10 sqrt(eps)` of the dtype.

        A quaternion that was not normalised is refused with a clear error
        instead of giving a silent NaN or a wrong density.
        """
        if x.shape[-1] % self.n:
            return torch.zeros_like(x, dtype=torch.bool)
        tol = 10 * torch.finfo(x.dtype).eps ** 0.5
        norms = x.unflatten(-1, (-1, self.n)).norm(dim=-1, keepdim=True)
        return ((norms - 1).abs() <= tol).expand(*x.shape[:-1], -1, self.n).flatten(-2)

    def propose(self, x: Tensor, step: float, generator: torch.Generator | None = None) -> Tensor:
        # normalise(x + step * noise): its density depends on the angle to x only, so the move is symmetric
        y = super().propose(x, step, generator).unflatten(-1, (-1, self.n))
        return (y / y.norm(dim=-1, keepdim=True)).flatten(-2)

    def tangent_basis(self, x: Tensor) -> Tensor:
        # Complete x to an orthonormal basis with a QR of [x, I]; drop the normal column.
        n = self.n
        if x.shape[-1] != n:  # k points of the sphere in one flat vector: a block-diagonal basis
            return _block_diagonal([self.tangent_basis(b) for b in x.split(n, dim=-1)])
        eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n, n)
        q, _ = torch.linalg.qr(torch.cat([x.unsqueeze(-1), eye], dim=-1))
        return q[..., :, 1:n]

    def __repr__(self) -> str:
        return f"Sphere({self.n})"


def _block_diagonal(blocks: list[Tensor]) -> Tensor:
    """The block-diagonal matrix `(..., sum n_i, sum m_i)` of bases `(..., n_i, m_i)`."""
    rows, cols = sum(b.shape[-2] for b in blocks), sum(b.shape[-1] for b in blocks)
    out = blocks[0].new_zeros(*blocks[0].shape[:-2], rows, cols)
    i = j = 0
    for b in blocks:
        out[..., i : i + b.shape[-2], j : j + b.shape[-1]] = b
        i, j = i + b.shape[-2], j + b.shape[-1]
    return out


class Product(Domain):
    """Product of domains side by side along the last dimension, e.g. a rigid body's `S^3 x T^3`.

    Each part spans its `width` coordinates (a [`Sphere`][flowkit.domains.Sphere] its `n`,
    an elementwise domain one); a row of the last dimension holds the parts in order, and a
    flat vector of several rows (several bodies) repeats them. Sampling, membership and the
    (block-diagonal) tangent basis are the parts'.

    Arguments:
        parts: the domains, in the order of their coordinates.

    Examples:
        >>> body = Product(Sphere(4), Circle(), Circle(), Circle())
        >>> body.width, body.is_manifold
        (7, True)
    """

    def __init__(self, *parts: Domain) -> None:
        if not parts or not all(isinstance(p, Domain) for p in parts):
            raise ValueError(f"Product needs at least one Domain, got {parts!r}")
        self.parts = tuple(parts)
        self.width = sum(p.width for p in self.parts)
        self.is_manifold = any(p.is_manifold for p in self.parts)

    def _columns(self, x: Tensor) -> list[tuple[Domain, Tensor]]:
        if x.shape[-1] % self.width:
            raise ValueError(f"{self!r}: the last dimension {x.shape[-1]} is not a multiple of {self.width}")
        rows = x.unflatten(-1, (-1, self.width))
        return [(p, c) for p, c in zip(self.parts, rows.split([p.width for p in self.parts], dim=-1), strict=True)]

    def _join(self, pieces: list[Tensor], shape: tuple[int, ...]) -> Tensor:
        return torch.cat(pieces, dim=-1).reshape(shape)

    def _rows(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if shape[-1] % self.width:
            raise ValueError(f"{self!r}: the last dimension {shape[-1]} is not a multiple of {self.width}")
        return (*shape[:-1], shape[-1] // self.width)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        rows = self._rows(tuple(shape))
        return self._join([p.sample((*rows, p.width), dtype=dtype, generator=generator) for p in self.parts], shape)

    def uniform(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        rows = self._rows(tuple(shape))
        return self._join([p.uniform((*rows, p.width), dtype=dtype, generator=generator) for p in self.parts], shape)

    def log_volume(self, event_shape: tuple[int, ...]) -> float | None:
        rows = math.prod(event_shape) // self.width
        logs = [p.log_volume((rows, p.width)) for p in self.parts]
        return None if any(v is None for v in logs) else float(sum(logs))  # type: ignore[arg-type]

    def contains(self, x: Tensor) -> Tensor:
        return self._join([p.contains(c) for p, c in self._columns(x)], x.shape)

    def admits(self, x: Tensor) -> Tensor | None:
        masks = [(p.admits(c), c) for p, c in self._columns(x)]
        if all(m is None for m, _ in masks):
            return None
        return self._join([torch.ones_like(c, dtype=torch.bool) if m is None else m for m, c in masks], x.shape)

    def propose(self, x: Tensor, step: float, generator: torch.Generator | None = None) -> Tensor:
        return self._join([p.propose(c, step, generator) for p, c in self._columns(x)], x.shape)

    def tangent_basis(self, x: Tensor) -> Tensor:
        blocks = [p.tangent_basis(c) for p, c in self._columns(x)]  # each (..., rows, w, m)
        per_row = _block_diagonal(blocks)
        return _block_diagonal(list(per_row.unbind(-3)))

    def __repr__(self) -> str:
        return f"Product({', '.join(map(repr, self.parts))})"


#: The kinds of segments of a rigid-body layout and the number of coordinates of each.
SEGMENTS = {"quaternion": 4, "angle": 1, "real": 1}


def check_segments(segments: Sequence[str], where: str) -> tuple[str, ...]:
    """The rigid-body layout `segments` as a tuple, after checking its kinds against `SEGMENTS`.

    Arguments:
        segments: a non-empty sequence of `"quaternion"`, `"angle"` and `"real"`.
        where: the caller's name, for the error message.

    Raises:
        ValueError: for a string, an empty sequence or an unknown kind.
    """
    if isinstance(segments, str) or not segments:
        raise ValueError(f"{where}: segments must be a non-empty sequence of {sorted(SEGMENTS)}, got {segments!r}")
    bad = [s for s in segments if s not in SEGMENTS]
    if bad:
        raise ValueError(f"{where}: unknown segment kinds {bad}; choose from {sorted(SEGMENTS)}")
    return tuple(segments)


def segment_slices(segments: Sequence[str]) -> list[slice]:
    """The coordinates of each segment in the flat event vector, in order."""
    out, start = [], 0
    for kind in check_segments(segments, "segment_slices"):
        out.append(slice(start, start + SEGMENTS[kind]))
        start += SEGMENTS[kind]
    return out


def rigid_domain(segments: Sequence[str]) -> Product:
    """The [`Product`][flowkit.domains.Product] domain of a rigid-body layout (`S^3`, circles, real lines)."""
    kinds = {"quaternion": Sphere(4), "angle": Circle(), "real": Real()}
    return Product(*(kinds[s] for s in check_segments(segments, "rigid_domain")))


def quaternion_to_matrix(q: Tensor) -> Tensor:
    r"""Rotation matrices `(..., 3, 3)` of quaternions `(..., 4)` (scalar first, normalised first).

    $R(q) = R(-q)$. Note that `scipy.spatial.transform.Rotation.from_quat` takes the scalar *last*.
    """
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return torch.stack([torch.stack(r, dim=-1) for r in rows], dim=-2)


def matrix_to_quaternion(matrix: Tensor) -> Tensor:
    """A unit quaternion `(..., 4)` (scalar first, `q_0 >= 0`) of each rotation matrix `(..., 3, 3)`.

    Uses the largest of the four squared components (Shepperd's method), so it is
    accurate for every rotation; the other root is its negative.
    """
    m = matrix
    trace = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    squares = torch.stack(
        [1 + trace, 1 + 2 * m[..., 0, 0] - trace, 1 + 2 * m[..., 1, 1] - trace, 1 + 2 * m[..., 2, 2] - trace], dim=-1
    )  # 4 q_i^2
    # Off-diagonal combinations: 4 q_i q_j.
    w_x, w_y, w_z = m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]
    x_y, x_z, y_z = m[..., 0, 1] + m[..., 1, 0], m[..., 0, 2] + m[..., 2, 0], m[..., 1, 2] + m[..., 2, 1]
    candidates = torch.stack(
        [
            torch.stack([squares[..., 0], w_x, w_y, w_z], -1),
            torch.stack([w_x, squares[..., 1], x_y, x_z], -1),
            torch.stack([w_y, x_y, squares[..., 2], y_z], -1),
            torch.stack([w_z, x_z, y_z, squares[..., 3]], -1),
        ],
        dim=-2,
    )  # row i: 4 q_i q
    best = squares.argmax(-1)
    row = candidates.gather(-2, best[..., None, None].expand(*best.shape, 1, 4)).squeeze(-2)
    q = row / row.norm(dim=-1, keepdim=True)
    return torch.where(q[..., :1] < 0, -q, q)
