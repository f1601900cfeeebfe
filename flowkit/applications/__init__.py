"""Flows at work: short modules that reproduce a paper's use of flows, built from the library's parts.

- [`mcmc_proposals`][flowkit.applications.mcmc_proposals]: flow proposals (IMH) against flow reparametrisation
  (NeuTra) in MCMC, and the IMH mixing bound (Grenioux et al., ICML 2023).
"""

from . import mcmc_proposals
from .mcmc_proposals import chain_mean, ess_per_evaluation, imh_tv_bound, imh_tv_by_quadrature

__all__ = ["mcmc_proposals", "imh_tv_bound", "imh_tv_by_quadrature", "chain_mean", "ess_per_evaluation"]
