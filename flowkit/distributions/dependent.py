r"""Dependent data: a base with standard normal marginals, and the correlation structures between points.

Flows for dependent data (Kirchler et al., ICML 2023) model the latents of all $n$ training points jointly,
$\operatorname{vec} Z \sim \mathcal N(0, \Sigma \otimes I)$. [`Kinship`][flowkit.distributions.Kinship] and
[`EquicorrelatedGroups`][flowkit.distributions.EquicorrelatedGroups] give $\Sigma$ and its algebra, which
[`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood] trains with. Each point is marginally
$\mathcal N(0, I)$, so [`DependentNormal`][flowkit.distributions.DependentNormal]'s `log_prob` is the standard
normal's (the density of one new, unrelated point); it holds the logits of $\lambda$ or the $\rho$'s as a
buffer, so that [`flowkit.io.save`][flowkit.io.save] and the checkpoints of [`fit`][flowkit.train.fit] carry
them with the flow's weights. Build it with
[`DependentMaximumLikelihood.base`][flowkit.train.dependent.DependentMaximumLikelihood.base].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from .normal import StandardNormal

__all__ = ["DependentNormal", "Kinship", "EquicorrelatedGroups"]

#: How the correlation of equicorrelated groups is tied: one for all, one per group, one per group size.
RHO_TYINGS = ("shared", "group", "size")


def _as_values(value: float | Tensor) -> Tensor:
    """A parameter value (a float or a tensor of them) as float64 on the CPU."""
    return torch.as_tensor(value, dtype=torch.float64).cpu()


class DependentNormal(StandardNormal):
    r"""$\mathcal N(0, I)$ marginals for points that depend on each other, with the dependence parameters.

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        parameters: how many dependence parameters: 1 ($\lambda$ of a kinship, or a shared $\rho$), or one
            per group or group size.
        value: their initial value, in $(0, 1)$.

    Examples:
        >>> import torch, flowkit
        >>> base = flowkit.distributions.DependentNormal(2, parameters=3, value=0.2)
        >>> base.values
        tensor([0.2000, 0.2000, 0.2000], dtype=torch.float64)
    """

    def __init__(self, event_shape: int | Sequence[int], parameters: int = 1, value: float = 0.5) -> None:
        super().__init__(event_shape)
        parameters = check_number(parameters, "parameters", where="DependentNormal", integer=True, low=1)
        value = check_number(value, "value", where="DependentNormal", positive=True, below=1)
        #: The logits of the dependence parameters (float64 until the model is cast).
        self.register_buffer("logits", torch.full((parameters,), math.log(value / (1 - value)), dtype=torch.float64))

    @property
    def values(self) -> Tensor:
        r"""The dependence parameters $\lambda$ or $\rho$, float64 `(parameters,)`."""
        return torch.sigmoid(self.logits.double())

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, parameters={self.logits.numel()}"


class Kinship:
    r"""Correlation between points from a kinship matrix: $\Sigma(\lambda) = \lambda I + (1 - \lambda) K$.

    $K = Q \operatorname{diag}(\kappa) Q^\top$ is eigendecomposed once, in float64, so that

    $$
    \log|\Sigma| = \sum_k \log(\lambda + (1 - \lambda)\kappa_k), \qquad
    \Sigma^{-1} = Q \operatorname{diag}\big(1 / (\lambda + (1 - \lambda)\kappa)\big) Q^\top,
    $$

    and $\operatorname{tr}(Z^\top \Sigma^{-1} Z) = \sum_k |(Q^\top Z)_k|^2 / (\lambda + (1-\lambda)\kappa_k)$
    is a sum over the rotated latents. For the mini-batch estimator, $W = Q
    \operatorname{diag}(\lambda + (1-\lambda)\kappa)^{-1/2}$ is cached for each value of
    $\lambda$ ($O(n^2)$) and a batch's block is $(\Sigma^{-1})_{BB} = W_B W_B^\top$ ($O(b^2 n)$).

    Arguments:
        kinship: a symmetric positive semi-definite $n \times n$ matrix with unit diagonal
            (a correlation matrix), as a tensor or array.

    Raises:
        ValueError: if `kinship` is not square, not finite, not symmetric, has a diagonal
            other than 1 or a negative eigenvalue.
    """

    name = "lam"
    #: The number of free parameters (one $\lambda$).
    parameters = 1

    def __init__(self, kinship: Any, where: str = "Kinship") -> None:
        try:
            k = torch.as_tensor(np.asarray(kinship.cpu() if isinstance(kinship, Tensor) else kinship, dtype=np.float64))
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
        self._root: tuple[float, Tensor] | None = None

    def _diagonal(self, value: float | Tensor) -> Tensor:
        value = _as_values(value).reshape(())
        return value + (1 - value) * self.eigenvalues

    def log_det(self, value: float | Tensor) -> Tensor:
        r"""$\log|\Sigma(\lambda)|$ from the eigenvalues (float64)."""
        return torch.log(self._diagonal(value)).sum()

    def _precision_root(self, value: float | Tensor) -> Tensor:
        r"""$W = Q\,\operatorname{diag}(\lambda + (1 - \lambda) e)^{-1/2}$ with $\Sigma^{-1} = W W^\top$, cached."""
        key = float(_as_values(value).reshape(()))
        if self._root is None or self._root[0] != key:
            self._root = (key, self.eigenvectors * self._diagonal(key).rsqrt())
        return self._root[1]

    def precision(self, value: float | Tensor, index: Tensor) -> Tensor:
        r"""The block $(\Sigma^{-1})_{BB} = W_B W_B^\top$ of the rows and columns `index` (float64)."""
        rows = self._precision_root(value)[index.cpu()]
        return rows @ rows.T

    def off_diagonal_product(self, value: float | Tensor, z: Tensor) -> Tensor:
        r"""The products $\sum_{j \ne i} (\Sigma^{-1})_{ij} z_j$ for all $n$ latents `z` (float64), $O(n^2)$.

        That is $W (W^\top Z) - \operatorname{diag}(W W^\top) Z$.
        """
        w = self._precision_root(value)
        z = z.double().cpu()
        return w @ (w.T @ z) - w.square().sum(1, keepdim=True) * z

    def statistics(self, z: Tensor) -> Tensor:
        r"""The squared norms $|(Q^\top Z)_k|^2$ of the rotated latents `z` (all $n$ points, in order)."""
        rotated = self.eigenvectors.T @ z.double().cpu()
        return rotated.square().sum(1)

    def quadratic(self, statistics: Tensor, value: float | Tensor) -> Tensor:
        r"""$\operatorname{tr}(Z^\top \Sigma^{-1} Z)$ from the rotated latents' `statistics`."""
        return (statistics / self._diagonal(value)).sum()

    def terms(self, statistics: Tensor, values: Tensor, p: int) -> Tensor:
        r"""Minus twice the log-likelihood less its constant, one term per parameter, shape `(1,)`.

        That is $p \log|\Sigma| + \operatorname{tr}(Z^\top \Sigma^{-1} Z)$.
        """
        return (p * self.log_det(values) + self.quadratic(statistics, values)).reshape(1)

    def identified(self) -> Tensor:
        """Whether each parameter enters the likelihood (λ does: K has n >= 2 points)."""
        return torch.ones(1, dtype=torch.bool)


