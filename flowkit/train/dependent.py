r"""Maximum likelihood for dependent data points (Kirchler et al., ICML 2023).

A flow $f$ maps each point to its latent $z_i = f(x_i) \in \mathbb R^p$, but the
latents of the $n$ training points are *jointly* Gaussian,
$\operatorname{vec}(Z) \sim \mathcal N(0, \Sigma \otimes I_p)$, with $\Sigma$ a
correlation matrix between points:

- a known kinship (relatedness) matrix $K$: $\Sigma = \lambda I + (1 - \lambda) K$
  ([`Kinship`][flowkit.train.dependent.Kinship]);
- equicorrelated groups (repeated measures, stocks on one day):
  $\Sigma_{gg} = (1 - \rho) I + \rho \mathbf 1 \mathbf 1^\top$ within a group, 0 across
  ([`EquicorrelatedGroups`][flowkit.train.dependent.EquicorrelatedGroups]).

The joint log-likelihood is

$$
\log p(X) = \sum_i \log |\det J_f(x_i)| - \frac{np}{2} \log 2\pi
- \frac p2 \log |\Sigma| - \frac12 \operatorname{tr}(Z^\top \Sigma^{-1} Z).
$$

[`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood] minimises an
unbiased mini-batch estimate of $-\log p(X) / n$ over the flow, with $\lambda$ (or
$\rho$) held fixed; [`DependenceUpdate`][flowkit.train.DependenceUpdate], a callback of
[`fit`][flowkit.train.fit], alternates those steps with full-batch updates of
$\lambda$ (or $\rho$) on the latents of all training points, as the paper's reference
code does. Every point of a marginal test set is scored by the flow alone,
`flow.log_prob(x)` (its base is $\mathcal N(0, I)$, the marginal of each $z_i$).

Reference: M. Kirchler, C. Lippert, M. Kloft, *Training Normalizing Flows from
Dependent Data*, ICML 2023 (code: `mkirchler/dependent_data_flows`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import Tensor

from .._validation import check_number, check_point, outermost
from ..distributions import StandardNormal
from ..flows import Flow
from .batches import split_batch, split_indexed_batch
from .callbacks import Callback
from .likelihood import MaximumLikelihood
from .objective import Objective
from .state import TrainState

__all__ = ["DependentMaximumLikelihood", "DependenceUpdate", "Kinship", "EquicorrelatedGroups"]

_LOG_2PI = math.log(2 * math.pi)


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


class Kinship:
    r"""Correlation between points from a kinship matrix: $\Sigma(\lambda) = \lambda I + (1 - \lambda) K$.

    $K = Q \operatorname{diag}(\kappa) Q^\top$ is eigendecomposed once, in float64, so that

    $$
    \log|\Sigma| = \sum_k \log(\lambda + (1 - \lambda)\kappa_k), \qquad
    \Sigma^{-1} = Q \operatorname{diag}\big(1 / (\lambda + (1 - \lambda)\kappa)\big) Q^\top,
    $$

    and $\operatorname{tr}(Z^\top \Sigma^{-1} Z) = \sum_k |(Q^\top Z)_k|^2 / (\lambda + (1-\lambda)\kappa_k)$
    is a sum over the rotated latents. The dense $\Sigma^{-1}$ ($n \times n$, float64) is
    cached for each value of $\lambda$, for the mini-batch estimator's blocks.

    Arguments:
        kinship: a symmetric positive semi-definite $n \times n$ matrix with unit diagonal
            (a correlation matrix), as a tensor or array.

    Raises:
        ValueError: if `kinship` is not square, not finite, not symmetric, has a diagonal
            other than 1 or a negative eigenvalue.
    """

    name = "lam"

    def __init__(self, kinship: Any, where: str = "Kinship") -> None:
        try:
            k = torch.as_tensor(np.asarray(kinship, dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: kinship must be a matrix of numbers, got {type(kinship).__name__}") from None
        if k.dim() != 2 or k.shape[0] != k.shape[1] or k.shape[0] < 2:
            raise ValueError(f"{where}: kinship must be a square n x n matrix with n >= 2, got shape {tuple(k.shape)}")
        if not bool(torch.isfinite(k).all()):
            raise ValueError(f"{where}: kinship contains non-finite values")
        scale = max(1.0, float(k.abs().max()))
        asymmetry = float((k - k.T).abs().max())
        if asymmetry > 1e-8 * scale:
            raise ValueError(f"{where}: kinship must be symmetric, max |K - K^T| = {asymmetry:.3g}")
        diagonal = float((k.diagonal() - 1).abs().max())
        if diagonal > 1e-6:
            raise ValueError(
                f"{where}: kinship must have a unit diagonal (a correlation matrix), max |K_ii - 1| = {diagonal:.3g}; "
                "rescale it by D^-1/2 K D^-1/2"
            )
        eigenvalues, q = torch.linalg.eigh((k + k.T) / 2)
        if float(eigenvalues[0]) < -1e-8 * k.shape[0] * scale:
            raise ValueError(
                f"{where}: kinship must be positive semi-definite, "
                f"its smallest eigenvalue is {float(eigenvalues[0]):.3g}"
            )
        self.n = int(k.shape[0])
        self.eigenvalues = eigenvalues.clamp(min=0.0)
        self.eigenvectors = q
        self._precision: tuple[float, Tensor] | None = None

    def _diagonal(self, value: Tensor) -> Tensor:
        return value + (1 - value) * self.eigenvalues

    def log_det(self, value: Tensor) -> Tensor:
        r"""$\log|\Sigma(\lambda)|$ from the eigenvalues (float64)."""
        return torch.log(self._diagonal(value)).sum()

    def precision(self, value: float, index: Tensor) -> Tensor:
        r"""The block $(\Sigma^{-1})_{BB}$ of the rows and columns `index` (float64)."""
        if self._precision is None or self._precision[0] != value:
            q = self.eigenvectors
            self._precision = (value, (q / self._diagonal(torch.tensor(value, dtype=torch.float64))) @ q.T)
        dense = self._precision[1]
        index = index.cpu()
        return dense[index[:, None], index[None, :]]

    def statistics(self, z: Tensor) -> Tensor:
        r"""The squared norms $|(Q^\top Z)_k|^2$ of the rotated latents `z` (all $n$ points, in order)."""
        rotated = self.eigenvectors.T @ z.double().cpu()
        return rotated.square().sum(1)

    def quadratic(self, statistics: Tensor, value: Tensor) -> Tensor:
        r"""$\operatorname{tr}(Z^\top \Sigma^{-1} Z)$ from the rotated latents' `statistics`."""
        return (statistics / self._diagonal(value)).sum()


