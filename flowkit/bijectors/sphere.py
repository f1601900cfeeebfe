r"""Möbius maps on spheres and couplings of rigid bodies (unit quaternions, periodic positions).

A Möbius map of $S^{n-1}$ with centre $w$, $|w| < 1$, sends $p$ through the
line from $p$ through $w$ and reflects:

$$
m_w(p) = -\bigl(p - 2\,\mathrm{proj}_{w - p}(p)\bigr), \qquad
\log|\det| = (n-1) \log\frac{1 - |w|^2}{|w - p|^2},
$$

and $m_w^{-1} = m_{-w}$. It is not antipodally equivariant, so on quaternions
(where $q$ and $-q$ are the same rotation) the *double* Möbius map is used,

$$
D_w(p) = \frac{m_w(p) + m_{-w}(p)}{|m_w(p) + m_{-w}(p)|}
       = \frac{M_w p}{|M_w p|}, \qquad M_w = (1 + |w|^2) I - 2 w w^\top,
$$

with $D_w(-p) = -D_w(p)$ and

$$
\log|\det D_w| = \log(1 - |w|^2) + (n-1) \log(1 + |w|^2) - \tfrac n2 \log\bigl((1 + |w|^2)^2 - 4 (w \cdot p)^2\bigr)
$$

on the tangent spaces. The inverse, solved on the great circle through $w$ and $y = D_w(p)$, is in
Cartesian form (no cancellation as $|w| \to 1$, so the reference's separate branch for $|w| > 0.9$ is not needed)

$$
D_w^{-1}(y) = \frac{(1 - |w|^2)\, y + 2 (w \cdot y)\, w}{\sqrt{(1 - |w|^2)^2 + 4 (w \cdot y)^2}},
$$

smooth in $w$, also at $w = 0$ (the identity).

**Convex combinations.** A convex combination of monotone maps of an interval with fixed ends is again
one. On the circle (Rezende et al. 2020, section 3.1) the Möbius maps that fix $-\pi$ are, on the
stereographic coordinate $t = \tan(\theta / 2)$, the affine maps $t \mapsto e^a t + b$ (the map $m_w$
followed by the rotation that takes $m_w(e^{-i\pi})$ back to $-\pi$), so

$$
f(\theta) = \Bigl(\sum_k \rho_k\, 2\arctan\bigl(e^{a_k}\tan\tfrac\theta2 + b_k\bigr) + t\Bigr) \bmod 2\pi,
$$

with weights $\rho$ on the simplex and a rotation $t$, is a diffeomorphism of the circle
([`convex_circle_moebius`][flowkit.bijectors.sphere.convex_circle_moebius]). On $S^{n-1}$ the double Möbius
map $D_w$ moves a point along the great circle through $\hat w$: with $\varphi \in [0, \pi]$
the angle between $p$ and the axis $\hat w$ it keeps the direction $e$ of $p - (p \cdot \hat w)\hat w$
and maps $\varphi \mapsto \arctan_2\bigl(e^\beta \sin\varphi, \cos\varphi\bigr)$ with
$e^\beta = (1 + |w|^2) / (1 - |w|^2)$ (and $\beta < 0$ gives $D_w^{-1}$). Maps that share the axis
can therefore be combined on the angle,

$$
g(\varphi) = \sum_k \rho_k \arctan_2\bigl(e^{\beta_k} \sin\varphi, \cos\varphi\bigr), \qquad
\log|\det| = \log g'(\varphi) + (n - 2) \log\frac{\sin g(\varphi)}{\sin\varphi}, \qquad
g'(\varphi) = \sum_k \frac{\rho_k e^{\beta_k}}{\cos^2\varphi + e^{2\beta_k} \sin^2\varphi},
$$

([`convex_double_moebius`][flowkit.bijectors.sphere.convex_double_moebius]): an increasing map of
$[0, \pi]$ with $g(\pi - \varphi) = \pi - g(\varphi)$, hence antipodally equivariant and smooth at the
poles. Any stack of double Möbius maps is $x \mapsto Mx / |Mx|$, which pushes the uniform distribution
to an angular central Gaussian (polynomial tails). The layers use the combination in the *sampling*
direction: the density it gives, relative to the base, is $(\sum_k \rho_k e^{\beta_k})^{-(n-1)}$ at the
poles and $(\sum_k \rho_k e^{-\beta_k})^{-1}$ on the equator, and by Cauchy-Schwarz the product of the
first's $(n-1)$-th root and the second is at most 1 (1 for a single map), so a concentrated density
gets light tails (the reference code of Köhler et al. stacks single double Möbius maps, as `heads` does).
The normalizing direction solves the monotone one-dimensional equation by a bracketed search
([`solve_monotone`][flowkit.root_finding.solve_monotone]; on $S^{n-1}$ on $\log|\cot\varphi|$,
where each component is a shift) and one Newton step with the graph (the implicit derivatives).

Conditioners emit an unconstrained vector $v$ and a gate $g$ per map; the centre is
$w = 0.95\, \tilde w / (1 + |\tilde w|)$ with $\tilde w = v\, \sigma(g - 3)$ (the
reference's gated parameterisation: zero outputs give the identity, and
$|w| < 0.95$).

References:
    Köhler, Invernizzi, de Haan & Noé, *Rigid body flows for sampling molecular
    crystal structures*, ICML 2023 (arXiv:2301.11355);
    Rezende, Papamakarios, Racanière et al., *Normalizing flows on tori and spheres*,
    ICML 2020 (arXiv:2002.02428).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..domains import SEGMENTS, Circle, Sphere, check_segments, quaternion_to_matrix, rigid_domain, segment_slices
from ..nn import MLP, check_conditioner
from ..root_finding import implicit_newton_step, solve_monotone
from ..transformers import Affine
from ..utils import broadcast_shapes
from .base import Bijector

__all__ = [
    "Moebius",
    "DoubleMoebius",
    "ConvexMoebius",
    "ConvexDoubleMoebius",
    "RigidCoupling",
    "moebius",
    "double_moebius",
    "double_moebius_inverse",
    "circle_moebius",
    "convex_circle_moebius",
    "convex_circle_moebius_inverse",
    "convex_double_moebius",
    "convex_double_moebius_inverse",
    "gated_center",
]

#: The reference's defaults: the largest |w| and the gate offset that makes zero outputs nearly the identity.
SLACK, GATE = 0.95, 3.0
#: Default bound on the log-stretches |beta| of the convex double Möbius maps (e^6 ~ 400: |w| up to 0.9975).
STRETCH = 6.0
#: The root finding of the convex inverses (grid cells, bisection steps, Newton steps of
#: `solve_monotone`) on S^{n-1} (a well-conditioned search: each component is a shift there) and on
#: the circle; both converge to the conditioning of the map in float64 (tests/bijectors/test_sphere_convex.py).
SOLVER, CIRCLE_SOLVER = (8, 4, 4), (16, 16, 4)


def gated_center(raw: Tensor, gate: Tensor, offset: float = GATE, slack: float = SLACK) -> Tensor:
    r"""Centres inside the ball of radius `slack`: $w = s \tilde w / (1 + |\tilde w|)$, $\tilde w = v \sigma(g - o)$.

    Arguments:
        raw: the vectors $v$, `(..., n)`.
        gate: the gates $g$, `(...)`.
        offset: the gate offset $o$ (larger: closer to the identity at the start).
        slack: the bound $s < 1$ on $|w|$.
    """
    w = raw * torch.sigmoid(gate - offset).unsqueeze(-1)
    norm = torch.sqrt(w.square().sum(-1, keepdim=True) + torch.finfo(w.dtype).tiny)
    return slack * w / (1 + norm)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1)


def moebius(p: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """The Möbius map $m_w(p)$ of $S^{n-1}$ and its log-determinant on the tangent spaces (`p`, `w`: `(..., n)`)."""
    diff = w - p
    dist2 = diff.square().sum(-1)
    y = -p + 2 * ((_dot(p, w) - 1) / dist2).unsqueeze(-1) * diff
    ladj = (p.shape[-1] - 1) * (torch.log1p(-w.square().sum(-1)) - torch.log(dist2))
    return y / y.norm(dim=-1, keepdim=True), ladj


def double_moebius(p: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """The double Möbius map $D_w(p)$ of $S^{n-1}$ and its log-determinant (`p`, `w`: `(..., n)`)."""
    n = p.shape[-1]
    r2, a = w.square().sum(-1), _dot(w, p)
    y = (1 + r2).unsqueeze(-1) * p - 2 * a.unsqueeze(-1) * w
    norm2 = (1 + r2).square() - 4 * a.square()
    ladj = torch.log1p(-r2) + (n - 1) * torch.log1p(r2) - 0.5 * n * torch.log(norm2)
    return y / y.norm(dim=-1, keepdim=True), ladj


def double_moebius_inverse(y: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """The inverse $D_w^{-1}(y)$ (the great-circle solution in closed form) and its log-determinant."""
    n = y.shape[-1]
    r2, a = w.square().sum(-1), _dot(w, y)
    p = (1 - r2).unsqueeze(-1) * y + 2 * a.unsqueeze(-1) * w
    norm2 = (1 - r2).square() + 4 * a.square()
    ladj = torch.log1p(r2) + (n - 1) * torch.log1p(-r2) - 0.5 * n * torch.log(norm2)
    return p / p.norm(dim=-1, keepdim=True), ladj


def circle_moebius(theta: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    r"""The Möbius map of the circle on angles: $\theta \mapsto \arg m_w(e^{i\theta})$, and $\log|d\theta'/d\theta|$.

    Arguments:
        theta: angles `(...)` in $[-\pi, \pi)$.
        w: centres `(..., 2)` in the unit disc.

    Returns:
        The new angles in $[-\pi, \pi)$ and $\log\frac{1 - |w|^2}{|w - e^{i\theta}|^2}$.
    """
    p = torch.stack([torch.cos(theta), torch.sin(theta)], dim=-1)
    y, ladj = moebius(p, w)
    out = torch.atan2(y[..., 1], y[..., 0])
    return torch.where(out >= math.pi, out - 2 * math.pi, out), ladj


def _axial(c: Tensor, s: Tensor, beta: Tensor, log_weights: Tensor) -> tuple[Tensor, Tensor]:
    r"""$g = \sum_k \rho_k \arctan_2(e^{\beta_k} s, c)$ and $\log g'$ for the angle $\varphi = \arctan_2(s, c)$.

    `c`, `s` `(...)` need not be normalised (the map depends on their ratio); `beta`,
    `log_weights` `(..., K)`.
    """
    cu, su = c.unsqueeze(-1), s.unsqueeze(-1)
    stretch = torch.exp(beta)
    g = (torch.exp(log_weights) * torch.atan2(stretch * su, cu)).sum(-1)
    log_slope = torch.logsumexp(
        log_weights + beta + torch.log(cu.square() + su.square()) - torch.log(cu.square() + (stretch * su).square()),
        dim=-1,
    )
    return g, log_slope


def _polar(p: Tensor, axis: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`p . axis`, the part of `p` orthogonal to the axis and its norm (kept above zero)."""
    c = _dot(p, axis)
    perp = p - c.unsqueeze(-1) * axis
    s = torch.sqrt(perp.square().sum(-1) + torch.finfo(p.dtype).tiny)
    return c, perp, s


