r"""Tail estimators and tail metrics, for heavy-tailed data and the flows fitted to them.

**Estimators.** For a marginal $x$ with $P(|x| > t) \sim t^{-1/\xi}$ (extreme value index
$\xi > 0$, tail index and Student-t degrees of freedom $\nu = 1/\xi$), the estimators read the
descending order statistics $X_{(1)} \ge X_{(2)} \ge \dots$ of $|x|$, with $L_i = \log X_{(i)}$ and
the log-excess moments $M_j(k) = \frac1k \sum_{i \le k} (L_i - L_{k+1})^j$:

- Hill: $\hat\xi_H(k) = M_1(k)$ (consistent for $\xi > 0$);
- moments (Dekkers, Einmahl & de Haan 1989): $\hat\xi_M(k) = M_1 + 1 - \frac12 (1 - M_1^2 / M_2)^{-1}$, consistent for
  every real $\xi$ (0 for Gaussian tails, negative for bounded ones);
- kernel type: with the spacings $D_i = X_{(i)} - X_{(i+1)}$, the biweight kernel
  $K_h(u) = \frac{15}{8h}(1 - (u/h)^2)^2$ on $[0, h]$ and $u_i = i/n$, $\hat\xi_K = q_2 / q_1 - 1$ where
  $q_1 = \sum_i u_i^{a} K_h(u_i) D_i$ and $q_2 = \sum_i \frac{d}{du}\big[u^{a+1} K_h(u)\big]_{u_i} D_i$ ($a = 2$).
  Integration by parts gives $q_2 / q_1 \to 1 + \xi$ for every real $\xi < a$ (the construction of Groeneboom, Lopuhaä &
  de Wolf 2003, in a simpler form).

The number $k$ of order statistics (the threshold) comes from the double bootstrap of Danielsson, de Haan, Peng & de
Vries (2001): the bootstrap mean squared error of a statistic whose mean is 0 (for Hill $M_2 - 2M_1^2$; for the moments
estimator the difference of two moment-type estimators, after Draisma et al. 1999) is minimised at $k_1$ in resamples of
size $n_1 = n\sqrt{t}$ and at $k_2$ in resamples of size $n_2 = n t$ ($t = 1/2$), and
$k^* = \frac{k_1^2}{k_2}\left(\frac{\log k_1}{2 \log n_1 - \log k_1}\right)^{2(\log n_1 - \log k_1)/\log n_1}$. The
kernel estimator's bandwidth is $h = k^*_M / n$.

**Decision** (mTAF): a marginal is light when both the moments and the kernel estimate are at most
`light_below` (0 in exact arithmetic; a small positive default absorbs their noise on Gaussian
data); otherwise it is heavy with $\nu = 1 / \hat\xi$, taking $\hat\xi$ from Hill, else the moments,
else the kernel estimate (the first that is positive).

**Metrics**: [`quantile_coverage`][flowkit.stats.quantile_coverage],
[`tail_value_at_risk`][flowkit.stats.tail_value_at_risk], [`loglog_tail_distance`][flowkit.stats.loglog_tail_distance],
and [`estimate_tails`][flowkit.stats.estimate_tails] on model samples against data.

References:
    Hill, *A simple general approach to inference about the tail of a distribution*, Ann. Stat. 1975
    ([doi:10.1214/aos/1176343247](https://doi.org/10.1214/aos/1176343247));
    Dekkers, Einmahl & de Haan, *A moment estimator for the index of an extreme-value distribution*,
    Ann. Stat. 1989 ([doi:10.1214/aos/1176347397](https://doi.org/10.1214/aos/1176347397));
    Danielsson, de Haan, Peng & de Vries, *Using a bootstrap method to choose the sample
    fraction in tail index estimation*, J. Multivariate Anal. 2001
    ([doi:10.1006/jmva.2000.1903](https://doi.org/10.1006/jmva.2000.1903)); Groeneboom, Lopuhaä & de Wolf,
    *Kernel-type estimators for the extreme value index*, Ann. Stat. 2003; Voitalov et al., *Scale-free
    networks well done*, Phys. Rev. Research 2019
    ([doi:10.1103/PhysRevResearch.1.033034](https://doi.org/10.1103/PhysRevResearch.1.033034));
    Laszkiewicz, Lederer & Fischer, *Marginal Tail-Adaptive Normalizing Flows*, ICML 2022 (arXiv:2206.10311).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_number

__all__ = [
    "TailEstimate",
    "hill",
    "moments",
    "kernel",
    "double_bootstrap",
    "estimate_tail",
    "estimate_tails",
    "quantile_coverage",
    "tail_value_at_risk",
    "loglog_tail_distance",
    "MIN_POINTS",
]

#: The fewest finite values a tail estimate accepts.
MIN_POINTS = 50

_KERNEL_POWER = 2.0


def _as_array(x: object, where: str, *, dims: int = 1) -> np.ndarray:
    """`x` (tensor, array or sequence) as a float64 array of `dims` dimensions, refusing non-finite values."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    array = np.asarray(x, dtype=np.float64)
    if array.ndim != dims:
        raise ValueError(f"{where}: expected a {dims}-D array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: the data contain {int((~np.isfinite(array)).sum())} non-finite value(s)")
    return array