class EquicorrelatedGroups:
    r"""Equicorrelated groups: $\Sigma = \bigoplus_g \big((1 - \rho) I_{m_g} + \rho \mathbf 1 \mathbf 1^\top\big)$.

    Points of one group (of size $m_g$) have correlation $\rho$, points of different
    groups none. In closed form, with $S_g = \sum_{i \in g} |z_i|^2$ and
    $T_g = |\sum_{i \in g} z_i|^2$,

    $$
    \log|\Sigma| = \sum_g (m_g - 1)\log(1 - \rho) + \log(1 + (m_g - 1)\rho), \qquad
    \operatorname{tr}(Z^\top \Sigma^{-1} Z) = \sum_g \frac{S_g - \rho T_g / (1 + (m_g - 1)\rho)}{1 - \rho},
    $$

    and $(\Sigma^{-1})_{ij} = \big(\delta_{ij} - \rho / (1 + (m_g - 1)\rho)\big) / (1 - \rho)$ within group $g$.

    Arguments:
        groups: one integer label per point (length $n$); points with the same label form a group.

    Raises:
        ValueError: if `groups` is not a 1-D sequence of at least 2 integers.
    """

    name = "rho"

    def __init__(self, groups: Any, where: str = "EquicorrelatedGroups") -> None:
        labels = np.asarray(groups.cpu() if isinstance(groups, Tensor) else groups)
        if labels.ndim != 1 or labels.shape[0] < 2 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"{where}: groups must be a 1-D sequence of at least 2 integer labels, "
                f"got dtype {labels.dtype} and shape {labels.shape}"
            )
        _, inverse, sizes = np.unique(labels, return_inverse=True, return_counts=True)
        self.n = int(labels.shape[0])
        self.labels = torch.as_tensor(inverse.reshape(-1), dtype=torch.int64)
        self.sizes = torch.as_tensor(sizes, dtype=torch.float64)

    def log_det(self, value: Tensor) -> Tensor:
        r"""$\log|\Sigma(\rho)|$ in closed form (float64)."""
        m = self.sizes
        return ((m - 1) * torch.log1p(-value) + torch.log1p((m - 1) * value)).sum()

    def precision(self, value: float, index: Tensor) -> Tensor:
        r"""The block $(\Sigma^{-1})_{BB}$ of the rows and columns `index` (float64)."""
        groups = self.labels[index.cpu()]
        m = self.sizes[groups]
        shared = value / (1 + (m - 1) * value) / (1 - value)
        same = (groups[:, None] == groups[None, :]).double()
        return torch.diag(torch.full_like(m, 1 / (1 - value))) - same * shared[:, None]

    def statistics(self, z: Tensor) -> Tensor:
        """Per group, $S_g$ and $T_g$ of the latents `z` (all $n$ points, in order), shape `(groups, 2)`."""
        z = z.double().cpu()
        groups = len(self.sizes)
        sums = torch.zeros(groups, z.shape[1], dtype=torch.float64).index_add_(0, self.labels, z)
        squares = torch.zeros(groups, dtype=torch.float64).index_add_(0, self.labels, z.square().sum(1))
        return torch.stack([squares, sums.square().sum(1)], 1)

    def quadratic(self, statistics: Tensor, value: Tensor) -> Tensor:
        r"""$\operatorname{tr}(Z^\top \Sigma^{-1} Z)$ from the groups' `statistics`."""
        m = self.sizes
        return ((statistics[:, 0] - value / (1 + (m - 1) * value) * statistics[:, 1]) / (1 - value)).sum()


