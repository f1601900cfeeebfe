r"""Distributions on spheres and rigid-body configurations, and rotations through the double cover of SO(3).

A unit quaternion $q = (q_0, q_1, q_2, q_3) \in S^3$ (scalar first) gives the
rotation $R(q) \in SO(3)$, and $R(q) = R(-q)$: $S^3$ covers SO(3) twice. A
density $p$ on $S^3$ (against the area measure, total area $2\pi^2$) that is
antipodally symmetric, $p(q) = p(-q)$, is a density on SO(3):

$$
p_{SO(3)}(R) = 2\, p(q) \quad\text{against the volume } \pi^2,
\qquad
p_{\mathrm{Haar}}(R) = 2\pi^2\, p(q) \quad\text{against the unit Haar measure.}
$$

The uniform distribution on $S^3$ ($p = 1/2\pi^2$) is the Haar measure
($p_{\mathrm{Haar}} = 1$). A flow built from antipodally equivariant layers
($f(-q) = -f(q)$, as [`DoubleMoebius`][flowkit.bijectors.DoubleMoebius]) over a
symmetric base is symmetric, so its `log_prob` gives
[`haar_log_prob`][flowkit.distributions.haar_log_prob] directly.

A *rigid-body layout* is a flat event vector made of segments, each a
`"quaternion"` (four coordinates on $S^3$), an `"angle"` (one coordinate on the
circle $[-\pi, \pi)$, a periodic position) or a `"real"` coordinate (an auxiliary
variable); [`rigid_domain`][flowkit.distributions.rigid_domain] gives its
[`Product`][flowkit.domains.Product] domain and
[`RigidBase`][flowkit.distributions.RigidBase] its uniform-times-normal base.

References:
    Köhler, Invernizzi, de Haan & Noé, *Rigid body flows for sampling molecular
    crystal structures*, ICML 2023 (arXiv:2301.11355).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..domains import Circle, Product, Real, Sphere
from .base import Distribution, as_shape

__all__ = [
    "SphereUniform",
    "RigidBase",
    "rigid_domain",
    "segment_slices",
    "quaternion_to_matrix",
    "matrix_to_quaternion",
    "haar_log_prob",
    "SEGMENTS",
]

#: The kinds of segments of a rigid-body layout and the number of coordinates of each.
SEGMENTS = {"quaternion": 4, "angle": 1, "real": 1}

_LOG_2PI = math.log(2 * math.pi)


def _check_segments(segments: Sequence[str], where: str) -> tuple[str, ...]:
    if isinstance(segments, str) or not segments:
        raise ValueError(f"{where}: segments must be a non-empty sequence of {sorted(SEGMENTS)}, got {segments!r}")
    bad = [s for s in segments if s not in SEGMENTS]
    if bad:
        raise ValueError(f"{where}: unknown segment kinds {bad}; choose from {sorted(SEGMENTS)}")
    return tuple(segments)


def segment_slices(segments: Sequence[str]) -> list[slice]:
    """The coordinates of each segment in the flat event vector, in order."""
    out, start = [], 0
    for kind in _check_segments(segments, "segment_slices"):
        out.append(slice(start, start + SEGMENTS[kind]))
        start += SEGMENTS[kind]
    return out


def rigid_domain(segments: Sequence[str]) -> Product:
    """The [`Product`][flowkit.domains.Product] domain of a rigid-body layout (`S^3`, circles, real lines)."""
    kinds = {"quaternion": Sphere(4), "angle": Circle(), "real": Real()}
    return Product(*(kinds[s] for s in _check_segments(segments, "rigid_domain")))


class SphereUniform(Distribution):
    r"""Uniform distribution on the unit sphere $S^{n-1}$ over the last dimension ($S^3$: unit quaternions).

    $\log p(q) = -k \log|S^{n-1}|$ for an event of `k` points, with
    $|S^{n-1}| = 2\pi^{n/2}/\Gamma(n/2)$ ($2\pi^2$ for `n = 4`); samples are
    normalised Gaussians. For `n = 4` it is the Haar measure of SO(3) through the
    double cover.

    Arguments:
        event_shape: `n` (one point) or `(k, n)` (`k` points, e.g. `k` rigid bodies).

    Examples:
        >>> import torch
        >>> base = SphereUniform(4)
        >>> q = base.sample((3,))
        >>> bool(torch.allclose(q.norm(dim=-1), torch.ones(3)))
        True
        >>> float(base.log_prob(q)[0].exp() * 2 * torch.pi**2)
        1.0
    """

    def __init__(self, event_shape: int | Sequence[int] = 4) -> None:
        super().__init__()
        self.event_shape = as_shape(event_shape)
        if not 1 <= len(self.event_shape) <= 2 or self.event_shape[-1] < 2:
            raise ValueError(f"SphereUniform: event_shape must be n or (k, n), n >= 2, got {tuple(self.event_shape)}")
        self.domain = Sphere(self.event_shape[-1])
        self._log_p = -self.domain.log_volume(tuple(self.event_shape))

    def log_prob(self, x: Tensor) -> Tensor:
        # constant, but a function of x with its graph (a zero gradient): score-based objectives differentiate it
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        return (0 * x).sum(dims) + self._log_p

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        x = torch.randn(*as_shape(shape), *self.event_shape, dtype=self.dtype, device=self.device)
        return x / x.norm(dim=-1, keepdim=True)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


class RigidBase(Distribution):
    r"""Base of rigid-body flows: uniform quaternions and angles, standard normal real coordinates.

    Over a flat event laid out by `segments` (see the module docstring), the
    density is the product of $1/2\pi^2$ per quaternion, $1/2\pi$ per angle and
    $\mathcal N(0, 1)$ per real (auxiliary) coordinate. Each quaternion factor is
    antipodally symmetric, so an equivariant flow over it has a density on $SO(3)^N$.

    Arguments:
        segments: the layout, e.g. `["quaternion", "angle", "angle", "angle"]` for a body in a periodic box.

    Examples:
        >>> base = RigidBase(["quaternion", "real", "real"])
        >>> base.sample((5,)).shape
        torch.Size([5, 6])
    """

    def __init__(self, segments: Sequence[str]) -> None:
        super().__init__()
        self.segments = _check_segments(segments, "RigidBase")
        self.domain = rigid_domain(self.segments)
        self.event_shape = torch.Size([self.domain.width])
        kinds = [k for k in self.segments for _ in range(SEGMENTS[k])]
        self._real = [i for i, k in enumerate(kinds) if k == "real"]
        self._log_const = (
            self.segments.count("quaternion") * -Sphere(4).log_area
            - self.segments.count("angle") * math.log(2 * math.pi)
            - 0.5 * len(self._real) * _LOG_2PI
        )

    def log_prob(self, x: Tensor) -> Tensor:
        reals = x[..., self._real]
        return self._log_const - 0.5 * reals.square().sum(-1)

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        shape = as_shape(shape)
        parts = []
        for kind in self.segments:
            c = torch.randn(*shape, SEGMENTS[kind], dtype=self.dtype, device=self.device)
            if kind == "quaternion":
                c = c / c.norm(dim=-1, keepdim=True)
            elif kind == "angle":
                c = (torch.rand_like(c) * 2 - 1) * math.pi
            parts.append(c)
        return torch.cat(parts, dim=-1)

    def extra_repr(self) -> str:
        return f"segments={list(self.segments)}"


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


def haar_log_prob(log_prob_s3: Tensor, bodies: int = 1) -> Tensor:
    r"""Log density on $SO(3)^N$ against the unit Haar measure from an antipodally symmetric density on $(S^3)^N$.

    $\log p_{\mathrm{Haar}}(R) = \log p(q) + N \log 2\pi^2$; valid only when
    $p(q) = p(-q)$ in each quaternion (equivariant flows over a symmetric base).

    Arguments:
        log_prob_s3: log densities on the quaternions (against the area measure).
        bodies: the number `N` of quaternions per event.
    """
    return log_prob_s3 + bodies * Sphere(4).log_area
