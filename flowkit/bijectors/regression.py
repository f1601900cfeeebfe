r"""The whitened residual of a linear regression on the context: a fixed conditional affine standardisation.

A conditional flow $q(\theta \mid c)$ whose layers see $\theta$ z-scored feature by feature still has to learn how
the location of $\theta$ moves with the context and how its features co-vary given it. When $\theta$ given $c$ is
nearly determined along some directions (a posterior much narrower than the prior, with strong correlations), that is
a badly conditioned problem for a network: it must place a mass of width $10^{-3}$ (in prior units) at a location
that moves over the whole prior. This layer removes the linear part of it with fixed statistics of training pairs
$(\theta_i, c_i)$: the least-squares regression $\theta \approx A c + b$ and the Cholesky factor $L$ of the
residuals' covariance,

$$
z = L^{-1} (\theta - A c - b), \qquad \log|\det \partial z / \partial \theta| = -\sum_i \log L_{ii}.
$$

The Jacobian does not depend on $\theta$ or $c$, so densities stay exact in $\theta$'s units. For a linear-Gaussian
model ($\theta \sim N$, $c = M\theta + \varepsilon$) the regression is the posterior mean and $L L^\top$ the posterior
covariance, so $z$ given $c$ is a standard normal and a flow that starts at the identity starts at the exact
posterior; for a nonlinear model the layers after this one learn what the linear part misses. This is the
regression adjustment of approximate Bayesian computation (Beaumont, Zhang & Balding 2002) used as a bijection.

References:
    Beaumont, Zhang & Balding, *Approximate Bayesian computation in population genetics*, Genetics 162 (2002).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import Bijector

__all__ = ["RegressionWhitening"]


class RegressionWhitening(Bijector):
    r"""Fixed map $z = L^{-1}(\theta - A c - b)$ of features $\theta$ given the context $c$.

    $A, b$ are the least-squares regression of $\theta$ on $c$ over training pairs and $L$ the Cholesky factor of
    the residuals' covariance; $\log|\det \partial z / \partial \theta| = -\sum_i \log L_{ii}$. For a
    linear-Gaussian model $A c + b$ is the posterior mean and $L L^\top$ the posterior covariance, so that $z$ given
    $c$ is a standard normal; otherwise the layers after this one learn what the linear part misses (the regression
    adjustment of approximate Bayesian computation, Beaumont, Zhang & Balding 2002, as a bijection).

    Put it first in a conditional flow's chain (data side); build it from training pairs with
    [`from_data`][flowkit.bijectors.regression.RegressionWhitening.from_data]. `matrix`, `offset` and `cholesky`
    are buffers (not trained) and travel with the model through [`flowkit.io`][flowkit.io].

    Arguments:
        matrix: the regression matrix $A$, `D` rows of `C` numbers (`C` context features).
        offset: the intercept $b$, `D` numbers.
        cholesky: the lower-triangular factor $L$ with a positive diagonal, `D` rows of `D` numbers (the entries
            above the diagonal are ignored).

    Raises:
        ValueError: for shapes that do not fit, non-finite entries, or a diagonal of $L$ that is not positive.

    Examples:
        >>> import torch
        >>> from flowkit.bijectors import RegressionWhitening
        >>> context = torch.randn(2000, 3, dtype=torch.float64)
        >>> theta = context[:, :2] @ torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.float64)
        >>> theta = theta + 0.1 * torch.randn(2000, 2, dtype=torch.float64)
        >>> layer = RegressionWhitening.from_data(theta, context).double()
        >>> z, ladj = layer(theta, context)
        >>> covariance = z.T @ z / (2000 - 3 - 1)  # the residual covariance's own divisor
        >>> torch.allclose(covariance, torch.eye(2, dtype=torch.float64), atol=1e-6)
        True
    """

    ladj_is_constant = True

    def __init__(
        self, matrix: Sequence[Sequence[float]], offset: Sequence[float], cholesky: Sequence[Sequence[float]]
    ) -> None:
        super().__init__()
        where = "RegressionWhitening"
        a = torch.as_tensor(matrix, dtype=torch.float64)
        b = torch.as_tensor(offset, dtype=torch.float64)
        factor = torch.as_tensor(cholesky, dtype=torch.float64)
        if b.dim() != 1 or b.shape[0] < 1:
            raise ValueError(f"{where}: offset must be a list of D >= 1 numbers, got shape {tuple(b.shape)}")
        features = b.shape[0]
        if a.dim() != 2 or a.shape[0] != features or a.shape[1] < 1:
            raise ValueError(f"{where}: matrix must be {features} rows of C >= 1 numbers, got shape {tuple(a.shape)}")
        if factor.shape != (features, features):
            raise ValueError(f"{where}: cholesky must be {features} x {features}, got shape {tuple(factor.shape)}")
        factor = factor.tril()
        for name, t in (("matrix", a), ("offset", b), ("cholesky", factor)):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{where}: {name} has non-finite entries")
        if not bool((factor.diagonal() > 0).all()):
            raise ValueError(f"{where}: the diagonal of cholesky must be positive, got {factor.diagonal().tolist()}")
        self.event_shape = torch.Size((features,))
        self.context_features = a.shape[1]
        self._exact = (a, b, factor)
        dtype = torch.get_default_dtype()
        self.register_buffer("matrix", a.to(dtype))
        self.register_buffer("offset", b.to(dtype))
        self.register_buffer("cholesky", factor.to(dtype))

    def _apply(self, fn, recurse: bool = True) -> RegressionWhitening:  # noqa: ANN001
        # A dtype change re-reads the float64 statistics (as Standardization does).
        super()._apply(fn, recurse)
        self.matrix = self._exact[0].to(self.matrix)
        self.offset = self._exact[1].to(self.offset)
        self.cholesky = self._exact[2].to(self.cholesky)
        return self

    @classmethod
    def from_data(cls, theta: Tensor, context: Tensor, ridge: float = 1e-8) -> RegressionWhitening:
        r"""The least-squares regression of `theta` `(N, D)` on `context` `(N, C)` and its residuals' Cholesky factor.

        Computed in float64 on centred data, with a ridge of `ridge` times the mean variance of the context features
        (for collinear features); the residual covariance gets `ridge` times its mean variance on the diagonal.

        Raises:
            ValueError: for non-tensors, shapes other than `(N, D)` and `(N, C)` with as many rows and
                `N > C + 1`, or non-finite values.
        """
        where = "RegressionWhitening.from_data"
        if not isinstance(theta, Tensor) or not isinstance(context, Tensor) or theta.dim() != 2 or context.dim() != 2:
            raise ValueError(f"{where}: theta and context must be tensors of shapes (N, D) and (N, C)")
        if theta.shape[0] != context.shape[0]:
            raise ValueError(f"{where}: theta has {theta.shape[0]} rows but context has {context.shape[0]}")
        n, width = context.shape
        if n <= width + 1:
            raise ValueError(f"{where}: {n} pairs cannot fit a regression on {width} context features; give more")
        theta, context = theta.detach().double(), context.detach().double()
        if not bool(torch.isfinite(theta).all() and torch.isfinite(context).all()):
            raise ValueError(f"{where}: theta and context must be finite")
        theta_mean, context_mean = theta.mean(0), context.mean(0)
        t, c = theta - theta_mean, context - context_mean
        gram = c.T @ c
        gram = gram + ridge * gram.diagonal().mean().clamp_min(1e-300) * torch.eye(width, dtype=gram.dtype)
        matrix = torch.linalg.solve(gram, c.T @ t).T  # (D, C)
        residual = t - c @ matrix.T
        cov = residual.T @ residual / (n - width - 1)
        cov = cov + ridge * cov.diagonal().mean().clamp_min(1e-300) * torch.eye(cov.shape[0], dtype=cov.dtype)
        factor = torch.linalg.cholesky(cov)
        offset = theta_mean - matrix @ context_mean
        return cls(matrix.tolist(), offset.tolist(), factor.tolist())

    def _ladj(self, batch: torch.Size) -> Tensor:
        return (-self.cholesky.diagonal().log().sum()).expand(batch)

    def _mean(self, context: Tensor | None, like: Tensor) -> Tensor:
        if context is None:
            raise ValueError("RegressionWhitening needs the context it regresses on")
        return context @ self.matrix.T + self.offset

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r = (x - self._mean(context, x)).unsqueeze(-1)
        z = torch.linalg.solve_triangular(self.cholesky, r, upper=False).squeeze(-1)
        return z, self._ladj(z.shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = z @ self.cholesky.T + self._mean(context, z)
        return x, -self._ladj(x.shape[:-1])

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, context={self.context_features}"
