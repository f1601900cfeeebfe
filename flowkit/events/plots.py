r"""Figures for event models: time-rescaling QQ plot, learned against true intensity, inter-event histograms.

Like [`flowkit.plot`][flowkit.plot], every function returns a `matplotlib.figure.Figure` built without pyplot.

Examples:
    >>> from flowkit.events import EventModel, simulate
    >>> from flowkit.events.plots import inter_event_histogram
    >>> seqs, process = simulate("hawkes", 300, seed=0)
    >>> fig = inter_event_histogram(seqs)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .data import EventSequences
from .diagnostics import ks_test

__all__ = ["qq_plot", "intensity_plot", "inter_event_histogram"]


def _figure(width: float, height: float) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def qq_plot(residuals: np.ndarray | dict[str, np.ndarray], *, title: str | None = None) -> Figure:
    r"""Quantiles of time-rescaling residuals against those of $\mathrm{Exp}(1)$, with the KS statistic.

    Arguments:
        residuals: the residuals of one model, or a dict of them by model name
            ([`rescaled_residuals`][flowkit.events.rescaled_residuals]).
        title: the figure's title.
    """
    sets = residuals if isinstance(residuals, dict) else {"model": residuals}
    fig, ax = _figure(4.5, 4.5)
    top = 0.0
    for name, r in sets.items():
        r = np.sort(np.asarray(r, dtype=np.float64))
        expected = -np.log1p(-(np.arange(1, len(r) + 1) - 0.5) / len(r))
        statistic, pvalue = ks_test(r)
        ax.plot(expected, r, ".", markersize=2, label=f"{name}: KS {statistic:.3f} (p = {pvalue:.2g})")
        top = max(top, float(expected[-1]), float(np.quantile(r, 0.999)))
    ax.plot([0, top], [0, top], "k--", linewidth=1, label="Exp(1)")
    ax.set_xlabel("Exp(1) quantiles")
    ax.set_ylabel("residual quantiles")
    ax.legend(fontsize=8)
    ax.set_title(title or "time-rescaling QQ plot")
    return fig


def intensity_plot(
    model: Any,
    sequences: EventSequences,
    *,
    index: int = 0,
    process: Any = None,
    points: int = 1000,
    window: tuple[float, float] | None = None,
    title: str | None = None,
) -> Figure:
    r"""The model's conditional intensity $\lambda^*(t)$ on one sequence, against the true one of a simulator.

    Arguments:
        model: an [`EventModel`][flowkit.events.EventModel].
        sequences: the sequences.
        index: which sequence.
        process: the simulator (a [`PointProcess`][flowkit.events.PointProcess]) for the true intensity, or None.
        points: grid points.
        window: the time range shown (default: the first 30 events' span, or the whole window).
        title: the figure's title.
    """
    seq = sequences[index]
    if window is None:
        last = seq.times[min(len(seq), 30) - 1] if len(seq) > 30 else seq.t_end
        window = (seq.t_start, float(last))
    grid = np.linspace(window[0], window[1], points)[1:]
    fig, ax = _figure(8, 3)
    ax.plot(grid, model.intensity(sequences, grid, index=index), label="model")
    if process is not None:
        ax.plot(grid, process.intensity(seq, grid), "--", label="true")
    shown = seq.times[(seq.times >= window[0]) & (seq.times <= window[1])]
    ax.plot(shown, np.zeros_like(shown), "|", color="k", markersize=12, label="events")
    ax.set_xlabel("time")
    ax.set_ylabel(r"intensity $\lambda^*(t)$")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(title or "conditional intensity")
    return fig


def inter_event_histogram(
    sequences: EventSequences, *, samples: EventSequences | None = None, bins: int = 60, title: str | None = None
) -> Figure:
    r"""Histogram of $\log_{10}$ inter-event times of the data, and of a model's samples when given.

    Arguments:
        sequences: the data.
        samples: sequences drawn from a model ([`EventModel.sample`][flowkit.events.EventModel.sample]), or None.
        bins: histogram bins.
        title: the figure's title.
    """
    fig, ax = _figure(5, 3.5)
    data = np.log10(np.concatenate([s.inter_times for s in sequences]))
    edges = np.histogram_bin_edges(data, bins=bins)
    ax.hist(data, bins=edges, density=True, alpha=0.5, label="data")
    if samples is not None:
        drawn = np.log10(np.concatenate([s.inter_times for s in samples]))
        ax.hist(drawn, bins=edges, density=True, histtype="step", linewidth=1.5, label="model samples")
    ax.set_xlabel(r"$\log_{10}\tau$")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    ax.set_title(title or "inter-event times")
    return fig
