"""Invertible linear layers `z = W x + b`.

Both have a log-determinant that does not depend on `x` (`ladj_is_constant`), which EBFlow's score matching exploits by
never computing it during training.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._validation import check_number
from .base import Bijector

__all__ = ["Linear", "LULinear"]


def _loaded(module: nn.Module, state_dict: dict[str, Any], prefix: str, names: tuple[str, ...]) -> dict[str, Tensor]:
    """The tensors `module` is about to load (of the right shape), as float64, refusing non-finite values.

    A value is checked in the dtype the module will hold it in (a float64 `1e300` is `inf` in float32).
    """
    loaded = {}
    for name in names:
        value, current = state_dict.get(prefix + name), getattr(module, name)
        if not isinstance(value, Tensor) or current is None or value.is_meta or value.shape != current.shape:
            continue  # missing keys and wrong shapes are reported by torch
        if not bool(torch.isfinite(value.to(current.dtype)).all()):
            raise ValueError(f"{type(module).__name__}: the loaded {name} holds non-finite values in {current.dtype}")
        loaded[name] = value.detach().to("cpu", torch.float64)
    return loaded


def _check_overflow(module: nn.Module, row_sums: Tensor, dtype: torch.dtype) -> None:
    """Refuse loaded weights whose absolute row sums (or a bound on them) pass `dtype`'s largest number."""
    if bool((row_sums > torch.finfo(dtype).max).any()):
        raise ValueError(f"{type(module).__name__}: the loaded weights overflow {dtype} on an input of size 1")


def _random_orthogonal(features: int) -> Tensor:
    q, r = torch.linalg.qr(torch.randn(features, features))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


