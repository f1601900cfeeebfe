r"""Smooth (C-infinity) monotone maps of the interval and the circle: mixtures of bump-function CDFs.

Splines are twice differentiable only piecewise, so the forces $-\nabla u_q$ of
a spline flow jump at the knots. The smooth normalizing flows of Köhler,
Krämer & Noé build their transformers from a smooth step instead. With the
ramp $\rho(t) = e^{\alpha(1 - t^{-\beta})}$ for $t > 0$ (zero otherwise),
the *bump CDF*

$$
\sigma(t) = \frac{\rho(t)}{\rho(t) + \rho(1 - t)}
= \mathrm{sigmoid}\!\big(\alpha\,[(1 - t)^{-\beta} - t^{-\beta}]\big), \qquad 0 < t < 1,
$$

rises from 0 at $t \le 0$ to 1 at $t \ge 1$, with all derivatives zero at both
ends, and is evaluated in log space (the sigmoid form, inputs clamped at
$10^{-6}$ from the ends, where $\rho$ underflows to zero exactly). With
$\alpha$ above the inflection value ($0.8657$ for $\beta = 1$, $0.3052$ for
$\beta = 2$) its density is unimodal.

**Interval** `[low, high]` (rescaled to $u \in [0, 1]$): component $k$ with
centre $\mu_k \in (0, 1)$ and scale $s_k = e^{\ell_k}$ is

$$
F_k(u) = \frac{\sigma(z_k(u)) - \sigma(z_k(0))}{\sigma(z_k(1)) - \sigma(z_k(0))},
\qquad z_k(u) = s_k (u - \mu_k) + \tfrac12,
$$

so $F_k(0) = 0$ and $F_k(1) = 1$ exactly.

**Circle** $[-\pi, \pi)$ (rescaled to $u \in [0, 1)$): with $s_k \ge 1$ the bump
fits in one period, and the lift $G(t) = \lfloor t\rfloor + \sigma(s_k\,(t - \lfloor t\rfloor))$
is smooth with $G(t + 1) = G(t) + 1$; component $k$ is
$F_k(u) = G(u - m_k) + \mu_k - \tfrac12$ with $m_k = \mu_k - 1/(2 s_k)$: the bump is
centred at $\mu_k$, $F_k(\mu_k) = \mu_k$, and $F_k$ is periodic in $\mu_k$ as well
(evenly spread centres then give no rotation). The output is
taken modulo the period, so the map is a smooth circle diffeomorphism with no
fixed point imposed.

**Mixture and minimum density**: with softmax weights $w_k$ and the mix-in
$c \in [c_\min, 1)$,

$$
f(u) = (1 - c) \sum_k w_k F_k(u) + c\,u, \qquad
\log f'(u) = \mathrm{logaddexp}\big(\log(1 - c) + \mathrm{logsumexp}_k(\log w_k + \log F_k'(u)),\ \log c\big),
$$

so $f' \ge c > 0$ everywhere. Log-scales $\ell_k$, sharpness $\alpha_k$ and the
mix-in are bounded by sigmoids; centres by a sigmoid on the interval and modulo 1
on the circle.

**Inverse**: no closed form. A vectorised root finder with a fixed number of
steps (no host synchronisation, so it compiles): bracketing on a grid of
`grid` cells, `bisection_steps` halvings of the bracket, then `newton_steps`
safeguarded Newton steps (a step that leaves the bracket is replaced by its
midpoint). The defaults reach the float64 round trip to ~1e-12 and float32 to
its rounding (see `bench/smooth.py`). Gradients of the root $u(v, \theta)$
come from the inverse-function theorem in a custom autograd function,
$\partial u / \partial v = 1 / f'(u)$ and $\partial u / \partial \theta = -\partial_\theta f / f'$,
written with differentiable operations on the saved root, so that second
derivatives (forces of the sampling direction, double backward) are exact too;
the inverse's log-derivative $-\log f'(u(v, \theta))$ is differentiated through
the root.

References:
    Köhler, Krämer & Noé, *Smooth normalizing flows*, NeurIPS 2021 (arXiv:2110.00351).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_number
from ..domains import Circle, Interval
from ..root_finding import implicit_newton_step as implicit_newton_step  # the old home of the root finders
from ..root_finding import solve_monotone
from ..utils import broadcast_shapes
from .base import Transformer

# The root finders live in `flowkit.root_finding`; imported here for code that imported them from here.
__all__ = ["SmoothMixture", "bump_cdf"]

#: Arguments of the ramp are clamped this far from the ends of `[0, 1]`; the ramp of the
#: clamped point is zero to double precision for every allowed `alpha`.
_EPS = 1e-6

#: The sharpness above which the bump density is unimodal, by the ramp's power `beta`
#: (bgflow's constants: the inflection point of the ramp sits at the centre).
_UNIMODAL_ALPHA = {1: 0.8656721, 2: 0.3052033}


def _step(t: Tensor, alpha: Tensor, power: int, density: bool = True) -> tuple[Tensor, Tensor | None]:
    """`(sigma(t), log sigma'(t))` with `t` and `1 - t` clamped at `_EPS` (the log only when `density`)."""
    left = t.clamp_min(_EPS)
    right = (1 - t).clamp_min(_EPS)
    if power == 1:
        inv_left, inv_right = torch.reciprocal(left), torch.reciprocal(right)
    else:
        inv_left, inv_right = left.pow(-power), right.pow(-power)
    a = alpha * (inv_right - inv_left)
    if not density:
        return torch.sigmoid(a), None
    # log sigma' = log sigmoid(a) + log sigmoid(-a) + log(alpha beta) + log(t^-(beta+1) + (1-t)^-(beta+1)).
    log_pdf = (
        F.logsigmoid(a)
        + F.logsigmoid(-a)
        + torch.log(alpha * power)
        + torch.log(inv_left * torch.reciprocal(left) + inv_right * torch.reciprocal(right))
    )
    return torch.sigmoid(a), log_pdf


def bump_cdf(t: Tensor, alpha: Tensor | float, power: int = 1) -> tuple[Tensor, Tensor]:
    r"""The smooth step $\sigma(t)$ and the log of its derivative, elementwise.

    $\sigma(t) = \mathrm{sigmoid}(a)$ with $a = \alpha[(1 - t)^{-\beta} - t^{-\beta}]$ and
    $\log\sigma'(t) = \log\mathrm{sigmoid}(a) + \log\mathrm{sigmoid}(-a) + \log(\alpha\beta)
    + \log\big(t^{-\beta-1} + (1 - t)^{-\beta-1}\big)$, with $t$ and $1 - t$ clamped
    at $10^{-6}$: outside $(0, 1)$ the step is 0 or 1 and its log-derivative a very
    negative finite number (the derivative underflows to zero).

    Arguments:
        t: points.
        alpha: sharpness $\alpha > 0$ (broadcast with `t`).
        power: the ramp's power $\beta$ (1 or 2).

    Returns:
        `(sigma(t), log sigma'(t))`.

    Examples:
        >>> import torch
        >>> cdf, log_pdf = bump_cdf(torch.tensor([-1.0, 0.5, 2.0]), 1.0)
        >>> cdf.tolist()
        [0.0, 0.5, 1.0]
    """
    cdf, log_pdf = _step(t, torch.as_tensor(alpha, dtype=t.dtype, device=t.device), power)
    assert log_pdf is not None
    return cdf, log_pdf


def _logaddexp(a: Tensor, b: Tensor) -> Tensor:
    """`log(e^a + e^b)` shifted by the detached maximum.

    torch's `logaddexp` has a double backward that is NaN when the arguments differ by
    more than ~700 (here: a density that underflows next to the minimum density).
    """
    m = torch.maximum(a, b).detach()
    return m + torch.log(torch.exp(a - m) + torch.exp(b - m))


class _Constrained(NamedTuple):
    """The constrained parameters of a [`SmoothMixture`][flowkit.transformers.SmoothMixture] and constants of its map.

    Per component `(..., K)`: log-weights and weights, scales `s` and log-scales, sharpness
    `alpha`, and two constants: on the interval `sigma(z(0))` and `sigma(z(1)) - sigma(z(0))`
    (the renormalisation), on the circle the lift's offset `m` and `1/(2s) - 1/2`. Per element
    `(...,)`: `log c`, `log(1 - c)` and `1 - c`.
    """

    log_w: Tensor
    w: Tensor
    mu: Tensor
    s: Tensor
    log_s: Tensor
    alpha: Tensor
    first: Tensor
    second: Tensor
    log_c: Tensor
    log_1mc: Tensor
    one_m_c: Tensor

    def gridded(self) -> _Constrained:
        """The parameters with a grid dimension before the component dimension (scalars get a trailing one)."""
        return _Constrained(*(p.unsqueeze(-2) for p in self[:8]), *(p.unsqueeze(-1) for p in self[8:]))


class _Inverse(torch.autograd.Function):
    r"""The root $u(v, \theta)$ of $f(u; \theta) = v$, with gradients by the inverse-function theorem.

    The backward pass re-evaluates $f$ at the saved root through aliases of the
    root and the parameters, so that $\partial_\theta f$ is a partial derivative
    (the root's own graph is not followed) while the result keeps its graph to
    the root and the parameters: double backward is exact.
    """

    @staticmethod
    def forward(ctx: Any, v: Tensor, params: Tensor, transformer: SmoothMixture) -> Tensor:  # type: ignore[override]
        u = transformer._solve(v, params)
        ctx.transformer = transformer
        ctx.save_for_backward(u, params)
        return u

    @staticmethod
    def backward(ctx: Any, g_u: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        u, params = ctx.saved_tensors
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            if create:
                u_alias, p_alias = u.view_as(u), params.view_as(params)
            else:
                u_alias, p_alias = u.detach(), params.detach().requires_grad_(True)
            f, log_df = ctx.transformer._unit_map(u_alias, p_alias)
            w = g_u * torch.exp(-log_df)
            (g_p,) = torch.autograd.grad(f, p_alias, w, create_graph=create)
        return w, -g_p, None


class SmoothMixture(Transformer):
    r"""Smooth mixture of bump-function CDFs on an interval or on the circle (smooth normalizing flows).

    A C-infinity monotone map (see the module [`flowkit.transformers.smooth`][flowkit.transformers.smooth]
    for the maths): on the interval `[low, high]` it fixes both ends exactly; on the circle
    `[-pi, pi)` it is periodic, `f(x + 2 pi) = f(x) + 2 pi`, and its output is wrapped.
    Parameters per element: `4K + 1`, laid out as `K` weight logits, `K` centres, `K`
    log-scales, `K` sharpness logits and one minimum-density logit. The forward
    direction is closed form; the inverse is a fixed-step root finder with gradients
    by the inverse-function theorem (second derivatives included), so both directions
    train and forces of either are smooth.

    Inputs outside the interval are clamped to it (the map is only a bijection of the
    interval); angles may be any real number (they are taken modulo $2\pi$).

    Arguments:
        components: number of mixture components `K`.
        circular: act on the circle `[-pi, pi)` instead of an interval.
        low: lower end of the interval (not for the circle).
        high: upper end of the interval (not for the circle).
        power: the ramp's power $\beta$, 1 or 2.
        min_density: the smallest mix-in $c_\min$ of the identity, in `(0, 1)`; `f' >= c_min`.
        min_scale: smallest component scale $s_k$ (at least 1 on the circle, where a bump must
            fit in one period).
        max_scale: largest component scale.
        max_sharpness: the sharpness $\alpha$ of each component ranges over $(\alpha_u, \alpha_u + m)$
            with $m$ = `max_sharpness` and $\alpha_u$ the unimodal bound (0.8657 for `power=1`, 0.3052 for
            `power=2`).
        grid: bracketing cells of the inverse.
        bisection_steps: bisection steps of the inverse.
        newton_steps: Newton steps of the inverse.

    Examples:
        >>> import torch
        >>> t = SmoothMixture(components=4)
        >>> x = torch.rand(3, 2, dtype=torch.float64)
        >>> params = torch.randn(3, 2, t.params_per_element, dtype=torch.float64)
        >>> y, ladj = t(x, params)
        >>> x_back, ladj_inv = t.inverse(y, params)
        >>> bool((x_back - x).abs().max() < 1e-10), bool((ladj + ladj_inv).abs().max() < 1e-10)
        (True, True)

    References:
        Köhler, Krämer & Noé, *Smooth normalizing flows*, NeurIPS 2021 (arXiv:2110.00351).
    """

    def __init__(
        self,
        components: int = 8,
        circular: bool = False,
        low: float | None = None,
        high: float | None = None,
        power: int = 1,
        min_density: float = 1e-3,
        min_scale: float | None = None,
        max_scale: float = 50.0,
        max_sharpness: float = 3.0,
        grid: int = 4,
        bisection_steps: int = 14,
        newton_steps: int = 4,
    ) -> None:
        super().__init__()
        where = "SmoothMixture"
        self.components = check_number(components, "components", where=where, integer=True, low=1)
        self.circular = bool(circular)
        if self.circular:
            if low is not None or high is not None:
                raise ValueError("SmoothMixture: the circle is [-pi, pi); low and high are for intervals only")
            self.low, self.high = -math.pi, math.pi
            self.domain = Circle()
        else:
            self.low = 0.0 if low is None else check_number(low, "low", where=where)
            self.high = 1.0 if high is None else check_number(high, "high", where=where)
            if not self.high > self.low:
                raise ValueError(f"SmoothMixture: need low < high, got low={self.low}, high={self.high}")
            self.domain = Interval(self.low, self.high)
        if power not in _UNIMODAL_ALPHA:
            raise ValueError(f"SmoothMixture: power must be 1 or 2, got {power!r}")
        self.power = int(power)
        self.min_density = check_number(min_density, "min_density", where=where, positive=True, below=1)
        if min_scale is None:
            min_scale = 1.0 if self.circular else 0.05
        self.min_scale = check_number(min_scale, "min_scale", where=where, positive=True, low=1.0 if circular else 0)
        self.max_scale = check_number(max_scale, "max_scale", where=where, low=self.min_scale, high=1e4)
        self.max_sharpness = check_number(max_sharpness, "max_sharpness", where=where, positive=True, high=100)
        self.grid = check_number(grid, "grid", where=where, integer=True, low=1)
        self.bisection_steps = check_number(bisection_steps, "bisection_steps", where=where, integer=True, low=0)
        self.newton_steps = check_number(newton_steps, "newton_steps", where=where, integer=True, low=0)
        self.params_per_element = 4 * self.components + 1

    # ---- parameters

    def _constrain(self, params: Tensor) -> _Constrained:
        k = self.components
        logits, centres, log_scales, sharpness, mix = params.split([k, k, k, k, 1], dim=-1)
        lo, hi = math.log(self.min_scale), math.log(self.max_scale)
        log_s = lo + (hi - lo) * torch.sigmoid(log_scales)
        s = torch.exp(log_s)
        alpha = _UNIMODAL_ALPHA[self.power] + self.max_sharpness * torch.sigmoid(sharpness)
        if self.circular:
            mu = centres - torch.floor(centres)  # the map is periodic in the centres
            first, second = mu - 0.5 / s, 0.5 / s - 0.5
        else:
            mu = torch.sigmoid(centres)
            # sigma(z(0)) and sigma(z(1)) - sigma(z(0)), z(u) = s (u - mu) + 1/2, computed as z(u) is,
            # so that F(0) = 0 and F(1) = 1 exactly; sigma(z1) >= 1/2 >= sigma(z0): no cancellation.
            ends = s * (torch.stack([torch.zeros_like(mu), torch.ones_like(mu)]) - mu) + 0.5
            step = _step(ends, alpha, self.power, density=False)[0]
            first, second = step[0], step[1] - step[0]
        # c = c_min + (1 - c_min) sigmoid(m): log c and log(1 - c) without cancellation.
        mix = mix.squeeze(-1)
        c_min = self.min_density
        log_c = _logaddexp(torch.full_like(mix, math.log(c_min)), math.log1p(-c_min) + F.logsigmoid(mix))
        log_1mc = math.log1p(-c_min) + F.logsigmoid(-mix)
        log_w = torch.log_softmax(logits, dim=-1)
        return _Constrained(log_w, torch.exp(log_w), mu, s, log_s, alpha, first, second, log_c, log_1mc, log_1mc.exp())

    def identity_params(self) -> Tensor:
        """Parameters of a map close to the identity (the mixture cannot be the identity exactly).

        Equal weights, centres evenly spread, the smallest scales (nearly linear pieces on the
        interval; on the circle the evenly shifted bumps sum to a nearly uniform density) and
        an even mix-in: `|f(x) - x|` is below `2e-3` of the period or interval.
        """
        k = self.components
        centres = (torch.arange(k, dtype=torch.float64) + 0.5) / k
        centres = centres if self.circular else torch.logit(centres)
        return torch.cat([torch.zeros(k), centres.float(), torch.full((k,), -4.0), torch.zeros(k), torch.zeros(1)])

    # ---- the map on the unit interval / circle

    def _components(self, u: Tensor, p: _Constrained, density: bool) -> tuple[Tensor, Tensor | None]:
        """`(F_k(u) - u, log F_k'(u))` for every component, `(..., K)` (the log only when `density`)."""
        u = u.unsqueeze(-1)
        if self.circular:
            t = u - p.first  # u - m
            n = torch.floor(t)
            cdf, log_pdf = _step(p.s * (t - n), p.alpha, self.power, density)
            # F_k(u) - u = G(t) - t + 1/(2s) - 1/2: periodic, zero at the centre u = mu.
            return (n - t) + cdf + p.second, None if log_pdf is None else log_pdf + p.log_s
        cdf, log_pdf = _step(p.s * (u - p.mu) + 0.5, p.alpha, self.power, density)
        offset = (cdf - p.first) / p.second - u
        return offset, None if log_pdf is None else log_pdf + p.log_s - torch.log(p.second)

    def _mixture(self, u: Tensor, p: _Constrained, density: bool = True) -> tuple[Tensor, Tensor | None]:
        """`(f(u), log f'(u))` on the unit interval (or circle, lifted), elementwise.

        `f(u) = u + (1 - c) sum_k w_k (F_k(u) - u)`: the ends of the interval are exact.
        """
        offset, log_pdf = self._components(u, p, density)
        f = u + p.one_m_c * (p.w * offset).sum(-1)
        if log_pdf is None:
            return f, None
        return f, _logaddexp(p.log_1mc + torch.logsumexp(p.log_w + log_pdf, dim=-1), p.log_c)

    def _unit_map(self, u: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        f, log_df = self._mixture(u, self._constrain(params))
        assert log_df is not None
        return f, log_df

    def _solve(self, v: Tensor, params: Tensor) -> Tensor:
        p = self._constrain(params)
        gridded = p.gridded()

        def fn(u: Tensor, cells: int, slope: bool) -> tuple[Tensor, Tensor | None]:
            f, log_df = self._mixture(u, gridded if cells else p, density=slope)
            return f, None if log_df is None else torch.exp(log_df)

        return solve_monotone(fn, v, self.grid, self.bisection_steps, self.newton_steps, "SmoothMixture.inverse")

    # ---- the transformer interface

    def _to_unit(self, x: Tensor) -> Tensor:
        return (x - self.low) / (self.high - self.low)

    def _from_unit(self, u: Tensor) -> Tensor:
        return self.low + (self.high - self.low) * u

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        u = self._to_unit(x)
        if not self.circular:
            u = u.clamp(0, 1)
        f, log_df = self._unit_map(u, params)
        if self.circular:
            f = f - torch.floor(f)
        return self._from_unit(f), log_df

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        v = self._to_unit(y)
        if self.circular:
            # The root lies in [0, 1): find the lift of v in [f(0), f(0) + 1).
            start = self._unit_map(torch.zeros_like(v), params)[0]
            shifted = v - start
            v = start + (shifted - torch.floor(shifted))
        else:
            v = v.clamp(0, 1)
        batch = broadcast_shapes(v.shape, params.shape[:-1])
        params = params.expand(*batch, params.shape[-1])
        u = _Inverse.apply(v.expand(batch), params, self)
        _, log_df = self._unit_map(u, params)
        if self.circular:
            u = u - torch.floor(u)
        return self._from_unit(u), -log_df

    def extra_repr(self) -> str:
        domain = "circle" if self.circular else f"[{self.low}, {self.high}]"
        return f"components={self.components}, {domain}"