class DependentMaximumLikelihood(Objective):
    r"""Maximum likelihood of a flow on dependent points, $\operatorname{vec} Z \sim \mathcal N(0, \Sigma \otimes I)$.

    Give `kinship=K` for $\Sigma = \lambda I + (1 - \lambda) K$ or `groups=g` for
    equicorrelated groups with correlation $\rho$ (see the
    [module][flowkit.train.dependent] for the likelihood). Batches carry the indices of their
    points: train on [`with_indices`][flowkit.train.with_indices]`(x)`. With $A = \Sigma^{-1}$
    and a batch $B$ of $b$ points drawn uniformly without replacement, the loss is minus the
    batch mean of

    $$
    \ell_i = \log|\det J_f(x_i)| - \frac p2 \log 2\pi - \frac p{2n}\log|\Sigma|
    - \frac12 \Big[A_{ii} |z_i|^2 + \frac{n-1}{b-1} \sum_{j \in B, j \ne i} A_{ij}\, z_i \cdot z_j\Big],
    $$

    whose expectation over batches is $\log p(X) / n$ (a pair $i, j$ is in a batch with
    probability $b(b-1) / (n(n-1))$). A batch of one point has no pairs and drops the
    second sum. $\lambda$ (or $\rho$) stays fixed during these steps; it lives on
    $[\epsilon, 1 - \epsilon]$, is stored as a logit, and is refitted by
    [`update`][flowkit.train.dependent.DependentMaximumLikelihood.update] (full batch, on the
    latents of all points), which [`DependenceUpdate`][flowkit.train.DependenceUpdate]
    calls during [`fit`][flowkit.train.fit]. With $K = I$ the loss is exactly
    [`MaximumLikelihood`][flowkit.train.MaximumLikelihood]'s.

    The flow must be a [`Flow`][flowkit.flows.Flow] with a
    [`StandardNormal`][flowkit.distributions.StandardNormal] base: each $z_i$ is then
    marginally $\mathcal N(0, I)$, and `flow.log_prob` is the model's marginal density,
    the validation loss (the mean marginal NLL, of points with or without indices).

    Arguments:
        kinship: an $n \times n$ kinship (correlation) matrix of the training points.
        groups: a group label per training point (give `kinship` or `groups`).
        value: the initial $\lambda$ (kinship) or $\rho$ (groups), in $[\epsilon, 1 - \epsilon]$.
        eps: the margin $\epsilon$ that keeps the parameter away from 0 and 1.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.train import DependenceUpdate, DependentMaximumLikelihood, fit, with_indices
        >>> x, groups = torch.randn(200, 2), torch.arange(200) // 4
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
        >>> objective = DependentMaximumLikelihood(groups=groups)
        >>> update = DependenceUpdate(objective, flow, x, every=5)
        >>> history = fit(flow, objective, with_indices(x), steps=10, batch_size=50, callbacks=[update], progress=False)
        >>> 0 < objective.value < 1
        True
    """

    needs_data = True

    def __init__(self, kinship: Any = None, groups: Any = None, *, value: float = 0.5, eps: float = 1e-3) -> None:
        where = type(self).__name__
        if (kinship is None) == (groups is None):
            raise ValueError(f"{where}: give kinship= or groups=, exactly one")
        self.eps = check_number(eps, "eps", where=where, positive=True, below=0.5)
        value = check_number(value, "value", where=where, low=self.eps, high=1 - self.eps)
        self.structure: Kinship | EquicorrelatedGroups = (
            Kinship(kinship, where) if kinship is not None else EquicorrelatedGroups(groups, where)
        )
        self.logit = _logit(value)

    @property
    def n(self) -> int:
        """The number of training points."""
        return self.structure.n

    @property
    def value(self) -> float:
        r"""The current $\lambda$ (kinship) or $\rho$ (groups)."""
        return 1 / (1 + math.exp(-self.logit))

    def _value_tensor(self) -> Tensor:
        return torch.tensor(self.value, dtype=torch.float64)

    def latents(self, flow: Any, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`(z, ladj)` of points `x` through the flow's bijector, `z` flattened to `(b, p)`."""
        where = type(self).__name__
        if not isinstance(flow, Flow) or not isinstance(flow.base, StandardNormal):
            raise ValueError(
                f"{where}: the flow must be a flowkit Flow with a StandardNormal base, got "
                f"{type(flow).__name__}" + (f" with base {type(flow.base).__name__}" if isinstance(flow, Flow) else "")
            )
        if x.dim() != len(flow.event_shape) + 1:
            raise ValueError(
                f"{where}: x must have one batch dimension, shape (b, {', '.join(map(str, flow.event_shape))}); "
                f"got {tuple(x.shape)}"
            )
        with outermost() as check:
            if check:
                check_point(flow, x, context, "forward", where)
            z, ladj = flow.bijector(x, context)
        return z.reshape(z.shape[0], -1), ladj

    def _check_index(self, index: Tensor) -> None:
        where = type(self).__name__
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.n):
            raise ValueError(
                f"{where}: point indices must lie in [0, {self.n}) (the kinship/groups size), "
                f"got [{int(index.min())}, {int(index.max())}]"
            )
        if torch.unique(index).numel() != index.numel():
            raise ValueError(f"{where}: a batch holds the same point twice (repeated indices)")

    def point_terms(self, z: Tensor, index: Tensor) -> Tensor:
        r"""The base terms $\ell_i - \log|\det J_f(x_i)|$ of a batch of latents `z` `(b, p)` at `index`."""
        self._check_index(index)
        b, p = z.shape
        value = self.value
        a = self.structure.precision(value, index).to(device=z.device, dtype=z.dtype)
        norms = z.square().sum(1)
        quadratic = a.diagonal() * norms
        if b > 1:
            off = (a * (z @ z.T)).sum(1) - quadratic
            quadratic = quadratic + (self.n - 1) / (b - 1) * off
        log_det = float(self.structure.log_det(self._value_tensor()))
        return -0.5 * p * _LOG_2PI - 0.5 * p * log_det / self.n - 0.5 * quadratic

    def loss(self, flow: Any, batch: Any) -> Tensor:
        x, context, index = split_indexed_batch(batch, type(self).__name__)
        z, ladj = self.latents(flow, x, context)
        return -(ladj + self.point_terms(z, index)).mean()

    def latent_log_likelihood(self, z: Tensor, value: float | None = None) -> Tensor:
        r"""$\log \mathcal N(\operatorname{vec} Z; 0, \Sigma \otimes I)$ of the latents `z` `(n, p)` of all points."""
        if z.dim() != 2 or z.shape[0] != self.n:
            raise ValueError(f"{type(self).__name__}: z must have shape ({self.n}, p), got {tuple(z.shape)}")
        v = self._value_tensor() if value is None else torch.tensor(value, dtype=torch.float64)
        p = z.shape[1]
        statistics = self.structure.statistics(z)
        return -0.5 * (self.n * p * _LOG_2PI + p * self.structure.log_det(v) + self.structure.quadratic(statistics, v))

    def log_likelihood(self, flow: Any, x: Tensor, context: Tensor | None = None) -> Tensor:
        r"""The joint (full-batch) $\log p(X)$ of all $n$ training points `x`, in their order (float64)."""
        z, ladj = self.latents(flow, x, context)
        return ladj.double().sum().cpu() + self.latent_log_likelihood(z)

    @torch.no_grad()
    def update(self, flow: Any, data: Any, batch_size: int = 4096) -> float:
        r"""Refit $\lambda$ (or $\rho$) to the latents of all training points, with the flow fixed.

        Computes $z_i = f(x_i)$ for every point (in eval mode, without gradients), then
        maximises the full-batch log-likelihood over the logit of the parameter on
        $[\epsilon, 1 - \epsilon]$: a grid of 65 logits, then bounded Brent search around the
        best (the paper's reference code takes gradient steps on the same full-batch loss).

        Arguments:
            flow: the flow.
            data: the $n$ training points `x`, `(x, context)`, or `with_indices(...)` of them.
            batch_size: points per pass through the flow.

        Returns:
            The new value (also in [`value`][flowkit.train.dependent.DependentMaximumLikelihood.value]).
        """
        x, context = _points(data, type(self).__name__)
        anchor = next((t for t in flow.parameters() if t.is_floating_point()), x)
        x = x.to(device=anchor.device, dtype=anchor.dtype)
        context = None if context is None else context.to(device=anchor.device, dtype=anchor.dtype)
        if x.shape[0] != self.n:
            raise ValueError(f"{type(self).__name__}: update needs all {self.n} training points, got {x.shape[0]}")
        was_training = flow.training
        flow.eval()
        try:
            parts = [
                self.latents(flow, xb, None if context is None else context[i : i + batch_size])[0]
                for i, xb in zip(range(0, x.shape[0], batch_size), x.split(batch_size), strict=True)
            ]
        finally:
            flow.train(was_training)
        z = torch.cat(parts)
        if not bool(torch.isfinite(z).all()):
            return self.value
        statistics, p = self.structure.statistics(z), z.shape[1]

        def negative(logit: float) -> float:
            v = torch.tensor(1 / (1 + math.exp(-logit)), dtype=torch.float64)
            return float(p * self.structure.log_det(v) + self.structure.quadratic(statistics, v))

        low, high = _logit(self.eps), _logit(1 - self.eps)
        grid = np.linspace(low, high, 65)
        best = int(np.argmin([negative(u) for u in grid]))
        bracket = (grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])
        result = minimize_scalar(negative, bounds=bracket, method="bounded", options={"xatol": 1e-10})
        self.logit = float(result.x) if result.fun <= negative(grid[best]) else float(grid[best])
        return self.value

    def validation_loss(self, flow: Any, batch: Any) -> Tensor:
        """The mean marginal NLL `-flow.log_prob(x)` of the batch's points (indices, if any, ignored)."""
        x, context = _points(batch, type(self).__name__)
        return MaximumLikelihood.negative_log_likelihood(flow, x if context is None else (x, context))

    def metrics(self) -> dict[str, float]:
        r"""The current $\lambda$ (`lam`) or $\rho$ (`rho`), logged at each step."""
        return {self.structure.name: self.value}


