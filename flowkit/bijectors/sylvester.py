r"""Sylvester flows (van den Berg et al. 2018): $z = x + Q R \tanh(\tilde R Q^\top x + b)$, inverted exactly.

$Q$ is $D \times M$ with orthonormal columns, $R$ and $\tilde R$ are $M \times M$ upper triangular and $b \in
\mathbb{R}^M$. By Sylvester's determinant identity, $\det(I_D + A B) = \det(I_M + B A)$, and since $Q^\top Q = I_M$,

$$
\log\Big|\det \frac{\partial z}{\partial x}\Big| = \log\det\big(I_M + \mathrm{diag}(h'(a))\, \tilde R R\big)
= \sum_{i=1}^{M} \log\big(1 + h'(a_i)\, \tilde R_{ii} R_{ii}\big), \qquad a = \tilde R Q^\top x + b,
$$

a triangular determinant. With $h = \tanh$ ($0 < h' \le 1$) the layer is invertible when
$\tilde R_{ii} R_{ii} > -1$; the diagonals are $R_{ii} = \tanh(\rho_i)$ and $\tilde R_{ii} = \tanh(\tilde\rho_i)$,
as in the paper, so $|\tilde R_{ii} R_{ii}| < 1$ for every parameter value.

Three ways to make $Q$ (`variant`):

- `"orthogonal"`: $M \le D$ orthonormal columns, the Q factor of a free $D \times M$ matrix (signs fixed by the
  diagonal of the R factor, so that it is a smooth function of the matrix; the paper orthogonalises iteratively);
- `"householder"`: $Q = H_K \cdots H_1$, a [`Householder`][flowkit.bijectors.Householder] product, $M = D$;
- `"triangular"`: $Q = I$ or, with `reverse=True`, the reversal permutation (alternate them in a chain), $M = D$.

**Inverse.** Sylvester flows have no closed-form inverse, but they are invertible and triangular in the rotated
coordinates: with $v = Q^\top x$ and $w = Q^\top z$, the complement of the columns of $Q$ is unchanged
($x - Q v = z - Q w$) and $w = v + R \tanh(\tilde R v + b)$ has an upper-triangular Jacobian. Component $i$
depends on $v_i, \dots, v_M$ only, so back substitution from $i = M$ down to 1 solves one increasing scalar
equation per component,

$$
v_i + R_{ii} \tanh(\tilde R_{ii} v_i + c_i) = w_i - \sum_{j > i} R_{ij} \tanh(a_j), \qquad
c_i = b_i + \sum_{k > i} \tilde R_{ik} v_k,
$$

whose root lies within $|R_{ii}| < 1$ of the right-hand side: safeguarded Newton
([`monotone_inverse`][flowkit.root_finding.monotone_inverse]) on that bracket, checked to the root finder's residual
tolerance (else [`ConvergenceError`][flowkit.root_finding.ConvergenceError]), with implicit gradients; then
$x = z - Q R \tanh(a)$. (Pyro's Sylvester layer computes no inverse.)

References:
    van den Berg, Hasenclever, Tomczak & Welling, *Sylvester Normalizing Flows for Variational Inference*,
    UAI 2018 (arXiv:1803.05649).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..root_finding import monotone_inverse
from .base import Bijector
from .householder import Householder

__all__ = ["Sylvester"]

#: The ways to make `Q`.
VARIANTS = ("orthogonal", "householder", "triangular")


class Sylvester(Bijector):
    r"""Sylvester flow layer $z = x + Q R \tanh(\tilde R Q^\top x + b)$ on vectors of `features`.

    See [the module][flowkit.bijectors.sylvester] for the log-determinant, the invertibility constraint and the
    exact inverse by back substitution (`M` scalar root solves, each checked). The layer is unconditional.

    Arguments:
        features: number of features `D`.
        variant: how $Q$ is made: `"orthogonal"`, `"householder"` or `"triangular"`.
        columns: the number $M$ of columns of $Q$, from 1 to `D` (`"orthogonal"` only; default `D`).
        reflections: Householder reflections $K$ of $Q$, from 1 to `D` (`"householder"` only; default `D`).
        reverse: $Q$ is the reversal permutation instead of the identity (`"triangular"` only).
        iterations: safeguarded Newton steps of each scalar solve of the inverse.

    Raises:
        ValueError: for an unknown variant, an option of another variant, `columns` or `reflections` outside
            `1..D`.

    Examples:
        >>> import torch
        >>> layer = Sylvester(3, variant="householder", reflections=2).double()
        >>> x = torch.randn(4, 3, dtype=torch.float64)
        >>> z, ladj = layer(x)
        >>> back, ladj_inv = layer.inverse(z)
        >>> bool(torch.allclose(back, x, atol=1e-10)), bool(torch.allclose(ladj, -ladj_inv))
        (True, True)

    References:
        van den Berg, Hasenclever, Tomczak & Welling, *Sylvester Normalizing Flows for Variational Inference*,
        UAI 2018 (arXiv:1803.05649).
    """

    def __init__(
        self,
        features: int,
        variant: str = "orthogonal",
        columns: int | None = None,
        reflections: int | None = None,
        reverse: bool = False,
        iterations: int = 100,
    ) -> None:
        super().__init__()
        features = check_number(features, "features", where="Sylvester", integer=True, low=1)
        if variant not in VARIANTS:
            raise ValueError(f"Sylvester: variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        for name, value, owner in (("columns", columns, "orthogonal"), ("reflections", reflections, "householder")):
            if value is not None and variant != owner:
                raise ValueError(f"Sylvester: {name} is an option of the {owner!r} variant, not of {variant!r}")
        if reverse and variant != "triangular":
            raise ValueError(f"Sylvester: reverse is an option of the 'triangular' variant, not of {variant!r}")
        self.variant, self.reverse = variant, bool(reverse)
        self.iterations = check_number(iterations, "iterations", where="Sylvester", integer=True, low=1, high=10_000)
        self.event_shape = torch.Size((features,))
        m = features
        if variant == "orthogonal":
            rule = f"an integer from 1 to features = {features}"
            m = features if columns is None else columns
            m = check_number(m, "columns", where="Sylvester", integer=True, low=1, high=features, rule=rule)
            self.frame = nn.Parameter(torch.linalg.qr(torch.randn(features, m))[0])
        elif variant == "householder":
            self.householder = Householder(features, reflections)
        self.columns = m
        scale = 1 / math.sqrt(m)
        self.r_upper = nn.Parameter(scale * torch.randn(m, m).triu(1))
        self.r_tilde_upper = nn.Parameter(scale * torch.randn(m, m).triu(1))
        self.r_diagonal = nn.Parameter(torch.randn(m))
        self.r_tilde_diagonal = nn.Parameter(torch.randn(m))
        self.bias = nn.Parameter(torch.zeros(m))

    def q(self) -> Tensor:
        """The `D x M` matrix $Q$ with orthonormal columns."""
        if self.variant == "orthogonal":
            q, r = torch.linalg.qr(self.frame)
            return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
        if self.variant == "householder":
            return self.householder.matrix()
        eye = torch.eye(self.columns, dtype=self.bias.dtype, device=self.bias.device)
        return eye.flip(-1) if self.reverse else eye

    def triangles(self) -> tuple[Tensor, Tensor]:
        r"""$(R, \tilde R)$: upper triangular, diagonals $\tanh(\rho)$ and $\tanh(\tilde\rho)$."""
        return (
            self.r_upper.triu(1) + torch.diag(torch.tanh(self.r_diagonal)),
            self.r_tilde_upper.triu(1) + torch.diag(torch.tanh(self.r_tilde_diagonal)),
        )

    def _ladj(self, a: Tensor, r: Tensor, r_tilde: Tensor) -> Tensor:
        # 1 + h'(a) p with p = R~_ii R_ii in (-1, 1) and h' = 1 - tanh^2 in (0, 1]: log1p of a number above -1.
        product = torch.diagonal(r) * torch.diagonal(r_tilde)
        return torch.log1p(product * (1 - torch.tanh(a) ** 2)).sum(-1)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q = self.q()
        r, r_tilde = self.triangles()
        a = x @ q @ r_tilde.mT + self.bias
        return x + torch.tanh(a) @ r.mT @ q.mT, self._ladj(a, r, r_tilde)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q = self.q()
        r, r_tilde = self.triangles()
        w = z @ q
        v: dict[int, Tensor] = {}
        h: dict[int, Tensor] = {}
        a: dict[int, Tensor] = {}
        for i in range(self.columns - 1, -1, -1):
            later = range(i + 1, self.columns)
            c = self.bias[i] + sum((r_tilde[i, k] * v[k] for k in later), torch.zeros_like(w[..., i]))
            target = w[..., i] - sum((r[i, j] * h[j] for j in later), torch.zeros_like(w[..., i]))
            r_ii, r_tilde_ii = r[i, i], r_tilde[i, i]

            def f(t: Tensor, r_ii: Tensor = r_ii, r_tilde_ii: Tensor = r_tilde_ii, c: Tensor = c) -> Tensor:
                return t + r_ii * torch.tanh(r_tilde_ii * t + c)

            def df(t: Tensor, r_ii: Tensor = r_ii, r_tilde_ii: Tensor = r_tilde_ii, c: Tensor = c) -> Tensor:
                return 1 + r_ii * r_tilde_ii * (1 - torch.tanh(r_tilde_ii * t + c) ** 2)

            width = r_ii.detach().abs() + 1
            v[i] = monotone_inverse(
                f, df, target, target - width, target + width, self.iterations, start=target, where="Sylvester.inverse"
            )
            a[i] = r_tilde_ii * v[i] + c
            h[i] = torch.tanh(a[i])
        a_all, h_all = (torch.stack([d[i] for i in range(self.columns)], dim=-1) for d in (a, h))
        return z - h_all @ r.mT @ q.mT, -self._ladj(a_all, r, r_tilde)

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, variant={self.variant!r}, columns={self.columns}"
