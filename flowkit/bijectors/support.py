r"""A map from a box (bounds per feature, each side possibly open) onto the real line: bounded supports for flows.

A flow for a prior with bounded support (a box, a positive parameter) should put no mass outside it: a posterior that
leaks out of the prior's box makes sbi's rejection step stall (sbi issues 741, 1292) and its density is wrong inside.
[`BoundedSupport`][flowkit.bijectors.BoundedSupport] as the first (data-side) layer of a flow maps the box
$\prod_i (a_i, b_i)$ onto $\mathbb{R}^D$ feature by feature, so the flow's samples $x = T^{-1}(z)$ lie inside
the box for every latent $z$, and its density is exactly zero outside:

| bounds of feature $i$ | forward $y = f(x)$ (data to latent) | inverse $x = f^{-1}(y)$ |
|---|---|---|
| $a < x < b$ | $\mathrm{logit}\frac{x - a}{b - a}$ | $a + (b - a)\,\sigma(y)$ |
| $x > a$ | $\mathrm{softplus}^{-1}(x - a) = t + \log(1 - e^{-t})$ | $a + \mathrm{softplus}(y)$ |
| $x < b$ | $-\mathrm{softplus}^{-1}(b - x)$ | $b - \mathrm{softplus}(-y)$ |
| none | $x$ | $y$ |

with $\log|\det J_{f^{-1}}| = \sum_i \log(b_i - a_i) + \log\sigma(y_i) + \log\sigma(-y_i)$, $\log\sigma(y_i)$ and
$\log\sigma(-y_i)$ on the three kinds. Forward, a point on or outside the boundary gets the log-determinant
$-\infty$, so a flow's `log_prob` there is $-\infty$ (not NaN, not an error); its latent point is that of an inside
point, so the layers after it stay finite. The inverse rounds a point that lands on a bound (a sigmoid that
saturates in float32) to the nearest representable inside point, so every sample has a finite density.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributions import constraints
from torch.nn import functional as F

from ..domains import Box
from .base import Bijector

__all__ = ["BoundedSupport", "support_bounds"]


def _softplus_inverse(t: Tensor) -> Tensor:
    """`log(exp(t) - 1) = t + log(1 - exp(-t))` for `t > 0`, without overflow."""
    return t + torch.log(-torch.expm1(-t))


def _floats(values: Any, features: int, name: str, where: str) -> list[float]:
    """Bounds as `features` Python floats (None and infinities kept as infinities)."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().broadcast_to((features,)).tolist()
    elif isinstance(values, (int, float)) or values is None:
        values = [values] * features
    out = []
    for v in values:
        if v is None:
            out.append(math.inf if name == "high" else -math.inf)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
            raise ValueError(f"{where}: every {name} bound must be a number or None, got {v!r}")
        out.append(float(v))
    if len(out) != features:
        raise ValueError(f"{where}: {name} has {len(out)} bounds for {features} features")
    return out


def support_bounds(prior: Any, features: int | None = None) -> tuple[list[float], list[float]]:
    """The per-feature bounds `(low, high)` of a prior's support (a `torch.distributions` one, or its `support`).

    Reads the constraints torch and sbi use: `interval`, `half_open_interval`, `greater_than(_eq)`, `positive`,
    `less_than`, `real`, `independent(...)` and `cat(...)` (sbi's `MultipleIndependent`); an unbounded side is
    an infinity.

    Arguments:
        prior: a distribution with `support` and `event_shape` (`BoxUniform`, a `MultivariateNormal`, ...), or a
            constraint.
        features: the number of features `D` (default: the prior's event size).

    Raises:
        ValueError: for a support none of whose features has a bound (a prior without bounds where bounds are
            requested), a constraint it cannot read (say what it is), or an event that is not a vector.
    """
    where = "support_bounds"
    support = getattr(prior, "support", prior)
    if features is None:
        shape = tuple(getattr(prior, "event_shape", ()))
        if len(shape) != 1:
            raise ValueError(f"{where}: the prior's events must be vectors (D,), got the event shape {shape}")
        features = shape[0]
    low, high = _read(support, features, where)
    if all(math.isinf(a) for a in low) and all(math.isinf(b) for b in high):
        raise ValueError(
            f"{where}: the prior's support {support!r} has no bound on any feature; a bounded flow needs a prior with "
            "bounded support (a box, a positive parameter), or give the bounds low= and high= yourself"
        )
    return low, high


def _read(support: Any, features: int, where: str) -> tuple[list[float], list[float]]:
    inf = math.inf
    if isinstance(support, constraints.independent):
        return _read(support.base_constraint, features, where)
    if isinstance(support, constraints._Cat):
        lengths = list(support.lengths)
        if sum(lengths) != features:
            raise ValueError(f"{where}: the support's parts hold {sum(lengths)} features, not {features}")
        low, high = [], []
        for part, n in zip(support.cseq, lengths, strict=True):
            a, b = _read(part, n, where)
            low, high = low + a, high + b
        return low, high
    if isinstance(support, (constraints._Interval, constraints._HalfOpenInterval)):
        return (
            _floats(support.lower_bound, features, "low", where),
            _floats(support.upper_bound, features, "high", where),
        )
    if isinstance(support, (constraints._GreaterThan, constraints._GreaterThanEq)):
        return _floats(support.lower_bound, features, "low", where), [inf] * features
    if isinstance(support, constraints._LessThan):
        return [-inf] * features, _floats(support.upper_bound, features, "high", where)
    if isinstance(support, constraints._Real):
        return [-inf] * features, [inf] * features
    raise ValueError(
        f"{where}: cannot read bounds from the support {support!r} (a {type(support).__name__}); "
        "give the bounds low= and high= yourself"
    )


