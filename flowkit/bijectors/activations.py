"""Smooth elementwise activations and the logit preprocessing, as invertible bijectors.

An elementwise bijector `z_i = f(x_i)` with a strictly increasing, smooth `f` has
`log|det dz/dx| = sum_i log f'(x_i)`. The activations here have no closed-form inverse;
[`monotone_inverse`][flowkit.root_finding.monotone_inverse] inverts them inside a closed-form bracket.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from .._validation import check_number
from ..domains import Interval, OpenInterval
from ..root_finding import monotone_inverse
from ..utils import as_shape, sum_event
from .base import Bijector

# `monotone_inverse` lives in `flowkit.root_finding`; it is imported here for code that imported it from here.
__all__ = ["Elementwise", "SmoothLeakyReLU", "SmoothTanh", "Logit"]

#: The largest slope parameter of an activation: `a / b` and `a x` stay well inside float32.
_MAX_SLOPE = 1e6


class Elementwise(Bijector):
    """Base of elementwise bijectors `z_i = f(x_i)` with `f` smooth and strictly increasing.

    Subclasses implement `_f`, `_log_df` (`log f'`) and `_bracket` (bounds on `f^{-1}(y)`); the inverse is
    [`monotone_inverse`][flowkit.root_finding.monotone_inverse].

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
    """

    _flowkit_register = False
    #: safeguarded Newton steps of the inverse (enough for float64 on the whole real line).
    newton_iterations: int = 60

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__()
        self.event_shape = as_shape(event_shape)

    def _f(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _log_df(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _bracket(self, y: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _start(self, y: Tensor, low: Tensor, high: Tensor) -> Tensor | None:
        """First guess of the inverse (default: the middle of the bracket)."""
        return None

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self._f(x)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._f(x), sum_event(self._log_df(x), self.event_dims)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        low, high = self._bracket(z)
        df, where = lambda t: self._log_df(t).exp(), f"{type(self).__name__}.inverse"
        x = monotone_inverse(self._f, df, z, low, high, self.newton_iterations, self._start(z, low, high), where=where)
        return x, -sum_event(self._log_df(x), self.event_dims)


class SmoothLeakyReLU(Elementwise):
    """Smooth leaky ReLU `f(x) = alpha x + (1 - alpha) softplus(x)`.

    `f'(x) = alpha + (1 - alpha) sigmoid(x)` lies in `(alpha, 1)`: `f` is strictly increasing, convex and
    bi-Lipschitz. With `m(x) = max(x, alpha x)`, `m(x) < f(x) < m(x) + (1 - alpha) log 2`, which brackets
    the root of `f(x) = y` for [`monotone_inverse`][flowkit.root_finding.monotone_inverse].

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        alpha: slope for `x -> -inf`, in `(0, 1]`.

    References:
        Chao et al., *Training Energy-Based Normalizing Flow with
        Score-Matching Objectives*, NeurIPS 2023 (arXiv:2305.15267).
    """

    def __init__(self, event_shape: int | Sequence[int], alpha: float = 0.3) -> None:
        super().__init__(event_shape)
        self.alpha = check_number(alpha, "alpha", where="SmoothLeakyReLU", positive=True, high=1)

    def _f(self, x: Tensor) -> Tensor:
        # softplus(x) = log(e^x + 1), exact everywhere (F.softplus switches to x above 20)
        return self.alpha * x + (1 - self.alpha) * torch.logaddexp(x, torch.zeros_like(x))

    def _log_df(self, x: Tensor) -> Tensor:
        # log(alpha + (1 - alpha) sigmoid(x)), stable for large |x|.
        if self.alpha == 1:
            return torch.zeros_like(x)
        return torch.logaddexp(torch.full_like(x, math.log(self.alpha)), math.log1p(-self.alpha) + F.logsigmoid(x))

    def _bracket(self, y: Tensor) -> tuple[Tensor, Tensor]:
        # With m(x) = max(x, alpha x): m(x) < f(x) < m(x) + (1 - alpha) log 2, and m^{-1}(y) = min(y, y / alpha).
        high = torch.minimum(y, y / self.alpha)
        low = torch.minimum(y - (1 - self.alpha) * math.log(2), (y - (1 - self.alpha) * math.log(2)) / self.alpha)
        return low - 1e-3 * (1 + low.abs()), high + 1e-3 * (1 + high.abs())

    def _start(self, y: Tensor, low: Tensor, high: Tensor) -> Tensor:
        # f is convex: Newton from the right of the root decreases monotonically onto it.
        return high

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, alpha={self.alpha}"


class SmoothTanh(Elementwise):
    """Tanh with a linear leak, `f(x) = tanh(a x) + b x`.

    `f'(x) = b + a / cosh^2(a x)` lies in `(b, a + b]`; since `|tanh| < 1` the inverse lies in
    `[(y - 1) / b, (y + 1) / b]` and is found by [`monotone_inverse`][flowkit.root_finding.monotone_inverse].

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        scale: `a > 0`, the slope of the tanh at 0 (at most `1e6`).
        leak: `b > 0`, the slope far from 0 (at most `1e6`).

    References:
        Chao et al., *Training Energy-Based Normalizing Flow with
        Score-Matching Objectives*, NeurIPS 2023 (arXiv:2305.15267).
    """

    def __init__(self, event_shape: int | Sequence[int], scale: float = 1.0, leak: float = 0.1) -> None:
        super().__init__(event_shape)
        self.scale = check_number(scale, "scale", where="SmoothTanh", positive=True, high=_MAX_SLOPE)
        self.leak = check_number(leak, "leak", where="SmoothTanh", positive=True, high=_MAX_SLOPE)

    def _f(self, x: Tensor) -> Tensor:
        return torch.tanh(self.scale * x) + self.leak * x

    def _log_df(self, x: Tensor) -> Tensor:
        # log(b + a sech^2(a x)) = log(b) + log1p((a / b) sech^2(a x)); sech^2(u) = 4 e^{-2|u|} / (1 + e^{-2|u|})^2.
        u = (self.scale * x).abs()
        sech2 = 4 * torch.exp(-2 * u) / (1 + torch.exp(-2 * u)).square()
        return math.log(self.leak) + torch.log1p(self.scale / self.leak * sech2)

    def _bracket(self, y: Tensor) -> tuple[Tensor, Tensor]:
        return (y - 1) / self.leak - 1e-3, (y + 1) / self.leak + 1e-3

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, scale={self.scale}, leak={self.leak}"


_OPEN_LOGIT = (
    "the plain logit (alpha=0) is infinite at 0 and 1, so data must lie in the open interval (0, 1): "
    "dequantise the pixels ((x + u) / K with u uniform on [0, 1), as flowkit.data.images does) or use alpha > 0"
)


class Logit(Bijector):
    r"""Logit preprocessing of data in `[0, 1]`: `z = logit(alpha + (1 - 2 alpha) x)`.

    The usual preprocessing of dequantised images (RealNVP, Glow, EBFlow). Per element,
    `log|dz/dx| = log(1 - 2 alpha) - log p - log(1 - p)` with `p = alpha + (1 - 2 alpha) x`.

    The map is a bijection from its [`domain`][flowkit.domains.Interval], the open interval
    $I_\alpha = \big(-\tfrac{\alpha}{1 - 2\alpha}, \tfrac{1 - \alpha}{1 - 2\alpha}\big)$ (where $p \in (0, 1)$), onto
    the real line: with `alpha > 0` a flow on it puts some mass just outside `[0, 1]`. EBFlow keeps this map outside the
    model trained by score matching (see `flowkit.train.score_matching.log_prob_with_preprocessing`).

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        alpha: the squeeze, in `[0, 0.5)`; `0` gives the plain logit on `(0, 1)`.

    Inputs outside the closure of $I_\alpha$ (with `alpha = 0`, also 0 and 1) raise a `ValueError` at the
    outermost call while validation is on.

    References:
        Dinh, Sohl-Dickstein & Bengio, *Density estimation using Real NVP*,
        ICLR 2017 (arXiv:1605.08803); Chao et al., NeurIPS 2023 (arXiv:2305.15267).
    """

    def __init__(self, event_shape: int | Sequence[int], alpha: float = 0.05) -> None:
        super().__init__()
        self.alpha = check_number(alpha, "alpha", where="Logit", low=0, below=0.5)
        self.event_shape = as_shape(event_shape)
        width = 1 - 2 * self.alpha
        if self.alpha == 0:  # the logit is infinite at 0 and 1: the ends are refused, not admitted
            self.domain = OpenInterval(0.0, 1.0, advice=_OPEN_LOGIT)
        else:
            self.domain = Interval(-self.alpha / width, (1 - self.alpha) / width)

    def _squeeze(self, x: Tensor) -> Tensor:
        return self.alpha + (1 - 2 * self.alpha) * x

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        p = self._squeeze(x)
        return torch.log(p) - torch.log1p(-p)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        p = self._squeeze(x)
        z = torch.log(p) - torch.log1p(-p)
        ladj = math.log(1 - 2 * self.alpha) - torch.log(p) - torch.log1p(-p)
        return z, sum_event(ladj, self.event_dims)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = (torch.sigmoid(z) - self.alpha) / (1 - 2 * self.alpha)
        # log|dx/dz| = log sigmoid(z) + log sigmoid(-z) - log(1 - 2 alpha)
        ladj = F.logsigmoid(z) + F.logsigmoid(-z) - math.log(1 - 2 * self.alpha)
        return x, sum_event(ladj, self.event_dims)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, alpha={self.alpha}"
