"""Figures of posterior estimates: corner plots against a reference, coverage curves, SBC ranks, predictive bands.

Like [`flowkit.plot`][flowkit.plot], every function returns a `matplotlib.figure.Figure` built without pyplot
(save it with `fig.savefig(...)` or let Jupyter display it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy import stats

from .diagnostics import PredictiveCheck, _array

__all__ = ["plot_corner", "plot_coverage", "plot_sbc", "plot_predictive"]


def _figure(width: float, height: float, *grid: int, **options: Any) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(*grid, **options) if grid else fig.add_subplot()


def _labels(labels: Sequence[str] | None, dim: int, where: str) -> list[str]:
    if labels is None:
        return [rf"$\theta_{{{d + 1}}}$" for d in range(dim)]
    if len(labels) != dim:
        raise ValueError(f"{where}: labels must name the {dim} parameters, got {len(labels)}")
    return [str(label) for label in labels]


def _subsample(a: np.ndarray, n: int) -> np.ndarray:
    return a if len(a) <= n else a[np.random.default_rng(0).choice(len(a), n, replace=False)]


def plot_corner(
    samples: Any,
    reference: Any = None,
    *,
    truth: Any = None,
    labels: Sequence[str] | None = None,
    bins: int = 40,
    n: int = 2000,
    title: str | None = None,
) -> Figure:
    """Corner plot of posterior samples (orange) against reference samples (blue) and the true parameters.

    Arguments:
        samples: posterior samples `(M, D)`.
        reference: reference posterior samples `(N, D)`, or None.
        truth: the true parameters `(D,)`, drawn as lines, or None.
        labels: the parameters' names.
        bins: histogram bins on the diagonal.
        n: points per scatter panel.
        title: the figure's title.

    Examples:
        >>> import numpy as np
        >>> fig = plot_corner(np.random.default_rng(0).normal(size=(500, 3)), truth=np.zeros(3))
    """
    where = "plot_corner"
    post = _array(samples, "samples", where, 2)
    ref = None if reference is None else _array(reference, "reference", where, 2)
    dim = post.shape[1]
    if ref is not None and ref.shape[1] != dim:
        raise ValueError(f"{where}: reference has {ref.shape[1]} parameters, samples {dim}")
    true = None if truth is None else _array(truth, "truth", where, 1)
    if true is not None and true.shape != (dim,):
        raise ValueError(f"{where}: truth must have shape ({dim},), got {true.shape}")
    names = _labels(labels, dim, where)
    both = post if ref is None else np.concatenate([post, ref])
    low, high = np.quantile(both, 0.002, 0), np.quantile(both, 0.998, 0)
    if true is not None:
        low, high = np.minimum(low, true), np.maximum(high, true)
    pad = 0.05 * (high - low + 1e-12)
    low, high = low - pad, high + pad
    fig, axes = _figure(1.8 * dim + 1, 1.8 * dim + 1, dim, dim, squeeze=False)
    shown, shown_ref = _subsample(post, n), None if ref is None else _subsample(ref, n)
    for r in range(dim):
        for c in range(dim):
            ax = axes[r, c]
            if c > r:
                ax.axis("off")
                continue
            if r == c:
                edges = np.linspace(low[r], high[r], bins + 1)
                if ref is not None:
                    ax.hist(ref[:, r], bins=edges, density=True, color="C0", alpha=0.4, label="reference")
                ax.hist(post[:, r], bins=edges, density=True, histtype="step", color="C1", label="estimate")
                if true is not None:
                    ax.axvline(true[r], color="k", lw=1)
                ax.set_yticks([])
                ax.set_xlim(low[r], high[r])
            else:
                if shown_ref is not None:
                    ax.scatter(shown_ref[:, c], shown_ref[:, r], s=0.8, c="C0", alpha=0.3, linewidths=0)
                ax.scatter(shown[:, c], shown[:, r], s=1.5, c="C1", alpha=0.5, linewidths=0)
                if true is not None:
                    ax.plot(true[c], true[r], "k+", ms=8)
                ax.set(xlim=(low[c], high[c]), ylim=(low[r], high[r]))
            if r == dim - 1:
                ax.set_xlabel(names[c])
            if c == 0 and r != c:
                ax.set_ylabel(names[r])
    if ref is not None:
        axes[0, 0].legend(loc="upper left", fontsize="small", frameon=False)
    fig.suptitle(title or ("posterior estimate (orange) vs reference (blue)" if ref is not None else "posterior"))
    return fig


def plot_coverage(curves: Mapping[str, tuple[Any, Any]], *, n: int | None = None, title: str | None = None) -> Figure:
    """Expected coverage against credibility level, one line per curve, with the diagonal.

    Arguments:
        curves: name to `(levels, coverage)`, e.g. `{"TARP": tarp_coverage(...), "SBC": sbc_coverage(...)}`.
        n: the number of simulations behind the curves: draws the binomial 95% band around the diagonal.
        title: the figure's title.
    """
    fig, ax = _figure(4.2, 4.0)
    alpha = np.linspace(0, 1, 201)
    if n is not None:
        half = 1.96 * np.sqrt(alpha * (1 - alpha) / n)
        ax.fill_between(alpha, alpha - half, alpha + half, color="0.85", label=f"95% band (N={n})")
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    for i, (name, (levels, coverage)) in enumerate(curves.items()):
        ax.plot(_array(levels, "levels", "plot_coverage", 1), _array(coverage, "coverage", "plot_coverage", 1),
                color=f"C{i}", label=name)  # fmt: skip
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="credibility level", ylabel="expected coverage")
    ax.set_aspect("equal")
    ax.legend(loc="upper left", fontsize="small", frameon=False)
    ax.set_title(title or "expected coverage")
    return fig


def plot_sbc(
    ranks: Any, n_samples: int, *, labels: Sequence[str] | None = None, bins: int = 20, title: str | None = None
) -> Figure:
    """SBC ranks: a histogram per parameter with the 99% band of uniform counts, and the ECDF minus the uniform CDF.

    Arguments:
        ranks: ranks `(N, D)` from [`sbc_ranks`][flowkit.inference.sbc_ranks].
        n_samples: the number `L` of posterior samples behind each rank.
        labels: the parameters' names.
        bins: histogram bins.
        title: the figure's title.
    """
    where = "plot_sbc"
    r = _array(ranks, "ranks", where, 2)
    count, dim = r.shape
    names = _labels(labels, dim, where)
    cols, rows = min(dim, 5), (dim - 1) // 5 + 1
    fig = Figure(figsize=(2.6 * cols + 3.5, 2.4 * rows + 0.6), layout="constrained")
    grid = fig.add_gridspec(rows, cols + 1, width_ratios=[1] * cols + [1.4])
    edges = np.linspace(0, n_samples + 1, bins + 1)
    expected = count / bins
    low, high = stats.binom.ppf([0.005, 0.995], count, 1 / bins)
    for d in range(dim):
        ax = fig.add_subplot(grid[d // 5, d % 5])
        ax.axhspan(low, high, color="0.85")
        ax.axhline(expected, color="k", lw=0.8)
        ax.hist(r[:, d], bins=edges, color="C0", alpha=0.8)
        ax.set(xlabel=f"rank of {names[d]}", yticks=[])
    ecdf_ax = fig.add_subplot(grid[:, cols])
    u = np.linspace(0, 1, 201)
    band = 1.36 / np.sqrt(count)  # 95% Kolmogorov-Smirnov band
    ecdf_ax.fill_between(u, -band, band, color="0.85")
    for d in range(dim):
        values = np.sort(r[:, d] / n_samples)
        ecdf = np.searchsorted(values, u, side="right") / count
        ecdf_ax.plot(u, ecdf - u, lw=1, color=f"C{d % 10}", label=names[d])
    ecdf_ax.set(xlabel="rank / L", ylabel="ECDF - uniform")
    if dim <= 10:
        ecdf_ax.legend(fontsize="x-small", frameon=False)
    fig.suptitle(title or f"simulation-based calibration (N={count}, L={n_samples})")
    return fig


def plot_predictive(
    check: PredictiveCheck, x: Any, *, grid: Any = None, xlabel: str = "feature", title: str | None = None
) -> Figure:
    """The posterior predictive 50% and 90% bands per feature, with the observation.

    Arguments:
        check: a [`PredictiveCheck`][flowkit.inference.PredictiveCheck].
        x: the observation `(x_dim,)`.
        grid: the features' positions (e.g. wavelengths), default their indices.
        xlabel: the horizontal axis' label.
        title: the figure's title.
    """
    obs = _array(x, "x", "plot_predictive", 1)
    where = np.arange(len(obs)) if grid is None else _array(grid, "grid", "plot_predictive", 1)
    q = np.quantile(check.predictive, [0.05, 0.25, 0.5, 0.75, 0.95], 0)
    fig, ax = _figure(6.0, 3.6)
    ax.fill_between(where, q[0], q[4], color="C1", alpha=0.25, label="predictive 90%")
    ax.fill_between(where, q[1], q[3], color="C1", alpha=0.45, label="predictive 50%")
    ax.plot(where, q[2], color="C1", lw=1)
    ax.plot(where, obs, "k.", ms=4, label="observation")
    ax.set(xlabel=xlabel, ylabel="x")
    ax.legend(fontsize="small", frameon=False)
    ax.set_title(title or f"posterior predictive check (p = {check.p_value:.2f})")
    return fig
