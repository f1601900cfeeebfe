r"""Interventional normalizing flows (Melnychuk, Frauen & Feuerriegel, ICML 2023): the density of $Y[a]$.

From observational data $(x_i, a_i, y_i)$ with confounders $x$, a binary treatment $a$ and an outcome $y$, the
density of the potential outcome $Y[a]$ (the outcome had everyone been given $a$) is, without hidden
confounders, $p_a(y) = \mathbb E_x\, p(y \mid x, a)$. Two stages:

1. *nuisance*: a conditional flow $\hat p(y \mid x, a)$
   ([`ConditionalOutcomeFlow`][flowkit.applications.interventional.ConditionalOutcomeFlow], fitted by
   [`MaximumLikelihood`][flowkit.train.MaximumLikelihood] with the context $(x, a)$) and a propensity head
   $\hat\pi(x) = P(A = 1 \mid x)$ ([`PropensityHead`][flowkit.applications.interventional.PropensityHead],
   fitted by [`PropensityLikelihood`][flowkit.applications.interventional.PropensityLikelihood]);
2. *target*: a 1-D flow $g_a$ fitted by [`fit`][flowkit.train.fit] with
   [`AIPTWCrossEntropy`][flowkit.applications.interventional.AIPTWCrossEntropy], the one-step (augmented
   inverse-propensity-weighted, doubly robust) estimate of the cross-entropy of $g_a$ to $p_a$:

$$
\mathcal L(g) = \frac1n \sum_i \Big[ \mathrm{CE}_i(g) + \frac{\mathbb 1\{a_i = a\}}{\hat\pi_a(x_i)}
\big(-\log g(y_i) - \mathrm{CE}_i(g)\big) \Big], \qquad
\mathrm{CE}_i(g) = -\mathbb E_{y \sim \hat p(\cdot \mid x_i, a)} \log g(y),
$$

with $\hat\pi_1 = \hat\pi$, $\hat\pi_0 = 1 - \hat\pi$. The first term alone is the *plug-in* cross-entropy
(the average over $x_i$ of the nuisance's densities: its bias is the nuisance's); the inverse-propensity term
corrects it with the observed outcomes of the units that got $a$ (first-order bias removed).

[`AIPTWCrossEntropy`][flowkit.applications.interventional.AIPTWCrossEntropy] estimates each $\mathrm{CE}_i$ with
`samples` nuisance draws per row and step (unbiased, noisy);
[`GridAIPTWCrossEntropy`][flowkit.applications.interventional.GridAIPTWCrossEntropy] computes them by quadrature on
a grid, tabulating the nuisance once (for a 1-D outcome, as the paper does): trained in full batches its loss is
deterministic, so the plug-in and the corrected fits differ by the correction alone.

**Propensities** are clipped to $[\epsilon, 1 - \epsilon]$ (`clip`, default 0.05) before they are inverted: an
estimate of exactly 0 or 1 (positivity fails there) then weighs $1/\epsilon$ at most. With `clip=0`, a point
that got $a$ with an estimated probability of 0 has an infinite weight and
[`aiptw_weights`][flowkit.applications.interventional.aiptw_weights] raises a `ValueError`.
Clipping trades variance for bias: the correction of a treated unit whose propensity is below $\epsilon$ is
scaled down by $\hat\pi_a / \epsilon$. On the SCM below at $b = 3$ and $4$ the clip at 0.05 keeps well under
half of the correction's gain that the clip at 0.01 gets (`bench/interventional.py`).

**Data in code.** [`PolynomialNormalSCM`][flowkit.applications.interventional.PolynomialNormalSCM]: $X \sim N(0, 1)$,
$A \mid X \sim \mathrm{Bernoulli}(\sigma(bX))$ (covariate shift $b$: at $b = 0$ a randomised trial, large $b$
leaves few treated units at $x < 0$), $Y \mid X, A = a \sim N(\mu_a(X), s^2)$ with polynomial $\mu_a$; the
exact $p_a(y) = \int N(y; \mu_a(x), s^2)\, \varphi(x)\, dx$ by 1-D quadrature.

References:
    Melnychuk, Frauen & Feuerriegel, *Normalizing flows for interventional density estimation*, ICML 2023
    (arXiv:2209.06203);
    Kennedy, *Semiparametric doubly robust targeted double machine learning: a review* (2022).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from .._validation import check_number
from ..bijectors import Chain, ElementwiseTransformer
from ..distributions import StandardNormal
from ..flows import Flow
from ..nn import MLP
from ..train import Objective
from ..transformers import Affine, RationalQuadraticSpline

__all__ = [
    "PolynomialNormalSCM",
    "ConditionalOutcomeFlow",
    "OutcomeFlow",
    "PropensityHead",
    "PropensityLikelihood",
    "aiptw_weights",
    "AIPTWCrossEntropy",
    "GridAIPTWCrossEntropy",
    "wasserstein1_on_grid",
]


class PolynomialNormalSCM:
    r"""The polynomial-normal structural causal model with covariate shift $b$.

    See [the module][flowkit.applications.interventional].

    $\mu_1(x) = \tfrac12 x^2 + x$, $\mu_0(x) = -\tfrac12 x^2 + \tfrac12 x$, noise scale $s = 0.5$.

    Arguments:
        shift: the covariate shift $b$ (the logit slope of the treatment in $x$).
        noise: the outcome noise scale $s$.

    Examples:
        >>> from flowkit.applications.interventional import PolynomialNormalSCM
        >>> x, a, y = PolynomialNormalSCM(shift=2.0).sample(5, seed=0)
        >>> x.shape, a.shape, y.shape
        ((5,), (5,), (5,))
    """

    def __init__(self, shift: float = 0.0, noise: float = 0.5) -> None:
        self.shift = check_number(shift, "shift", where="PolynomialNormalSCM")
        self.noise = check_number(noise, "noise", where="PolynomialNormalSCM", positive=True)

    @staticmethod
    def mean(x: np.ndarray, a: np.ndarray | int) -> np.ndarray:
        r"""$\mu_a(x)$."""
        a = np.asarray(a)
        return np.where(a == 1, 0.5 * x**2 + x, -0.5 * x**2 + 0.5 * x)

    def propensity(self, x: np.ndarray) -> np.ndarray:
        r"""The true $P(A = 1 \mid x) = \sigma(bx)$."""
        return 1.0 / (1.0 + np.exp(-self.shift * np.asarray(x)))

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`n` observational draws `(x, a, y)`, float64 arrays (`a` in {0, 1})."""
        n = check_number(n, "n", where="PolynomialNormalSCM.sample", integer=True, low=1)
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(n)
        a = (rng.uniform(size=n) < self.propensity(x)).astype(np.float64)
        return x, a, self.mean(x, a) + self.noise * rng.standard_normal(n)

    def interventional_sample(self, n: int, treatment: int, seed: int = 0) -> np.ndarray:
        """`n` draws of $Y[a]$ (everyone given `treatment`)."""
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(n)
        return self.mean(x, treatment) + self.noise * rng.standard_normal(n)

    def interventional_density(self, y: np.ndarray, treatment: int, nodes: int = 4001) -> np.ndarray:
        r"""The exact $p_a(y) = \int N(y; \mu_a(x), s^2)\,\varphi(x)\,dx$ by the trapezoid rule on $x \in [-10, 10]$.

        `nodes` points: the step $20/(\text{nodes} - 1)$ keeps $\mu_a$'s moves between nodes well below $s$.
        """
        t = np.linspace(-10.0, 10.0, nodes)
        w = np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi) * (t[1] - t[0])
        w[[0, -1]] *= 0.5
        means = self.mean(t, treatment)
        out = np.empty(np.shape(y))
        flat, dest = np.asarray(y, np.float64).reshape(-1), out.reshape(-1)
        for start in range(0, flat.size, 256):  # bounded memory: 256 x nodes at a time
            z = (flat[start : start + 256, None] - means) / self.noise
            dest[start : start + 256] = (np.exp(-0.5 * z * z) * w).sum(-1) / (self.noise * math.sqrt(2 * math.pi))
        return out


