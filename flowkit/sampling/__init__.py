"""Sampling with a flow and a target: importance weights, ESS, log Z, reweighting, and Markov chains.

`importance` (weights and their statistics), `mcmc` (Markov chains and autocorrelation times) on it, and
`ais` (annealed importance sampling from a flow) on both.
"""

from .ais import AISResult, ais
from .fermion_hmc import pseudofermion_hmc
from .importance import (
    ess,
    importance_sample,
    log_weights,
    log_weights_at,
    log_Z,
    resample,
    reweight,
    sample_with_log_weights,
)
from .mcmc import (
    Chains,
    Potential,
    autocorrelation,
    flow_hmc,
    hmc,
    hmc_transition,
    imh,
    independent_metropolis,
    integrated_autocorrelation_time,
    langevin_transition,
    latent_energy,
    leapfrog,
    mala,
    metropolis,
    metropolis_transition,
    neutra_mala,
    potential,
)

__all__ = [
    "sample_with_log_weights",
    "log_weights_at",
    "importance_sample",
    "log_weights",
    "ess",
    "log_Z",
    "reweight",
    "resample",
    "imh",
    "metropolis",
    "Chains",
    "Potential",
    "potential",
    "latent_energy",
    "leapfrog",
    "hmc",
    "hmc_transition",
    "metropolis_transition",
    "langevin_transition",
    "ais",
    "AISResult",
    "mala",
    "flow_hmc",
    "neutra_mala",
    "pseudofermion_hmc",
    "independent_metropolis",
    "autocorrelation",
    "integrated_autocorrelation_time",
]
