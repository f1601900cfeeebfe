r"""Monotonic networks as elementwise transformers: deep sigmoidal flows (NAF), integrals of positive networks (UMNN).

**Deep sigmoidal flow** ([`MonotonicMLP`][flowkit.transformers.MonotonicMLP], Huang et al. 2018). One
sigmoidal layer of `H` units with slopes $a_j > 0$, offsets $b_j$ and softmax weights $w_j$ is

$$
y = \sigma^{-1}\Big(\sum_{j=1}^H w_j\, \sigma(a_j x + b_j)\Big), \qquad
\frac{dy}{dx} = \frac{\sum_j w_j a_j\, \sigma(u_j)\,\sigma(-u_j)}{p\,(1 - p)},
$$

with $u_j = a_j x + b_j$ and $p = \sum_j w_j \sigma(u_j)$: a positive-weight network of one
input and one output, strictly increasing, onto the real line, with linear tails (slope
$\min_j a_j$ far out). Every term is evaluated in log space, $\log p = \mathrm{logsumexp}_j(\log w_j +
\log\sigma(u_j))$, $\log(1 - p) = \mathrm{logsumexp}_j(\log w_j + \log\sigma(-u_j))$, so $y = \log p - \log(1 - p)$
and $\log y'$ are accurate far into the tails. `layers` such layers are composed (a deep sigmoidal
flow whose layers are joined through one unit); the log-derivatives add.

*Inverse.* Since $\min_j u_j \le \sigma^{-1}(p) \le \max_j u_j$, the root of $y(x) = v$ lies in the
exact bracket $[\min_j (v - b_j)/a_j,\ \max_j (v - b_j)/a_j]$; each layer is inverted (last layer
first) by safeguarded Newton on that bracket ([`monotone_inverse`][flowkit.root_finding.monotone_inverse]),
with the implicit derivatives $\partial x/\partial v = 1/y'$ and
$\partial x / \partial\theta = -\partial_\theta y / y'$.

**Unconstrained monotonic network** ([`UnconstrainedMonotonic`][flowkit.transformers.UnconstrainedMonotonic],
Wehenkel & Louppe 2019). The map is the integral of a positive function built from a free network,

$$
y = \beta + \int_0^x \hat g(t)\,dt, \qquad \log g(t) = L \tanh(s(t) / L), \qquad
s(t) = d + \sum_{k=1}^H v_k \tanh(w_k t + c_k),
$$

whose weights $w, c, v, d$ (and the offset $\beta$) are free: positivity comes from the exponential,
not from constrained weights. The integral is taken *exactly* of $\hat g$, the interpolant of $g$ that is
piecewise exponential between fixed nodes: $\log g$ is evaluated on the grid $t_j = jh$,
$h = B / \text{nodes}$, $|j| \le \text{nodes}$, and interpolated linearly in between, so on the cell
$[t_k, t_{k+1}]$ with $x = t_k + s h$, $s \in [0, 1]$, and $\ell_j = \log g(t_j)$,

$$
\log \hat g(x) = \ell_k + s\,(\ell_{k+1} - \ell_k), \qquad
y(x) = Y_k + h\, s\, \frac{\hat g(x) - g(t_k)}{\log\hat g(x) - \ell_k}, \qquad
Y_k = \beta + \sum_{\text{cells between } 0 \text{ and } t_k} \pm\, h\,\frac{g(t_{j+1}) - g(t_j)}{\ell_{j+1} - \ell_j}
$$

(the logarithmic means evaluated as $e^{\max} (1 - e^{-|\Delta|}) / |\Delta|$, so nothing overflows). Outside the
window $[-B, B]$ the map is linear with the slope $g(\pm B)$.

*Monotone by construction.* Every cell integral is positive and the partial integral of the current cell
grows with $s$, whatever the parameters: $y$ is strictly increasing with derivative $\hat g(x) \ge e^{-L}$.
The log-derivative is exact for the map as computed, $\log y' = \log\hat g(x)$ (autograd's derivative of
the computed $y$; a quadrature rule whose nodes move with $x$ is not monotone for rough $g$). $\hat g$
resolves $g$ at the grid spacing $h$: the interpolation error of $\log g$ is at most $h^2 \max|(\log g)''| / 8$.

*Inverse* (exact, no iteration). The node values $Y_j$ are sorted, so the cell of $v$ is found by counting
the $Y_j \le v$; in the cell, $y = v$ solves in closed form, from the end of the cell where $\hat g$ is
larger ($\hat g(t) = g_\text{end} e^{-|\Delta| u}$ at a distance $u h$ from it, $|\Delta| = |\ell_{k+1} - \ell_k|$):
with $R$ the part of the cell's integral between that end and $x$, $\rho = R / (h\, g_\text{end})$,

$$
u = -\frac{\log(1 - |\Delta| \rho)}{|\Delta|} \in [0, 1],
$$

and beyond the window the tails are linear. Gradients flow through the closed form by autograd.

*Tolerance of the inverses.* NAF's solves run a fixed number of safeguarded Newton steps
(`iterations`, default 60) and are then checked ([`check_converged`][flowkit.root_finding.check_converged]:
a residual within $\tau (\max(1, |y|) + y' \max(1, |x|))$, $\tau = 2^{10}\varepsilon$, or
[`ConvergenceError`][flowkit.root_finding.ConvergenceError]). The round trip is limited by conditioning, not by
the solver: $x$ is known to about $\varepsilon \max(1, |y|) / y'(x)$, large where the map is flat (in float64
for parameters of unit scale, within $10^{-10}$ of $\max(1, |x|)$; in float32 within $10^{-5}$ only where
$y' \gtrsim 10^{-1}$). UMNN's inverse is closed form: the same conditioning bound, with no solver error on top.

References:
    Huang, Krueger, Lacoste & Courville, *Neural Autoregressive Flows*, ICML 2018 (arXiv:1804.00779);
    Wehenkel & Louppe, *Unconstrained Monotonic Neural Networks*, NeurIPS 2019 (arXiv:1908.05164).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_number
from ..root_finding import monotone_inverse
from .base import Transformer

__all__ = ["MonotonicMLP", "UnconstrainedMonotonic"]

#: The smallest slope `a_j` of a sigmoidal unit (added to a softplus).
_MIN_SLOPE = 1e-3


def _check_iterations(iterations: int, where: str) -> int:
    return check_number(iterations, "iterations", where=where, integer=True, low=1, high=10_000)


class MonotonicMLP(Transformer):
    r"""Neural autoregressive transformer: a deep sigmoidal flow, a positive-weight network per element.

    Each of `layers` layers maps $x \mapsto \sigma^{-1}(\sum_j w_j \sigma(a_j x + b_j))$ with
    `hidden` units (see [the module][flowkit.transformers.monotonic] for the maths, the log-space
    evaluation and the bracketed inverse). Parameters per element: `3 * hidden * layers`, laid out
    layer by layer as `hidden` pre-softplus slopes ($a_j = 10^{-3} + \mathrm{softplus}(\hat a_j)$),
    `hidden` offsets $b_j$ and `hidden` weight logits ($w = \mathrm{softmax}(\hat w)$). Slopes 1,
    offsets 0 and equal weights give the identity; `identity_params` spreads the offsets over
    `[-1, 1]` (a map close to the identity) so that the units start apart.

    The inverse is numerical: safeguarded Newton on an exact bracket, `iterations` steps per layer,
    checked to its residual tolerance (else [`ConvergenceError`][flowkit.root_finding.ConvergenceError]),
    with implicit gradients; the round trip is limited by conditioning (see the module).

    Arguments:
        hidden: sigmoidal units `H` per layer (at least 1).
        layers: number of composed sigmoidal layers (at least 1).
        iterations: safeguarded Newton steps of the inverse, per layer.

    Examples:
        >>> import torch
        >>> t = MonotonicMLP(hidden=4)
        >>> params = torch.randn(5, t.params_per_element)
        >>> x = torch.randn(5, dtype=torch.float64)
        >>> y, ladj = t(x, params.double())
        >>> back, _ = t.inverse(y, params.double())
        >>> bool(torch.allclose(back, x, atol=1e-10))
        True

    References:
        Huang, Krueger, Lacoste & Courville, *Neural Autoregressive Flows*, ICML 2018 (arXiv:1804.00779).
    """

    def __init__(self, hidden: int = 8, layers: int = 1, iterations: int = 60) -> None:
        super().__init__()
        self.hidden = check_number(hidden, "hidden", where="MonotonicMLP", integer=True, low=1)
        self.layers = check_number(layers, "layers", where="MonotonicMLP", integer=True, low=1)
        self.iterations = _check_iterations(iterations, "MonotonicMLP")
        self.params_per_element = 3 * self.hidden * self.layers

    def _units(self, params: Tensor) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
        """Per layer `(a, log a, b, log w)`, each of shape `(*S, H)`."""
        units = []
        for chunk in params.chunk(self.layers, dim=-1):
            raw_a, b, raw_w = chunk.chunk(3, dim=-1)
            a = F.softplus(raw_a) + _MIN_SLOPE
            units.append((a, torch.log(a), b, torch.log_softmax(raw_w, dim=-1)))
        return units

    @staticmethod
    def _layer(x: Tensor, unit: tuple[Tensor, Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """One sigmoidal layer at `x`: `(y, log dy/dx)`."""
        a, log_a, b, log_w = unit
        u = a * x.unsqueeze(-1) + b
        log_sig, log_sig_neg = F.logsigmoid(u), F.logsigmoid(-u)
        log_p = torch.logsumexp(log_w + log_sig, dim=-1)
        log_q = torch.logsumexp(log_w + log_sig_neg, dim=-1)
        log_slope = torch.logsumexp(log_w + log_a + log_sig + log_sig_neg, dim=-1)
        return log_p - log_q, log_slope - log_p - log_q

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        ladj = torch.zeros_like(x)
        for unit in self._units(params):
            x, log_slope = self._layer(x, unit)
            ladj = ladj + log_slope
        return x, ladj

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        ladj = torch.zeros_like(y)
        for unit in reversed(self._units(params)):
            a, _, b, _ = unit
            ends = (y.unsqueeze(-1) - b) / a
            low, high = ends.detach().amin(-1), ends.detach().amax(-1)

            def value(x: Tensor, unit: tuple[Tensor, Tensor, Tensor, Tensor] = unit) -> Tensor:
                return self._layer(x, unit)[0]

            def slope(x: Tensor, unit: tuple[Tensor, Tensor, Tensor, Tensor] = unit) -> Tensor:
                return self._layer(x, unit)[1].exp()

            y = monotone_inverse(value, slope, y, low, high, self.iterations, where="MonotonicMLP.inverse")
            ladj = ladj - self._layer(y, unit)[1]
        return y, ladj

    def identity_params(self) -> Tensor:
        """Parameters of a map close to the identity: slopes 1, equal weights, offsets spread over `[-1, 1]`.

        Equal offsets would give the identity exactly, but units that start equal get equal gradients
        and stay equal; spread offsets keep the units apart (the slope at 0 is then about 0.9).
        """
        layer = torch.zeros(3, self.hidden)
        layer[0] = math.log(math.expm1(1 - _MIN_SLOPE))  # softplus(.) + 1e-3 = 1
        if self.hidden > 1:
            layer[1] = torch.linspace(-1.0, 1.0, self.hidden)
        return layer.flatten().repeat(self.layers)

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, layers={self.layers}"


class UnconstrainedMonotonic(Transformer):
    r"""Unconstrained monotonic transformer (UMNN): the integral of a positive network, monotone by construction.

    $y = \beta + \int_0^x \hat g(t)\,dt$ where $\hat g$ interpolates $g = \exp(L \tanh(s / L))$,
    $s(t) = d + \sum_k v_k \tanh(w_k t + c_k)$ (a free network of `hidden` units), exponentially between
    the fixed nodes $t_j = j B / \text{nodes}$, $|j| \le$ `nodes` (see [the module][flowkit.transformers.monotonic]).
    The map is strictly increasing for every parameter value. Parameters per element: `3 * hidden + 2`,
    laid out as `hidden` input weights $w_k$, `hidden` offsets $c_k$, `hidden` output weights $v_k$, the
    bias $d$ and the offset $\beta$.
    Zero output weights, bias and offset give the identity (`identity_params`).

    The inverse is closed form, exact up to conditioning.

    Arguments:
        hidden: hidden units `H` of the integrand network (at least 1).
        nodes: grid cells on each side of 0 within the window: $g$ is evaluated at `2 nodes + 1` points,
            `B / nodes` apart (at least 1).
        bound: the half-width `B` of the window where the integrand varies: outside `[-B, B]` the map
            is linear with the slope at the window's end (as a spline's tails).
        clamp: the soft bound `L` on `|log g|` (positive, at most 80).
        iterations: unused (the inverse is closed form); kept so that saved configurations load.

    References:
        Wehenkel & Louppe, *Unconstrained Monotonic Neural Networks*, NeurIPS 2019 (arXiv:1908.05164).
    """

    def __init__(
        self, hidden: int = 8, nodes: int = 16, bound: float = 10.0, clamp: float = 7.0, iterations: int = 60
    ) -> None:
        super().__init__()
        self.hidden = check_number(hidden, "hidden", where="UnconstrainedMonotonic", integer=True, low=1)
        self.nodes = check_number(nodes, "nodes", where="UnconstrainedMonotonic", integer=True, low=1, high=1000)
        self.bound = check_number(bound, "bound", where="UnconstrainedMonotonic", positive=True, high=1e6)
        self.clamp = check_number(clamp, "clamp", where="UnconstrainedMonotonic", positive=True, high=80.0)
        self.iterations = _check_iterations(iterations, "UnconstrainedMonotonic")
        self.params_per_element = 3 * self.hidden + 2
        # The grid t_j = j h, j = -nodes..nodes, h = B / nodes (0 is a node: y(0) = beta exactly).
        steps = torch.arange(-self.nodes, self.nodes + 1, dtype=torch.float64)
        self.register_buffer("_grid", steps * (self.bound / self.nodes), persistent=False)

    def _split(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        h = self.hidden
        return params[..., :h], params[..., h : 2 * h], params[..., 2 * h : 3 * h], params[..., 3 * h], params[..., -1]

    def _log_integrand(self, t: Tensor, w: Tensor, c: Tensor, v: Tensor, d: Tensor) -> Tensor:
        """`log g(t)` for `t` of shape `(*S, M)` and parameters of shape `(*S, H)` (`d`: `(*S,)`)."""
        hidden = torch.tanh(w.unsqueeze(-2) * t.unsqueeze(-1) + c.unsqueeze(-2))
        s = d.unsqueeze(-1) + (hidden * v.unsqueeze(-2)).sum(-1)
        return self.clamp * torch.tanh(s / self.clamp)

    def _table(self, parts: tuple[Tensor, Tensor, Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """`(l, Y)`: `log g` at the `2 nodes + 1` grid points and the map's values there, each `(*S, 2 nodes + 1)`."""
        w, c, v, d, beta = parts
        grid = self._grid.to(w.dtype).expand(*w.shape[:-1], -1)
        log_g = self._log_integrand(grid, w, c, v, d)
        cells = (self.bound / self.nodes) * _log_mean_exp(log_g[..., :-1], log_g[..., 1:])
        right = torch.cumsum(cells[..., self.nodes :], dim=-1)
        left = -torch.cumsum(cells[..., : self.nodes].flip(-1), dim=-1).flip(-1)
        values = torch.cat([left, torch.zeros_like(beta).unsqueeze(-1), right], dim=-1) + beta.unsqueeze(-1)
        return log_g, values

    def _cell(self, k: Tensor, log_g: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The left node, `log g` at both ends and the map's value at the left end of cell `k` (a long tensor)."""
        index = k.unsqueeze(-1)
        start = self._grid.to(log_g.dtype)[k]
        ends = torch.gather(log_g, -1, torch.cat([index, index + 1], dim=-1))
        return start, ends[..., 0], ends[..., 1], torch.gather(values, -1, index).squeeze(-1)

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        log_g, values = self._table(self._split(params.expand(*x.shape, -1)))
        h = self.bound / self.nodes
        inside = x.clamp(-self.bound, self.bound)
        position = (inside + self.bound) / h
        k = position.detach().floor().clamp(0, 2 * self.nodes - 1).long()
        _, left, right, base = self._cell(k, log_g, values)
        s = position - k.to(x.dtype)
        log_slope = left + s * (right - left)
        y = base + h * s * _log_mean_exp(left, log_slope) + log_slope.exp() * (x - inside)
        return y, log_slope

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        log_g, values = self._table(self._split(params.expand(*y.shape, -1)))
        h = self.bound / self.nodes
        inside = torch.minimum(torch.maximum(y, values[..., 0]), values[..., -1])
        k = (values[..., 1:-1].detach() <= inside.detach().unsqueeze(-1)).sum(-1)
        start, left, right, base = self._cell(k, log_g, values)
        # Solve from the end of the cell where g is larger: g(t) = g_end exp(-|delta| u) at u cells from it.
        rising = right > left
        delta = (right - left).abs()
        cell = h * _log_mean_exp(left, right)
        rest = torch.where(rising, cell - (inside - base), inside - base).clamp_min(0)
        rho = rest / (h * torch.where(rising, right, left).exp())
        u = rho * _neg_log1m_rel(delta * rho)
        s = torch.where(rising, 1 - u, u).clamp(0, 1)
        log_slope = left + s * (right - left)
        return start + h * s + (y - inside) / log_slope.exp(), -log_slope

    def identity_params(self) -> Tensor:
        """The identity: zero output weights, bias and offset; input weights 1 and offsets over `[-3, 3]`.

        The input weights and offsets do not change the map while the output weights are zero; spread
        offsets keep the hidden units apart (units that start equal get equal gradients).
        """
        params = torch.zeros(self.params_per_element)
        params[: self.hidden] = 1.0
        if self.hidden > 1:
            params[self.hidden : 2 * self.hidden] = torch.linspace(-3.0, 3.0, self.hidden)
        return params

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, nodes={self.nodes}, bound={self.bound}, clamp={self.clamp}"


def _log_mean_exp(a: Tensor, b: Tensor) -> Tensor:
    r"""The logarithmic mean of $e^a$ and $e^b$, $(e^a - e^b) / (a - b)$ ($e^a$ at $a = b$), without overflow.

    Evaluated as $e^{\max(a, b)} \phi(|a - b|)$ with $\phi(\Delta) = (1 - e^{-\Delta}) / \Delta$ (a series
    below $10^{-4}$); its gradient is exact also at $a = b$.
    """
    gap = (a - b).abs()
    small = gap < 1e-4
    safe = torch.where(small, torch.ones_like(gap), gap)
    phi = torch.where(small, 1 - gap / 2 + gap * gap / 6, -torch.expm1(-safe) / safe)
    return torch.maximum(a, b).exp() * phi


def _neg_log1m_rel(z: Tensor) -> Tensor:
    r"""$-\log(1 - z) / z$ for $z \in [0, 1)$ (1 at 0; $z$ clamped below 1), a series below $10^{-4}$."""
    z = z.clamp(0, 1 - torch.finfo(z.dtype).eps)
    small = z < 1e-4
    safe = torch.where(small, torch.full_like(z, 0.5), z)
    return torch.where(small, 1 + z / 2 + z * z / 3, -torch.log1p(-safe) / safe)
