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

on the tangent spaces. The inverse solves the map on the great circle through
$w$ and $y = D_w(p)$: with $u_x = y \cdot \hat w$, $u_y = |y - u_x \hat w|$ and
$r = |w|$, $p = -(x' \hat w + y' \hat e_\perp)$ with
$x' = -(1 + r^2) u_x / d$, $y' = (r^2 - 1) u_y / d$ and
$d = \sqrt{(1 - r^2)^2 + 4 r^2 u_x^2}$ (this form of $d$ equals the reference's
$\sqrt{(1+r^2)^2 - 4 r^2 u_y^2}$ on the sphere and has no cancellation as $r \to 1$,
so the separate branch for $|w| > 0.9$ of the reference is not needed). In
Cartesian form,

$$
D_w^{-1}(y) = \frac{(1 - |w|^2)\, y + 2 (w \cdot y)\, w}{\sqrt{(1 - |w|^2)^2 + 4 (w \cdot y)^2}},
$$

smooth in $w$, also at $w = 0$ (the identity).

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
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..distributions.sphere import SEGMENTS, _check_segments, quaternion_to_matrix, rigid_domain, segment_slices
from ..domains import Sphere
from ..nn import MLP, _check_conditioner
from .base import Bijector

__all__ = [
    "Moebius",
    "DoubleMoebius",
    "RigidCoupling",
    "moebius",
    "double_moebius",
    "double_moebius_inverse",
    "circle_moebius",
    "gated_center",
]

#: The reference's defaults: the largest |w| and the gate offset that makes zero outputs nearly the identity.
SLACK, GATE = 0.95, 3.0


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


