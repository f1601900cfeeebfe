"""Flows at work: short modules that reproduce a paper's use of flows, built from the library's parts.

- [`mcmc_proposals`][flowkit.applications.mcmc_proposals]: flow proposals (IMH) against flow reparametrisation
  (NeuTra) in MCMC, and the IMH mixing bound (Grenioux et al., ICML 2023).
- [`learned_index`][flowkit.applications.learned_index]: a flow-based learned index of sorted keys (NFL,
  Wu et al., VLDB 2022).
- [`interventional`][flowkit.applications.interventional]: interventional normalizing flows, the density of a
  potential outcome with a one-step (AIPTW) corrected target flow (Melnychuk et al., ICML 2023).
- [`weak_supervision`][flowkit.applications.weak_supervision]: label learning flows, weakly supervised
  classification from weak signals with error bounds (Lu et al.).
"""

from . import interventional, learned_index, mcmc_proposals, weak_supervision
from .interventional import AIPTWCrossEntropy, GridAIPTWCrossEntropy, PolynomialNormalSCM
from .learned_index import KeyFlow, LearnedIndex
from .mcmc_proposals import chain_mean, ess_per_evaluation, imh_tv_bound, imh_tv_by_quadrature
from .weak_supervision import LabelLearningFlow, LabelLearningObjective

__all__ = [
    "mcmc_proposals",
    "learned_index",
    "imh_tv_bound",
    "imh_tv_by_quadrature",
    "chain_mean",
    "ess_per_evaluation",
    "KeyFlow",
    "LearnedIndex",
    "interventional",
    "PolynomialNormalSCM",
    "AIPTWCrossEntropy",
    "GridAIPTWCrossEntropy",
    "weak_supervision",
    "LabelLearningFlow",
    "LabelLearningObjective",
]
