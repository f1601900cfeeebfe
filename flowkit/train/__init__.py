"""Training: one fit loop and small objective classes."""

from .batches import split_batch
from .boltzmann import BoltzmannGenerator
from .likelihood import MaximumLikelihood
from .loop import History, fit
from .objective import Objective
from .pathgrad import ForwardKLPathGradient, PathGradientVI
from .score_matching import EMA, ScoreMatching, exact_log_prob

__all__ = ["fit", "History", "MaximumLikelihood", "split_batch", "Objective", "PathGradientVI", "ForwardKLPathGradient", "BoltzmannGenerator", "ScoreMatching", "EMA", "exact_log_prob"]
