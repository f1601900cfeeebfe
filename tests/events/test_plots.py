"""The event figures draw what they say: the QQ points, both intensities, both histograms."""

import numpy as np
import torch

from flowkit.events import EventModel, rescaled_residuals, simulate
from flowkit.events.plots import intensity_plot, inter_event_histogram, qq_plot


def test_figures():
    torch.manual_seed(0)
    seqs, process = simulate("hawkes", 400, seed=0)
    model = EventModel(hidden=8).double().standardize_(seqs)
    fig = qq_plot({"model": rescaled_residuals(model, seqs), "exp": np.random.default_rng(0).exponential(size=500)})
    assert len(fig.axes[0].lines) == 3 and "KS" in fig.axes[0].get_legend().texts[0].get_text()
    fig = intensity_plot(model, seqs, process=process)
    model_line, true_line = fig.axes[0].lines[:2]
    assert np.all(np.asarray(model_line.get_ydata()) > 0) and np.all(np.asarray(true_line.get_ydata()) >= 0.2 - 1e-12)
    fig = inter_event_histogram(seqs, samples=model.sample(5, t_end=50.0, seed=0))
    assert len(fig.axes[0].patches) > 60
