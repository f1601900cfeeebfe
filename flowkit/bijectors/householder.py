r"""Householder flows: a product of reflections, an orthogonal map with log-determinant zero.

Each reflection $H_k = I - 2\, v_k v_k^\top / \|v_k\|^2$ is orthogonal and its own inverse, so

$$
z = H_K \cdots H_1\, x, \qquad x = H_1 \cdots H_K\, z, \qquad \log|\det \partial z / \partial x| = 0.
$$

Applied as $x - 2 (x^\top \hat v) \hat v$ per reflection, $K$ vector operations rather than a matrix. A product of
$K$ reflections has determinant $(-1)^K$, and by the Cartan-Dieudonné theorem every orthogonal map of $D$ dimensions
is a product of at most $D$ reflections: $K = D$ (or $D - 1$) reaches every orthogonal map of its determinant, and
more reflections than features add parameters but no maps (refused).

References:
    Tomczak & Welling, *Improving Variational Auto-Encoders using Householder Flow*, NeurIPS workshop 2016
    (arXiv:1611.09630).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._validation import check_number
from .base import Bijector

__all__ = ["Householder"]


class Householder(Bijector):
    r"""A product of $K$ Householder reflections $z = H_K \cdots H_1 x$ on vectors of `features`; log-determinant 0.

    See [the module][flowkit.bijectors.householder]. The reflection vectors $v_k$ are free parameters (a zero vector
    is floored to the smallest normal norm). `matrix()` gives the orthogonal matrix.

    Arguments:
        features: number of features `D`.
        reflections: number of reflections $K$, from 1 to `D` (default `D`): more add no maps.

    Raises:
        ValueError: for `reflections` below 1 or above `features`.

    Examples:
        >>> import torch
        >>> layer = Householder(3, reflections=2)
        >>> x = torch.randn(4, 3)
        >>> z, ladj = layer(x)
        >>> bool(torch.allclose(z.norm(dim=-1), x.norm(dim=-1))), ladj.tolist()
        (True, [0.0, 0.0, 0.0, 0.0])

    References:
        Tomczak & Welling, *Improving Variational Auto-Encoders using Householder Flow*, 2016 (arXiv:1611.09630).
    """

    ladj_is_constant = True

    def __init__(self, features: int, reflections: int | None = None) -> None:
        super().__init__()
        features = check_number(features, "features", where="Householder", integer=True, low=1)
        reflections = features if reflections is None else reflections
        rule = f"an integer from 1 to features = {features} (more reflections than features add no maps)"
        self.reflections = check_number(
            reflections, "reflections", where="Householder", integer=True, low=1, high=features, rule=rule
        )
        self.event_shape = torch.Size((features,))
        self.vectors = nn.Parameter(torch.randn(self.reflections, features))

    def _units(self) -> Tensor:
        norms = torch.linalg.vector_norm(self.vectors, dim=-1, keepdim=True)
        return self.vectors / norms.clamp_min(torch.finfo(self.vectors.dtype).tiny)

    @staticmethod
    def _reflect(x: Tensor, units: Tensor) -> Tensor:
        for v in units:
            x = x - 2 * (x @ v).unsqueeze(-1) * v
        return x

    def matrix(self) -> Tensor:
        r"""The orthogonal matrix $Q = H_K \cdots H_1$ (`z = x Q^T` for row vectors)."""
        eye = torch.eye(self.event_shape[0], dtype=self.vectors.dtype, device=self.vectors.device)
        return self._reflect(eye, self._units()).mT

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._reflect(x, self._units()), x.new_zeros(x.shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._reflect(z, self._units().flip(0)), z.new_zeros(z.shape[:-1])

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, reflections={self.reflections}"