class ConditionalOutcomeFlow(Flow):
    r"""The nuisance flow $\hat p(y \mid x, a)$: a context-conditioned affine map, then a spline, of a scalar $y$.

    Each layer is an [`ElementwiseTransformer`][flowkit.bijectors.ElementwiseTransformer] whose parameters an MLP
    computes from the context (the covariates and the treatment, concatenated).

    Arguments:
        context: context features (covariates + 1 for the treatment).
        hidden: hidden sizes of each context network.
        bins: spline bins.
        bound: the spline's half-width (outcomes are standardised first).
    """

    def __init__(self, context: int = 2, hidden: tuple[int, ...] = (64, 64), bins: int = 8, bound: float = 5.0) -> None:
        context = check_number(context, "context", where="ConditionalOutcomeFlow", integer=True, low=1)
        layers = Chain(
            ElementwiseTransformer(Affine(), 1, context=context, hidden=hidden),
            ElementwiseTransformer(RationalQuadraticSpline(bins, bound), 1, context=context, hidden=hidden),
        )
        super().__init__(layers, StandardNormal(1))


class OutcomeFlow(Flow):
    """The target flow $g_a$: a scalar affine map and a spline with free parameters.

    Arguments:
        bins: spline bins.
        bound: the spline's half-width.
    """

    def __init__(self, bins: int = 8, bound: float = 5.0) -> None:
        layers = Chain(
            ElementwiseTransformer(Affine(), 1), ElementwiseTransformer(RationalQuadraticSpline(bins, bound), 1)
        )
        super().__init__(layers, StandardNormal(1))