class _MatrixMap(Bijector):
    """`z = W x + b` given `weight`, `bias`, `log_abs_det()` and `inverse_call`: what every linear layer shares."""

    _flowkit_register = False
    ladj_is_constant = True

    def log_abs_det(self) -> Tensor:
        raise NotImplementedError

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.call(x), self.log_abs_det().expand(x.shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.inverse_call(z), -self.log_abs_det().expand(z.shape[:-1])


class Linear(_MatrixMap):
    """Dense invertible linear layer `z = W x + b` with a general matrix `W`.

    `log|det dz/dx| = log|det W|` costs $O(D^3)$ (an LU factorisation); `call` and score matching skip it and cost
    $O(D^2)$ per point. The inverse solves a linear system. `W` starts as a random rotation.

    Arguments:
        features: number of features `D`.
        bias: whether to learn `b`.

    References:
        Chao et al., *Training Energy-Based Normalizing Flow with Score-Matching
        Objectives*, NeurIPS 2023 (arXiv:2305.15267).
    """

    def __init__(self, features: int, bias: bool = True) -> None:
        super().__init__()
        features = check_number(features, "features", where=type(self).__name__, integer=True, low=1)
        self.event_shape = torch.Size([features])
        self.weight = nn.Parameter(_random_orthogonal(features))
        self.bias = nn.Parameter(torch.zeros(features)) if bias else None

    def log_abs_det(self) -> Tensor:
        """`log|det W|` (a scalar)."""
        return torch.linalg.slogdet(self.weight)[1]

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        loaded = _loaded(self, state_dict, prefix, ("weight", "bias"))
        if "weight" in loaded:
            _check_overflow(self, loaded["weight"].abs().sum(-1), self.weight.dtype)
            if torch.linalg.slogdet(loaded["weight"])[0] == 0:
                raise ValueError("Linear: the loaded weight matrix is singular (not invertible)")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        if self.bias is not None:
            z = z - self.bias
        return torch.linalg.solve(self.weight, z.unsqueeze(-1)).squeeze(-1)


class _TriangularFactors(_MatrixMap):
    """`z = P L U x + b` from triangular factors: the maps shared by `LULinear` and `TailLU`.

    Subclasses define `_factors()` (unit lower `L`, upper `U` with diagonal `exp(s)`),
    `log_diag`, `bias`, and `permutation` (a buffer, or the attribute `None` for `P = I`).
    """

    _flowkit_register = False

    def _factors(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        """The dense matrix `W = P L U`."""
        lower, upper = self._factors()
        w = lower @ upper
        return w if self.permutation is None else self.permutation @ w

    def log_abs_det(self) -> Tensor:
        r"""$\log|\det W| = \sum_i s_i$ (a scalar)."""
        return self.log_diag.sum()

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        if self.bias is not None:
            z = z - self.bias
        lower, upper = self._factors()
        rows = z.reshape(-1, z.shape[-1])
        rhs = (rows if self.permutation is None else rows @ self.permutation).T  # P^T y, as columns
        y = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        x = torch.linalg.solve_triangular(upper, y, upper=True)
        return x.T.reshape(z.shape)


class LULinear(_TriangularFactors):
    """Linear layer with an LU-factorised matrix `W = P L U`.

    `P` is a fixed permutation, `L` unit lower triangular and `U` upper triangular with a positive diagonal `exp(s)`, so
    `log|det W| = sum(s)` costs $O(D)$ and the inverse is two triangular solves. Starts at the LU factors of a random
    rotation.

    Arguments:
        features: number of features `D`.
        bias: whether to learn `b`.

    References:
        Kingma & Dhariwal, *Glow: Generative Flow with Invertible 1x1
        Convolutions*, NeurIPS 2018 (arXiv:1807.03039).
    """

    def __init__(self, features: int, bias: bool = True) -> None:
        super().__init__()
        features = check_number(features, "features", where=type(self).__name__, integer=True, low=1)
        self.event_shape = torch.Size([features])
        p, lower, u = torch.linalg.lu(_random_orthogonal(features))
        diag = torch.diagonal(u)
        sign = torch.sign(diag)
        # Q = P L U = (P S)(S L S)(S U) with S = diag(sign(diag U)), S^2 = I: the signs go into P, U gets the
        # positive diagonal exp(s), and S L S is still unit lower triangular, so W = Q exactly.
        self.register_buffer("permutation", p * sign.unsqueeze(0))
        self.lower = nn.Parameter(torch.tril(lower, -1) * sign.unsqueeze(1) * sign.unsqueeze(0))
        self.upper = nn.Parameter(torch.triu(u, 1) * sign.unsqueeze(1))
        self.log_diag = nn.Parameter(diag.abs().log())
        self.bias = nn.Parameter(torch.zeros(features)) if bias else None
        self.register_buffer("_eye", torch.eye(features), persistent=False)

    def _factors(self) -> tuple[Tensor, Tensor]:
        lower = torch.tril(self.lower, -1) + self._eye
        upper = torch.triu(self.upper, 1) + torch.diag(self.log_diag.exp())
        return lower, upper

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        loaded = _loaded(self, state_dict, prefix, ("permutation", "lower", "upper", "log_diag", "bias"))
        name, dtype = type(self).__name__, self.log_diag.dtype
        p = loaded.get("permutation")
        if p is not None and not (
            bool(((p == 0) | (p.abs() == 1)).all())
            and bool(((p != 0).sum(0) == 1).all())
            and bool(((p != 0).sum(1) == 1).all())
        ):
            raise ValueError(
                f"{name}: the loaded permutation is not a signed permutation matrix (one 1 or -1 per row and column)"
            )
        s = loaded.get("log_diag")
        low, high = math.log(torch.finfo(dtype).tiny), math.log(torch.finfo(dtype).max)
        if s is not None and not bool(((s > low) & (s < high)).all()):
            raise ValueError(f"{name}: the loaded log_diag must lie in ({low:.4g}, {high:.4g}) for exp() in {dtype}")
        if {"lower", "upper", "log_diag"} <= set(loaded):
            # |P L U| 1 <= |P| |L| |U| 1 entrywise: a bound on the row sums in O(D^2).
            lower = torch.tril(loaded["lower"], -1).abs() + torch.eye(len(s), dtype=torch.float64)
            upper = torch.triu(loaded["upper"], 1).abs() + torch.diag(s.exp())
            p = loaded.get("permutation", self.permutation.detach().to("cpu", torch.float64))
            _check_overflow(self, p.abs() @ (lower @ (upper @ torch.ones(len(s), dtype=torch.float64))), dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
