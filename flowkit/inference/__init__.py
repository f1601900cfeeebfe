"""Simulation-based inference: simulators with reference posteriors, amortised posteriors and their diagnostics."""

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
]
