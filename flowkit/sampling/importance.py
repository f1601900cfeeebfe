r"""Importance sampling with a flow as proposal: weights, ESS, log Z and reweighting.

For a target $p(x) = e^{-u(x)}/Z$ and flow samples $x_i \sim q$,
the log importance weights are $\log w_i = -u(x_i) - \log q(x_i)$; then
$\hat Z = \frac1n \sum_i w_i$ is unbiased for $Z$, the normalised
Kish effective sample size is $(\sum w)^2 / (n \sum w^2) \in (0, 1]$, and
self-normalised averages $\sum_i w_i f(x_i) / \sum_i w_i$ estimate
$E_p[f]$. Weights are computed in float64 with `logsumexp`.

Examples:
    >>> import flowkit
    >>> flow = flowkit.flows.RealNVP(2, transforms=2)
    >>> x, log_w = flowkit.sampling.importance_sample(flow, flowkit.targets.DoubleWell(), 1000)
    >>> log_Z, err = flowkit.sampling.log_Z(log_w)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._validation import outermost
from ..flows.base import FlowModel, draw_latent, require_exact_weights
from ..targets import Target, energy_of

__all__ = [
    "sample_with_log_weights",
    "log_weights_at",
    "importance_sample",
    "log_weights",
    "check_target",
    "ess",
    "log_Z",
    "reweight",
    "resample",
]


def check_target(flow: FlowModel, target: Target, where: str) -> None:
    """Raise a ValueError (starting with `where`) unless `target` is a `Target` for the unconditional `flow`."""
    if not isinstance(target, Target):
        raise ValueError(f"{where}: target must be a flowkit.targets.Target, got {type(target).__name__}")
    if tuple(flow.event_shape) != tuple(target.event_shape):
        raise ValueError(
            f"{where}: the flow's event shape {tuple(flow.event_shape)} differs from the target's "
            f"{tuple(target.event_shape)}"
        )
    if getattr(flow, "context_features", 0):
        raise ValueError(f"{where}: the flow is conditional; targets have no context")


def sample_with_log_weights(
    flow: FlowModel, n: int | Sequence[int], target: Any, context: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""[`log_weights_at`][flowkit.sampling.importance.log_weights_at] `n` latent points drawn from the flow's base.

    `logsumexp(log_w) - log n` estimates $\log Z$ and `-mean(log_w)` is the reverse KL divergence (on path
    space for a stochastic flow) up to $\log Z$; minimise it to train by reverse KL (reparameterised).

    Raises:
        ValueError: for a model whose samples do not follow its weights
            ([`require_exact_weights`][flowkit.flows.base.require_exact_weights]).
    """
    where = "sample_with_log_weights"
    require_exact_weights(flow, where)
    return log_weights_at(flow, draw_latent(flow, n, context, where), target, context)


