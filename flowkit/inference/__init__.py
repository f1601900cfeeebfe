"""Simulation-based inference: simulators, amortised posteriors, diagnostics, sbi and lampe backends, morphing."""

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
from .lampe import ConditionedFlow, lampe_flow
from .morphing import DiphotonToy, MMDToData, UnpairedMorphing, mmd2, morphing_flow
from .npe import NeuralPosterior, fit_posterior, posterior_flow
from .plots import plot_corner, plot_coverage, plot_predictive, plot_sbc
from .sbi import build_posterior_flow, sbi_builder, sbi_estimator
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
    "sbi_builder",
    "sbi_estimator",
    "build_posterior_flow",
    "lampe_flow",
    "ConditionedFlow",
    "DiphotonToy",
    "MMDToData",
    "UnpairedMorphing",
    "mmd2",
    "morphing_flow",
]