def _from_polar(cos: Tensor, sin: Tensor, axis: Tensor, perp: Tensor, s: Tensor) -> Tensor:
    """The unit vector at the angle of cosine `cos` and sine `sin` from the axis, towards `perp` (of norm `s`)."""
    y = cos.unsqueeze(-1) * axis + (sin / s).unsqueeze(-1) * perp
    return y / y.norm(dim=-1, keepdim=True)


def _check_weights(weights: Tensor, where: str) -> Tensor:
    """Log-weights from weights on the simplex (last dimension)."""
    if not bool(((weights.sum(-1) - 1).abs() < 1e-4).all()) or bool((weights < 0).any()):
        raise ValueError(f"{where}: weights must be non-negative and sum to 1 over the last dimension")
    return torch.log(weights)


def convex_double_moebius(p: Tensor, axis: Tensor, beta: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    r"""A convex combination of double Möbius maps on one axis, on the angle to it (module docstring).

    Arguments:
        p: points `(..., n)` on $S^{n-1}$.
        axis: unit axes $\hat w$ `(..., n)`.
        beta: log-stretches $\beta_k$ `(..., K)` (component $k$ is $D_{r_k \hat w}$ with
            $r_k^2 = \tanh(\beta_k / 2)$ for $\beta_k \ge 0$, and its inverse for $\beta_k < 0$).
        weights: convex weights $\rho_k$ `(..., K)`.

    Returns:
        The image and the log-determinant on the tangent spaces, `(...)`.
    """
    return _convex_double_moebius(p, axis, beta, _check_weights(weights, "convex_double_moebius"))


def _convex_double_moebius(p: Tensor, axis: Tensor, beta: Tensor, log_weights: Tensor) -> tuple[Tensor, Tensor]:
    c, perp, s = _polar(p, axis)
    g, log_slope = _axial(c, s, beta, log_weights)
    sin_g = torch.sin(g)
    ladj = log_slope + (p.shape[-1] - 2) * (torch.log(sin_g) - torch.log(s / torch.hypot(c, s)))
    return _from_polar(torch.cos(g), sin_g, axis, perp, s), ladj


def convex_double_moebius_inverse(y: Tensor, axis: Tensor, beta: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    r"""The inverse of [`convex_double_moebius`][flowkit.bijectors.sphere.convex_double_moebius] and its log-det.

    The angle $\varphi \in [0, \pi]$ with $g(\varphi) = \arctan_2(|y_\perp|, y \cdot \hat w)$ is found by a
    bracketed root search on $\log|\cot\varphi|$ (see the source); gradients flow by the implicit-function rule.
    """
    return _convex_double_moebius_inverse(y, axis, beta, _check_weights(weights, "convex_double_moebius_inverse"))


def _half_angle_residual(v: Tensor, v0: Tensor, beta: Tensor, log_weights: Tensor) -> tuple[Tensor, Tensor]:
    r"""$F(v) - F_0$ and $F'(v)$ for $F(v) = \sum_k \rho_k \arctan e^{v - \beta_k}$ and $F_0 = \arctan e^{v_0}$.

    Where $v_0 > 0$ (near a pole) it is written with the complements $\arctan e^{-x} = \pi/2 - \arctan e^{x}$,
    so that the residual keeps its relative precision; only that form is evaluated there.
    """
    x = v.unsqueeze(-1) - beta
    weights = torch.exp(log_weights)
    # sigma (F(v) - F_0) in terms of arctan e^{sigma x}, with sigma = -1 near a pole: one branch is
    # evaluated, whose exponentials stay small (the other one's overflow would poison the gradient).
    sign = torch.where(v0 > 0, -1.0, 1.0).to(v.dtype)
    terms = (weights * torch.atan(torch.exp(sign.unsqueeze(-1) * x))).sum(-1) - torch.atan(torch.exp(sign * v0))
    slope = (weights * 0.5 / torch.cosh(x)).sum(-1)
    return sign * terms, slope


def _convex_double_moebius_inverse(y: Tensor, axis: Tensor, beta: Tensor, log_weights: Tensor) -> tuple[Tensor, Tensor]:
    r"""The inverse, solved on $v = \log|\cot\varphi|$.

    There $g$ is $\sum_k \rho_k \arctan e^{v - \beta_k}$ against
    $\arctan e^{v_0}$, $v_0 = \log|\cot\gamma|$ (each component is the shift $v_0 = v - \beta_k$), the root
    lies in $[v_0 + \min\beta, v_0 + \max\beta]$, and $\varphi$ is on the side of the equator of $\gamma$.
    [`solve_monotone`][flowkit.root_finding.solve_monotone] searches that bracket (`SOLVER`).
    """
    c, perp, s = _polar(y, axis)
    tiny = torch.finfo(y.dtype).tiny
    v0 = torch.log(c.abs() + tiny) - torch.log(s)
    b, lw, w0 = beta.detach(), log_weights.detach(), v0.detach()
    low = w0 + b.min(-1).values
    width = b.max(-1).values - b.min(-1).values + torch.finfo(y.dtype).eps

    def residual(u: Tensor, cells: int, slope: bool) -> tuple[Tensor, Tensor | None]:
        lead = (lambda t: t.unsqueeze(-1)) if cells else (lambda t: t)
        v = lead(low) + lead(width) * u
        beta_, lw_ = (b.unsqueeze(-2), lw.unsqueeze(-2)) if cells else (b, lw)
        r, d = _half_angle_residual(v, lead(w0), beta_, lw_)
        return r, (d * lead(width) if slope else None)

    v = low + width * solve_monotone(residual, torch.zeros_like(w0), *SOLVER, "convex double Moebius inverse")
    v = implicit_newton_step(v, *_half_angle_residual(v, v0, beta, log_weights), low, low + width)
    log_sin = -0.5 * nn.functional.softplus(2 * v)
    sin_phi, cos_phi = torch.exp(log_sin), torch.sign(c) * torch.exp(v + log_sin)
    log_slope = _axial(cos_phi, sin_phi, beta, log_weights)[1]
    ladj = -log_slope - (y.shape[-1] - 2) * (torch.log(s / torch.hypot(c, s)) - log_sin)
    return _from_polar(cos_phi, sin_phi, axis, perp, s), ladj


def _wrap(theta: Tensor) -> Tensor:
    return torch.remainder(theta + math.pi, 2 * math.pi) - math.pi


def _fixing(theta: Tensor, log_scale: Tensor, offset: Tensor) -> tuple[Tensor, Tensor]:
    r"""Circle Möbius maps fixing $-\pi$, `(..., K)`: $t \mapsto e^{a} t + b$ on $t = \tan(\theta/2)$, and $\log h'$."""
    c, s = torch.cos(0.5 * theta), torch.sin(0.5 * theta)
    scale = torch.exp(log_scale)
    num = scale * s + offset * c
    return 2 * torch.atan2(num, c), log_scale - torch.log(c.square() + num.square())


def convex_circle_moebius(
    theta: Tensor, log_scale: Tensor, offset: Tensor, weights: Tensor, shift: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""A convex combination of circle Möbius maps that fix $-\pi$ (Rezende et al. 2020), then a rotation.

    Component $k$ is $h_k(\theta) = 2 \arctan\bigl(e^{a_k} \tan(\theta/2) + b_k\bigr)$ (module docstring).

    Arguments:
        theta: angles `(...)` in $[-\pi, \pi)$.
        log_scale: $a_k$ `(..., K)`.
        offset: $b_k$ `(..., K)`.
        weights: convex weights $\rho_k$ `(..., K)`.
        shift: the rotation $t$ `(...)` (default 0).

    Returns:
        The angles $\sum_k \rho_k h_k(\theta) + t$ wrapped to $[-\pi, \pi)$ and $\log \sum_k \rho_k h_k'(\theta)$.
    """
    return _convex_circle(theta, log_scale, offset, _check_weights(weights, "convex_circle_moebius"), shift)


def _convex_circle(
    theta: Tensor, log_scale: Tensor, offset: Tensor, log_weights: Tensor, shift: Tensor | None
) -> tuple[Tensor, Tensor]:
    h, log_d = _fixing(theta.unsqueeze(-1), log_scale, offset)
    out = (torch.exp(log_weights) * h).sum(-1)
    ladj = torch.logsumexp(log_weights + log_d, dim=-1)
    return (out if shift is None else _wrap(out + shift)), ladj


def convex_circle_moebius_inverse(
    theta: Tensor, log_scale: Tensor, offset: Tensor, weights: Tensor, shift: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The inverse of [`convex_circle_moebius`][flowkit.bijectors.sphere.convex_circle_moebius] and its log-derivative.

    The root lies between the components' own inverses (explicit); a bracketed search there
    (`CIRCLE_SOLVER`) and one Newton step with the graph (the implicit derivatives) find it.
    """
    log_weights = _check_weights(weights, "convex_circle_moebius_inverse")
    return _convex_circle_inverse(theta, log_scale, offset, log_weights, shift)


def _convex_circle_inverse(
    theta: Tensor, log_scale: Tensor, offset: Tensor, log_weights: Tensor, shift: Tensor | None
) -> tuple[Tensor, Tensor]:
    target = theta if shift is None else _wrap(theta - shift)
    a, b, lw, y = log_scale.detach(), offset.detach(), log_weights.detach(), target.detach()
    # each component's own root, as a half angle in (-pi/2, pi/2): tan(x/2) = (tan(y/2) - b) e^-a
    half = 0.5 * y.unsqueeze(-1)
    roots = torch.atan2((torch.sin(half) - b * torch.cos(half)) * torch.exp(-a), torch.cos(half))
    low = roots.min(-1).values
    width = roots.max(-1).values - low + torch.finfo(y.dtype).eps

    def residual(u: Tensor, cells: int, slope: bool) -> tuple[Tensor, Tensor | None]:
        lead = (lambda t: t.unsqueeze(-1)) if cells else (lambda t: t)
        a_, b_, lw_ = (a.unsqueeze(-2), b.unsqueeze(-2), lw.unsqueeze(-2)) if cells else (a, b, lw)
        x = 2 * (lead(low) + lead(width) * u)
        value, log_d = _convex_circle(x, a_, b_, lw_, None)
        return value - lead(y), (2 * lead(width) * torch.exp(log_d) if slope else None)

    u = solve_monotone(residual, torch.zeros_like(y), *CIRCLE_SOLVER, "convex circle Moebius inverse")
    x = 2 * (low + width * u)
    value, log_d = _convex_circle(x, log_scale, offset, log_weights, None)
    x = implicit_newton_step(x, value - target, torch.exp(log_d), 2 * low, 2 * (low + width))
    return x, -_convex_circle(x, log_scale, offset, log_weights, None)[1]


def _through_heads(
    y: Tensor, heads: Sequence[tuple[Tensor, ...]], step: Callable[..., tuple[Tensor, Tensor]], reverse: bool = False
) -> tuple[Any, Any]:
    """`y` through `step(y, *params)` for each head's parameters in turn (last first if `reverse`); the summed ladj."""
    total: Any = 0
    for params in reversed(heads) if reverse else heads:
        y, ladj = step(y, *params)
        total = total + ladj
    return y, total


class _Raw(nn.Module):
    """Unconstrained outputs `(..., heads, size)`: learnable parameters, or an MLP of a context that starts constant."""

    def __init__(self, heads: int, size: int, context: int, hidden: Sequence[int], initial: Tensor) -> None:
        super().__init__()
        self.heads, self.size = heads, size
        if context:
            self.net: nn.Module | None = MLP(context, heads * size, hidden, "silu", context=0)
            self.net.zero_last(initial.flatten())
            self.raw = None
        else:
            self.net = None
            self.raw = nn.Parameter(initial.clone())

    def outputs(self, like: Tensor, batch: torch.Size, context: Tensor | None) -> Tensor:
        out = self.raw.to(like) if self.net is None else self.net(context).unflatten(-1, (self.heads, self.size))
        return out.expand(*batch, self.heads, self.size)


def _centre_initial(heads: int, n: int, init: float) -> Tensor:
    """Random centre vectors of standard deviation `init` and zero gates: `w = 0` is a stationary point."""
    initial = torch.zeros(heads, n + 1)
    initial[:, :n] = init * torch.randn(heads, n)
    return initial


class _Centres(_Raw):
    """Learnable unconstrained vectors and gates for `heads` maps, or a conditioner from a context."""

    def __init__(self, n: int, heads: int, context: int, hidden: Sequence[int], offset: float, init: float) -> None:
        super().__init__(heads, n + 1, context, hidden, _centre_initial(heads, n, init))
        self.n, self.offset = n, offset

    def forward(self, like: Tensor, batch: torch.Size, context: Tensor | None) -> Tensor:
        out = self.outputs(like, batch, context)
        return gated_center(out[..., : self.n], out[..., self.n], self.offset)


class Moebius(Bijector):
    r"""A Möbius map $m_w$ of $S^{n-1}$ with a learnt centre (or one conditioned on a context).

    Not antipodally equivariant: for rotations use [`DoubleMoebius`][flowkit.bijectors.DoubleMoebius].
    `heads` maps are applied in turn (their composition is again a Möbius map up
    to a rotation of the sphere). The inverse of $m_w$ is $m_{-w}$.

    Arguments:
        n: the ambient dimension (`S^{n-1}`; 2 for the circle, 4 for quaternions).
        heads: the number of maps applied in turn.
        context: number of context features (0: the centres are parameters).
        hidden: hidden sizes of the context network.
        gate: the gate offset of [`gated_center`][flowkit.bijectors.sphere.gated_center].
        init: standard deviation of the initial centre vectors (the double map cannot leave
            `w = 0`, a stationary point, so it starts close to the identity instead).

    Examples:
        >>> import torch
        >>> from flowkit.testing import randomize
        >>> layer = randomize(Moebius(4), scale=1.0)
        >>> q = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
        >>> torch.allclose(layer.inverse(layer(q)[0])[0], q, atol=1e-5)
        True
    """

    def __init__(
        self,
        n: int = 4,
        heads: int = 1,
        context: int = 0,
        hidden: Sequence[int] = (64,),
        gate: float = GATE,
        init: float = 0.5,
    ) -> None:
        super().__init__()
        n = check_number(n, "n", where=type(self).__name__, integer=True, low=2)
        heads = check_number(heads, "heads", where=type(self).__name__, integer=True, low=1)
        self.context_features = check_number(context, "context", where=type(self).__name__, integer=True, low=0)
        self.event_shape = torch.Size([n])
        self.domain = Sphere(n)
        init = check_number(init, "init", where=type(self).__name__, low=0)
        self.centres = _Centres(n, heads, self.context_features, hidden, float(gate), init)

    _map = staticmethod(moebius)
    _unmap = staticmethod(lambda y, w: moebius(y, -w))

    def _w(self, x: Tensor, context: Tensor | None) -> Tensor:
        return self.centres(x, x.shape[:-1], context).unbind(-2)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return _through_heads(x, [(w,) for w in self._w(x, context)], self._map)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return _through_heads(z, [(w,) for w in self._w(z, context)], self._unmap, reverse=True)


class DoubleMoebius(Moebius):
    r"""Antipodally equivariant double Möbius maps $D_w$ of $S^{n-1}$, for unit quaternions.

    $D_w(-q) = -D_w(q)$ with equal log-determinants, so over a symmetric base the
    flow's density is symmetric and defines a density on SO(3) (see
    [`flowkit.domains`][flowkit.domains]). The inverse is
    analytic (module docstring). `heads` maps are applied in turn.

    Arguments:
        n: the ambient dimension (4 for quaternions).
        heads: the number of maps applied in turn.
        context: number of context features (0: the centres are parameters).
        hidden: hidden sizes of the context network.
        gate: the gate offset of [`gated_center`][flowkit.bijectors.sphere.gated_center].
        init: standard deviation of the initial centre vectors (see [`Moebius`][flowkit.bijectors.Moebius]).

    Examples:
        >>> import torch
        >>> from flowkit.testing import randomize
        >>> layer = randomize(DoubleMoebius(4, heads=2), scale=1.0)
        >>> q = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
        >>> (z, ladj), (z_neg, ladj_neg) = layer(q), layer(-q)
        >>> torch.allclose(z_neg, -z) and torch.allclose(ladj_neg, ladj)
        True
    """

    _map = staticmethod(double_moebius)
    _unmap = staticmethod(double_moebius_inverse)


def _axial_parameters(out: Tensor, n: int, clamp: float) -> tuple[Tensor, Tensor, Tensor]:
    """Unit axes, bounded log-stretches and log-weights from unconstrained outputs `(..., n + 2K)`."""
    v, raw_beta, logits = out[..., :n], *out[..., n:].chunk(2, dim=-1)
    axis = v / torch.sqrt(v.square().sum(-1, keepdim=True) + torch.finfo(v.dtype).tiny)
    return axis, clamp * torch.tanh(raw_beta / clamp), torch.log_softmax(logits, dim=-1)


def _axial_initial(heads: int, n: int, components: int, init: float) -> Tensor:
    """Random axes (any non-zero vector), log-stretches of standard deviation `init`, equal weights."""
    return torch.cat([torch.randn(heads, n), init * torch.randn(heads, components), torch.zeros(heads, components)], -1)


def _circle_parameters(out: Tensor, clamp: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Log-scales (below `clamp`), offsets, log-weights `(..., K)` and the rotation `(...)` from `(..., 3K + 1)`."""
    raw_scale, offset, logits = out[..., :-1].chunk(3, dim=-1)
    return clamp * torch.tanh(raw_scale / clamp), offset, torch.log_softmax(logits, dim=-1), out[..., -1]


def _circle_initial(heads: int, components: int, init: float) -> Tensor:
    """Log-scales and offsets of standard deviation `init` (distinct components), equal weights, no rotation."""
    return torch.cat([init * torch.randn(heads, 2 * components), torch.zeros(heads, components + 1)], -1)


class _ConvexCombination(Bijector):
    """What the convex-combination layers share: their argument checks, and `heads` maps applied in turn.

    A subclass gives `_heads(x, context)` (each head's parameters), `_map` (one head's explicit map,
    the sampling direction, returning `(y, ladj)`), `_map_inverse` (its solved inverse) and
    `_event_ladj` (the event's log-determinant from the summed per-head ones).
    """

    _map: Callable[..., tuple[Tensor, Tensor]]
    _map_inverse: Callable[..., tuple[Tensor, Tensor]]

    def _check_arguments(
        self, components: int, heads: int, context: int, clamp: float, init: float
    ) -> tuple[int, float]:
        """Check and keep `components`, `context` and `clamp`; return the checked `heads` and `init`."""
        where = type(self).__name__
        self.components = check_number(components, "components", where=where, integer=True, low=1)
        heads = check_number(heads, "heads", where=where, integer=True, low=1)
        self.context_features = check_number(context, "context", where=where, integer=True, low=0)
        self.clamp = check_number(clamp, "clamp", where=where, positive=True)
        return heads, check_number(init, "init", where=where, low=0)

    def _heads(self, x: Tensor, context: Tensor | None) -> list[tuple[Tensor, ...]]:
        raise NotImplementedError

    @staticmethod
    def _event_ladj(total: Tensor) -> Tensor:
        return total

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, total = _through_heads(x, self._heads(x, context), self._map_inverse, reverse=True)
        return x, self._event_ladj(total)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, total = _through_heads(z, self._heads(z, context), self._map)
        return z, self._event_ladj(total)


class ConvexDoubleMoebius(_ConvexCombination):
    r"""Convex combinations of `components` double Möbius maps on a shared axis, on $S^{n-1}$.

    Each of the `heads` maps, applied in turn, has a learnt (or context-conditioned) axis
    $\hat w$, log-stretches $\beta_k$ (bounded by `clamp`) and weights $\rho_k$ and maps the angle
    to the axis by $g(\varphi) = \sum_k \rho_k \arctan_2(e^{\beta_k} \sin\varphi, \cos\varphi)$
    (see [`convex_double_moebius`][flowkit.bijectors.sphere.convex_double_moebius]). It is
    antipodally equivariant with equal log-determinants, like
    [`DoubleMoebius`][flowkit.bijectors.DoubleMoebius] (`components=1`). The combination is the
    *sampling* (`inverse`) direction, which is explicit; `forward` solves for the angle. In that
    direction a concentrated density, such as a matrix-Fisher target, gets light tails, which no stack of
    double Möbius maps gives (module docstring).

    At $\beta = 0$ the map is the identity whatever the axis, and the log-stretches enter to
    first order, so training leaves it (unlike $w = 0$ of the double Möbius map); `init`
    spreads the initial $\beta_k$ so that the components differ.

    Arguments:
        n: the ambient dimension (4 for quaternions).
        components: the number $K$ of maps in each convex combination.
        heads: the number of convex combinations applied in turn.
        context: number of context features (0: the parameters are learnt directly).
        hidden: hidden sizes of the context network.
        clamp: bound on $|\beta_k|$ (soft, by `tanh`).
        init: standard deviation of the initial log-stretches (0: exactly the identity).

    Examples:
        >>> import torch
        >>> from flowkit.testing import randomize
        >>> layer = randomize(ConvexDoubleMoebius(4, components=3), scale=1.0).double()
        >>> q = torch.nn.functional.normalize(torch.randn(5, 4, dtype=torch.float64), dim=-1)
        >>> (x, ladj), (x_neg, ladj_neg) = layer.inverse(q), layer.inverse(-q)  # sampling: explicit
        >>> torch.allclose(x_neg, -x) and torch.allclose(ladj_neg, ladj)
        True
        >>> bool((layer(x)[0] - q).abs().max() < 1e-12)
        True

    References:
        Rezende, Papamakarios, Racanière et al., *Normalizing flows on tori and spheres*,
        ICML 2020 (arXiv:2002.02428), section 3.1 (convex combinations);
        Köhler, Invernizzi, de Haan & Noé, ICML 2023 (arXiv:2301.11355) (double Möbius maps).
    """

    def __init__(
        self,
        n: int = 4,
        components: int = 4,
        heads: int = 1,
        context: int = 0,
        hidden: Sequence[int] = (64,),
        clamp: float = STRETCH,
        init: float = 0.5,
    ) -> None:
        super().__init__()
        n = check_number(n, "n", where=type(self).__name__, integer=True, low=2)
        heads, init = self._check_arguments(components, heads, context, clamp, init)
        self.event_shape = torch.Size([n])
        self.domain = Sphere(n)
        initial = _axial_initial(heads, n, self.components, init)
        self.params = _Raw(heads, n + 2 * self.components, self.context_features, hidden, initial)

    def _heads(self, x: Tensor, context: Tensor | None) -> list[tuple[Tensor, Tensor, Tensor]]:
        out = _axial_parameters(self.params.outputs(x, x.shape[:-1], context), x.shape[-1], self.clamp)
        return list(zip(*(t.unbind(-2) for t in out), strict=True))

    _map = staticmethod(_convex_double_moebius)
    _map_inverse = staticmethod(_convex_double_moebius_inverse)

    def extra_repr(self) -> str:
        return f"n={self.event_shape[0]}, components={self.components}, heads={self.params.heads}"


class ConvexMoebius(_ConvexCombination):
    r"""Convex combinations of `components` circle Möbius maps per angle (Rezende et al. 2020), for periodic positions.

    The event is `features` angles in $[-\pi, \pi)$ (a torus), each mapped by `heads`
    maps in turn, $\theta \mapsto \sum_k \rho_k h_k(\theta) + t \pmod{2\pi}$ with Möbius maps
    $h_k(\theta) = 2\arctan(e^{a_k}\tan(\theta/2) + b_k)$ that fix $-\pi$, weights $\rho_k$ and a
    rotation $t$ (see [`convex_circle_moebius`][flowkit.bijectors.sphere.convex_circle_moebius]);
    $|a_k| <$ `clamp`. Zero parameters give the identity, and every parameter enters to first
    order there; `init` spreads the initial $a_k, b_k$ so that the components differ. As in
    [`ConvexDoubleMoebius`][flowkit.bijectors.ConvexDoubleMoebius] the combination is the
    sampling (`inverse`) direction, which is explicit; `forward` solves a monotone equation.

    Arguments:
        features: the number of angles.
        components: the number $K$ of Möbius maps in each combination.
        heads: the number of combinations applied in turn.
        context: number of context features (0: the parameters are learnt directly).
        hidden: hidden sizes of the context network.
        clamp: bound on the log-scales $|a_k|$ (soft, by `tanh`).
        init: standard deviation of the initial $a_k$, $b_k$ (0: exactly the identity).

    Examples:
        >>> import math, torch
        >>> from flowkit.testing import randomize
        >>> layer = randomize(ConvexMoebius(2, components=3), scale=1.0).double()
        >>> theta = (torch.rand(5, 2, dtype=torch.float64) * 2 - 1) * math.pi
        >>> x, ladj = layer.inverse(theta)  # sampling: explicit
        >>> bool((layer(x)[0] - theta).abs().max() < 1e-12)
        True

    References:
        Rezende, Papamakarios, Racanière et al., *Normalizing flows on tori and spheres*,
        ICML 2020 (arXiv:2002.02428), section 3.1.
    """

    def __init__(
        self,
        features: int = 1,
        components: int = 4,
        heads: int = 1,
        context: int = 0,
        hidden: Sequence[int] = (64,),
        clamp: float = STRETCH,
        init: float = 0.5,
    ) -> None:
        super().__init__()
        features = check_number(features, "features", where=type(self).__name__, integer=True, low=1)
        heads, init = self._check_arguments(components, heads, context, clamp, init)
        self.event_shape = torch.Size([features])
        self.domain = Circle()
        size = 3 * self.components + 1
        initial = torch.stack([_circle_initial(heads, self.components, init) for _ in range(features)], 1)
        self.params = _Raw(heads, features * size, self.context_features, hidden, initial.flatten(1))

    def _heads(self, x: Tensor, context: Tensor | None) -> list[tuple[Tensor, ...]]:
        out = self.params.outputs(x, x.shape[:-1], context).unflatten(-1, (x.shape[-1], -1))
        params = _circle_parameters(out, self.clamp)  # (..., heads, D, K) and (..., heads, D)
        return list(zip(*(p.unbind(x.ndim - 1) for p in params), strict=True))

    _map = staticmethod(_convex_circle)
    _map_inverse = staticmethod(_convex_circle_inverse)

    @staticmethod
    def _event_ladj(total: Tensor) -> Tensor:
        return total.sum(-1)  # elementwise over the angles

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, components={self.components}, heads={self.params.heads}"


def _embed(x: Tensor, segments: Sequence[str], slices: Sequence[slice], keep: Sequence[int]) -> Tensor:
    """Conditioner features of the kept segments, invariant under `q -> -q`: rotation matrices, (cos, sin), values."""
    parts = []
    for i in keep:
        c = x[..., slices[i]]
        if segments[i] == "quaternion":
            parts.append(quaternion_to_matrix(c).flatten(-2))
        elif segments[i] == "angle":
            parts.append(torch.cat([torch.cos(c), torch.sin(c)], -1))
        else:
            parts.append(c)
    return torch.cat(parts, -1)


_FEATURES = {"quaternion": 9, "angle": 2, "real": 1}


class _SegmentMap:
    """The map of one transformed segment of a [`RigidCoupling`][flowkit.bijectors.RigidCoupling], given parameters.

    The segment transformers of a rigid coupling, one class per segment kind, as the elementwise
    transformers of a [`Coupling`][flowkit.bijectors.Coupling]: `size` parameters per segment,
    `initial(init)` their starting values (the conditioner's last bias), and `__call__(c, theta, inverse)`
    the map of the segment's coordinates `c` `(..., width)` (the sampling direction when `inverse`), with
    its log-determinant.
    """

    size: int

    def initial(self, init: float) -> Tensor:
        raise NotImplementedError

    def __call__(self, c: Tensor, theta: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class _RealAffine(_SegmentMap):
    """A real (auxiliary) coordinate: the [`Affine`][flowkit.transformers.Affine] transformer, $x e^s + t$."""

    size = 2

    def __init__(self, clamp: float) -> None:
        self.affine = Affine(clamp)

    def initial(self, init: float) -> Tensor:
        return self.affine.identity_params()

    def __call__(self, c: Tensor, theta: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        y, ladj = (self.affine.inverse if inverse else self.affine.forward)(c[..., 0], theta)
        return y.unsqueeze(-1), ladj


class _MoebiusHeads(_SegmentMap):
    """A quaternion (`heads` double Moebius maps) or an angle (`heads` circle Moebius maps), applied in turn."""

    def __init__(self, kind: str, heads: int, gate: float) -> None:
        self.quaternion, self.heads, self.gate = kind == "quaternion", heads, gate
        self.n = 4 if self.quaternion else 2
        self.size = heads * (self.n + 1)

    def initial(self, init: float) -> Tensor:
        return _centre_initial(self.heads, self.n, init).flatten()

    def __call__(self, c: Tensor, theta: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        centres = theta.unflatten(-1, (self.heads, self.n + 1))
        ws = gated_center(centres[..., : self.n], centres[..., self.n], self.gate).unbind(-2)
        if self.quaternion:
            y, step = c, double_moebius_inverse if inverse else double_moebius
        else:
            y, step = c[..., 0], (lambda t, w: circle_moebius(t, -w)) if inverse else circle_moebius
        y, ladj = _through_heads(y, [(w,) for w in ws], step, reverse=inverse)
        return (y if self.quaternion else y.unsqueeze(-1)), ladj


class _ConvexHeads(_SegmentMap):
    """A quaternion or an angle through `heads` convex combinations of `components` maps (explicit when sampling)."""

    def __init__(self, kind: str, heads: int, components: int, stretch: float) -> None:
        self.quaternion, self.heads, self.components, self.stretch = kind == "quaternion", heads, components, stretch
        self.size = heads * (4 + 2 * components) if self.quaternion else heads * (3 * components + 1)

    def initial(self, init: float) -> Tensor:
        if self.quaternion:
            return _axial_initial(self.heads, 4, self.components, init).flatten()
        return _circle_initial(self.heads, self.components, init).flatten()

    def __call__(self, c: Tensor, theta: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        if self.quaternion:
            heads = _axial_parameters(theta.unflatten(-1, (self.heads, -1)), 4, self.stretch)
            y, explicit, solved = c, _convex_double_moebius, _convex_double_moebius_inverse
        else:
            heads = _circle_parameters(theta.unflatten(-1, (self.heads, -1)), self.stretch)
            y, explicit, solved = c[..., 0], _convex_circle, _convex_circle_inverse
        heads = list(zip(*(t.unbind(theta.ndim - 1) for t in heads), strict=True))  # the head dimension
        y, total = _through_heads(y, heads, explicit) if inverse else _through_heads(y, heads, solved, reverse=True)
        return (y if self.quaternion else y.unsqueeze(-1)), total


class RigidCoupling(Bijector):
    r"""Coupling across rigid bodies: some segments of a layout change, conditioned on all the others.

    The event is a flat vector laid out by `segments` (`"quaternion"`, `"angle"`,
    `"real"`; see [`rigid_domain`][flowkit.domains.rigid_domain]). The
    segments listed in `transformed` are mapped, the others pass unchanged and,
    through a conditioner, set the maps' parameters:

    - a quaternion by `heads` double Möbius maps $D_{w_1}, \dots$ in turn
      ([`DoubleMoebius`][flowkit.bijectors.DoubleMoebius]);
    - an angle (a periodic position) by `heads` circle Möbius maps
      ([`circle_moebius`][flowkit.bijectors.sphere.circle_moebius]);
    - a real (auxiliary) coordinate by an affine map $x e^s + t$, $|s| <$ `clamp`.

    With `components=K`, each quaternion map is instead a convex combination of $K$ double
    Möbius maps on a shared axis ([`convex_double_moebius`][flowkit.bijectors.sphere.convex_double_moebius])
    and each angle map a convex combination of $K$ circle Möbius maps and a rotation
    ([`convex_circle_moebius`][flowkit.bijectors.sphere.convex_circle_moebius]), log-stretches and
    log-scales bounded by `stretch`; the gates do not apply to them.
    These are explicit in the sampling (`inverse`) direction, so sampling and reverse-KL
    training need no root finding; `forward` (the density of given data) solves a monotone
    one-dimensional equation per map.

    Centres come from gated outputs ([`gated_center`][flowkit.bijectors.sphere.gated_center];
    gate offset `gate` for quaternions, `position_gate` for angles). The conditioner sees the kept
    quaternions as rotation matrices (so flipping the sign of another body's quaternion changes nothing),
    angles as $(\cos, \sin)$ and real coordinates as they are, plus the context. Its last layer starts with
    zero weights, gates and affine parameters and small random centre vectors (`init`; $w = 0$ is a
    stationary point of the double Möbius map). The layer is antipodally equivariant in every quaternion.

    Arguments:
        segments: the layout of the event.
        transformed: indices of the segments to map.
        heads: maps per quaternion or angle, applied in turn.
        hidden: hidden sizes of the default conditioner MLP.
        context: number of context features.
        activation: activation of the default conditioner MLP.
        gate: gate offset of the quaternion maps.
        position_gate: gate offset of the angle maps.
        clamp: soft bound on the affine log-scales.
        conditioner: a [`Conditioner`][flowkit.nn.Conditioner] from the embedded kept
            segments (9 numbers per quaternion, 2 per angle, 1 per real) and the context
            to `out_features` parameters (`heads (4 + 1)` per quaternion, `heads (2 + 1)`
            per angle, 2 per real, in the order of `transformed`; with `components=K`,
            `heads (4 + 2K)` per quaternion and `heads (3K + 1)` per angle).
        init: standard deviation of the initial centre vectors $v$ (0: exactly the identity);
            with `components`, also of the log-stretches, which makes the components differ.
        components: the number $K$ of maps in each convex combination (None: single maps).
        stretch: bound on the log-stretches of the convex quaternion maps.

    Examples:
        >>> import torch
        >>> from flowkit.distributions import RigidBase
        >>> segments = ["quaternion", "angle", "quaternion", "angle"]
        >>> layer = RigidCoupling(segments, transformed=[0, 3], hidden=(16,), init=0.0)  # the identity
        >>> x = RigidBase(segments).sample((5,))
        >>> z, ladj = layer(x)
        >>> bool((z - x).abs().max() < 1e-6), ladj.shape
        (True, torch.Size([5]))
    """

    def __init__(
        self,
        segments: Sequence[str],
        transformed: Sequence[int],
        heads: int = 1,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        activation: str = "silu",
        gate: float = GATE,
        position_gate: float = GATE,
        clamp: float = 3.0,
        conditioner: nn.Module | None = None,
        init: float = 0.5,
        components: int | None = None,
        stretch: float = STRETCH,
    ) -> None:
        super().__init__()
        where = "RigidCoupling"
        self.segments = check_segments(segments, where)
        transformed = sorted({int(i) for i in transformed})
        if not transformed or transformed[0] < 0 or transformed[-1] >= len(self.segments):
            raise ValueError(f"{where}: transformed must be segment indices in [0, {len(self.segments)})")
        if len(transformed) == len(self.segments):
            raise ValueError(f"{where}: some segments must stay unchanged to condition the others")
        self.transformed = transformed
        self.keep = [i for i in range(len(self.segments)) if i not in transformed]
        self.heads = check_number(heads, "heads", where=where, integer=True, low=1)
        self.context_features = check_number(context, "context", where=where, integer=True, low=0)
        self.gate, self.position_gate = float(gate), float(position_gate)
        self.clamp = check_number(clamp, "clamp", where=where, positive=True)
        init = check_number(init, "init", where=where, low=0)
        self.components = (
            None if components is None else check_number(components, "components", where=where, integer=True, low=1)
        )
        self.stretch = check_number(stretch, "stretch", where=where, positive=True)
        self.slices = segment_slices(self.segments)
        self.domain = rigid_domain(self.segments)
        self.event_shape = torch.Size([self.domain.width])
        self._maps = [self._segment_map(self.segments[i]) for i in transformed]
        self._sizes = [m.size for m in self._maps]
        n_in = sum(_FEATURES[self.segments[i]] for i in self.keep)
        n_out = sum(self._sizes)
        if conditioner is None:
            conditioner = MLP(n_in, n_out, hidden, activation, context=self.context_features)
        else:
            check_conditioner(conditioner, n_in, n_out, self.context_features, False, where)
        self.conditioner = conditioner
        self.conditioner.zero_last(self._initial_outputs(init))

    def _segment_map(self, kind: str) -> _SegmentMap:
        """The transformer of a segment of `kind`."""
        if kind == "real":
            return _RealAffine(self.clamp)
        if self.components is not None:
            return _ConvexHeads(kind, self.heads, self.components, self.stretch)
        return _MoebiusHeads(kind, self.heads, self.gate if kind == "quaternion" else self.position_gate)

    def _initial_outputs(self, init: float) -> Tensor:
        """Small random centre vectors (zero gates, zero affine parameters): `w = 0` is a stationary point."""
        return torch.cat([m.initial(init) for m in self._maps])

    def _params(self, x: Tensor, context: Tensor | None) -> list[Tensor]:
        h = self.conditioner(_embed(x, self.segments, self.slices, self.keep), context)
        return list(h.split(self._sizes, dim=-1))

    def _run(self, x: Tensor, context: Tensor | None, inverse: bool) -> tuple[Tensor, Tensor]:
        params = self._params(x, context)
        out = list(x.unbind(-1))
        batch = broadcast_shapes(x.shape[:-1], params[0].shape[:-1]) if params else x.shape[:-1]
        total = x.new_zeros(batch)
        for i, theta, segment_map in zip(self.transformed, params, self._maps, strict=True):
            sl = self.slices[i]
            y, ladj = segment_map(x[..., sl].expand(*batch, SEGMENTS[self.segments[i]]), theta, inverse)
            out[sl] = list(y.unbind(-1))
            total = total + ladj
        out = [o.expand(batch) for o in out]
        return torch.stack(out, dim=-1), total

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(x, context, inverse=False)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(z, context, inverse=True)

    def extra_repr(self) -> str:
        extra = "" if self.components is None else f", components={self.components}"
        return f"segments={list(self.segments)}, transformed={self.transformed}, heads={self.heads}{extra}"