def log_weights_at(flow: FlowModel, z: Tensor, target: Any, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""Samples $x = T(z)$ of given latent points and their log importance weights $-u(x) - \log q$.

    $x$ and $\log q$ come from the flow's [`latent_to_data`][flowkit.flows.base.FlowModel.latent_to_data] (for a
    [`StochasticFlow`][flowkit.flows.StochasticFlow], the path density: $w$ is its exact path weight). The
    flow's samples must follow its weights (not checked here); `target` is anything with `energy(x)`, or a
    flowkit Distribution.

    Returns:
        `(x, log_w)` of shapes `(*batch, *event_shape)` and `batch`, with their graphs.
    """
    x, log_q = flow.latent_to_data(z, context)
    with outermost():
        return x, -energy_of(target, x, len(flow.event_shape), "sample_with_log_weights") - log_q


def _check_log_w(log_w: Tensor, where: str) -> Tensor:
    if not isinstance(log_w, Tensor) or log_w.dim() != 1 or log_w.numel() < 2:
        raise ValueError(f"{where}: log_w must be a 1-D tensor of at least 2 log weights")
    if not log_w.is_floating_point():
        raise ValueError(f"{where}: log_w must have a floating dtype, got {log_w.dtype}")
    if torch.isnan(log_w).any() or torch.isposinf(log_w).any():
        raise ValueError(f"{where}: log_w contains NaN or +inf")
    if torch.isneginf(log_w).all():
        raise ValueError(f"{where}: every weight is zero")
    return log_w.detach().double()


def _relative(log_w: Tensor) -> Tensor:
    """Log weights relative to the largest (`<= 0`), so that no sum or square of them overflows."""
    return log_w - log_w.max()


@torch.no_grad()
def importance_sample(flow: FlowModel, target: Target, n: int, batch_size: int = 10_000) -> tuple[Tensor, Tensor]:
    """Draw `n` flow samples and their log importance weights `-u(x) - log q(x)`.

    The weights are [`log_weights_at`][flowkit.sampling.importance.log_weights_at]'s (a stochastic flow's path
    weights), drawn `batch_size` at a time.

    Returns:
        `(x, log_w)`: samples `(n, *event_shape)` and float64 log weights `(n,)`.

    Raises:
        ValueError: for a model whose samples do not come from its density (a free-form flow; see
            [`require_exact_weights`][flowkit.flows.base.require_exact_weights]), a target of another event
            shape, non-positive sizes, or weights that are NaN or +inf.
    """
    return _weighted_samples(flow, target, n, batch_size, "importance_sample")


def _weighted_samples(flow: FlowModel, target: Target, n: int, batch_size: int, where: str) -> tuple[Tensor, Tensor]:
    """[`importance_sample`][flowkit.sampling.importance_sample], with errors that start with `where`."""
    check_target(flow, target, where)
    require_exact_weights(flow, where)
    if n < 1 or batch_size < 1:
        raise ValueError(f"{where}: n and batch_size must be positive, got {n} and {batch_size}")
    xs, lws = [], []
    for start in range(0, n, batch_size):
        m = min(batch_size, n - start)
        x, log_w = log_weights_at(flow, draw_latent(flow, m, None, where), target)
        xs.append(x)
        lws.append(log_w.double())
    log_w = torch.cat(lws)
    bad = int((torch.isnan(log_w) | torch.isposinf(log_w)).sum())
    if bad:
        raise ValueError(
            f"{where}: {bad} of {n} log weights are NaN or +inf; the target's energy "
            f"({type(target).__name__}) or the flow's density is not finite at some samples"
        )
    return torch.cat(xs), log_w


def log_weights(flow: FlowModel, target: Target, n: int, batch_size: int = 10_000) -> Tensor:
    """Log importance weights of `n` fresh flow samples, float64, shape `(n,)`.

    See [`importance_sample`][flowkit.sampling.importance_sample].
    """
    return importance_sample(flow, target, n, batch_size)[1]


def ess(log_w: Tensor) -> float:
    r"""Normalised Kish effective sample size $(\sum w)^2 / (n \sum w^2)$, in `(0, 1]`."""
    log_w = _relative(_check_log_w(log_w, "ess"))
    value = float(torch.exp(2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0)) / log_w.numel())
    return min(value, 1.0)  # rounding can exceed 1 by an ulp when every weight is equal


def log_Z(log_w: Tensor) -> tuple[float, float]:
    r"""Estimate $\log Z = \log \frac1n \sum_i w_i$ and its standard error.

    The error is the delta-method one, $\mathrm{sd}(w) / (\sqrt n\, \bar w)
    = \sqrt{(1/\mathrm{ESS} - 1)/(n - 1)}$ with the normalised ESS. The
    estimate of $\log Z$ is biased low by about half its variance. When
    a few weights dominate (fewer than 10 effective points) both are
    meaningless (the error cannot exceed 1), and a `RuntimeWarning` says so.

    Returns:
        `(log_Z_hat, standard_error)` as floats.
    """
    log_w = _check_log_w(log_w, "log_Z")
    n = log_w.numel()
    top = log_w.max()
    estimate = float(top + (torch.logsumexp(_relative(log_w), 0) - math.log(n)))
    effective = ess(log_w)
    if n * effective < 10:
        warnings.warn(
            "log_Z: fewer than 10 effective samples (a few weights dominate); "
            "the estimate and its standard error are not to be trusted",
            RuntimeWarning,
            stacklevel=2,
        )
    error = math.sqrt(max(1.0 / effective - 1.0, 0.0) / (n - 1))
    return estimate, error


def reweight(observable: Tensor, log_w: Tensor) -> tuple[Tensor, Tensor]:
    r"""Self-normalised importance estimate $\sum_i w_i f_i / \sum_i w_i$ and its standard error.

    Arguments:
        observable: values `f(x_i)`, shape `(n, ...)` (any trailing shape).
        log_w: log weights of the same samples, shape `(n,)`.

    Returns:
        `(estimate, standard_error)`, each of the trailing shape of `observable`;
        the error is the delta-method one, $\sqrt{\sum_i \bar w_i^2 (f_i - \hat f)^2}$.
    """
    log_w = _check_log_w(log_w, "reweight")
    if not isinstance(observable, Tensor) or observable.shape[:1] != log_w.shape:
        got = tuple(observable.shape) if isinstance(observable, Tensor) else type(observable).__name__
        raise ValueError(
            f"reweight: observable must have one value per weight, shape ({log_w.numel()}, ...); got {got}"
        )
    if observable.is_complex():
        raise ValueError("reweight: observable must be real (reweight the real and imaginary parts separately)")
    if not bool(torch.isfinite(observable).all()):
        raise ValueError(
            f"reweight: observable contains {int((~torch.isfinite(observable)).sum())} non-finite value(s)"
        )
    f = observable.detach().double()
    w = torch.softmax(log_w, 0).reshape(-1, *([1] * (f.dim() - 1)))
    estimate = (w * f).sum(0)
    error = (w.square() * (f - estimate).square()).sum(0).sqrt()
    # Indicators and counts (bool, integer) give float64 averages; floating observables keep their dtype.
    dtype = observable.dtype if observable.is_floating_point() else torch.float64
    return estimate.to(dtype), error.to(dtype)


def resample(log_w: Tensor, n: int | None = None, *, generator: torch.Generator | None = None) -> Tensor:
    r"""Systematic resampling: indices of `n` draws from the samples in proportion to their weights.

    With normalised weights $\bar w_i$, cumulative sums $c_i = \sum_{j \le i} \bar w_j$ and one uniform
    $u \sim U[0, 1)$, draw $k$ is the first $i$ with $c_i > (k + u)/n$: each sample is drawn
    $\lfloor n \bar w_i \rfloor$ or $\lceil n \bar w_i \rceil$ times, unbiased and with less variance than
    multinomial resampling. The draws are equally weighted samples of the target.

    Arguments:
        log_w: log weights `(N,)` (`-inf` for a zero weight).
        n: number of draws (default `N`).
        generator: random generator of the offset $u$.

    Returns:
        Indices `(n,)` (int64) into the samples, in increasing order.

    Raises:
        ValueError: for bad weights (see [`ess`][flowkit.sampling.ess]) or a non-positive `n`.

    References:
        Kitagawa, *Monte Carlo filter and smoother for non-Gaussian nonlinear state space models*,
        J. Comput. Graph. Stat. 5 (1996); Douc, Cappé & Moulines, *Comparison of resampling schemes for
        particle filtering*, ISPA 2005 (arXiv:cs/0507025).
    """
    log_w = _check_log_w(log_w, "resample")
    n = log_w.numel() if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"resample: n must be a positive integer, got {n!r}")
    cumulative = torch.cumsum(torch.softmax(log_w, 0), 0)
    u = torch.rand((), dtype=torch.float64, generator=generator)
    points = (torch.arange(n, dtype=torch.float64) + u) / n
    # cumulative[-1] is 1 up to rounding: the clamp keeps the last draws on the last positive weight
    index = torch.searchsorted(cumulative, points, right=True)
    last = int(torch.nonzero(log_w > -math.inf).max())
    return index.clamp(max=last)
