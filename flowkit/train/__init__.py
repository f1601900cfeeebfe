"""Training: one fit loop and small objective classes."""

from .batches import split_batch, split_indexed_batch, with_indices
from .boltzmann import BoltzmannGenerator
from .callbacks import EMA, Callback
from .constraints import AtLeast, AtMost, Constrained, Constraint, Equality
from .continuous import FlowMatching, LearnEndTime, RegularizedLikelihood
from .dependent import DependenceUpdate, DependentMaximumLikelihood
from .fab import FAB, PrioritisedReplayBuffer
from .force_matching import ForceMatching
from .free_form import FreeFormLikelihood
from .latent import LatentFlowLoss
from .likelihood import ForwardKLPathGradient, MaximumLikelihood
from .loop import History, default_threads, fit
from .noisy import FeatureAlignment, NoisyMaximumLikelihood
from .objective import Objective
from .pathgrad import PathGradientVI
from .score_matching import ScoreMatching, exact_log_prob

__all__ = [
    "fit",
    "default_threads",
    "History",
    "MaximumLikelihood",
    "split_batch",
    "Objective",
    "PathGradientVI",
    "ForwardKLPathGradient",
    "BoltzmannGenerator",
    "FAB",
    "PrioritisedReplayBuffer",
    "ForceMatching",
    "RegularizedLikelihood",
    "LearnEndTime",
    "FlowMatching",
    "FreeFormLikelihood",
    "ScoreMatching",
    "EMA",
    "Callback",
    "exact_log_prob",
    "DependentMaximumLikelihood",
    "DependenceUpdate",
    "with_indices",
    "split_indexed_batch",
    "Constrained",
    "Constraint",
    "Equality",
    "AtMost",
    "AtLeast",
    "NoisyMaximumLikelihood",
    "FeatureAlignment",
    "LatentFlowLoss",
]
