"""Statistics on samples, in numpy and scipy: tail-index estimators and tail metrics (`flowkit.stats.tails`).

`flowkit.tails`, the old home of these functions, is a deprecated alias (its name clashed with
`flowkit.bijectors.tails` and `flowkit.flows.tails`, the heavy-tailed layers and flows).
"""

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
