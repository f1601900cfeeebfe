"""Flows: a bijector over a base distribution, and presets that build common flows.

`Flow(bijector, base)` models `x = f^{-1}(z)`, `z ~ base`, with density `log p(x) = log p_Z(f(x)) + log|det J_f(x)|`.
"""

from .base import FlowModel, require_exact_weights
from .continuous import CNF
from .flow import Flow, FlowDistribution
from .free_form import FreeFormFlow, InjectiveFlow, ResidualMLP
from .images import EIW, Glow
from .lattice import LatticeFlow
from .molecules import internal_coordinate_flow
from .neural import BNAF, NAF, UNAF
from .presets import MAF, NSF, RealNVP
from .registry import DATA_PRESETS, PRESET_NAMES, PRESETS, build_data_flow, build_flow, parse_hidden
from .residual import PlanarFlow, ResidualFlow
from .rigid import RigidBodyFlow
from .tails import COMET, TailAdaptive

__all__ = [
    "FlowModel",
    "require_exact_weights",
    "Flow",
    "FlowDistribution",
    "FreeFormFlow",
    "InjectiveFlow",
    "ResidualMLP",
    "RealNVP",
    "MAF",
    "NSF",
    "NAF",
    "UNAF",
    "BNAF",
    "ResidualFlow",
    "PlanarFlow",
    "CNF",
    "Glow",
    "EIW",
    "LatticeFlow",
    "RigidBodyFlow",
    "internal_coordinate_flow",
    "TailAdaptive",
    "COMET",
    "PRESETS",
    "PRESET_NAMES",
    "build_flow",
    "DATA_PRESETS",
    "build_data_flow",
    "parse_hidden",
]