def _paired(samples: object, data: object, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Model samples `(M, D)` and data `(N, D)` as arrays, refusing different `D`."""
    s, d = _as_array(samples, where, dims=2), _as_array(data, where, dims=2)
    if s.shape[1] != d.shape[1]:
        raise ValueError(f"{where}: samples have {s.shape[1]} dimensions but data have {d.shape[1]}")
    return s, d


def _order_statistics(x: object, where: str) -> np.ndarray:
    """Descending order statistics of the positive values of `|x|` (at least `MIN_POINTS`)."""
    values = np.abs(_as_array(x, where))
    values = np.sort(values[values > 0])[::-1]
    if values.size < MIN_POINTS:
        raise ValueError(f"{where}: a tail estimate needs at least {MIN_POINTS} non-zero values, got {values.size}")
    return values


def _log_moments(desc: np.ndarray, orders: int) -> list[np.ndarray]:
    """`M_j(k)` for `j = 1..orders` (at most 3) and `k = 1..len(desc) - 1` (index `k - 1`), by cumulative sums."""
    logs = np.log(desc)
    head = logs[:-1]
    k = np.arange(1, logs.size, dtype=np.float64)
    c = logs[1:]
    a1 = np.cumsum(head) / k
    out = [a1 - c]
    if orders >= 2:
        a2 = np.cumsum(head * head) / k
        out.append(np.maximum(a2 - c * (2 * a1 - c), 0.0))
    if orders >= 3:
        a3 = np.cumsum(head * head * head) / k
        out.append(a3 - c * (3 * a2 - c * (3 * a1 - c)))
    return out


def _hill_path(desc: np.ndarray) -> np.ndarray:
    return _log_moments(desc, 1)[0]


def _moments_path(desc: np.ndarray) -> np.ndarray:
    m1, m2 = _log_moments(desc, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return m1 + 1 - 0.5 / (1 - m1**2 / m2)


def _hill_discrepancy(desc: np.ndarray) -> np.ndarray:
    m1, m2 = _log_moments(desc, 2)
    return m2 - 2 * m1**2


def _moments_discrepancy(desc: np.ndarray) -> np.ndarray:
    m1, m2, m3 = _log_moments(desc, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        xi_2 = m1 + 1 - 0.5 / (1 - m1**2 / m2)
        xi_3 = np.sqrt(m2 / 2) + 1 - (2 / 3) / (1 - m1 * m2 / m3)
        return xi_2 - xi_3


def double_bootstrap(
    x: object,
    discrepancy: str = "hill",
    *,
    bootstraps: int = 200,
    t: float = 0.5,
    max_fraction: float = 0.25,
    seed: int = 0,
) -> int:
    r"""The number of order statistics $k^*$ chosen by the double bootstrap (Danielsson et al. 2001).

    Arguments:
        x: one marginal's values (their absolute values are used).
        discrepancy: `"hill"` ($M_2 - 2M_1^2$) or `"moments"` (the difference of two moment-type estimators).
        bootstraps: resamples per stage (the reference uses 500).
        t: the second stage's resample size $n_2 = t n$ (the first's is $n_1 = \sqrt{t}\, n$).
        max_fraction: the largest $k$ considered, as a fraction of the resample size; $k^*$ is also
            kept at most this fraction of `n`.
        seed: seed of the resampling.

    Raises:
        ValueError: for non-finite data, fewer than `MIN_POINTS` non-zero values, or bad arguments.
    """
    where = "double_bootstrap"
    check_number(bootstraps, "bootstraps", where=where, integer=True, low=2)
    check_number(t, "t", where=where, positive=True, below=1)
    check_number(max_fraction, "max_fraction", where=where, positive=True, high=1)
    statistic: Callable[[np.ndarray], np.ndarray] = {"hill": _hill_discrepancy, "moments": _moments_discrepancy}[
        _choice(discrepancy, ("hill", "moments"), "discrepancy", where)
    ]
    desc = _order_statistics(x, where)
    n = desc.size
    rng = np.random.default_rng(seed)
    n1, n2 = int(n * math.sqrt(t)), int(n * t)
    k_best = []
    for size in (n1, n2):
        top = max(min(int(max_fraction * size), size - 2), 3)
        amse = np.zeros(top)
        counts = np.zeros(top)
        for _ in range(bootstraps):
            # The top `top + 1` order statistics of a resample of `size` points, without sorting it all.
            index = rng.integers(0, n, size)
            head = np.sort(np.partition(index, top)[: top + 1])
            values = statistic(desc[head])[:top] ** 2
            good = np.isfinite(values)
            amse[good] += values[good]
            counts[good] += 1
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(counts > 0, amse / np.maximum(counts, 1), np.inf)
        k_best.append(int(np.argmin(mean[1:])) + 2)  # k >= 2
    k1, k2 = k_best
    # k* stays in the range the stages searched: a first-stage minimum deep in the body (the discrepancy
    # of a mixture crosses 0 again there) over a small k2 would give k* ~ n, the Hill mean of log|x|
    # over the whole sample (xi ~ 9 on mTAF's t2 mixtures, not 0.5).
    limit = max(min(int(max_fraction * n), n - 2), 2)
    log_n1, log_k1 = math.log(n1), math.log(k1)
    if k1 >= n1 or 2 * log_n1 <= log_k1:
        return max(min(k1, limit), 2)
    rho = (log_k1 / (2 * log_n1 - log_k1)) ** (2 * (log_n1 - log_k1) / log_n1)
    return int(min(max(round(k1 * k1 / k2 * rho), 2), limit))


def _choice(value: object, options: tuple[str, ...], name: str, where: str) -> str:
    if value not in options:
        raise ValueError(f"{where}: {name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value  # type: ignore[return-value]


def _at(path: np.ndarray, k: int, where: str) -> float:
    check_number(k, "k", where=where, integer=True, low=1)
    if k > path.size:
        raise ValueError(f"{where}: k must be at most {path.size} (the number of non-zero values - 1), got {k}")
    return float(path[k - 1])


def hill(x: object, k: int | None = None, **bootstrap: object) -> float:
    r"""The Hill estimate $\hat\xi_H(k) = M_1(k)$ of the extreme value index of `|x|`.

    Arguments:
        x: one marginal's values.
        k: the number of order statistics (default: the double bootstrap's $k^*$).
        **bootstrap: arguments of [`double_bootstrap`][flowkit.stats.double_bootstrap].

    Examples:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).pareto(2.0, 20000) + 1  # xi = 1/2
        >>> round(hill(x, k=2000), 1)
        0.5
    """
    desc = _order_statistics(x, "hill")
    k = double_bootstrap(desc, "hill", **bootstrap) if k is None else k  # type: ignore[arg-type]
    return _at(_hill_path(desc), k, "hill")


def moments(x: object, k: int | None = None, **bootstrap: object) -> float:
    r"""The moments estimate $\hat\xi_M(k)$ of the extreme value index of `|x|` (any real $\xi$).

    Arguments:
        x: one marginal's values.
        k: the number of order statistics (default: the double bootstrap's $k^*$ for this estimator).
        **bootstrap: arguments of [`double_bootstrap`][flowkit.stats.double_bootstrap].
    """
    desc = _order_statistics(x, "moments")
    k = double_bootstrap(desc, "moments", **bootstrap) if k is None else k  # type: ignore[arg-type]
    return _at(_moments_path(desc), k, "moments")


def kernel(x: object, h: float) -> float:
    r"""The kernel-type estimate $\hat\xi_K = q_2 / q_1 - 1$ of the extreme value index of `|x|` (any real $\xi < 2$).

    Arguments:
        x: one marginal's values.
        h: the bandwidth, a fraction of the sample in $(0, 1]$ (about `k / n`).
    """
    desc = _order_statistics(x, "kernel")
    check_number(h, "h", where="kernel", positive=True, high=1)
    n = desc.size
    h = max(h, 8 / n)  # at least a few spacings under the kernel
    u = np.arange(1, n) / n
    v = np.clip(u / h, 0, 1)
    k = 15 / 8 * (1 - v**2) ** 2 / h
    dk = -15 / 2 * v * (1 - v**2) / h**2
    a = _KERNEL_POWER
    spacing = desc[:-1] - desc[1:]
    q1 = np.sum(u**a * k * spacing)
    q2 = np.sum(((a + 1) * u**a * k + u ** (a + 1) * dk) * spacing)
    return float(q2 / q1 - 1) if q1 > 0 else 0.0


@dataclass(frozen=True)
class TailEstimate:
    r"""The tail estimates of one marginal and the light/heavy decision.

    Attributes:
        hill: Hill estimate of $\xi$ at `k_hill`.
        moments: moments estimate of $\xi$ at `k_moments`.
        kernel: kernel-type estimate of $\xi$ at bandwidth `k_moments / n`.
        k_hill: the Hill threshold (double bootstrap).
        k_moments: the moments threshold (double bootstrap).
        heavy: whether the marginal is heavy-tailed.
        xi: the index used for `df` (Hill, else moments, else kernel: the first that is positive), or 0.
        df: $1/\xi$ for a heavy marginal, else `None`.
    """

    hill: float
    moments: float
    kernel: float
    k_hill: int
    k_moments: int
    heavy: bool
    xi: float
    df: float | None


def estimate_tail(x: object, *, light_below: float = 0.1, bootstraps: int = 200, seed: int = 0) -> TailEstimate:
    r"""Estimate one marginal's tail: Hill, moments and kernel estimates and the mTAF light/heavy decision.

    Arguments:
        x: one marginal's values (`N` numbers; the tail of `|x|` is estimated).
        light_below: the marginal is light when the moments and the kernel estimates are both at most this.
        bootstraps: resamples per double-bootstrap stage.
        seed: seed of the resampling.

    Returns:
        A [`TailEstimate`][flowkit.stats.TailEstimate].

    Raises:
        ValueError: for non-finite data or fewer than `MIN_POINTS` non-zero values.

    Examples:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> estimate_tail(rng.standard_normal(20000), bootstraps=50).heavy
        False
        >>> 2 < estimate_tail(rng.standard_t(3, 20000), bootstraps=50).df < 4.5
        True
    """
    check_number(light_below, "light_below", where="estimate_tail", low=0)
    desc = _order_statistics(x, "estimate_tail")
    k_h = double_bootstrap(desc, "hill", bootstraps=bootstraps, seed=seed)
    k_m = double_bootstrap(desc, "moments", bootstraps=bootstraps, seed=seed + 1)
    xi_h = _at(_hill_path(desc), k_h, "estimate_tail")
    xi_m = _at(_moments_path(desc), k_m, "estimate_tail")
    xi_k = kernel(desc, k_m / desc.size)
    heavy = not (xi_m <= light_below and xi_k <= light_below)
    xi = next((v for v in (xi_h, xi_m, xi_k) if v > 0 and math.isfinite(v)), 0.0) if heavy else 0.0
    heavy = heavy and xi > 0
    return TailEstimate(xi_h, xi_m, xi_k, k_h, k_m, heavy, xi, 1 / xi if heavy else None)


def estimate_tails(x: object, **options: object) -> list[TailEstimate]:
    """[`estimate_tail`][flowkit.stats.estimate_tail] for every column of `x` (shape `(N, D)`).

    Arguments:
        x: data or model samples, `(N, D)`.
        **options: arguments of [`estimate_tail`][flowkit.stats.estimate_tail].
    """
    array = _as_array(x, "estimate_tails", dims=2)
    return [estimate_tail(array[:, j], **options) for j in range(array.shape[1])]  # type: ignore[arg-type]


def quantile_coverage(
    samples: object, data: object, levels: Sequence[float] = (0.001, 0.01, 0.99, 0.999)
) -> np.ndarray:
    r"""The fraction of `data` below the model's quantiles: `coverage[i, j] = mean(data[:, j] <= q_j(levels[i]))`.

    `q_j` is the empirical quantile of the model's samples in dimension `j`; a calibrated model gives
    `coverage[i, j]` close to `levels[i]`.

    Arguments:
        samples: model samples, `(M, D)`.
        data: test data, `(N, D)`.
        levels: the quantile levels, in $(0, 1)$.

    Returns:
        An array of shape `(len(levels), D)`.
    """
    s, d = _paired(samples, data, "quantile_coverage")
    for level in levels:
        check_number(level, "every level", where="quantile_coverage", positive=True, below=1)
    quantiles = np.quantile(s, np.asarray(levels), axis=0)
    return (d[None, :, :] <= quantiles[:, None, :]).mean(axis=1)


def tail_value_at_risk(x: object, level: float = 0.99, side: str = "upper") -> np.ndarray:
    r"""Tail value-at-risk (expected shortfall) per dimension: the mean of the values beyond the `level` quantile.

    $\mathrm{tVaR}_\alpha = E[x \mid x \ge q_\alpha]$ (`side="upper"`), $E[-x \mid -x \ge q_\alpha(-x)]$
    (`"lower"`, losses of a return series), or the same of $|x|$ (`"abs"`).

    Arguments:
        x: values `(N,)` or `(N, D)`.
        level: $\alpha \in (0, 1)$.
        side: `"upper"`, `"lower"` or `"abs"`.

    Returns:
        An array with one value per dimension.
    """
    array = np.asarray(x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    array = _as_array(array[:, None] if array.ndim == 1 else array, "tail_value_at_risk", dims=2)
    check_number(level, "level", where="tail_value_at_risk", positive=True, below=1)
    side = _choice(side, ("upper", "lower", "abs"), "side", "tail_value_at_risk")
    values = {"upper": array, "lower": -array, "abs": np.abs(array)}[side]
    q = np.quantile(values, level, axis=0)
    beyond = values >= q
    return (values * beyond).sum(0) / np.maximum(beyond.sum(0), 1)


def loglog_tail_distance(samples: object, data: object, tail: float = 0.1, points: int = 200) -> np.ndarray:
    r"""Area between the log-log tail quantile curves of `|samples|` and `|data|`, per dimension.

    With $Q$ the empirical quantile function of $|x|$ and $s = -\log(1 - p)$ for $p$ from 1 - `tail`
    to $1 - 1/N$ (the data's largest order statistic), the distance is
    $\int |\log Q_{\text{model}}(p) - \log Q_{\text{data}}(p)|\, ds$ by the trapezoid rule on `points`
    values of $s$. Power-law tails are straight lines of slope $\xi$ on this scale, so a model with the
    wrong tail index drifts away linearly in $s$.

    Arguments:
        samples: model samples, `(M, D)`.
        data: data, `(N, D)`.
        tail: the upper fraction of `|x|` compared.
        points: grid size.

    Returns:
        An array of shape `(D,)`.
    """
    s, d = (np.abs(a) for a in _paired(samples, data, "loglog_tail_distance"))
    check_number(tail, "tail", where="loglog_tail_distance", positive=True, below=1)
    check_number(points, "points", where="loglog_tail_distance", integer=True, low=2)
    grid = np.linspace(-math.log(tail), math.log(d.shape[0]), points)
    p = 1 - np.exp(-grid)
    tiny = np.finfo(np.float64).tiny
    log_s, log_d = (np.log(np.maximum(np.quantile(a, p, axis=0), tiny)) for a in (s, d))
    return np.trapezoid(np.abs(log_s - log_d), grid, axis=0)
