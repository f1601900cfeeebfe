"""Statistics on samples, in numpy and scipy: tail metrics, free-energy profiles and blocked errors.

Tail-index estimators and tail metrics are in `flowkit.stats.tails`; free-energy profiles of reweighted
samples and blocked errors of time series in `flowkit.stats.profiles`.
"""

from .profiles import FreeEnergyProfile, blocked_mean, free_energy_profile
from .tails import (
    MIN_POINTS,
    TailEstimate,
    double_bootstrap,
    estimate_tail,
    estimate_tails,
    hill,
    kernel,
    loglog_tail_distance,
    moments,
    quantile_coverage,
    tail_value_at_risk,
)

__all__ = [
    "FreeEnergyProfile",
    "free_energy_profile",
    "blocked_mean",
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