class PropensityHead(MLP):
    r"""The propensity head: an MLP from the covariates to the logit of $\hat\pi(x) = P(A = 1 \mid x)$.

    Arguments:
        features: covariates.
        hidden: hidden sizes.
    """

    def __init__(self, features: int = 1, hidden: tuple[int, ...] = (32, 32)) -> None:
        super().__init__(features, 1, hidden, "relu")

    def propensity(self, x: Tensor) -> Tensor:
        r"""$\hat\pi(x)$, batch-shaped."""
        return torch.sigmoid(self(x)[..., 0])


class PropensityLikelihood(Objective):
    """Binary cross-entropy of a [`PropensityHead`][flowkit.applications.interventional.PropensityHead].

    Batches are rows `[x_1, ..., x_d, a]` (the treatment last).
    """

    def loss(self, flow: Any, batch: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(flow(batch[:, :-1])[:, 0], batch[:, -1])


def aiptw_weights(treated: Tensor, propensity: Tensor, treatment: int, clip: float = 0.05) -> Tensor:
    r"""The weights $\mathbb 1\{a_i = a\} / \hat\pi_a(x_i)$, propensities clipped to $[\epsilon, 1 - \epsilon]$.

    Arguments:
        treated: the treatments $a_i \in \{0, 1\}$.
        propensity: $\hat\pi(x_i) = P(A = 1 \mid x_i) \in [0, 1]$.
        treatment: the intervention $a$ (0 or 1).
        clip: $\epsilon \in [0, 0.5)$.

    Raises:
        ValueError: for propensities outside $[0, 1]$ or not finite, treatments other than 0 and 1, or, with
            `clip=0`, a unit that got $a$ with an estimated probability of exactly 0 (an infinite weight).

    Examples:
        >>> import torch
        >>> from flowkit.applications.interventional import aiptw_weights
        >>> aiptw_weights(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.5, 0.5, 1.0]), 1, clip=0.1).tolist()
        [2.0, 0.0, 1.1111111640930176]
    """
    where = "aiptw_weights"
    clip = check_number(clip, "clip", where=where, low=0, below=0.5)
    if treatment not in (0, 1):
        raise ValueError(f"{where}: treatment must be 0 or 1, got {treatment}")
    if not bool(((treated == 0) | (treated == 1)).all()):
        raise ValueError(f"{where}: treatments must be 0 or 1")
    if not bool(torch.isfinite(propensity).all()) or bool(((propensity < 0) | (propensity > 1)).any()):
        raise ValueError(f"{where}: propensities must be finite numbers in [0, 1]")
    chosen = propensity if treatment == 1 else 1 - propensity
    chosen = chosen.clamp(clip, 1 - clip)
    got = treated == treatment
    if bool((got & (chosen == 0)).any()):
        raise ValueError(
            f"{where}: a unit with treatment {treatment} has an estimated probability 0 of it (positivity fails): "
            "its weight is infinite; clip the propensities (clip > 0)"
        )
    return torch.where(got, 1 / torch.where(got, chosen, torch.ones_like(chosen)), torch.zeros_like(chosen))


class AIPTWCrossEntropy(Objective):
    r"""The one-step (AIPTW) cross-entropy of a target flow $g_a$ to $p_a$.

    See [the module][flowkit.applications.interventional] for the maths.

    Batches are rows `[x_1, ..., x_d, a, y, w]` (`w` from
    [`aiptw_weights`][flowkit.applications.interventional.aiptw_weights]); each step draws `samples` outcomes
    per row from the nuisance flow at $(x_i, a)$ for $\mathrm{CE}_i$. `corrected=False` drops the weighted term:
    the plug-in estimate, fitted the same way.

    Arguments:
        nuisance: the fitted [`ConditionalOutcomeFlow`][flowkit.applications.interventional.ConditionalOutcomeFlow].
        treatment: the intervention $a$.
        samples: nuisance draws per row and step.
        corrected: include the inverse-propensity-weighted correction.
    """

    _flowkit_register = False

    def __init__(self, nuisance: Flow, treatment: int, samples: int = 8, corrected: bool = True) -> None:
        if treatment not in (0, 1):
            raise ValueError(f"AIPTWCrossEntropy: treatment must be 0 or 1, got {treatment}")
        self.nuisance = nuisance
        self.treatment = treatment
        self.samples = check_number(samples, "samples", where="AIPTWCrossEntropy", integer=True, low=1)
        self.corrected = bool(corrected)
        self._last: dict[str, float] = {}

    def loss(self, flow: Flow, batch: Tensor) -> Tensor:
        x, y, w = batch[:, :-3], batch[:, -2:-1], batch[:, -1]
        context = torch.cat([x, torch.full_like(x[:, :1], float(self.treatment))], -1)
        with torch.no_grad():
            draws = self.nuisance.sample((self.samples,), context=context)  # (samples, rows, 1)
        ce_i = -flow.log_prob(draws.reshape(-1, 1)).reshape(self.samples, -1).mean(0)
        plug_in = ce_i.mean()
        if not self.corrected:
            self._last = {"plug_in": float(plug_in.detach())}
            return plug_in
        correction = (w * (-flow.log_prob(y) - ce_i)).mean()
        self._last = {"plug_in": float(plug_in.detach()), "correction": float(correction.detach())}
        return plug_in + correction

    def metrics(self) -> dict[str, float]:
        return dict(self._last)


class GridAIPTWCrossEntropy(Objective):
    r"""The one-step (AIPTW) cross-entropy of a 1-D target flow $g_a$, its nuisance terms by quadrature on a grid.

    The same objective as [`AIPTWCrossEntropy`][flowkit.applications.interventional.AIPTWCrossEntropy] (see
    [the module][flowkit.applications.interventional]), with $\mathrm{CE}_i(g)$ computed by the trapezoid rule on
    the increasing `grid` $y_1 < \dots < y_K$ (trapezoid weights $\omega_k$) instead of by nuisance draws. The
    nuisance is fixed, so the densities $\hat p(y_k \mid x_i, a)$ are tabulated once, at construction, and
    summed over the units:

    $$
    \mathcal L(g) = -\sum_k \omega_k\, \bar m(y_k) \log g(y_k) - \frac1n \sum_i w_i \log g(y_i), \qquad
    \bar m(y) = \frac1n \sum_i (1 - w_i)\, \hat p(y \mid x_i, a),
    $$

    with $w_i = \mathbb 1\{a_i = a\}/\hat\pi_a(x_i)$ (`weights`, from
    [`aiptw_weights`][flowkit.applications.interventional.aiptw_weights]; `corrected=False` takes $w = 0$: the
    plug-in cross-entropy). The loss is deterministic: the training batches are the rows `[y_i, w_i]` of the
    units (their mean is the last term; give all $n$ rows, in one batch for the exact loss). The grid must
    cover the nuisance's mass: mass outside it is dropped (`plug_in_mass` reports $\sum_k \omega_k \frac1n
    \sum_i \hat p(y_k \mid x_i, a)$, which should be close to 1).

    Attributes:
        plug_in_density: the plug-in estimate $\frac1n \sum_i \hat p(y_k \mid x_i, a)$ on the grid (float64).
        plug_in_mass: its trapezoid integral over the grid.

    Arguments:
        nuisance: the fitted [`ConditionalOutcomeFlow`][flowkit.applications.interventional.ConditionalOutcomeFlow].
        treatment: the intervention $a$.
        covariates: the units' covariates `(n, d)`.
        weights: the units' $w_i$ `(n,)`.
        grid: increasing outcome grid `(K,)` (at least 3 points), in the nuisance's units.
        corrected: include the inverse-propensity-weighted correction.
        chunk: units tabulated at a time (memory: `chunk * K` nuisance evaluations).

    Raises:
        ValueError: for a grid that is not increasing, weights that are negative, not finite or of another length
            than `covariates`, or a treatment other than 0 and 1.

    Examples:
        >>> import torch
        >>> from flowkit.applications.interventional import ConditionalOutcomeFlow, GridAIPTWCrossEntropy, OutcomeFlow
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> x, w = torch.randn(50, 1), torch.zeros(50)
        >>> nuisance = ConditionalOutcomeFlow(2, hidden=(8,))
        >>> objective = GridAIPTWCrossEntropy(nuisance, 1, x, w, torch.linspace(-9, 9, 901))
        >>> round(objective.plug_in_mass, 3)
        1.0
        >>> objective.loss(OutcomeFlow(), torch.stack([torch.randn(50), w], -1)).shape
        torch.Size([])
    """

    _flowkit_register = False

    def __init__(
        self,
        nuisance: Flow,
        treatment: int,
        covariates: Tensor,
        weights: Tensor,
        grid: Tensor,
        corrected: bool = True,
        chunk: int = 64,
    ) -> None:
        where = "GridAIPTWCrossEntropy"
        if treatment not in (0, 1):
            raise ValueError(f"{where}: treatment must be 0 or 1, got {treatment}")
        chunk = check_number(chunk, "chunk", where=where, integer=True, low=1)
        grid = torch.as_tensor(grid).reshape(-1)
        if grid.numel() < 3 or not bool(torch.isfinite(grid).all()) or not bool((grid.diff() > 0).all()):
            raise ValueError(f"{where}: grid must be finite and increasing, at least 3 points")
        covariates = torch.as_tensor(covariates)
        covariates = covariates[:, None] if covariates.dim() == 1 else covariates
        weights = torch.as_tensor(weights).reshape(-1)
        if weights.numel() != covariates.shape[0]:
            raise ValueError(f"{where}: {weights.numel()} weights for {covariates.shape[0]} units")
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError(f"{where}: weights must be finite and non-negative")
        self.treatment = treatment
        self.corrected = bool(corrected)
        self.grid = grid
        step = grid.diff()
        omega = torch.zeros_like(grid)
        omega[1:] += 0.5 * step
        omega[:-1] += 0.5 * step
        density_sum = torch.zeros_like(grid, dtype=torch.float64)
        weighted_sum = torch.zeros_like(grid, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, covariates.shape[0], chunk):
                x = covariates[start : start + chunk]
                context = torch.cat([x, torch.full_like(x[:, :1], float(treatment))], -1)
                points = grid[:, None, None].expand(-1, x.shape[0], 1)  # (K, rows, 1)
                density = nuisance.log_prob(points, context=context.expand(grid.numel(), -1, -1)).double().exp()
                density_sum += density.sum(1)
                weighted_sum += (density * weights[start : start + chunk].double()).sum(1)
        n = covariates.shape[0]
        mass = density_sum / n - (weighted_sum / n if self.corrected else 0.0)
        self.plug_in_density = density_sum / n
        self.plug_in_mass = float((omega.double() * self.plug_in_density).sum())
        self._grid_weights = (omega.double() * mass).to(grid.dtype)
        self._last: dict[str, float] = {}

    def loss(self, flow: Flow, batch: Tensor) -> Tensor:
        y, w = batch[:, :1], batch[:, 1]
        grid_term = -(self._grid_weights.to(batch) * flow.log_prob(self.grid.to(batch)[:, None])).sum()
        if not self.corrected:
            self._last = {"grid_term": float(grid_term.detach())}
            return grid_term
        observed = (w * -flow.log_prob(y)).mean()
        self._last = {"grid_term": float(grid_term.detach()), "observed_term": float(observed.detach())}
        return grid_term + observed

    def metrics(self) -> dict[str, float]:
        return dict(self._last)


def wasserstein1_on_grid(grid: np.ndarray, density_a: np.ndarray, density_b: np.ndarray) -> float:
    r"""$W_1 = \int |F_a - F_b|\,dy$ of two densities tabulated on an even grid (trapezoid CDFs, each normalised).

    Examples:
        >>> import numpy as np
        >>> from scipy.stats import norm
        >>> from flowkit.applications.interventional import wasserstein1_on_grid
        >>> y = np.linspace(-10, 10, 4001)
        >>> round(wasserstein1_on_grid(y, norm.pdf(y), norm.pdf(y, loc=0.5)), 4)
        0.5
    """
    y = np.asarray(grid, np.float64)
    h = np.diff(y)
    if y.ndim != 1 or y.size < 3 or not (h > 0).all():
        raise ValueError("wasserstein1_on_grid: grid must be increasing, at least 3 points")
    cdfs = []
    for d in (density_a, density_b):
        d = np.asarray(d, np.float64)
        if d.shape != y.shape or not np.isfinite(d).all() or (d < 0).any():
            raise ValueError("wasserstein1_on_grid: densities must be finite, non-negative, on the grid")
        c = np.concatenate([[0.0], np.cumsum(0.5 * (d[1:] + d[:-1]) * h)])
        cdfs.append(c / c[-1])
    diff = np.abs(cdfs[0] - cdfs[1])
    return float((0.5 * (diff[1:] + diff[:-1]) * h).sum())
