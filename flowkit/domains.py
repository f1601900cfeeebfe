"""Domains on which bijectors act.

A domain tells the correctness checks where to draw test points and, for
manifolds, which tangent space to take the Jacobian in: for a bijector between
`m`-dimensional manifolds embedded in `R^n` the log-determinant is
`log|det(E_out^T J E_in)|` with `E` orthonormal tangent bases.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Domain", "Real", "Interval", "Circle", "Sphere"]


class Domain:
    """Base domain: the whole space `R^n`."""

    is_manifold: bool = False

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        """Test points, drawn so that they cover the interesting part of the domain."""
        return torch.randn(shape, dtype=dtype, generator=generator)

    def contains(self, x: Tensor) -> Tensor:
        """Elementwise membership (boolean tensor with the shape of `x`)."""
        return torch.isfinite(x)

    def admits(self, x: Tensor) -> Tensor | None:
        """Elementwise membership of the closure, which the input checks of bijectors test (None: no test).

        Unbounded domains and manifolds leave it to the finiteness check (None); an
        interval admits its end points, so data at exactly `0` or `1` (or an angle
        at exactly `pi`) pass.
        """
        return None

    def tangent_basis(self, x: Tensor) -> Tensor:
        """Orthonormal basis `(..., n, m)` of the tangent space at `x` (identity off manifolds)."""
        n = x.shape[-1]
        return torch.eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n, n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Real(Domain):
    """The real line or `R^n`, for unbounded bijectors."""


class Interval(Domain):
    """Open interval `(low, high)`, elementwise."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = float(low), float(high)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        u = torch.rand(shape, dtype=dtype, generator=generator)
        return self.low + (self.high - self.low) * (0.02 + 0.96 * u)

    def contains(self, x: Tensor) -> Tensor:
        return (x > self.low) & (x < self.high)

    def admits(self, x: Tensor) -> Tensor:
        return (x >= self.low) & (x <= self.high)

    def __repr__(self) -> str:
        return f"Interval({self.low}, {self.high})"


class Circle(Interval):
    """Angles in `[-pi, pi)`, elementwise (a torus when several)."""

    def __init__(self) -> None:
        super().__init__(-math.pi, math.pi)

    def __repr__(self) -> str:
        return "Circle()"


class Sphere(Domain):
    """Unit sphere `S^{n-1}` in `R^n` over the last dimension (`S^3` holds unit quaternions)."""

    is_manifold = True

    def __init__(self, n: int = 4) -> None:
        self.n = int(n)

    def sample(
        self, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None
    ) -> Tensor:
        x = torch.randn(shape, dtype=dtype, generator=generator)
        return x / x.norm(dim=-1, keepdim=True)

    def contains(self, x: Tensor) -> Tensor:
        return ((x.norm(dim=-1, keepdim=True) - 1).abs() < 1e-4).expand_as(x)

    def tangent_basis(self, x: Tensor) -> Tensor:
        # Complete x to an orthonormal basis with a QR of [x, I]; drop the normal column.
        n = x.shape[-1]
        eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n, n)
        q, _ = torch.linalg.qr(torch.cat([x.unsqueeze(-1), eye], dim=-1))
        return q[..., :, 1:n]

    def __repr__(self) -> str:
        return f"Sphere({self.n})"