def _points(data: Any, where: str) -> tuple[Tensor, Tensor | None]:
    """`(x, context)` of data or a batch with or without trailing point indices."""
    if isinstance(data, np.ndarray):
        data = torch.as_tensor(data)
    if isinstance(data, (tuple, list)) and len(data) in (2, 3) and isinstance(data[-1], Tensor):
        last = data[-1]
        if not (last.dtype.is_floating_point or last.dtype.is_complex):
            x, context, _ = split_indexed_batch(data, where)
            return x, context
    return split_batch(data, where)


class DependenceUpdate(Callback):
    r"""Alternate the flow's steps with full-batch updates of $\lambda$ (or $\rho$), as in Kirchler et al. 2023.

    Every `every` steps of [`fit`][flowkit.train.fit] and after the last one (and before the
    first, with `at_start`) it calls
    [`DependentMaximumLikelihood.update`][flowkit.train.dependent.DependentMaximumLikelihood.update]
    on the latents of all training points; between updates the flow trains with the
    parameter fixed, so each mini-batch loss is unbiased.

    Arguments:
        objective: the [`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood] being minimised.
        flow: the flow being trained.
        data: the $n$ training points (`x`, `(x, context)` or `with_indices(...)`), in the
            order of the kinship matrix or group labels.
        every: steps between updates (each costs one pass of the flow over the data, and for a
            kinship one $n \times n$ product the next step; with groups, every 10 to 20 steps is cheap).
        at_start: also update before the first step, on the latents of the untrained flow
            (otherwise the flow's first `every` steps use the objective's initial value, as in the
            paper's code). A run resumed from a checkpoint always updates first: the value is
            not part of the checkpoint.
    """

    def __init__(
        self, objective: DependentMaximumLikelihood, flow: Any, data: Any, every: int = 100, at_start: bool = False
    ) -> None:
        if not isinstance(objective, DependentMaximumLikelihood):
            raise ValueError(
                f"DependenceUpdate: objective must be a DependentMaximumLikelihood, got {type(objective).__name__}"
            )
        self.every = int(check_number(every, "every", where="DependenceUpdate", integer=True, low=1))
        x, _ = _points(data, "DependenceUpdate")
        if x.shape[0] != objective.n:
            raise ValueError(f"DependenceUpdate: data has {x.shape[0]} points but the objective {objective.n}")
        self.objective, self.flow, self.data, self.at_start = objective, flow, data, bool(at_start)
        self.last_update: int | None = None

    def _update(self, state: TrainState) -> None:
        self.objective.update(self.flow, self.data)
        self.last_update = state.step

    def on_start(self, state: TrainState) -> None:
        if self.at_start or state.step > 0:  # a resumed run refits the value, which checkpoints do not hold
            self._update(state)

    def on_step_end(self, state: TrainState) -> None:
        if state.step % self.every == 0:
            self._update(state)

    def on_train_end(self, state: TrainState) -> None:
        if self.last_update != state.step:
            self._update(state)
