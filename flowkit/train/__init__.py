"""Training: one fit loop and small objective classes."""

from .objective import Objective
from .score_matching import EMA, ScoreMatching, exact_log_prob

__all__ = ["Objective", "ScoreMatching", "EMA", "exact_log_prob"]
