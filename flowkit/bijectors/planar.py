r"""Planar and radial layers (Rezende & Mohamed 2015), with their invertibility constraints built in.

Both are applied in flowkit's forward (data to latent) direction, so `log_prob` costs one pass; sampling runs their
inverse: a 1-D monotone root along $w$ for the planar layer, a closed-form quadratic for the radial one.

References:
    Rezende & Mohamed, *Variational Inference with Normalizing Flows*, ICML 2015 (arXiv:1505.05770),
    section 4.1 and appendix A.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._validation import check_number
from ..root_finding import monotone_inverse
from .base import Bijector

__all__ = ["Planar", "Radial"]


class Planar(Bijector):
    r"""Planar layer $z = x + \hat u \tanh(w^\top x + b)$ on vectors of `features`.

    $\log|\det \partial z / \partial x| = \log(1 + w^\top \hat u \, \tanh'(w^\top x + b))$. The layer is invertible when
    $w^\top \hat u \ge -1$; the free parameter $u$ enters through $\hat u = u + (m(w^\top u) - w^\top u) \, w / \|w\|^2$
    with $m(a) = -1 + \mathrm{softplus}(a)$, so that $w^\top \hat u = m(w^\top u) > -1$ for every $u$ (appendix A).

    **Inverse.** With $\alpha = w^\top x$ the layer gives $w^\top z = \alpha + w^\top \hat u \tanh(\alpha + b)$,
    increasing in $\alpha$; $\alpha$ lies within $|w^\top \hat u|$ of $w^\top z$, and is found by safeguarded Newton
    ([`monotone_inverse`][flowkit.root_finding.monotone_inverse]) on that bracket widened by 1, then
    $x = z - \hat u \tanh(\alpha + b)$. `iterations` steps (default 100) gain at least one bit per two steps, so the
    root is exact to the dtype's precision (tested to 1e-10 in float64); gradients are the implicit ones.

    Arguments:
        features: number of features `D`.
        iterations: safeguarded Newton steps of the inverse (at least 1).

    References:
        Rezende & Mohamed, *Variational Inference with Normalizing Flows*, ICML 2015 (arXiv:1505.05770).
    """

    def __init__(self, features: int, iterations: int = 100) -> None:
        super().__init__()
        check_number(features, "features", where="Planar", integer=True, low=1)
        self.iterations = check_number(iterations, "iterations", where="Planar", integer=True, low=1)
        self.event_shape = torch.Size((features,))
        self.w = nn.Parameter(torch.randn(features) / math.sqrt(features))
        self.u = nn.Parameter(0.01 * torch.randn(features))
        self.b = nn.Parameter(torch.zeros(()))

    def u_hat(self) -> Tensor:
        r"""$\hat u$, the constrained direction: $w^\top \hat u = -1 + \mathrm{softplus}(w^\top u) > -1$."""
        wu = self.w @ self.u
        # w = 0 makes the layer the identity (w.u_hat = 0 there); the floor keeps 0/0 out of it
        return self.u + (F.softplus(wu) - 1 - wu) * self.w / (self.w @ self.w).clamp_min(torch.finfo(self.w.dtype).tiny)

    def _ladj(self, a: Tensor) -> Tensor:
        # 1 + w.u_hat tanh'(a) = tanh(a)^2 + s (1 - tanh(a)^2) with s = 1 + w.u_hat = softplus(w.u) > 0: positive in
        # any dtype. At w = 0 (the identity plus a shift) w.u_hat = 0, so s = 1.
        t2 = torch.tanh(a) ** 2
        return torch.log(t2 + self._slope_factor() * (1 - t2))

    def _slope_factor(self) -> Tensor:
        r"""$1 + w^\top \hat u$ = softplus(w.u) > 0 (without the rounding of 1 + w @ u_hat); 1 where w = 0."""
        return torch.where(self.w @ self.w > 0, F.softplus(self.w @ self.u), torch.ones_like(self.b))

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        a = x @ self.w + self.b
        return x + self.u_hat() * torch.tanh(a).unsqueeze(-1), self._ladj(a)

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return x + self.u_hat() * torch.tanh(x @ self.w + self.b).unsqueeze(-1)

    def _solve(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """`(x, a)` with `a = w^T x + b` for the `x` that maps to `z`."""
        u = self.u_hat()
        wu = self._slope_factor() - 1  # w.u_hat, without the rounding of w @ u_hat
        target = z @ self.w
        width = wu.abs() + 1

        def f(alpha: Tensor) -> Tensor:
            return alpha + wu * torch.tanh(alpha + self.b)

        def df(alpha: Tensor) -> Tensor:
            return 1 + wu * (1 - torch.tanh(alpha + self.b) ** 2)

        alpha = monotone_inverse(
            f, df, target, target - width, target + width, self.iterations, start=target, where="Planar.inverse"
        )
        a = alpha + self.b
        return z - u * torch.tanh(a).unsqueeze(-1), a

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, a = self._solve(z)
        return x, -self._ladj(a)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self._solve(z)[0]

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}"


class Radial(Bijector):
    r"""Radial layer $z = x + \hat\beta \, (x - x_0) / (\alpha + r)$, $r = \|x - x_0\|$, on vectors of `features`.

    $\alpha = \mathrm{softplus}(a) > 0$ and $\hat\beta = -\alpha + \mathrm{softplus}(b) > -\alpha$, the layer's
    invertibility condition (appendix A). With $h = 1 / (\alpha + r)$,
    $\log|\det \partial z / \partial x| = (D - 1) \log(1 + \hat\beta h) + \log(1 + \hat\beta \alpha h^2)$.

    **Inverse**, in closed form: $\|z - x_0\| = \rho = r (1 + \hat\beta / (\alpha + r))$ gives the quadratic
    $r^2 + (\alpha + \hat\beta - \rho) r - \alpha \rho = 0$, whose one non-negative root (taken in the form
    free of cancellation) gives $x = x_0 + (z - x_0) / (1 + \hat\beta / (\alpha + r))$.

    Arguments:
        features: number of features `D`.

    References:
        Rezende & Mohamed, *Variational Inference with Normalizing Flows*, ICML 2015 (arXiv:1505.05770).
    """

    def __init__(self, features: int) -> None:
        super().__init__()
        check_number(features, "features", where="Radial", integer=True, low=1)
        self.event_shape = torch.Size((features,))
        self.center = nn.Parameter(torch.randn(features) / math.sqrt(features))
        self.raw_alpha = nn.Parameter(torch.zeros(()))
        self.raw_beta = nn.Parameter(torch.zeros(()))  # softplus(raw_beta) = alpha: beta_hat = 0, the identity

    def alpha_beta(self) -> tuple[Tensor, Tensor]:
        r"""$(\alpha, \hat\beta)$ with $\alpha > 0$ and $\hat\beta > -\alpha$."""
        alpha = F.softplus(self.raw_alpha)
        return alpha, F.softplus(self.raw_beta) - alpha

    def _ladj(self, r: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        h = 1 / (alpha + r)
        return (self.event_shape[0] - 1) * torch.log1p(beta * h) + torch.log1p(beta * alpha * h**2)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        alpha, beta = self.alpha_beta()
        d = x - self.center
        r = torch.linalg.vector_norm(d, dim=-1)
        z = x + (beta / (alpha + r)).unsqueeze(-1) * d
        return z, self._ladj(r, alpha, beta)

    def _solve(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        alpha, beta = self.alpha_beta()
        d = z - self.center
        rho = torch.linalg.vector_norm(d, dim=-1)
        q = alpha + beta - rho
        root = torch.sqrt(q**2 + 4 * alpha * rho)
        # (-q + root) / 2 without cancellation for q > 0: the same root as 2 alpha rho / (q + root).
        r = torch.where(q > 0, 2 * alpha * rho / torch.where(q > 0, q + root, 1.0), 0.5 * (root - q))
        x = self.center + d / (1 + beta / (alpha + r)).unsqueeze(-1)
        return x, r, alpha, beta

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, r, alpha, beta = self._solve(z)
        return x, -self._ladj(r, alpha, beta)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self._solve(z)[0]

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}"
