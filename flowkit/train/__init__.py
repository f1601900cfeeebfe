"""Training: one fit loop and small objective classes."""

from .batches import split_batch
from .likelihood import MaximumLikelihood
from .loop import History, fit
from .objective import Objective
from .score_matching import EMA, ScoreMatching, exact_log_prob

__all__ = ["fit", "History", "MaximumLikelihood", "split_batch", "Objective", "ScoreMatching", "EMA", "exact_log_prob"]
