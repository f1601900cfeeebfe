"""Simulation-based inference: simulators with reference posteriors, amortised posteriors and their diagnostics."""

from .diagnostics import (
    PredictiveCheck,
    c2st,
    coverage_error,
    posterior_predictive_check,
    posterior_samples,
    sbc_coverage,
    sbc_ranks,
    sbc_uniformity,
    tarp_coverage,
)
from .npe import NeuralPosterior, fit_posterior, posterior_flow
from .plots import plot_corner, plot_coverage, plot_predictive, plot_sbc
from .tasks import (
    SLCP,
    TASKS,
    GaussianLinear,
    LinearTransitSpectrum,
    Task,
    TransitSpectrum,
    TwoMoons,
    drop_invalid_simulations,
    get_task,
)

__all__ = [
    "Task",
    "GaussianLinear",
    "TwoMoons",
    "SLCP",
    "TransitSpectrum",
    "LinearTransitSpectrum",
    "TASKS",
    "get_task",
    "drop_invalid_simulations",
    "NeuralPosterior",
    "fit_posterior",
    "posterior_flow",
    "c2st",
    "sbc_ranks",
    "sbc_coverage",
    "sbc_uniformity",
    "tarp_coverage",
    "coverage_error",
    "posterior_samples",
    "PredictiveCheck",
    "posterior_predictive_check",
    "plot_corner",
    "plot_coverage",
    "plot_sbc",
    "plot_predictive",
]
