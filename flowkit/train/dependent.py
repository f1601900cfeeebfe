r"""Maximum likelihood for dependent data points (Kirchler et al., ICML 2023).

A flow $f$ maps each point to its latent $z_i = f(x_i) \in \mathbb R^p$, but the latents of the $n$ training
points are *jointly* Gaussian, $\operatorname{vec}(Z) \sim \mathcal N(0, \Sigma \otimes I_p)$, with $\Sigma$ a
correlation matrix between points: $\lambda I + (1 - \lambda) K$ for a known kinship matrix $K$
([`Kinship`][flowkit.distributions.Kinship]) or equicorrelated groups (repeated measures, stocks on one day;
[`EquicorrelatedGroups`][flowkit.distributions.EquicorrelatedGroups]), whose algebra lives with the bases.

The joint log-likelihood is

$$
\log p(X) = \sum_i \log |\det J_f(x_i)| - \frac{np}{2} \log 2\pi
- \frac p2 \log |\Sigma| - \frac12 \operatorname{tr}(Z^\top \Sigma^{-1} Z).
$$

[`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood] minimises an
unbiased mini-batch estimate of $-\log p(X) / n$ with $\lambda$ (or $\rho$) fixed;
[`DependenceUpdate`][flowkit.train.DependenceUpdate] alternates those steps with full-batch
updates of $\lambda$ (or $\rho$), as the paper's reference code does. Independent test points
are scored by `flow.log_prob(x)` (each $z_i$ is marginally $\mathcal N(0, I)$); related held-out
points by [`held_out`][flowkit.train.dependent.DependentMaximumLikelihood.held_out]`(...).log_likelihood`.

Reference: M. Kirchler, C. Lippert, M. Kloft, *Training Normalizing Flows from
Dependent Data*, ICML 2023 (code: `mkirchler/dependent_data_flows`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._deprecation import moved_names
from .._validation import check_number, check_point, outermost
from ..bijectors import Bijector
from ..distributions import DependentNormal, StandardNormal
from ..distributions import dependent as _covariance
from ..flows.base import FlowModel
from .batches import split_batch, split_indexed_batch
from .callbacks import Callback
from .likelihood import MaximumLikelihood
from .objective import Objective, check_state
from .state import TrainState

__all__ = ["DependentMaximumLikelihood", "DependenceUpdate"]
_COVARIANCES = ("Kinship", "EquicorrelatedGroups")  # moved to flowkit.distributions, deprecated here
__getattr__ = moved_names("flowkit.train.dependent", "flowkit.distributions", _covariance, _COVARIANCES)

_LOG_2PI = math.log(2 * math.pi)


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


def _minimise_separable(negative: Any, low: float, high: float, size: int, points: int = 65) -> Tensor:
    r"""Minimise `negative(u)`, a sum of terms each in one coordinate of `u` (shape `(size,)`), per coordinate.

    A grid of `points` values on `[low, high]` for every coordinate at once, then golden-section search in
    the bracket around each coordinate's best grid point (to float64 resolution); the better of the two is kept.
    """
    grid = torch.linspace(low, high, points, dtype=torch.float64)
    values = torch.stack([negative(torch.full((size,), float(u), dtype=torch.float64)) for u in grid])
    best = values.argmin(0)
    a, b = grid[(best - 1).clamp(min=0)], grid[(best + 1).clamp(max=points - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = negative(c), negative(d)
    for _ in range(80):  # the bracket shrinks by 0.618 per iteration: 80 take two grid steps below 1e-15
        left = fc < fd
        b, fd_new = torch.where(left, d, b), fc
        a = torch.where(left, a, c)
        c_next = torch.where(left, b - ratio * (b - a), d)
        d_next = torch.where(left, c, a + ratio * (b - a))
        fresh = negative(torch.where(left, c_next, d_next))
        fc, fd = torch.where(left, fresh, fd), torch.where(left, fd_new, fresh)
        c, d = c_next, d_next
    found = (a + b) / 2
    return torch.where(negative(found) <= values.min(0).values, found, grid[best])


class DependentMaximumLikelihood(Objective):
    r"""Maximum likelihood of a flow on dependent points, $\operatorname{vec} Z \sim \mathcal N(0, \Sigma \otimes I)$.

    Batches carry the indices of their points: train on [`with_indices`][flowkit.train.with_indices]`(x)`.
    With $A = \Sigma^{-1}$ and a batch $B$ of $b$ points drawn uniformly without replacement, the loss is minus
    the batch mean of

    $$
    \ell_i = \log|\det J_f(x_i)| - \frac p2 \log 2\pi - \frac p{2n}\log|\Sigma|
    - \frac12 \Big[A_{ii} |z_i|^2 + \frac{n-1}{b-1} \sum_{j \in B, j \ne i} A_{ij}\, z_i \cdot z_j\Big],
    $$

    whose expectation over batches is $\log p(X) / n$ (a pair $i, j$ is in a batch with
    probability $b(b-1) / (n(n-1))$; a batch of one point drops the second sum). $\lambda$ (or
    $\rho$), in $[\epsilon, 1 - \epsilon]$ and stored as a logit, stays fixed during these steps and is
    refitted by [`update`][flowkit.train.dependent.DependentMaximumLikelihood.update]. With $K = I$ the
    loss is exactly [`MaximumLikelihood`][flowkit.train.MaximumLikelihood]'s.

    The flow is a [`Flow`][flowkit.flows.Flow] over the [`DependentNormal`][flowkit.distributions.DependentNormal]
    base that [`base`][flowkit.train.dependent.DependentMaximumLikelihood.base] builds, which holds the
    parameters so that the model saves them (a plain `StandardNormal` base is deprecated: the saved model then
    lacks them). The validation loss is the mean marginal NLL `-flow.log_prob(x)`. The objective's
    [state][flowkit.train.dependent.DependentMaximumLikelihood.state_dict] is saved in the checkpoints of
    [`fit`][flowkit.train.fit], so that a resumed run repeats the uninterrupted one bit for bit.

    Arguments:
        kinship: an $n \times n$ kinship (correlation) matrix of the training points:
            $\Sigma = \lambda I + (1 - \lambda) K$.
        groups: a group label per training point, equicorrelated with $\rho$ (give `kinship` or `groups`).
        value: the initial $\lambda$ or $\rho$ (every parameter), in $[\epsilon, 1 - \epsilon]$.
        eps: the margin $\epsilon$ that keeps the parameter away from 0 and 1.
        rho: with `groups`: `"shared"` (one $\rho$), `"group"` (one per group, as the paper) or `"size"`.
        control_variate: subtract a control variate from the pair sum (not in the paper): the exact terms at
            the latents $\tilde z$ cached at the last `update`, the batch sampling only the change since
            (see [dependent data][flowkit.train.dependent]). Experimental: it can hurt early training with $\rho$
            near 1.

    Raises:
        ValueError: for a bad kinship matrix or group labels, `value` or `eps` out of range, or `rho` other
            than `"shared"` with a kinship.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.train import DependenceUpdate, DependentMaximumLikelihood, fit, with_indices
        >>> x, groups = torch.randn(200, 2), torch.arange(200) // 4
        >>> objective = DependentMaximumLikelihood(groups=groups)
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,), base=objective.base(2))
        >>> update = DependenceUpdate(objective, flow, x, every=5)
        >>> history = fit(flow, objective, with_indices(x), steps=10, batch_size=50, callbacks=[update], progress=False)
        >>> 0 < objective.value < 1
        True
        >>> per_group = DependentMaximumLikelihood(groups=groups, rho="group")
        >>> per_group.values.shape  # one rho per group of 4
        torch.Size([50])
    """

    needs_data = True

    def __init__(
        self,
        kinship: Any = None,
        groups: Any = None,
        *,
        value: float = 0.5,
        eps: float = 1e-3,
        rho: str = "shared",
        control_variate: bool = False,
    ) -> None:
        where = type(self).__name__
        if not isinstance(control_variate, bool):
            raise ValueError(f"{where}: control_variate must be True or False, got {control_variate!r}")
        self.control_variate = control_variate
        self._warned = False
        self._loaded = False  # whether load_state_dict gave the state (a resumed run: no refit needed)
        self._binds = True  # False for held_out's objectives: their parameters are not the model's
        #: With `control_variate`: the cached latents of all points, `(logits, z~, m~, tr(Z~^T A Z~))`.
        self.cache: tuple[Tensor, Tensor, Tensor, float] | None = None
        if (kinship is None) == (groups is None):
            raise ValueError(f"{where}: give kinship= or groups=, exactly one")
        self.eps = check_number(eps, "eps", where=where, positive=True, below=0.5)
        value = check_number(value, "value", where=where, low=self.eps, high=1 - self.eps)
        if kinship is not None and rho != "shared":
            raise ValueError(f"{where}: rho={rho!r} is for groups; a kinship has one lambda (rho='shared')")
        self.structure: _covariance.Kinship | _covariance.EquicorrelatedGroups = (
            _covariance.Kinship(kinship, where)
            if kinship is not None
            else _covariance.EquicorrelatedGroups(groups, where, rho)
        )
        # The one home of the parameters: the model's DependentNormal base once a flow with one was seen, until
        # then (or for a plain StandardNormal base) one of the objective's.
        self._home = DependentNormal(1, self.structure.parameters)
        self.logits = torch.full((self.structure.parameters,), _logit(value), dtype=torch.float64)

    def base(self, event_shape: int | Sequence[int]) -> DependentNormal:
        r"""A [`DependentNormal`][flowkit.distributions.DependentNormal] base: $\lambda$ or the $\rho$'s in the model.

        Examples:
            >>> import torch, flowkit
            >>> objective = flowkit.train.DependentMaximumLikelihood(groups=torch.arange(8) // 2, rho="group")
            >>> flow = flowkit.flows.RealNVP(2, transforms=2, base=objective.base(2))
            >>> flow.base.values.shape
            torch.Size([4])
        """
        return DependentNormal(event_shape, self.structure.parameters, float(torch.sigmoid(self.logits[0])))

    @property
    def logits(self) -> Tensor:
        """The logits of the parameters, float64 `(parameters,)`: the model's base's once it was seen."""
        return self._home.logits.double()

    @logits.setter
    def logits(self, logits: Tensor) -> None:
        with torch.no_grad():
            self._home.logits.copy_(logits)

    def _bind(self, flow: FlowModel) -> None:
        """Keep the parameters in the flow's base, when it is a `DependentNormal` of the right size."""
        base = getattr(flow, "base", None)
        if not self._binds or base is self._home:
            return
        if not isinstance(base, DependentNormal):
            if not self._warned:
                warnings.warn(
                    f"{type(self).__name__}: the flow's base is a plain StandardNormal, so lambda/rho live in the "
                    "objective and are not saved with the model (checkpoints carry them); build the flow with "
                    "base=objective.base(features) (a DependentNormal)",
                    DeprecationWarning,
                    stacklevel=3,
                )
                self._warned = True
            return
        if base.logits.numel() != self.structure.parameters:
            raise ValueError(
                f"{type(self).__name__}: the flow's DependentNormal base holds {base.logits.numel()} parameters, "
                f"the objective has {self.structure.parameters}; build it with objective.base(features)"
            )
        self._home = base

    def holds_state_in(self, flow: FlowModel) -> bool:
        """Whether `flow`'s base holds the dependence parameters (so checkpoints carry them)."""
        return isinstance(getattr(flow, "base", None), DependentNormal)

    @property
    def n(self) -> int:
        """The number of training points."""
        return self.structure.n

    def check_data(self, points: int | None) -> None:
        """Refuse training data of another number of points than the kinship's or the group labels' `n`."""
        if points is not None and points != self.n:
            what = "kinship matrix is" if isinstance(self.structure, _covariance.Kinship) else "group labels are"
            raise ValueError(
                f"{type(self).__name__}: the data has {points} points but the {what} for {self.n}; "
                "give one label (one kinship row) per training point, in the data's order"
            )

    @property
    def values(self) -> Tensor:
        r"""The current parameters, float64 `(parameters,)`: $\lambda$, $\rho$, or a $\rho$ per group or size."""
        return torch.sigmoid(self.logits)

    @property
    def value(self) -> float | Tensor:
        r"""The current $\lambda$ or shared $\rho$ as a float; with several parameters, the tensor `values`."""
        values = self.values
        return float(values[0]) if values.numel() == 1 else values

    @property
    def logit(self) -> float:
        """The logit of a single parameter (kinship or shared rho)."""
        if self.logits.numel() != 1:
            raise ValueError(f"{type(self).__name__}: {self.logits.numel()} parameters; use logits")
        return float(self.logits[0])

    @logit.setter
    def logit(self, logit: float) -> None:
        if self.logits.numel() != 1:
            raise ValueError(f"{type(self).__name__}: {self.logits.numel()} parameters; set logits")
        self.logits = torch.tensor([float(logit)], dtype=torch.float64)

    def latents(self, flow: FlowModel, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`(z, ladj)` of points `x` through the flow's bijector, `z` flattened to `(b, p)`."""
        where = type(self).__name__
        bijector, base = getattr(flow, "bijector", None), getattr(flow, "base", None)
        if not (isinstance(bijector, Bijector) and isinstance(base, StandardNormal)):
            raise ValueError(
                f"{where}: the flow must be a bijector over a StandardNormal base (a flowkit Flow), got "
                f"{type(flow).__name__}" + ("" if base is None else f" with base {type(base).__name__}")
            )
        self._bind(flow)
        if x.dim() != len(flow.event_shape) + 1:
            raise ValueError(
                f"{where}: x must have one batch dimension, shape (b, {', '.join(map(str, flow.event_shape))}); "
                f"got {tuple(x.shape)}"
            )
        with outermost() as check:
            if check:
                check_point(flow, x, context, "forward", where)
            z, ladj = bijector(x, context)
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

    def cache_latents(self, z: Tensor) -> None:
        r"""Keep the latents `z` `(n, p)` of all points as the control variate's $\tilde z$ (see `control_variate`)."""
        if z.dim() != 2 or z.shape[0] != self.n:
            raise ValueError(f"{type(self).__name__}: z must have shape ({self.n}, p), got {tuple(z.shape)}")
        z, values = z.detach().double().cpu(), self.values
        quadratic = float(self.structure.quadratic(self.structure.statistics(z), values))
        self.cache = (self.logits.clone(), z, self.structure.off_diagonal_product(values, z), quadratic)

    def point_terms(self, z: Tensor, index: Tensor) -> Tensor:
        r"""The base terms $\ell_i - \log|\det J_f(x_i)|$ of a batch of latents `z` `(b, p)` at `index`."""
        self._check_index(index)
        b, p = z.shape
        values = self.values
        a = self.structure.precision(values, index).to(device=z.device, dtype=z.dtype)
        diagonal = a.diagonal()
        cache = self.cache if self.control_variate else None
        if cache is not None and cache[1].shape[1] != p:
            raise ValueError(f"{type(self).__name__}: the cached latents have {cache[1].shape[1]} numbers, z has {p}")
        if cache is not None and not torch.equal(cache[0], self.logits):  # the parameter moved: the same z~, new A
            self.cache_latents(cache[1])
            cache = self.cache
        if cache is not None:  # each point's exact term at z~, its change since, and the mean exact term
            kept, products = (t[index.cpu()].to(device=z.device, dtype=z.dtype) for t in cache[1:3])
            pairs = z - kept
            quadratic = diagonal * (z.square().sum(1) - kept.square().sum(1)) + 2 * (pairs * products).sum(1)
            quadratic = quadratic + cache[3] / self.n
        else:
            pairs = z
            quadratic = diagonal * z.square().sum(1)
        if b > 1:
            off = (a * (pairs @ pairs.T)).sum(1) - diagonal * pairs.square().sum(1)
            quadratic = quadratic + (self.n - 1) / (b - 1) * off
        log_det = float(self.structure.log_det(values))
        return -0.5 * p * _LOG_2PI - 0.5 * p * log_det / self.n - 0.5 * quadratic

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        x, context, index = split_indexed_batch(batch, type(self).__name__)
        z, ladj = self.latents(flow, x, context)
        return -(ladj + self.point_terms(z, index)).mean()

    def latent_log_likelihood(self, z: Tensor, value: float | Tensor | None = None) -> Tensor:
        r"""$\log \mathcal N(\operatorname{vec} Z; 0, \Sigma \otimes I)$ of the latents `z` `(n, p)` of all points."""
        if z.dim() != 2 or z.shape[0] != self.n:
            raise ValueError(f"{type(self).__name__}: z must have shape ({self.n}, p), got {tuple(z.shape)}")
        v = self.values if value is None else torch.as_tensor(value, dtype=torch.float64).cpu()
        p, quadratic = z.shape[1], self.structure.quadratic(self.structure.statistics(z), v)
        return -0.5 * (self.n * p * _LOG_2PI + p * self.structure.log_det(v) + quadratic)

    def log_likelihood(self, flow: FlowModel, x: Tensor, context: Tensor | None = None) -> Tensor:
        r"""The joint (full-batch) $\log p(X)$ of all $n$ points `x`, in their order (float64)."""
        z, ladj = self.latents(flow, x, context)
        return ladj.double().sum().cpu() + self.latent_log_likelihood(z)

    def held_out(self, kinship: Any = None, groups: Any = None) -> DependentMaximumLikelihood:
        r"""The same model over other points that are related among themselves (test relatives, test days).

        The held-out points get their own $\Sigma$ with this objective's $\lambda$, shared $\rho$ or each group
        size's $\rho$; `held_out(...).log_likelihood(flow, x)` is their joint log-likelihood.

        Arguments:
            kinship: the held-out points' kinship matrix (for a kinship objective).
            groups: the held-out points' group labels (for an objective of groups).

        Raises:
            ValueError: for the other kind of structure than this objective's, `rho="group"`
                (the per-group values belong to the training groups), or a group size without a
                training group of that size (`rho="size"`).
        """
        where = f"{type(self).__name__}.held_out"
        if (kinship is None) == (groups is None):
            raise ValueError(f"{where}: give kinship= or groups=, exactly one")
        mine = self.structure
        kind = "kinship" if isinstance(mine, _covariance.Kinship) else "groups"
        if (kinship is not None) != (kind == "kinship"):
            raise ValueError(f"{where}: this objective has a {kind}; give the held-out points' {kind}")
        tying = getattr(mine, "tying", "shared")
        if tying == "group":
            raise ValueError(f"{where}: a rho per training group does not carry to new groups; use rho='shared'/'size'")
        other = DependentMaximumLikelihood(kinship, groups, value=0.5, eps=self.eps, rho=tying)
        other._binds = False
        found = torch.ones(other.structure.parameters, 1, dtype=torch.bool)  # one lambda or shared rho: ours
        if tying == "size":
            found = other.structure.parameter_sizes[:, None] == mine.parameter_sizes[None, :]
        if not bool(found.any(1).all()):
            missing = other.structure.parameter_sizes[~found.any(1)].tolist()
            raise ValueError(f"{where}: no training group has size {missing[0]} (held-out sizes {missing})")
        other.logits = self.logits[found.int().argmax(1)]
        return other

    @torch.no_grad()
    def update(self, flow: FlowModel, data: Any, batch_size: int = 4096) -> float | Tensor:
        r"""Refit $\lambda$ (or the $\rho$'s) to the latents of all training points, with the flow fixed.

        Maximises the full-batch log-likelihood of $z_i = f(x_i)$ (eval mode) over each parameter's logit on
        $[\epsilon, 1 - \epsilon]$: a grid of 65 logits, then golden-section search around the best (the paper
        takes gradient steps). A parameter of singleton groups only, which the likelihood ignores, keeps its value.

        Arguments:
            flow: the flow.
            data: the $n$ training points `x`, `(x, context)`, or `with_indices(...)` of them.
            batch_size: points per pass through the flow.

        Returns:
            The new [`value`][flowkit.train.dependent.DependentMaximumLikelihood.value].
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

        def negative(logits: Tensor) -> Tensor:
            return self.structure.terms(statistics, torch.sigmoid(logits), p)

        found = _minimise_separable(negative, _logit(self.eps), _logit(1 - self.eps), self.structure.parameters)
        self.logits = torch.where(self.structure.identified(), found, self.logits)
        if self.control_variate:
            self.cache_latents(z)
        return self.value

    def state_dict(self) -> dict[str, Any]:
        r"""The logits of $\lambda$ or the $\rho$'s (`"logits"`) and the control variate's cache (`"cache"`, or None).

        The cache holds its logits, the latents $\tilde z$, the products $\tilde m$ and
        $\operatorname{tr}(\tilde Z^\top A \tilde Z)$.
        """
        cache = None if self.cache is None else dict(zip(_CACHE_KEYS, self.cache, strict=True))
        return {"logits": self.logits, "cache": cache}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a [`state_dict`][flowkit.train.dependent.DependentMaximumLikelihood.state_dict] (copied).

        Raises:
            ValueError: if `state` is not one of an objective with the same number of parameters and points.
        """
        where = type(self).__name__
        logits, cache = check_state(state, ("logits", "cache"), where)
        size = (self.structure.parameters,)
        if not _float64(logits, size):
            raise ValueError(f"{where}: the state's logits must be float64 of shape {size}")
        if cache is not None:
            cache_logits, z, products, quadratic = check_state(cache, _CACHE_KEYS, f"{where} (cache)")
            if not (
                _float64(cache_logits, size)
                and _float64(z, (self.n, z.shape[-1]) if isinstance(z, Tensor) and z.dim() == 2 else None)
                and _float64(products, z.shape)
                and isinstance(quadratic, float)
            ):
                raise ValueError(f"{where}: the state's cache must hold float64 logits {size}, latents and products "
                                 f"({self.n}, p) and a number")  # fmt: skip
            cache = (cache_logits.clone(), z.clone(), products.clone(), quadratic)
        self.logits = logits.clone()
        self.cache = cache
        self._loaded = True

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The mean marginal NLL `-flow.log_prob(x)` of the batch's points (indices, if any, ignored)."""
        x, context = _points(batch, type(self).__name__)
        return MaximumLikelihood.negative_log_likelihood(flow, x if context is None else (x, context))

    def metrics(self) -> dict[str, float]:
        r"""The current $\lambda$ (`lam`) or $\rho$ (`rho`), logged at each step.

        With a $\rho$ per group or size, `rho_mean`: their mean over the points of groups of two or more.
        """
        values = self.values
        if values.numel() == 1:
            return {self.structure.name: float(values[0])}
        structure = self.structure
        rho, m = structure.group_rho(values), structure.sizes
        weight = torch.where(m > 1, m, torch.zeros_like(m))
        return {"rho_mean": float((rho * weight).sum() / weight.sum()) if weight.sum() > 0 else float("nan")}


#: The names of the control variate's cache entries in a state dict.
_CACHE_KEYS = ("logits", "latents", "products", "quadratic")


def _float64(t: Any, shape: tuple[int, ...] | None) -> bool:
    """Whether `t` is a finite float64 tensor of `shape`."""
    return isinstance(t, Tensor) and t.dtype == torch.float64 and t.shape == shape and bool(torch.isfinite(t).all())


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

    Every `every` steps of [`fit`][flowkit.train.fit] (and before the first, with `at_start`) it calls
    [`update`][flowkit.train.dependent.DependentMaximumLikelihood.update]; between updates the parameter is
    fixed, so each mini-batch loss is unbiased. At the end it updates once more on the flow's final weights.

    Arguments:
        objective: the [`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood] being minimised.
        flow: the flow being trained.
        data: the $n$ training points (`x`, `(x, context)` or `with_indices(...)`), in the
            order of the kinship matrix or group labels.
        every: steps between updates (each one pass of the flow over the data).
        at_start: also update before the first step (otherwise the first `every` steps use the initial value,
            as in the paper's code). A resumed run continues with its checkpoint's value (refitted first
            only when the checkpoint lacks it).
    """

    def __init__(
        self,
        objective: DependentMaximumLikelihood,
        flow: FlowModel,
        data: Any,
        every: int = 100,
        at_start: bool = False,
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
        self._fitted_to: tuple[int, ...] | None = None

    def _weights(self) -> tuple[int, ...]:
        """Version counters of the flow's tensors: they change with every in-place write (a step, a restore)."""
        return tuple(t._version for t in (*self.flow.parameters(), *self.flow.buffers()))

    def _update(self, state: TrainState) -> None:
        self.objective.update(self.flow, self.data)
        self._fitted_to = self._weights()

    def on_start(self, state: TrainState) -> None:
        if state.step == 0:
            if self.at_start:
                self._update(state)
        elif not (self.objective._loaded or self.objective.holds_state_in(self.flow)):
            self._update(state)  # resumed from a checkpoint without the value: refit it

    def on_step_end(self, state: TrainState) -> None:
        if state.step % self.every == 0:
            self._update(state)

    def on_end(self, state: TrainState) -> None:  # after fit's own callbacks have put the final weights in
        if self._weights() != self._fitted_to:  # not already fitted to these weights (by the last step's update)
            self._update(state)
