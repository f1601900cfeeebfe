"""Simulation-based inference: flowkit flows as posterior estimators, in sbi and lampe."""

from .lampe import ConditionedFlow, lampe_flow
from .sbi import build_posterior_flow, sbi_builder, sbi_estimator

__all__ = ["sbi_builder", "sbi_estimator", "build_posterior_flow", "lampe_flow", "ConditionedFlow"]
