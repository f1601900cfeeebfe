"""Matplotlib figures for fitted flows: density heatmaps, samples against data, marginals, training curves.

Every function returns a `matplotlib.figure.Figure` built without pyplot (nothing is shown or kept alive);
save it with `fig.savefig("out.png")` or let Jupyter display it.

Examples:
    >>> import flowkit, flowkit.plot
    >>> data = flowkit.data.load("moons")
    >>> flow = flowkit.flows.RealNVP(2)
    >>> fig = flowkit.plot.density(flow, data.test, resolution=50)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from .data import bits_per_dim
from .data.evaluation import log_prob_batched
from .domains import quaternion_to_matrix
from .sampling import autocorrelation as acf
from .sampling import integrated_autocorrelation_time

__all__ = [
    "density",
    "samples_vs_data",
    "pairwise",
    "training_curves",
    "ramachandran",
    "free_energy_profiles",
    "lattice_configurations",
    "magnetization_histogram",
    "autocorrelation",
    "image_grid",
    "bits_per_dim_curve",
    "equal_area",
    "orientations",
]


def _figure(width: float, height: float, *grid: int, **options: Any) -> tuple[Figure, Any]:
    """A figure with constrained layout and its axes: one `Axes`, or `fig.subplots(*grid, **options)`."""
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(*grid, **options) if grid else fig.add_subplot()


def _numpy(x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _bounds(data: np.ndarray, margin: float = 0.1) -> list[tuple[float, float]]:
    lo, hi = np.quantile(data, 0.001, axis=0), np.quantile(data, 0.999, axis=0)
    pad = margin * (hi - lo) + 1e-6
    return [(float(a - p), float(b + p)) for a, b, p in zip(lo, hi, pad, strict=True)]


def _subsample(data: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    if len(data) <= n:
        return data
    return data[np.random.default_rng(seed).choice(len(data), n, replace=False)]


def _flow_samples(flow: Any, n: int) -> Any:
    """`n` samples of a flow (in eval mode) as an array, or `flow` itself when it is already samples."""
    if not hasattr(flow, "sample"):
        return flow
    was_training = flow.training
    flow.eval()
    try:
        with torch.no_grad():
            return _numpy(flow.sample((n,)))
    finally:
        flow.train(was_training)


def _points(x: Any, where: str, name: str = "data") -> np.ndarray:
    """`x` as a float64 array of shape `(N, D)`, `N >= 1`, all finite; else a ValueError naming the problem."""
    try:
        points = _numpy(x)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {name} must be an array or tensor of numbers ({error})") from None
    if points.ndim != 2 or len(points) == 0:
        raise ValueError(f"{where}: {name} must have shape (N, D) with at least one point, got shape {points.shape}")
    if not np.isfinite(points).all():
        raise ValueError(
            f"{where}: {name} contain {int((~np.isfinite(points)).sum())} non-finite value(s) (NaN or inf)"
        )
    return points


def _positive(value: Any, name: str, where: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{where}: {name} must be an integer of at least {minimum}, got {value!r}")


def density(
    flow: Any,
    data: Tensor | np.ndarray | None = None,
    *,
    bounds: Sequence[tuple[float, float]] | None = None,
    resolution: int = 200,
    max_points: int = 2000,
    title: str | None = None,
    labels: Sequence[str] | None = None,
) -> Figure:
    """Heatmap of a 2-D flow's density `p(x)` on a grid, with data points on top.

    Arguments:
        flow: a flow with two-dimensional events (anything with `log_prob`).
        data: points of shape `(N, 2)` to overlay (at most `max_points` are drawn).
        bounds: `[(xmin, xmax), (ymin, ymax)]`; by default the data's range plus a margin, or `[-4, 4]^2`.
        resolution: grid points per axis.
        max_points: number of data points drawn.
        title: axes title.
        labels: names of the two axes (default `x_1`, `x_2`), e.g. a CSV header's column names.
    """
    where = "plot.density"
    if not hasattr(flow, "log_prob"):
        raise ValueError(f"{where}: flow must have a log_prob method, got {type(flow).__name__}")
    if (points := None if data is None else _points(data, where)) is not None and points.shape[1] != 2:
        raise ValueError(f"{where}: needs 2-D points of shape (N, 2), got shape {points.shape}")
    if tuple(getattr(flow, "event_shape", (2,))) != (2,):
        raise ValueError(f"{where}: the flow's events have shape {tuple(flow.event_shape)}, not (2,)")
    _positive(resolution, "resolution", where, minimum=2)
    _positive(max_points, "max_points", where)
    if bounds is None:
        bounds = _bounds(points) if points is not None else [(-4.0, 4.0), (-4.0, 4.0)]
    pairs = np.asarray(bounds, dtype=np.float64) if np.ndim(bounds) == 2 else None
    if pairs is None or pairs.shape != (2, 2) or not np.isfinite(pairs).all() or not (pairs[:, 0] < pairs[:, 1]).all():
        raise ValueError(f"{where}: bounds must be [(xmin, xmax), (ymin, ymax)] with finite min < max, got {bounds}")
    (x0, x1), (y0, y1) = pairs.tolist()
    xs, ys = np.linspace(x0, x1, resolution), np.linspace(y0, y1, resolution)
    grid = np.stack(np.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2)
    dtype = next((p.dtype for p in flow.parameters()), torch.float32)
    logp = log_prob_batched(flow, torch.as_tensor(grid, dtype=dtype)).double().numpy().reshape(resolution, resolution)
    fig, ax = _figure(5, 4.4)
    mesh = ax.pcolormesh(xs, ys, np.exp(logp), shading="auto", cmap="viridis")
    fig.colorbar(mesh, ax=ax, label="p(x)")
    if points is not None:
        shown = _subsample(points, max_points)
        ax.scatter(shown[:, 0], shown[:, 1], s=1.5, c="white", alpha=0.5, linewidths=0, label="data")
    xlabel, ylabel = _axis_labels(labels, [0, 1], where)
    ax.set(xlim=(x0, x1), ylim=(y0, y1), xlabel=xlabel, ylabel=ylabel, title=title or "flow density")
    ax.set_aspect("equal")
    return fig


def _axis_labels(labels: Sequence[str] | None, dims: Sequence[int], where: str) -> list[str]:
    """The axis label of each of `dims`: `labels[d]` when names are given, else `x_{d+1}`."""
    if labels is None:
        return [f"$x_{{{d + 1}}}$" for d in dims]
    names = [str(name) for name in labels]
    if any(not 0 <= d < len(names) for d in dims):
        raise ValueError(f"{where}: labels must name every dimension shown, got {len(names)} for {list(dims)}")
    return [names[d] for d in dims]


def _scatter_panel(
    ax: Axes, pts: np.ndarray, bounds: list[tuple[float, float]], title: str, color: str, labels: Sequence[str]
) -> None:
    ax.scatter(pts[:, 0], pts[:, 1], s=1.5, c=color, alpha=0.5, linewidths=0)
    ax.set(xlim=bounds[0], ylim=bounds[1], title=title, xlabel=labels[0], ylabel=labels[1])
    ax.set_aspect("equal")


def samples_vs_data(
    flow_or_samples: Any,
    data: Tensor | np.ndarray,
    *,
    n: int = 2000,
    dims: tuple[int, int] = (0, 1),
    labels: Sequence[str] | None = None,
) -> Figure:
    """Side-by-side scatter of data and flow samples (two chosen dimensions), on the same axes limits.

    Arguments:
        flow_or_samples: a flow (`n` samples are drawn) or an array of samples `(M, D)`.
        data: data points `(N, D)`.
        n: number of points per panel.
        dims: the two dimensions to show when `D > 2`.
        labels: names of the `D` dimensions (default `x_1`, ..., `x_D`).
    """
    where = "plot.samples_vs_data"
    if (pts := _points(data, where)).shape[1] < 2:
        raise ValueError(f"{where}: data must have shape (N, D) with D >= 2, got {pts.shape}")
    _positive(n, "n", where)
    if len(dims) != 2 or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d < pts.shape[1] for d in dims
    ):
        raise ValueError(f"{where}: dims must be two indices of the {pts.shape[1]} dimensions, got {tuple(dims)}")
    samples = _points(_flow_samples(flow_or_samples, n), where, "samples")
    if samples.shape[1] != pts.shape[1]:
        raise ValueError(f"{where}: samples have shape {samples.shape} but data {pts.shape}")
    i, j = dims
    pts, samples = _subsample(pts, n)[:, [i, j]], _subsample(samples, n)[:, [i, j]]
    bounds = _bounds(pts)
    names = _axis_labels(labels, [i, j], where)
    # Equal-aspect panels: the figure's height follows the data's aspect ratio, without empty bands.
    aspect = (bounds[1][1] - bounds[1][0]) / (bounds[0][1] - bounds[0][0])
    fig, (left, right) = _figure(8, float(np.clip(3.6 * aspect, 2.0, 7.0)) + 0.8, 1, 2, sharex=True, sharey=True)
    _scatter_panel(left, pts, bounds, "data", "C0", names)
    _scatter_panel(right, samples, bounds, "flow samples", "C1", names)
    return fig


def pairwise(
    data: Tensor | np.ndarray,
    samples: Any = None,
    *,
    dims: Sequence[int] | None = None,
    max_dims: int = 6,
    n: int = 2000,
    bins: int = 40,
    labels: Sequence[str] | None = None,
) -> Figure:
    """Pairwise marginals (a corner plot) of data and, optionally, flow samples, for `D > 2`.

    The diagonal shows 1-D histograms (data filled, samples as a line), the lower triangle data points, the
    upper triangle samples.

    Arguments:
        data: data points `(N, D)`.
        samples: a flow (`n` samples are drawn), an array `(M, D)`, or None.
        dims: the dimensions to show (default: the first `max_dims`).
        max_dims: most dimensions shown when `dims` is None.
        n: points per scatter panel.
        bins: histogram bins.
        labels: names of the `D` dimensions (default `x_1`, ..., `x_D`), e.g. a CSV header's.
    """
    where = "plot.pairwise"
    pts = _points(data, where)
    for name, value in (("n", n), ("bins", bins), ("max_dims", max_dims)):
        _positive(value, name, where)
    if samples is not None:
        samples = _points(_flow_samples(samples, n), where, "samples")
        if samples.shape[1] != pts.shape[1]:
            raise ValueError(f"plot.pairwise: samples have shape {samples.shape} but data {pts.shape}")
    dims = list(range(min(max_dims, pts.shape[1]))) if dims is None else list(dims)
    if not dims or any(not 0 <= d < pts.shape[1] for d in dims):
        raise ValueError(f"plot.pairwise: dims must index the {pts.shape[1]} dimensions, got {dims}")
    k = len(dims)
    names = _axis_labels(labels, dims, where)
    bounds = _bounds(pts[:, dims])
    shown = _subsample(pts, n)
    fig, axes = _figure(1.9 * k + 1, 1.9 * k + 1, k, k, squeeze=False)
    for r, dr in enumerate(dims):
        for c, dc in enumerate(dims):
            ax = axes[r, c]
            if r == c:
                edges = np.linspace(*bounds[r], bins + 1)
                ax.hist(pts[:, dr], bins=edges, density=True, color="C0", alpha=0.5)
                if samples is not None:
                    ax.hist(samples[:, dr], bins=edges, density=True, histtype="step", color="C1")
                ax.set_xlim(bounds[r])
                ax.set_yticks([])
            elif r > c:
                ax.scatter(shown[:, dc], shown[:, dr], s=0.8, c="C0", alpha=0.4, linewidths=0)
                ax.set(xlim=bounds[c], ylim=bounds[r])
            elif samples is not None:
                s = _subsample(samples, n)
                ax.scatter(s[:, dc], s[:, dr], s=0.8, c="C1", alpha=0.4, linewidths=0)
                ax.set(xlim=bounds[c], ylim=bounds[r])
            else:
                ax.axis("off")
            if r == k - 1:
                ax.set_xlabel(names[c])
            if c == 0 and r != c:
                ax.set_ylabel(names[r])
    if k == 1:  # one histogram: no triangles
        axes[0, 0].set_ylabel("density")
        title = "data (filled)" + (" vs flow samples (line)" if samples is not None else "")
    else:
        title = "data (lower, filled)" + (" vs flow samples (upper, line)" if samples is not None else "")
    fig.suptitle(title)
    return fig


def _column(history: Any, *names: str) -> list | None:
    for name in names:
        if isinstance(history, Mapping) and name in history:
            return list(history[name])
        value = getattr(history, name, None)
        if value is not None and not callable(value):
            return list(value)
    return None


def _finite_pairs(steps: Sequence, values: Sequence | None) -> tuple[list, list]:
    if values is None:
        return [], []
    pairs = [(s, v) for s, v in zip(steps, values, strict=False) if v is not None and math.isfinite(float(v))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def training_curves(
    history: Any,
    *,
    smooth: int = 0,
    title: str | None = None,
    ylabel: str = "loss",
    bits_per_dim: tuple[int, int] | None = None,
) -> Figure:
    """Training (and validation) loss against the step, with the learning rate in a second panel.

    Arguments:
        history: a [`flowkit.train.History`][flowkit.train.History] (or a mapping with `loss` and optionally
            `step`, `lr`, `val_loss` and `val_step` lists).
        smooth: width of a moving average applied to the training loss (0: none).
        title: title of the loss panel.
        ylabel: label of the loss axis, with its unit (for maximum likelihood `"NLL (nats)"`).
        bits_per_dim: `(D, K)` for an NLL in nats of dequantised data with `D` dimensions of `K` levels: a
            second axis gives it in bits/dim ([`flowkit.data.bits_per_dim`][flowkit.data.bits_per_dim]).
    """
    loss = _column(history, "loss", "train_loss")
    if not loss:
        raise ValueError("plot.training_curves: the history holds no training loss")
    steps = _column(history, "step", "steps") or list(range(1, len(loss) + 1))
    val = _column(history, "val_loss")
    lr = _column(history, "lr")
    fig, axes = _figure(7, 5.5 if lr else 4, 2 if lr else 1, 1, sharex=True, squeeze=False)
    axes = axes[:, 0]
    ax = axes[0]
    xs, ys = _finite_pairs(steps, loss)
    ax.plot(xs, ys, color="C0", alpha=0.35 if smooth > 1 else 1.0, lw=0.8, label="train")
    if smooth > 1 and len(ys) >= smooth:
        kernel = np.ones(smooth) / smooth
        mean = np.convolve(ys, kernel, mode="valid")
        ax.plot(xs[smooth - 1 :], mean, color="C0", lw=1.5, label=f"train ({smooth}-step mean)")
    val_steps = _column(history, "val_step") or steps  # History keeps validations apart from steps
    vx, vy = _finite_pairs(val_steps, val)
    if vx:
        ax.plot(vx, vy, "o-", color="C1", ms=3, lw=1.2, label="validation")
    ax.set(ylabel=ylabel, title=title or "training curves")
    if bits_per_dim is not None:
        dims, levels = (int(v) for v in bits_per_dim)
        if dims < 1 or levels < 1:
            raise ValueError(f"plot.training_curves: bits_per_dim must be (D, K) with D, K >= 1, got {bits_per_dim}")
        offset, scale = dims * math.log(levels), dims * math.log(2)
        bits = ax.secondary_yaxis("right", functions=(lambda y: (y + offset) / scale, lambda b: b * scale - offset))
        bits.set_ylabel("bits/dim")
    ax.legend(loc="upper right")
    if lr:
        lx, ly = _finite_pairs(steps, lr)
        axes[1].plot(lx, ly, color="C2")
        axes[1].set(ylabel="learning rate")
    axes[-1].set_xlabel("step")
    return fig


def ramachandran(
    phi: Tensor | np.ndarray,
    psi: Tensor | np.ndarray,
    log_weights: Tensor | np.ndarray | None = None,
    *,
    bins: int = 60,
    reference: tuple[Tensor | np.ndarray, Tensor | np.ndarray] | None = None,
    raw: bool = False,
    titles: Sequence[str] | None = None,
) -> Figure:
    r"""Ramachandran plot: the free energy $-\log p(\phi, \psi)$ in units of $kT$ on $[-\pi, \pi)^2$.

    Arguments:
        phi: backbone dihedrals $\phi$ in radians, shape `(n,)`.
        psi: backbone dihedrals $\psi$, shape `(n,)`.
        log_weights: log importance weights of the samples (reweighted histogram), or None.
        bins: histogram bins per axis.
        reference: `(phi, psi)` of reference samples (molecular dynamics), drawn in the last panel.
        raw: with `log_weights`, also draw the unweighted samples, in a first panel.
        titles: panel titles (default `("samples", "reference")`, or `("raw", "reweighted", "reference")` with `raw`).

    Returns:
        The figure: the panels (raw samples, samples, reference) side by side.
    """
    where = "plot.ramachandran"
    _positive(bins, "bins", where, minimum=2)
    panels = [(_numpy(phi).ravel(), _numpy(psi).ravel(), log_weights)]
    if raw and log_weights is not None:
        panels.insert(0, (panels[0][0], panels[0][1], None))
    if titles is None:
        titles = ("raw", "reweighted", "reference") if len(panels) == 2 else ("samples", "reference")
    if reference is not None:
        panels.append((_numpy(reference[0]).ravel(), _numpy(reference[1]).ravel(), None))
    if len(titles) < len(panels):
        raise ValueError(f"{where}: {len(panels)} panels need {len(panels)} titles, got {len(titles)}")
    edges = np.linspace(-math.pi, math.pi, bins + 1)
    fig, (axes,) = _figure(4.6 * len(panels), 4, 1, len(panels), squeeze=False)
    for ax, (a, b, lw), title in zip(axes, panels, titles, strict=False):
        if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError(f"{where}: phi and psi must be finite and of one shape, got {a.shape} and {b.shape}")
        w = None
        if lw is not None:
            lw = _numpy(lw).ravel()
            if lw.shape != a.shape:
                raise ValueError(f"{where}: log_weights must have one value per sample, got {lw.shape} for {a.shape}")
            w = np.exp(lw - lw.max())
        hist, _, _ = np.histogram2d(a, b, bins=[edges, edges], weights=w, density=True)
        with np.errstate(divide="ignore"):
            free = -np.log(hist)
        free -= free[np.isfinite(free)].min() if np.isfinite(free).any() else 0.0
        mesh = ax.pcolormesh(edges, edges, np.ma.masked_invalid(free).T, cmap="viridis_r", vmax=10.0)
        ax.set(xlabel=r"$\phi$", ylabel=r"$\psi$", title=title, aspect="equal")
        fig.colorbar(mesh, ax=ax, label="free energy / kT")
    return fig


def free_energy_profiles(profiles: Mapping[str, Any], *, xlabel: str = r"$\phi$", title: str | None = None) -> Figure:
    r"""Free-energy profiles $F(s) = -\log p(s)$ in kT with their error bars, one line per profile.

    Arguments:
        profiles: name -> [`FreeEnergyProfile`][flowkit.stats.FreeEnergyProfile] (of
            [`flowkit.stats.free_energy_profile`][flowkit.stats.free_energy_profile]), drawn as they are
            (no shift, empty bins left out).
        xlabel: the coordinate's label.
        title: the figure title.

    Returns:
        The figure.
    """
    where = "plot.free_energy_profiles"
    if not profiles:
        raise ValueError(f"{where}: profiles must name at least one profile")
    fig, ax = _figure(5.5, 3.8)
    for name, profile in profiles.items():
        if not all(hasattr(profile, a) for a in ("edges", "free_energy", "error")):
            raise ValueError(f"{where}: profile {name!r} is not a FreeEnergyProfile, got {type(profile).__name__}")
        centres = 0.5 * (profile.edges[1:] + profile.edges[:-1])
        keep = np.isfinite(profile.free_energy)
        err = np.where(np.isfinite(profile.error), profile.error, 0.0)[keep]
        method = {"bootstrap": " (bootstrap errors)", "blocks": " (block errors)"}.get(getattr(profile, "method", None))
        label = name + (method or "")
        ax.errorbar(centres[keep], profile.free_energy[keep], yerr=err, marker="o", ms=3, capsize=2, label=label)
    ax.set(xlabel=xlabel, ylabel="free energy / kT", title=title)
    ax.legend(fontsize="small")
    return fig


# ---- lattice field theory


def lattice_configurations(configurations: Tensor, *, n: int = 4, title: str | None = None) -> Figure:
    """The first `n` lattice configurations `(N, L, L)` as images on one colour scale (blue negative, red positive).

    Arguments:
        configurations: field configurations `(N, L, L)`.
        n: number of configurations shown (at most `N`).
        title: figure title.
    """
    x = _numpy(configurations)
    if x.ndim != 3 or len(x) < 1 or not np.isfinite(x).all():
        raise ValueError("lattice_configurations: configurations must be a finite (N, L, L) array with N >= 1")
    _positive(n, "n", "lattice_configurations")
    shown = x[: min(n, len(x))]
    scale = float(np.abs(shown).max()) or 1.0
    fig, (axes,) = _figure(2.1 * len(shown) + 0.8, 2.3, 1, len(shown), squeeze=False)
    for i, (ax, phi) in enumerate(zip(axes, shown, strict=True)):
        image = ax.imshow(phi, cmap="RdBu_r", vmin=-scale, vmax=scale)
        ax.set(xticks=[], yticks=[], title=f"#{i}")
    fig.colorbar(image, ax=list(axes), label=r"$\phi_x$", shrink=0.9)
    if title:
        fig.suptitle(title)
    return fig


def magnetization_histogram(chains: Mapping[str, Tensor], *, bins: int = 50, title: str | None = None) -> Figure:
    r"""Histograms of the magnetisation $M = \frac1V\sum_x \phi_x$ of several chains (e.g. a flow chain against HMC).

    Arguments:
        chains: `{label: configurations}`, each `(..., L, L)` (all leading axes are pooled).
        bins: number of histogram bins (shared by the chains).
        title: axes title.
    """
    if not chains:
        raise ValueError("magnetization_histogram: give at least one chain")
    values = {}
    for label, x in chains.items():
        m = _numpy(x)
        if m.ndim < 2 or not np.isfinite(m).all():
            raise ValueError(f"magnetization_histogram: chain {label!r} must be finite configurations (..., L, L)")
        values[label] = m.mean((-1, -2)).ravel()
    _positive(bins, "bins", "magnetization_histogram")
    edges = np.histogram_bin_edges(np.concatenate(list(values.values())), bins=bins)
    fig, ax = _figure(5, 3.5)
    for i, (label, m) in enumerate(values.items()):
        style = {"histtype": "step"} if i else {"histtype": "stepfilled", "alpha": 0.4}
        ax.hist(m, bins=edges, density=True, label=label, linewidth=1.5, **style)
    ax.set(xlabel="magnetisation $M$", ylabel="density", title=title or "magnetisation")
    ax.legend()
    return fig


def autocorrelation(series: Mapping[str, Tensor], *, max_lag: int = 50, title: str | None = None) -> Figure:
    r"""Normalised autocorrelation functions $\rho(t)$ of scalar chains, with their $\tau_{int}$ in the legend.

    Arguments:
        series: `{label: values}`, each `(n_steps,)` or `(n_steps, chains)`
            (see [`flowkit.sampling.autocorrelation`][flowkit.sampling.autocorrelation]).
        max_lag: the largest lag shown.
        title: axes title.
    """
    if not series:
        raise ValueError("autocorrelation: give at least one series")
    _positive(max_lag, "max_lag", "autocorrelation")
    fig, ax = _figure(5, 3.5)
    for label, values in series.items():
        x = torch.as_tensor(values)
        rho = acf(x).numpy()[: max_lag + 1]
        tau = integrated_autocorrelation_time(x)
        ax.plot(np.arange(len(rho)), rho, marker=".", label=f"{label} ($\\tau_{{int}}$ = {tau:.2f})")
    ax.axhline(0, color="0.6", linewidth=0.8)
    ax.set(xlabel="lag $t$ (steps)", ylabel=r"$\rho(t)$", title=title or "autocorrelation")
    ax.legend()
    return fig


def image_grid(
    images: Tensor | np.ndarray, *, columns: int | None = None, title: str | None = None, cmap: str = "gray"
) -> Figure:
    """A grid of images `(N, C, H, W)` (or `(N, H, W)`) with values in `[0, 1]` (clipped), one or three channels.

    Arguments:
        images: the images, e.g. `flow.sample((64,))` of an image flow.
        columns: images per row (default: about the square root of `N`).
        title: the figure's title.
        cmap: colour map of one-channel images.
    """
    array = _numpy(images)
    if array.ndim == 3:
        array = array[:, None]
    if array.ndim != 4 or array.shape[1] not in (1, 3) or len(array) == 0:
        raise ValueError(f"plot.image_grid: images must be (N, 1 or 3, H, W) with N >= 1, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("plot.image_grid: the images hold non-finite values")
    n, (c, h, w) = len(array), array.shape[1:]
    columns = columns or math.ceil(math.sqrt(n))
    _positive(columns, "columns", "plot.image_grid")
    rows = math.ceil(n / columns)
    canvas = np.ones((rows * (h + 1) - 1, columns * (w + 1) - 1, c))
    for i, image in enumerate(np.clip(array, 0.0, 1.0)):
        r, q = divmod(i, columns)
        canvas[r * (h + 1) : r * (h + 1) + h, q * (w + 1) : q * (w + 1) + w] = image.transpose(1, 2, 0)
    fig, ax = _figure(max(2.0, columns * 0.6), max(2.0, rows * 0.6))
    ax.imshow(canvas[..., 0] if c == 1 else canvas, cmap=cmap if c == 1 else None, vmin=0.0, vmax=1.0)
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return fig


def bits_per_dim_curve(history: Any, dims: int, levels: int, *, smooth: int = 25, title: str | None = None) -> Figure:
    """[`training_curves`][flowkit.plot.training_curves] in bits/dim of dequantised data with `levels` levels.

    The losses become `(loss + dims log K) / (dims ln 2)`, as [`flowkit.data.bits_per_dim`][flowkit.data.bits_per_dim].
    """

    def convert(values: Sequence | None) -> list | None:
        return None if values is None else [float(bits_per_dim(-v, dims, levels)) for v in values]

    curves = {
        "loss": convert(_column(history, "loss", "train_loss")),
        "step": _column(history, "step", "steps"),
        "val_loss": convert(_column(history, "val_loss")),
        "val_step": _column(history, "val_step"),
        "lr": _column(history, "lr"),
    }
    curves = {k: v for k, v in curves.items() if v}
    return training_curves(curves, smooth=smooth, title=title or "bits/dim", ylabel="bits/dim")


def equal_area(v: Tensor | np.ndarray) -> np.ndarray:
    r"""Lambert azimuthal equal-area projection of unit vectors `(..., 3)` onto the disc of radius 2.

    $(x, y, z) \mapsto \sqrt{2 / (1 + z)}\, (x, y)$: the north pole goes to the centre, the south pole to the
    rim, and equal areas on the sphere to equal areas in the disc.
    """
    v = _numpy(v)
    scale = np.sqrt(2.0 / np.clip(1.0 + v[..., 2], 1e-12, None))
    return np.stack([scale * v[..., 0], scale * v[..., 1]], -1)


def orientations(
    quaternions: Mapping[str, Tensor],
    log_weights: Mapping[str, Tensor] | None = None,
    *,
    axes: Sequence[int] = (0, 1, 2),
    bins: int = 40,
    title: str | None = None,
) -> Figure:
    r"""Orientation marginals: where the body axes point, in equal-area projection, for several sample sets.

    For unit quaternions $q$ (scalar first) the body axis $k$ points along $R(q) e_k \in S^2$; each panel is the
    (weighted) histogram of one axis over one sample set in the [`equal_area`][flowkit.plot.equal_area] projection.

    Arguments:
        quaternions: name -> quaternions `(n, 4)` (one rigid body: slice a layout first).
        log_weights: name -> log importance weights `(n,)` for the sets that have them.
        axes: the body axes to show (0, 1, 2 for x, y, z).
        bins: histogram bins per direction.
        title: figure title.
    """
    if not quaternions:
        raise ValueError("orientations: give at least one set of quaternions")
    _positive(bins, "bins", "orientations", minimum=2)
    log_weights = dict(log_weights or {})
    names = list(quaternions)
    fig, grid = _figure(3.0 * len(axes), 3.0 * len(names), len(names), len(axes), squeeze=False)
    edges = np.linspace(-2, 2, bins + 1)
    circle = np.linspace(0, 2 * np.pi, 200)
    for row, name in enumerate(names):
        q = torch.as_tensor(quaternions[name]).detach().double()
        if q.dim() != 2 or q.shape[1] != 4:
            raise ValueError(f"orientations: {name!r} must have shape (n, 4), got {tuple(q.shape)}")
        matrices = quaternion_to_matrix(q).numpy()
        lw = log_weights.get(name)
        weights = None if lw is None else torch.softmax(torch.as_tensor(lw).detach().double(), 0).numpy()
        for col, k in enumerate(axes):
            ax: Axes = grid[row][col]
            xy = equal_area(matrices[:, :, k])
            hist, _, _ = np.histogram2d(xy[:, 0], xy[:, 1], bins=[edges, edges], weights=weights, density=True)
            ax.pcolormesh(edges, edges, hist.T, cmap="magma", shading="auto")
            ax.plot(2 * np.cos(circle), 2 * np.sin(circle), color="0.6", lw=0.8)
            ax.set(aspect="equal", xticks=[], yticks=[])
            ax.set_title(f"{name}: body axis {'xyz'[k]}", fontsize=9)
    if title:
        fig.suptitle(title)
    return fig
