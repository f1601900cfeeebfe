r"""Calibration and accuracy diagnostics of posterior estimates (numpy, scipy and scikit-learn).

- **C2ST**, the classifier two-sample test, exactly as sbibm computes it: both samples z-scored with the first
  one's mean and standard deviation, a scikit-learn `MLPClassifier` (ReLU, two hidden layers of $10D$ units,
  Adam, up to 10 000 iterations) scored by 5-fold cross-validated accuracy. 0.5 means the classifier cannot tell
  the samples apart; 1 means they are disjoint.
- **SBC**, simulation-based calibration (Talts et al. 2018): for $\theta_i \sim p(\theta)$, $x_i \sim p(x \mid
  \theta_i)$ and $L$ posterior samples $\theta_{ij} \sim q(\theta \mid x_i)$, the rank $r_{id} = \#\{j :
  \theta_{ij,d} < \theta_{i,d}\}$ is uniform on $\{0, \dots, L\}$ for every parameter $d$ when $q$ is the exact
  posterior. The central credible interval of level $\alpha$ holds $\theta_{i,d}$ when
  $|r_{id}/L - 1/2| \le \alpha/2$, so the ranks give an expected coverage per level too.
- **TARP**, tests of accuracy with random points (Lemos, Coogan, Hezaveh & Perreault-Levasseur 2023): with a
  random reference point $\theta_{r,i}$ per simulation, $f_i$ is the share of posterior samples closer to it
  than the true $\theta_i$ (in the parameters scaled to the unit box of the $\theta_i$); the expected coverage
  probability is $\mathrm{ECP}(\alpha) = \frac1N \sum_i 1[f_i < \alpha]$, which is $\alpha$ at every level if and
  only if $q$ is the posterior (for reference points drawn from a suitable distribution).
- **Posterior predictive check**: simulations from the posterior's samples against the observation (its
  quantile per feature, and a predictive p-value of its standardised distance).

References:
    Lopez-Paz & Oquab, *Revisiting classifier two-sample tests*, ICLR 2017; Lueckmann et al.,
    *Benchmarking simulation-based inference*, AISTATS 2021; Talts, Betancourt, Simpson, Vehtari & Gelman,
    *Validating Bayesian inference algorithms with simulation-based calibration*, arXiv:1804.06788;
    Lemos, Coogan, Hezaveh & Perreault-Levasseur, *Sampling-based accuracy testing of posterior estimators for
    general inference*, ICML 2023 (arXiv:2302.03026).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from .._validation import check_number

__all__ = [
    "c2st",
    "sbc_ranks",
    "sbc_coverage",
    "sbc_uniformity",
    "tarp_coverage",
    "coverage_error",
    "posterior_samples",
    "PredictiveCheck",
    "posterior_predictive_check",
]


def _array(x: Any, name: str, where: str, dims: int | None = None) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be an array of numbers, got {type(x).__name__}") from None
    if dims is not None and a.ndim != dims:
        raise ValueError(f"{where}: {name} must have {dims} dimensions, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{where}: {name} contains non-finite values (NaN or inf)")
    return a


def c2st(x: Any, y: Any, *, seed: int = 1, n_folds: int = 5, z_score: bool = True) -> float:
    r"""Classifier two-sample test accuracy of samples `x` `(N, D)` against `y` `(M, D)`, as sbibm computes it.

    Arguments:
        x: the first sample (e.g. the reference posterior's); its moments z-score both.
        y: the second sample (e.g. the estimate's).
        seed: the classifier's and the folds' random state.
        n_folds: cross-validation folds.
        z_score: z-score both samples with `x`'s mean and (unbiased) standard deviation.

    Returns:
        The mean cross-validated accuracy: about 0.5 for samples of one distribution, 1 for disjoint ones.

    Raises:
        ValueError: for samples that are not 2-D with the same width, non-finite values, or too few points.

    Examples:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> round(c2st(rng.normal(size=(400, 2)), rng.normal(size=(400, 2)) + 10), 2)
        1.0
    """
    from sklearn.model_selection import KFold, cross_val_score
    from sklearn.neural_network import MLPClassifier

    where = "c2st"
    a, b = _array(x, "x", where, 2), _array(y, "y", where, 2)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{where}: x and y must have the same number of columns, got {a.shape[1]} and {b.shape[1]}")
    n_folds = int(check_number(n_folds, "n_folds", where=where, integer=True, low=2))
    if min(len(a), len(b)) < n_folds:
        raise ValueError(f"{where}: need at least {n_folds} points in each sample, got {len(a)} and {len(b)}")
    if z_score:
        mean, std = a.mean(0), a.std(0, ddof=1)
        a, b = (a - mean) / std, (b - mean) / std
    dim = a.shape[1]
    classifier = MLPClassifier(
        activation="relu", hidden_layer_sizes=(10 * dim, 10 * dim), max_iter=10000, solver="adam", random_state=seed
    )
    data = np.concatenate((a, b))
    target = np.concatenate((np.zeros(len(a)), np.ones(len(b))))
    folds = KFold(n_splits=n_folds, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(classifier, data, target, cv=folds, scoring="accuracy")))


def posterior_samples(posterior: Any, n: int, x: Tensor) -> Tensor:
    """`n` samples of `posterior` per row of `x`, `(n, B, D)`: its `sample(n, x)` (a [`NeuralPosterior`][flowkit.inference.NeuralPosterior]) or a callable `posterior(n, x)`."""  # noqa: E501
    sample = getattr(posterior, "sample", None)
    draw: Callable[[int, Tensor], Tensor] = sample if callable(sample) else posterior
    if not callable(draw):
        raise ValueError(f"posterior must have sample(n, x) or be a callable, got {type(posterior).__name__}")
    out = draw(n, x)
    if not isinstance(out, Tensor) or out.dim() != 3 or out.shape[:2] != (n, x.shape[0]):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"posterior samples must have shape (n, B, D) = ({n}, {x.shape[0]}, D), got {shape}")
    return out


def sbc_ranks(samples: Any, theta: Any) -> np.ndarray:
    r"""SBC rank statistics $r_{id} = \#\{j : \theta_{ij,d} < \theta_{i,d}\}$.

    Arguments:
        samples: posterior samples `(L, N, D)`: `L` per simulation `i` (see
            [`posterior_samples`][flowkit.inference.posterior_samples]).
        theta: the parameters `(N, D)` each simulation was made with.

    Returns:
        Integer ranks `(N, D)` in `0..L`.

    Examples:
        >>> import numpy as np
        >>> sbc_ranks(np.zeros((4, 1, 2)), np.array([[1.0, -1.0]])).tolist()
        [[4, 0]]
    """
    where = "sbc_ranks"
    s, t = _array(samples, "samples", where, 3), _array(theta, "theta", where, 2)
    if s.shape[1:] != t.shape:
        raise ValueError(f"{where}: samples (L, N, D) and theta (N, D) do not fit: {s.shape} and {t.shape}")
    return (s < t[None]).sum(0)


def sbc_coverage(ranks: Any, n_samples: int, levels: Any = None) -> tuple[np.ndarray, np.ndarray]:
    r"""Expected coverage of the central credible intervals from SBC ranks, averaged over the parameters.

    The interval of level $\alpha$ holds $\theta_{i,d}$ when $|r_{id}/L - 1/2| \le \alpha/2$.

    Arguments:
        ranks: ranks `(N, D)` from [`sbc_ranks`][flowkit.inference.sbc_ranks].
        n_samples: the number `L` of posterior samples behind each rank.
        levels: the credibility levels (default 0, 0.01, ..., 1).

    Returns:
        `(levels, coverage)`; the coverage is per level, averaged over simulations and parameters.
    """
    where = "sbc_coverage"
    r = _array(ranks, "ranks", where, 2)
    n_samples = int(check_number(n_samples, "n_samples", where=where, integer=True, low=1))
    alpha = np.linspace(0, 1, 101) if levels is None else _array(levels, "levels", where, 1)
    u = r / n_samples
    covered = np.abs(u - 0.5)[None] <= alpha[:, None, None] / 2 + 1e-12
    return alpha, covered.mean((1, 2))


def sbc_uniformity(ranks: Any, n_samples: int) -> np.ndarray:
    r"""Per parameter, the p-value of the Kolmogorov-Smirnov test of the ranks against the uniform on `0..L`.

    The ranks are spread over their unit bins, $(r + U)/(L + 1)$ with $U \sim U(0, 1)$ (seeded), which are
    uniform on $(0, 1)$ exactly when the ranks are uniform on `0..L`.
    """
    from scipy import stats

    r = _array(ranks, "ranks", "sbc_uniformity", 2)
    n_samples = int(check_number(n_samples, "n_samples", where="sbc_uniformity", integer=True, low=1))
    u = (r + np.random.default_rng(0).uniform(size=r.shape)) / (n_samples + 1)
    return np.array([stats.kstest(u[:, d], "uniform").pvalue for d in range(r.shape[1])])


def tarp_coverage(
    samples: Any,
    theta: Any,
    *,
    references: Any = None,
    levels: Any = None,
    metric: str = "euclidean",
    norm: bool = True,
    seed: int | None = 0,
) -> tuple[np.ndarray, np.ndarray]:
    r"""TARP expected coverage probability $\mathrm{ECP}(\alpha)$ (Lemos et al. 2023).

    Arguments:
        samples: posterior samples `(L, N, D)`, `L` per simulation.
        theta: the true parameters `(N, D)`.
        references: one reference point per simulation `(N, D)`, in the normalised coordinates when `norm`;
            None draws them uniformly from the unit box (seeded by `seed`), as the `tarp` package does.
        levels: the credibility levels $\alpha$ (default 0, 0.01, ..., 1).
        metric: `"euclidean"` or `"manhattan"` distances.
        norm: scale samples and parameters by the minimum and maximum of `theta` per parameter first.
        seed: seed of the reference points.

    Returns:
        `(levels, ecp)` with $\mathrm{ECP}(\alpha) = \frac1N \sum_i 1[f_i < \alpha]$ (and 1 at $\alpha = 1$).

    Raises:
        ValueError: for shapes that do not fit, an unknown metric or non-finite values.
    """
    where = "tarp_coverage"
    s, t = _array(samples, "samples", where, 3), _array(theta, "theta", where, 2)
    if s.shape[1:] != t.shape:
        raise ValueError(f"{where}: samples (L, N, D) and theta (N, D) do not fit: {s.shape} and {t.shape}")
    if metric not in ("euclidean", "manhattan"):
        raise ValueError(f"{where}: metric must be 'euclidean' or 'manhattan', got {metric!r}")
    if norm:
        low, high = t.min(0), t.max(0)
        s, t = (s - low) / (high - low + 1e-10), (t - low) / (high - low + 1e-10)
    if references is None:
        references = np.random.default_rng(seed).uniform(size=t.shape)
    ref = _array(references, "references", where, 2)
    if ref.shape != t.shape:
        raise ValueError(f"{where}: references must have theta's shape {t.shape}, got {ref.shape}")
    if metric == "euclidean":
        d_samples = np.sqrt(((ref[None] - s) ** 2).sum(-1))
        d_theta = np.sqrt(((ref - t) ** 2).sum(-1))
    else:
        d_samples, d_theta = np.abs(ref[None] - s).sum(-1), np.abs(ref - t).sum(-1)
    f = (d_samples < d_theta[None]).mean(0)
    alpha = np.linspace(0, 1, 101) if levels is None else _array(levels, "levels", where, 1)
    ecp = (f[None] < alpha[:, None]).mean(1)
    return alpha, np.where(alpha >= 1, 1.0, ecp)


def coverage_error(levels: Any, coverage: Any) -> float:
    r"""The largest distance of an expected-coverage curve from the diagonal, $\max_\alpha |\mathrm{ECP}(\alpha) - \alpha|$."""  # noqa: E501
    a, c = _array(levels, "levels", "coverage_error", 1), _array(coverage, "coverage", "coverage_error", 1)
    if a.shape != c.shape:
        raise ValueError(f"coverage_error: levels and coverage differ in shape: {a.shape} and {c.shape}")
    return float(np.abs(c - a).max())


@dataclass
class PredictiveCheck:
    """The result of [`posterior_predictive_check`][flowkit.inference.posterior_predictive_check].

    Attributes:
        predictive: simulations from the posterior samples `(n, x_dim)`.
        quantiles: per feature, the share of predictive simulations below the observation `(x_dim,)`.
        p_value: the share of predictive simulations at least as far from the predictive mean (in predictive
            standard deviations, summed in quadrature) as the observation; small values flag a misfit.
    """

    predictive: np.ndarray
    quantiles: np.ndarray
    p_value: float


def posterior_predictive_check(simulate: Callable[[Tensor], Tensor], samples: Tensor, x: Tensor) -> PredictiveCheck:
    r"""Simulate from posterior samples and place the observation among the simulations.

    Arguments:
        simulate: the simulator, `theta (n, D) -> x (n, x_dim)` (e.g. a task's
            `simulate`).
        samples: posterior samples `(n, D)` for the observation `x`.
        x: the observation `(x_dim,)`.

    Returns:
        A [`PredictiveCheck`][flowkit.inference.PredictiveCheck].
    """
    where = "posterior_predictive_check"
    if not isinstance(samples, Tensor) or samples.dim() != 2:
        raise ValueError(f"{where}: samples must be a tensor (n, D)")
    simulated = simulate(samples)
    predictive = np.asarray(simulated.detach().cpu().double() if isinstance(simulated, Tensor) else simulated, float)
    if predictive.ndim != 2:
        raise ValueError(f"{where}: the simulator must return (n, x_dim), got shape {predictive.shape}")
    obs = _array(x, "x", where, 1)
    if predictive.shape[1] != obs.shape[0]:
        raise ValueError(f"{where}: simulations have {predictive.shape[1]} features, x has {obs.shape[0]}")
    predictive = predictive[np.isfinite(predictive).all(1)]  # failed simulations are left out
    if len(predictive) < 2:
        raise ValueError(f"{where}: fewer than 2 finite simulations")
    mean, std = predictive.mean(0), predictive.std(0) + 1e-300
    distance = np.sqrt((((predictive - mean) / std) ** 2).sum(1))
    observed = np.sqrt((((obs - mean) / std) ** 2).sum())
    return PredictiveCheck(predictive, (predictive < obs).mean(0), float((distance >= observed).mean()))
