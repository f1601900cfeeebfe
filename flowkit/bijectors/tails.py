r"""Bijectors for heavy-tailed data: mTAF's block-triangular linear layer and COMET's fitted marginal CDFs.

[`TailLU`][flowkit.bijectors.TailLU] mixes features without letting heavy-tailed ones leak into
light-tailed ones; [`MarginalTailCDF`][flowkit.bijectors.MarginalTailCDF] maps each feature
through a fixed, fitted CDF with a kernel density body and generalized Pareto tails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._validation import check_number
from ..transformers.rational_quadratic import spline_through_knots
from .base import Bijector
from .linear import _check_overflow, _loaded, _TriangularFactors

__all__ = ["TailLU", "MarginalTailCDF", "MARGINAL_OUTPUTS"]


class TailLU(_TriangularFactors):
    r"""Block lower-triangular linear layer that keeps heavy-tailed features out of light-tailed ones (mTAF).

    With the first `light` features light-tailed and the rest heavy-tailed,

    $$
    z = W x + b, \qquad W = \begin{pmatrix} W_1 & 0 \\ W_2 & W_3 \end{pmatrix} = L U,
    $$

    where $L$ is unit lower triangular and $U$ is block-diagonal and upper triangular with a positive
    diagonal $e^{s}$: $W_1 = L_{11} U_1$ and $W_3 = L_{22} U_3$ are LU-parametrised and
    $W_2 = L_{21} U_1$ is any matrix. The light outputs depend on the light inputs only
    ($\partial z_{\text{light}} / \partial x_{\text{heavy}} = 0$), so a light-tailed base marginal
    stays light through the flow.
    $\log|\det W| = \log|\det W_1| + \log|\det W_3| = \sum_i s_i$; the inverse is two triangular
    solves. The layer starts at the identity ($W_2 = 0$).

    Arguments:
        features: number of features `D`.
        light: number `l` of light-tailed features, the first ones (`0 <= l <= D`).
        bias: whether to learn `b`.

    Examples:
        >>> import torch, flowkit
        >>> layer = flowkit.bijectors.TailLU(4, light=2)
        >>> z, ladj = layer(torch.randn(3, 4))

    References:
        Laszkiewicz, Lederer & Fischer, *Marginal Tail-Adaptive Normalizing Flows*, ICML 2022 (arXiv:2206.10311).
    """

    def __init__(self, features: int, light: int, bias: bool = True) -> None:
        super().__init__()
        features = check_number(features, "features", where="TailLU", integer=True, low=1)
        self.light = check_number(light, "light", where="TailLU", integer=True, low=0, high=features)
        self.event_shape = torch.Size([features])
        groups = torch.arange(features) >= self.light
        same_group = groups[:, None] == groups[None, :]
        self.register_buffer("_lower_mask", torch.tril(torch.ones(features, features), -1), persistent=False)
        self.register_buffer(
            "_upper_mask", torch.triu(torch.ones(features, features), 1) * same_group, persistent=False
        )
        self.register_buffer("_eye", torch.eye(features), persistent=False)
        self.lower = nn.Parameter(torch.zeros(features, features))
        self.upper = nn.Parameter(torch.zeros(features, features))
        self.log_diag = nn.Parameter(torch.zeros(features))
        self.bias = nn.Parameter(torch.zeros(features)) if bias else None
        self.permutation = None  # P = I

    def _factors(self) -> tuple[Tensor, Tensor]:
        lower = self.lower * self._lower_mask + self._eye
        upper = self.upper * self._upper_mask + torch.diag(self.log_diag.exp())
        return lower, upper

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        loaded = _loaded(self, state_dict, prefix, ("lower", "upper", "log_diag", "bias"))
        dtype = self.log_diag.dtype
        s = loaded.get("log_diag")
        low, high = math.log(torch.finfo(dtype).tiny), math.log(torch.finfo(dtype).max)
        if s is not None and not bool(((s > low) & (s < high)).all()):
            raise ValueError(f"TailLU: the loaded log_diag must lie in ({low:.4g}, {high:.4g}) for exp() in {dtype}")
        if {"lower", "upper", "log_diag"} <= set(loaded):
            masks = self._lower_mask.to("cpu", torch.float64), self._upper_mask.to("cpu", torch.float64)
            lower = (loaded["lower"] * masks[0]).abs() + torch.eye(len(s), dtype=torch.float64)
            upper = (loaded["upper"] * masks[1]).abs() + torch.diag(s.exp())
            _check_overflow(self, lower @ (upper @ torch.ones(len(s), dtype=torch.float64)), dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, light={self.light}"


#: The maps after the marginal CDF `u`: the Gaussian quantile `z = Phi^{-1}(u)` or `z = logit(u)`.
MARGINAL_OUTPUTS = ("normal", "logit")

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _gpd_hazard(y: Tensor, xi: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
    r"""A GPD's cumulative hazard $H = -\log(1 - G(y)) = \log(1 + \xi y/\sigma)/\xi$, and $\log(1 + \xi y/\sigma)$.

    $\xi \to 0$ gives the exponential's $y / \sigma$ (used below $\xi = 10^{-6}$).
    """
    t = torch.log1p(xi * y / sigma)
    small = xi < 1e-6
    return torch.where(small, y / sigma, t / torch.where(small, 1.0, xi)), t


def _gpd_quantile(log_q: Tensor, xi: Tensor, sigma: Tensor) -> Tensor:
    r"""The excess $y$ of GPD survival $q$: $\sigma (q^{-\xi} - 1) / \xi$ ($-\sigma \log q$ at $\xi \to 0$).

    Survivals so small that the excess would pass a quarter of the largest float
    (a latent far in a heavy tail) are raised to the one that reaches it, so the
    excess, its density and their gradients stay finite.
    """
    small = xi < 1e-6
    log_big = math.log(torch.finfo(log_q.dtype).max / 4)
    safe_xi = torch.where(small, 1.0, xi)
    # log(1 + xi * big / sigma), computed in logs so that it cannot overflow
    log_growth = torch.logaddexp(torch.zeros_like(xi), torch.log(safe_xi) + log_big - torch.log(sigma))
    floor = torch.where(small, -torch.exp(log_big - torch.log(sigma)), -log_growth / safe_xi)
    log_q = torch.maximum(log_q, floor)
    return torch.where(small, -sigma * log_q, sigma * torch.expm1(-xi * log_q) / torch.where(small, 1.0, xi))


#: Below this, `_log_ndtr` uses the asymptotic series (torch's gradient of `log_ndtr` is wrong or NaN far out).
_NDTR_SERIES_FROM = -40.0


def _log_ndtr(z: Tensor) -> Tensor:
    r"""$\log\Phi(z)$ with finite, accurate gradients for every finite `z`.

    Below $z = -40$ it is the asymptotic series
    $-z^2/2 - \log(-z) - \tfrac12\log 2\pi + \log(1 - z^{-2} + 3z^{-4} - 15z^{-6} + 105z^{-8} - 945z^{-10})$
    (error below 1e-15 there), whose autograd gradient is finite; `torch.special.log_ndtr`'s
    gradient is off by 5% at $z = -1000$ and NaN at $z = -10^{30}$ in float32.
    """
    far = z < _NDTR_SERIES_FROM
    near_z = torch.where(far, _NDTR_SERIES_FROM, z)
    far_z = torch.where(far, z, _NDTR_SERIES_FROM)
    r = 1 / (far_z * far_z)
    series = 1 + r * (-1 + r * (3 + r * (-15 + r * (105 - 945 * r))))
    tail = -0.5 * far_z * far_z - torch.log(-far_z) - _HALF_LOG_2PI + torch.log(series)
    return torch.where(far, tail, torch.special.log_ndtr(near_z))


def _normal_quantile_of_log(log_p: Tensor) -> Tensor:
    r"""$\Phi^{-1}(e^{l})$ for $l \le \log \frac12$, also where $e^{l}$ underflows (asymptotics, two Newton steps)."""
    floor = math.log(torch.finfo(log_p.dtype).tiny) + 10
    direct = torch.special.ndtri(log_p.clamp_min(floor).exp())
    l = log_p.clamp_max(floor)  # noqa: E741 - the usual name of a log-probability
    z = -torch.sqrt(-2 * l - torch.log(-2 * l) - math.log(2 * math.pi))
    for _ in range(2):
        log_cdf = _log_ndtr(z)
        z = z - (log_cdf - l) * torch.exp(log_cdf + 0.5 * z * z + _HALF_LOG_2PI)
    return torch.where(log_p > floor, direct, z)


def _tail_excess(log_p: Tensor, mass: float, xi: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
    """The excess past a cut of a tail of `mass` at the log-probability `log_p`, and the log density there."""
    excess = _gpd_quantile((log_p - math.log(mass)).clamp_max(0), xi, sigma)
    return excess, log_p - torch.log(sigma) - torch.log1p(xi * excess / sigma)


class MarginalTailCDF(Bijector):
    r"""Fixed marginal CDFs, kernel density body and generalized Pareto tails, then $\Phi^{-1}$ or a logit (COMET).

    Each feature $x$ goes through a continuous, strictly increasing CDF $F$ fitted to data by
    [`fit`][flowkit.bijectors.MarginalTailCDF.fit], then through the Gaussian quantile function
    $z = \Phi^{-1}(F(x))$ (a Gaussian copula; `output="normal"`) or $z = \operatorname{logit} F(x)$ (the
    reference's choice). With the cut points $\alpha = x_{(\lfloor a n \rfloor)}$ and
    $\beta = x_{(\lfloor b n \rfloor - 1)}$ of the sorted training values ($a = 0.05$, $b = 0.95$):

    - body, $\alpha \le x \le \beta$: $F(x) = a + (b - a)\frac{K(x) - K(\alpha)}{K(\beta) - K(\alpha)}$ with $K$
      the CDF of a Gaussian KDE (`scipy.stats.gaussian_kde`, Scott's bandwidth) on at most `anchors`
      central points, interpolated by a monotone rational-quadratic spline through `knots` equally
      spaced points with the KDE's density as the knot derivatives (exactly invertible);
    - tails: $F(x) = a\,(1 - G_-(\alpha - x))$ below $\alpha$ and $F(x) = b + (1 - b)\, G_+(x - \beta)$ above
      $\beta$, with $G_\pm$ generalized Pareto CDFs $G(y) = 1 - (1 + \xi y / \sigma)^{-1/\xi}$ fitted by maximum
      likelihood (`scipy.stats.genpareto`, `floc=0`) to the excesses, $\xi$ clipped to $[0, 1]$.

    Sign convention: $\xi$ is scipy's shape `c`; $\xi > 0$ is a heavy, power-law tail with
    $P(X > t) \sim t^{-1/\xi}$ (Student-t with $\nu$ degrees of freedom: $\xi = 1/\nu$), $\xi = 0$ an
    exponential tail. (The COMET reference code passes `c=-xi`, which makes its "tails" bounded.)

    $F$ is continuous at $\alpha$ and $\beta$ (it equals $a$ and $b$ there from both sides), its density
    $f$ integrates to 1 (mass $a$, $b - a$, $1 - b$ in the three pieces), and
    $\log|dz/dx| = \log f(x) - \log\varphi(z)$ (normal) or $\log f(x) - \log F - \log(1 - F)$ (logit). Both
    $\log F$ and $\log(1 - F)$ are computed in each piece without cancellation, so the far tails stay
    finite. The fitted CDFs are buffers (tensors): they are saved and loaded with the model's weights.
    The layer is not trained.

    Arguments:
        features: number of features `D`.
        knots: number of spline knots in the body (at least 2).
        lower: the lower tail mass `a`.
        upper: the upper cut `b` (tail mass `1 - b`).
        anchors: the most central points the KDE is built on.
        output: `"normal"` or `"logit"`.

    Examples:
        >>> import torch, flowkit
        >>> x = torch.distributions.StudentT(3.0).sample((2000, 2))
        >>> layer = flowkit.bijectors.MarginalTailCDF(2).fit(x)
        >>> z, ladj = layer(x[:5])

    References:
        McDonald, Tan & Luo, *COMET Flows: Towards Generative Modeling of Multivariate Extremes and Tail
        Dependence*, 2022 (arXiv:2205.01224).
    """

    standardizes_data = True  # its fitted CDFs map data of any scale into range

    def __init__(
        self,
        features: int,
        knots: int = 256,
        lower: float = 0.05,
        upper: float = 0.95,
        anchors: int = 1000,
        output: str = "normal",
    ) -> None:
        super().__init__()
        where = "MarginalTailCDF"
        features = check_number(features, "features", where=where, integer=True, low=1)
        self.knot_count = check_number(knots, "knots", where=where, integer=True, low=2)
        self.lower_mass = check_number(lower, "lower", where=where, positive=True, below=0.5)
        self.upper_cut = check_number(upper, "upper", where=where, low=0.5, below=1)
        if not self.upper_cut > 0.5:
            raise ValueError(f"{where}: upper must be above 0.5, got {upper!r}")
        self.anchors = check_number(anchors, "anchors", where=where, integer=True, low=2)
        if output not in MARGINAL_OUTPUTS:
            raise ValueError(f"{where}: output must be one of {', '.join(MARGINAL_OUTPUTS)}, got {output!r}")
        self.output = output
        self.event_shape = torch.Size([features])
        grid = torch.linspace(0, 1, self.knot_count).expand(features, 2, -1).clone()
        self.register_buffer("cuts", torch.tensor([-1.0, 1.0]).repeat(features, 1))
        self.register_buffer("knots", grid)
        self.register_buffer("derivatives", torch.ones(features, self.knot_count))
        self.register_buffer("tail_params", torch.tensor([[0.0, 1.0], [0.0, 1.0]]).repeat(features, 1, 1))
        self.register_buffer("fitted", torch.tensor(False))
        self._fitted = False
        self.register_load_state_dict_post_hook(MarginalTailCDF._after_load)

    @staticmethod
    def _after_load(module: MarginalTailCDF, incompatible: object) -> None:
        module._fitted = bool(module.fitted)

    @torch.no_grad()
    def fit(self, x: Tensor) -> MarginalTailCDF:
        """Fit every feature's CDF to training data `x` of shape `(N, D)` (in place); returns the layer.

        Raises:
            ValueError: for non-finite data, a wrong shape, or fewer than 20 points in a tail (`N` too
                small for the cuts) or a feature with too few distinct values.
        """
        from scipy import special, stats

        where = "MarginalTailCDF.fit"
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.event_shape[0]:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{where}: x must be a tensor of shape (N, {self.event_shape[0]}), got {shape}")
        data = x.detach().cpu().double().numpy()
        if not np.isfinite(data).all():
            raise ValueError(f"{where}: x contains {int((~np.isfinite(data)).sum())} non-finite value(s)")
        n = data.shape[0]
        low_index, high_index = int(math.floor(self.lower_mass * n)), int(math.floor(self.upper_cut * n)) - 1
        if low_index < 20 or n - 1 - high_index < 20:
            raise ValueError(f"{where}: {n} points leave fewer than 20 in a tail; give more data or wider tails")
        cuts, knots, derivatives, tails = [], [], [], []
        grid = np.linspace(0.0, 1.0, self.knot_count)
        for j, column in enumerate(data.T):
            values = np.sort(column)
            alpha, beta = values[low_index], values[high_index]
            central = values[low_index : high_index + 1]
            if not beta > alpha or np.unique(central).size < 3:
                raise ValueError(f"{where}: feature {j} has too few distinct values between its cut points")
            anchors = central[np.linspace(0, central.size - 1, min(self.anchors, central.size)).round().astype(int)]
            kde = stats.gaussian_kde(anchors)
            bandwidth = float(np.sqrt(kde.covariance[0, 0]))
            points = alpha + (beta - alpha) * grid
            cdf = special.ndtr((points[:, None] - anchors[None, :]) / bandwidth).mean(1)
            density = kde(points)
            mass = cdf[-1] - cdf[0]
            cuts.append([alpha, beta])
            knots.append([grid, (cdf - cdf[0]) / mass])
            derivatives.append(density * (beta - alpha) / mass)
            sides = []
            for excess in (alpha - values[:low_index], values[high_index + 1 :] - beta):
                excess = excess[excess > 0]
                if excess.size < 10:
                    raise ValueError(f"{where}: feature {j} has fewer than 10 distinct values in a tail")
                xi, _, sigma = stats.genpareto.fit(excess, floc=0)
                if not 0 <= xi <= 1:
                    xi = float(np.clip(xi, 0, 1))
                    sigma = stats.genpareto.fit(excess, fc=xi, floc=0)[2]
                sides.append([xi, sigma])
            tails.append(sides)
        dtype, device = self.cuts.dtype, self.cuts.device
        self.cuts.copy_(torch.tensor(np.array(cuts), dtype=dtype, device=device))
        self.knots.copy_(torch.tensor(np.array(knots), dtype=dtype, device=device))
        self.derivatives.copy_(torch.tensor(np.array(derivatives), dtype=dtype, device=device))
        self.tail_params.copy_(torch.tensor(np.array(tails), dtype=dtype, device=device))
        self.fitted.fill_(True)
        self._fitted = True
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        loaded = _loaded(self, state_dict, prefix, ("cuts", "knots", "derivatives", "tail_params"))
        name = type(self).__name__
        rules: dict[str, tuple[str, Callable[[Tensor], Tensor]]] = {
            "cuts": ("increasing cut points", lambda c: c[:, 1] > c[:, 0]),
            "knots": (
                "knots increasing from 0 to 1",
                lambda k: (k[..., 1:] > k[..., :-1]).all() & (k[..., [0, -1]] == torch.tensor([0, 1]).to(k)).all(),
            ),
            "derivatives": ("positive derivatives", lambda d: d > 0),
            "tail_params": (
                "xi in [0, 1] and positive scales",
                lambda p: (p[..., 0] >= 0) & (p[..., 0] <= 1) & (p[..., 1] > 0),
            ),
        }
        for key, value in loaded.items():
            if not bool(rules[key][1](value).all()):
                raise ValueError(f"{name}: the loaded {key} must hold {rules[key][0]}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise ValueError("MarginalTailCDF: the marginals are not fitted; call fit(x) with training data first")

    def _body(self, v: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        """The normalised body spline (or its inverse) at `v` in `[0, 1]`, shape `(N, D)`, and its log-derivative."""
        out, ladj, _ = spline_through_knots(v.T.contiguous(), self.knots, self.derivatives, inverse)
        return out.T, ladj.T

    def _pieces(self) -> tuple[Tensor, ...]:
        alpha, beta = self.cuts.unbind(-1)
        (xi_low, sigma_low), (xi_up, sigma_up) = (p.unbind(-1) for p in self.tail_params.unbind(-2))
        return alpha, beta, xi_low, sigma_low, xi_up, sigma_up

    def _to_latent(self, log_u: Tensor, log_s: Tensor, log_f: Tensor) -> tuple[Tensor, Tensor]:
        if self.output == "logit":
            return log_u - log_s, log_f - log_u - log_s
        # Phi^{-1}(u) = -Phi^{-1}(1 - u): evaluated on the smaller of the two, where it is accurate.
        quantile = _normal_quantile_of_log(torch.minimum(log_u, log_s))
        z = torch.where(log_u < log_s, quantile, -quantile)
        return z, log_f + 0.5 * z * z + _HALF_LOG_2PI

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self._check_fitted()
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        a, b = self.lower_mass, self.upper_cut
        alpha, beta, xi_low, sigma_low, xi_up, sigma_up = self._pieces()
        width = beta - alpha
        y, log_dy = self._body(((x - alpha) / width).clamp(0, 1), inverse=False)
        body = (
            torch.log(a + (b - a) * y),
            torch.log((1 - b) + (b - a) * (1 - y)),
            math.log(b - a) + log_dy - torch.log(width),
        )
        hazard, log_ratio = _gpd_hazard((alpha - x).clamp_min(0), xi_low, sigma_low)
        log_u = math.log(a) - hazard
        low = (log_u, torch.log1p(-log_u.exp()), log_u - torch.log(sigma_low) - log_ratio)
        hazard, log_ratio = _gpd_hazard((x - beta).clamp_min(0), xi_up, sigma_up)
        log_s = math.log(1 - b) - hazard
        up = (torch.log1p(-log_s.exp()), log_s, log_s - torch.log(sigma_up) - log_ratio)
        below, above = x < alpha, x > beta
        log_u, log_s, log_f = (
            torch.where(below, lo, torch.where(above, hi, mid)) for lo, mid, hi in zip(low, body, up, strict=True)
        )
        z, ladj = self._to_latent(log_u, log_s, log_f)
        return z.reshape(shape), ladj.sum(-1).reshape(shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self._check_fitted()
        shape = z.shape
        z = z.reshape(-1, shape[-1])
        a, b = self.lower_mass, self.upper_cut
        alpha, beta, xi_low, sigma_low, xi_up, sigma_up = self._pieces()
        width = beta - alpha
        if self.output == "logit":
            log_u, log_s = -F.softplus(-z), -F.softplus(z)
        else:
            log_u, log_s = _log_ndtr(z), _log_ndtr(-z)
        below, above = log_u < math.log(a), log_s < math.log(1 - b)
        excess_low, f_low = _tail_excess(log_u, a, xi_low, sigma_low)  # the survival of alpha - x is u / a
        excess_up, f_up = _tail_excess(log_s, 1 - b, xi_up, sigma_up)
        x_low, x_up = alpha - excess_low, beta + excess_up
        y = ((log_u.exp() - a) / (b - a)).clamp(0, 1)
        t, log_dt = self._body(y, inverse=True)
        x_body = alpha + width * t
        f_body = math.log(b - a) - log_dt - torch.log(width)
        x = torch.where(below, x_low, torch.where(above, x_up, x_body))
        log_f = torch.where(below, f_low, torch.where(above, f_up, f_body))
        _, ladj = self._to_latent(log_u, log_s, log_f)
        return x.reshape(shape), -ladj.sum(-1).reshape(shape[:-1])

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, knots={self.knot_count}, output={self.output!r}"