class EquicorrelatedGroups:
    r"""Equicorrelated groups: $\Sigma = \bigoplus_g \big((1 - \rho_g) I_{m_g} + \rho_g \mathbf 1 \mathbf 1^\top\big)$.

    Points of one group (of size $m_g$) have correlation $\rho_g$, points of different groups
    none. The correlations are tied by `rho`: one $\rho$ for every group (`"shared"`), one per
    group (`"group"`, the paper's model: its `equi_*` sets draw $\rho_g \sim U(0.5, 0.99)$), or
    one per group size (`"size"`). In closed form, with $S_g = \sum_{i \in g} |z_i|^2$ and
    $T_g = |\sum_{i \in g} z_i|^2$,

    $$
    \log|\Sigma| = \sum_g (m_g - 1)\log(1 - \rho_g) + \log(1 + (m_g - 1)\rho_g), \qquad
    \operatorname{tr}(Z^\top \Sigma^{-1} Z) = \sum_g \frac{S_g - \rho_g T_g / (1 + (m_g - 1)\rho_g)}{1 - \rho_g},
    $$

    and $(\Sigma^{-1})_{ij} = \big(\delta_{ij} - \rho_g / (1 + (m_g - 1)\rho_g)\big) / (1 - \rho_g)$
    within group $g$. Each group's terms involve its own $\rho_g$ alone, so the full-batch
    update is one 1-D problem per parameter. A group of one point has no correlation: its
    terms do not depend on $\rho_g$ (a parameter of singletons only is left as it is).

    Arguments:
        groups: one integer label per point (length $n$); points with the same label form a
            group. Groups are numbered by sorted label.
        rho: `"shared"`, `"group"` or `"size"`.

    Raises:
        ValueError: if `groups` is not a 1-D sequence of at least 2 integers, or `rho` is not
            one of the three.
    """

    name = "rho"

    def __init__(self, groups: Any, where: str = "EquicorrelatedGroups", rho: str = "shared") -> None:
        labels = np.asarray(groups.cpu() if isinstance(groups, Tensor) else groups)
        if labels.ndim != 1 or labels.shape[0] < 2 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"{where}: groups must be a 1-D sequence of at least 2 integer labels, "
                f"got dtype {labels.dtype} and shape {labels.shape}"
            )
        if not isinstance(rho, str) or rho not in RHO_TYINGS:
            raise ValueError(f"{where}: rho must be one of {', '.join(map(repr, RHO_TYINGS))}, got {rho!r}")
        _, inverse, sizes = np.unique(labels, return_inverse=True, return_counts=True)
        self.n = int(labels.shape[0])
        self.tying = rho
        self.labels = torch.as_tensor(inverse.reshape(-1), dtype=torch.int64)
        self.sizes = torch.as_tensor(sizes, dtype=torch.float64)
        if rho == "shared":
            parameter = np.zeros(len(sizes), dtype=np.int64)
            self.parameter_sizes: Tensor | None = None
        elif rho == "group":
            parameter = np.arange(len(sizes))
            self.parameter_sizes = None
        else:
            distinct, parameter = np.unique(sizes, return_inverse=True)
            #: The group size of each parameter (`rho="size"`), else None.
            self.parameter_sizes = torch.as_tensor(distinct, dtype=torch.int64)
        #: The parameter of each group, `(groups,)`.
        self.parameter = torch.as_tensor(parameter.reshape(-1), dtype=torch.int64)
        #: The number of free parameters.
        self.parameters = int(self.parameter.max()) + 1

    def group_rho(self, value: float | Tensor) -> Tensor:
        """The correlation of each group, `(groups,)`, from one value or one per parameter."""
        value = _as_values(value)
        if value.dim() == 0 or value.numel() == 1:
            return value.reshape(()).expand(len(self.sizes))
        if value.shape != (self.parameters,):
            raise ValueError(f"EquicorrelatedGroups: expected {self.parameters} values, got shape {tuple(value.shape)}")
        return value[self.parameter]

    def _group_log_det(self, value: float | Tensor) -> Tensor:
        m, rho = self.sizes, self.group_rho(value)
        return (m - 1) * torch.log1p(-rho) + torch.log1p((m - 1) * rho)

    def _group_quadratic(self, statistics: Tensor, value: float | Tensor) -> Tensor:
        m, rho = self.sizes, self.group_rho(value)
        return (statistics[:, 0] - rho / (1 + (m - 1) * rho) * statistics[:, 1]) / (1 - rho)

    def log_det(self, value: float | Tensor) -> Tensor:
        r"""$\log|\Sigma|$ in closed form, summed over the groups (float64)."""
        return self._group_log_det(value).sum()

    def precision(self, value: float | Tensor, index: Tensor) -> Tensor:
        r"""The block $(\Sigma^{-1})_{BB}$ of the rows and columns `index` (float64)."""
        groups = self.labels[index.cpu()]
        m, rho = self.sizes[groups], self.group_rho(value)[groups]
        shared = rho / (1 + (m - 1) * rho) / (1 - rho)
        same = (groups[:, None] == groups[None, :]).double()
        return torch.diag(1 / (1 - rho)) - same * shared[:, None]

    def off_diagonal_product(self, value: float | Tensor, z: Tensor) -> Tensor:
        r"""The products $\sum_{j \ne i} (\Sigma^{-1})_{ij} z_j$ for all $n$ latents `z` (float64), $O(n)$.

        That is $-\rho_g \big(\sum_{j \in g} z_j - z_i\big) / \big((1 + (m_g - 1)\rho_g)(1 - \rho_g)\big)$.
        """
        z = z.double().cpu()
        m, rho = self.sizes, self.group_rho(value)
        shared = (rho / (1 + (m - 1) * rho) / (1 - rho))[self.labels, None]
        sums = torch.zeros(len(m), z.shape[1], dtype=torch.float64).index_add_(0, self.labels, z)
        return -shared * (sums[self.labels] - z)

    def statistics(self, z: Tensor) -> Tensor:
        """Per group, $S_g$ and $T_g$ of the latents `z` (all $n$ points, in order), shape `(groups, 2)`."""
        z = z.double().cpu()
        groups = len(self.sizes)
        sums = torch.zeros(groups, z.shape[1], dtype=torch.float64).index_add_(0, self.labels, z)
        squares = torch.zeros(groups, dtype=torch.float64).index_add_(0, self.labels, z.square().sum(1))
        return torch.stack([squares, sums.square().sum(1)], 1)

    def quadratic(self, statistics: Tensor, value: float | Tensor) -> Tensor:
        r"""$\operatorname{tr}(Z^\top \Sigma^{-1} Z)$ from the groups' `statistics`."""
        return self._group_quadratic(statistics, value).sum()

    def terms(self, statistics: Tensor, values: Tensor, p: int) -> Tensor:
        r"""$p \log|\Sigma| + \operatorname{tr}(Z^\top \Sigma^{-1} Z)$, summed per parameter, shape `(parameters,)`."""
        per_group = p * self._group_log_det(values) + self._group_quadratic(statistics, values)
        return torch.zeros(self.parameters, dtype=torch.float64).index_add_(0, self.parameter, per_group)

    def identified(self) -> Tensor:
        """Whether each parameter has a group of two or more points (else the likelihood ignores it)."""
        return torch.zeros(self.parameters, dtype=torch.bool).index_fill_(0, self.parameter[self.sizes > 1], True)
