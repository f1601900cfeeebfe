r"""Distributions on spheres and rigid-body configurations; densities on SO(3) through the double cover.

A density $p$ on $S^3$ (against the area measure, total area $2\pi^2$) that is antipodally symmetric,
$p(q) = p(-q)$, is a density on SO(3) (the quaternion geometry is in [`flowkit.domains`][flowkit.domains]):

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
[`RigidBase`][flowkit.distributions.RigidBase] is the uniform-times-normal base of a rigid-body layout
([`rigid_domain`][flowkit.domains.rigid_domain]).

References:
    Köhler, Invernizzi, de Haan & Noé, *Rigid body flows for sampling molecular
    crystal structures*, ICML 2023 (arXiv:2301.11355).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import domains
from .._deprecation import moved_names
from ..domains import SEGMENTS, Sphere, check_segments, rigid_domain
from .base import Distribution, as_shape

__all__ = ["SphereUniform", "RigidBase", "haar_log_prob"]
__getattr__ = moved_names(
    "flowkit.distributions.sphere",
    "flowkit.domains",
    domains,
    ["segment_slices", "quaternion_to_matrix", "matrix_to_quaternion"],
)

_LOG_2PI = math.log(2 * math.pi)


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
        self.segments = check_segments(segments, "RigidBase")
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


def haar_log_prob(log_prob_s3: Tensor, bodies: int = 1) -> Tensor:
    r"""Log density on $SO(3)^N$ against the unit Haar measure from an antipodally symmetric density on $(S^3)^N$.

    $\log p_{\mathrm{Haar}}(R) = \log p(q) + N \log 2\pi^2$; valid only when
    $p(q) = p(-q)$ in each quaternion (equivariant flows over a symmetric base).

    Arguments:
        log_prob_s3: log densities on the quaternions (against the area measure).
        bodies: the number `N` of quaternions per event.
    """
    return log_prob_s3 + bodies * Sphere(4).log_area