class _Centres(nn.Module):
    """Learnable unconstrained vectors and gates for `heads` maps, or a conditioner from a context."""

    def __init__(self, n: int, heads: int, context: int, hidden: Sequence[int], offset: float, init: float) -> None:
        super().__init__()
        self.n, self.heads, self.offset = n, heads, offset
        if context:
            self.net: nn.Module | None = MLP(context, heads * (n + 1), hidden, "silu", context=0)
            bias = torch.zeros(heads, n + 1)
            bias[:, :n] = init * torch.randn(heads, n)
            self.net.zero_last(bias.flatten())
            self.raw = None
        else:
            self.net = None
            raw = torch.zeros(heads, n + 1)
            raw[:, :n] = init * torch.randn(heads, n)  # w = 0 is a stationary point of the double map
            self.raw = nn.Parameter(raw)

    def forward(self, like: Tensor, batch: torch.Size, context: Tensor | None) -> Tensor:
        out = self.raw.to(like) if self.net is None else self.net(context).unflatten(-1, (self.heads, self.n + 1))
        out = out.expand(*batch, self.heads, self.n + 1)
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

    def _w(self, x: Tensor, context: Tensor | None) -> Tensor:
        return self.centres(x, x.shape[:-1], context).unbind(-2)

    def _map(self, p: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return moebius(p, w)

    def _unmap(self, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return moebius(y, -w)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        total = x.new_zeros(x.shape[:-1])
        for w in self._w(x, context):
            x, ladj = self._map(x, w)
            total = total + ladj
        return x, total

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        total = z.new_zeros(z.shape[:-1])
        for w in reversed(self._w(z, context)):
            z, ladj = self._unmap(z, w)
            total = total + ladj
        return z, total


class DoubleMoebius(Moebius):
    r"""Antipodally equivariant double Möbius maps $D_w$ of $S^{n-1}$, for unit quaternions.

    $D_w(-q) = -D_w(q)$ with equal log-determinants, so over a symmetric base the
    flow's density is symmetric and defines a density on SO(3) (see
    [`flowkit.distributions.sphere`][flowkit.distributions.sphere]). The inverse is
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

    def _map(self, p: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return double_moebius(p, w)

    def _unmap(self, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return double_moebius_inverse(y, w)


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


class RigidCoupling(Bijector):
    r"""Coupling across rigid bodies: some segments of a layout change, conditioned on all the others.

    The event is a flat vector laid out by `segments` (`"quaternion"`, `"angle"`,
    `"real"`; see [`rigid_domain`][flowkit.distributions.rigid_domain]). The
    segments listed in `transformed` are mapped, the others pass unchanged and,
    through a conditioner, set the maps' parameters:

    - a quaternion by `heads` double Möbius maps $D_{w_1}, \dots$ in turn
      ([`DoubleMoebius`][flowkit.bijectors.DoubleMoebius]);
    - an angle (a periodic position) by `heads` circle Möbius maps
      ([`circle_moebius`][flowkit.bijectors.sphere.circle_moebius]);
    - a real (auxiliary) coordinate by an affine map $x e^s + t$, $|s| <$ `clamp`.

    Centres come from gated outputs ([`gated_center`][flowkit.bijectors.sphere.gated_center];
    gate offset `gate` for quaternions, `position_gate` for angles). The
    conditioner sees the kept quaternions as rotation matrices (so flipping
    the sign of another body's quaternion changes nothing), angles as
    $(\cos, \sin)$ and real coordinates as they are, plus the context. Its last
    layer starts with zero weights, zero gates and affine parameters, and small random
    centre vectors (`init`): the double Möbius map depends on $w$ only through
    $w w^\top$ and $|w|^2$, so $w = 0$ (the identity) is a stationary point of any loss
    and training could not leave it; the layer starts close to the identity instead. The
    layer is antipodally equivariant in every quaternion.

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
            per angle, 2 per real, in the order of `transformed`).
        init: standard deviation of the initial centre vectors $v$ (0: exactly the identity).

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
    ) -> None:
        super().__init__()
        where = "RigidCoupling"
        self.segments = _check_segments(segments, where)
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
        self.slices = segment_slices(self.segments)
        self.domain = rigid_domain(self.segments)
        self.event_shape = torch.Size([self.domain.width])
        sizes = {"quaternion": self.heads * 5, "angle": self.heads * 3, "real": 2}
        self._sizes = [sizes[self.segments[i]] for i in transformed]
        n_in = sum(_FEATURES[self.segments[i]] for i in self.keep)
        n_out = sum(self._sizes)
        if conditioner is None:
            conditioner = MLP(n_in, n_out, hidden, activation, context=self.context_features)
        else:
            _check_conditioner(conditioner, n_in, n_out, self.context_features, False, where)
        self.conditioner = conditioner
        self.conditioner.zero_last(self._initial_outputs(init))

    def _initial_outputs(self, init: float) -> Tensor:
        """Small random centre vectors (zero gates, zero affine parameters): `w = 0` is a stationary point."""
        parts = []
        for i, size in zip(self.transformed, self._sizes, strict=True):
            kind = self.segments[i]
            if kind == "real":
                parts.append(torch.zeros(size))
                continue
            n = SEGMENTS[kind] if kind == "quaternion" else 2
            block = torch.zeros(self.heads, n + 1)
            block[:, :n] = init * torch.randn(self.heads, n)
            parts.append(block.flatten())
        return torch.cat(parts)

    def _params(self, x: Tensor, context: Tensor | None) -> list[Tensor]:
        h = self.conditioner(_embed(x, self.segments, self.slices, self.keep), context)
        return list(h.split(self._sizes, dim=-1))

    def _run(self, x: Tensor, context: Tensor | None, inverse: bool) -> tuple[Tensor, Tensor]:
        params = self._params(x, context)
        out = list(x.unbind(-1))
        batch = torch.broadcast_shapes(x.shape[:-1], params[0].shape[:-1]) if params else x.shape[:-1]
        total = x.new_zeros(batch)
        for i, theta in zip(self.transformed, params, strict=True):
            kind, sl = self.segments[i], self.slices[i]
            c = x[..., sl].expand(*batch, SEGMENTS[kind])
            if kind == "real":
                shift, raw = theta.unbind(-1)
                s = self.clamp * torch.tanh(raw / self.clamp)
                y = (c[..., 0] - shift) * torch.exp(-s) if inverse else c[..., 0] * torch.exp(s) + shift
                total = total + (-s if inverse else s)
                out[sl.start] = y
                continue
            n = 4 if kind == "quaternion" else 2
            centres = theta.unflatten(-1, (self.heads, n + 1))
            offset = self.gate if kind == "quaternion" else self.position_gate
            ws = gated_center(centres[..., :n], centres[..., n], offset).unbind(-2)
            y = c if kind == "quaternion" else c[..., 0]
            for w in reversed(ws) if inverse else ws:
                if kind == "quaternion":
                    y, ladj = double_moebius_inverse(y, w) if inverse else double_moebius(y, w)
                else:
                    y, ladj = circle_moebius(y, -w if inverse else w)
                total = total + ladj
            if kind == "quaternion":
                out[sl] = list(y.unbind(-1))
            else:
                out[sl.start] = y
        out = [o.expand(batch) for o in out]
        return torch.stack(out, dim=-1), total

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(x, context, inverse=False)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(z, context, inverse=True)

    def extra_repr(self) -> str:
        return f"segments={list(self.segments)}, transformed={self.transformed}, heads={self.heads}"