class BoundedSupport(Bijector):
    r"""Map a box of bounds per feature (each side possibly infinite) onto the real line (see the module).

    The data-side first layer of a flow on a bounded support; [`bounded`][flowkit.flows.bounded] puts it in front of
    a flow from a prior or from bounds. Its domain is the [`Box`][flowkit.domains.Box], whose points outside have
    log-determinant $-\infty$.

    Arguments:
        low: lower bounds `(D,)`, a number for all, or None; `None` or `-inf` entries are unbounded.
        high: upper bounds `(D,)`, a number for all, or None; `None` or `inf` entries are unbounded.
        features: the number of features `D` (needed when both bounds are numbers).

    Raises:
        ValueError: for bounds of different lengths, NaN bounds, or a lower bound not below its upper one.

    Examples:
        >>> import torch
        >>> layer = BoundedSupport([0.0, None], [1.0, None])  # x_1 in (0, 1), x_2 on the real line
        >>> x, ladj = layer.inverse(torch.tensor([[30.0, -2.0]]))
        >>> bool(0 < x[0, 0] < 1), layer(torch.tensor([[1.5, 0.0]]))[1]
        (True, tensor([-inf]))
    """

    def __init__(
        self,
        low: Sequence[float | None] | float | None,
        high: Sequence[float | None] | float | None,
        features: int | None = None,
    ) -> None:
        super().__init__()
        where = "BoundedSupport"
        if features is None:
            sized = [v for v in (low, high) if isinstance(v, (Sequence, Tensor)) and not isinstance(v, str)]
            if not sized:
                raise ValueError(f"{where}: give features= when both bounds are single numbers")
            features = len(sized[0])
        features = int(features)
        lows, highs = _floats(low, features, "low", where), _floats(high, features, "high", where)
        for i, (a, b) in enumerate(zip(lows, highs, strict=True)):
            if not a < b:
                raise ValueError(f"{where}: feature {i} has low {a} not below high {b}")
        self.event_shape = torch.Size((features,))
        self.domain = Box(lows, highs)
        self.register_buffer("low", torch.tensor(lows))
        self.register_buffer("high", torch.tensor(highs))
        record = {
            "low": [a if math.isfinite(a) else None for a in lows],
            "high": [b if math.isfinite(b) else None for b in highs],
        }
        object.__setattr__(self, "_flowkit_config", (BoundedSupport, {**record, "features": features}))

    @classmethod
    def from_prior(cls, prior: Any, features: int | None = None) -> BoundedSupport:
        """The layer for the support of `prior` (see [`support_bounds`][flowkit.bijectors.support_bounds])."""
        return cls(*support_bounds(prior, features))

    def _kinds(self, like: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Per feature: bounded on both sides, below only, above only; and finite stand-ins for a, b and b - a."""
        low, high = self.low.to(like), self.high.to(like)
        has_low, has_high = torch.isfinite(low), torch.isfinite(high)
        both = has_low & has_high
        a = torch.where(has_low, low, torch.zeros_like(low))
        b = torch.where(has_high, high, torch.zeros_like(high))
        width = torch.where(both, b - a, torch.ones_like(low))
        return both, has_low & ~has_high, has_high & ~has_low, a, b, width

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        both, lower, upper, a, b, width = self._kinds(x)
        inside = (x > self.low.to(x)) & (x < self.high.to(x))
        # A point outside gets the latent point of an inside stand-in (finite for the layers after this one).
        x = torch.where(inside, x, torch.where(both, a + 0.5 * width, torch.where(lower, a + 1, b - 1)))
        # Distances to the bounds, exact near either (x - a and b - x, not 1 - (x - a) / (b - a), which rounds to 0).
        ones = torch.ones_like(x)
        log_above, log_below = torch.log(torch.where(both, x - a, ones)), torch.log(torch.where(both, b - x, ones))
        t = torch.where(lower, x - a, torch.where(upper, b - x, ones))
        shifted = _softplus_inverse(t)
        y = torch.where(both, log_above - log_below, torch.where(lower, shifted, torch.where(upper, -shifted, x)))
        slope = -torch.log(-torch.expm1(-t))  # log d softplus^{-1}(t) / dt
        ladj = torch.where(both, torch.log(width) - log_above - log_below, torch.where(lower | upper, slope, 0.0))
        total = torch.where(inside.all(-1), ladj.sum(-1), torch.full_like(ladj[..., 0], -math.inf))
        return y, total

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        both, lower, upper, a, b, width = self._kinds(z)
        x_both = a + width * torch.sigmoid(z)
        x = torch.where(both, x_both, torch.where(lower, a + F.softplus(z), torch.where(upper, b - F.softplus(-z), z)))
        # Keep the samples strictly inside: a saturated sigmoid or softplus lands on the bound.
        low, high = self.low.to(z), self.high.to(z)
        x = torch.minimum(torch.maximum(x, torch.nextafter(low, high)), torch.nextafter(high, low))
        log_up, log_down = F.logsigmoid(z), F.logsigmoid(-z)
        ladj = torch.where(
            both, torch.log(width) + log_up + log_down, torch.where(lower, log_up, torch.where(upper, log_down, 0.0))
        )
        return x, ladj.sum(-1)

    def extra_repr(self) -> str:
        return f"low={self.low.tolist()}, high={self.high.tolist()}"
