"""Flows: a bijector over a base distribution, and presets that build common flows.

`Flow(bijector, base)` models `x = f^{-1}(z)`, `z ~ base`, with density
`log p(x) = log p_Z(f(x)) + log|det J_f(x)|`.
"""

from .flow import Flow, FlowDistribution
from .images import EIW, Glow
from .lattice import LatticeFlow
from .presets import MAF, NSF, RealNVP
from .registry import PRESET_NAMES, PRESETS, build_flow, parse_hidden
from .rigid import RigidBodyFlow

__all__ = [
    "Flow",
    "FlowDistribution",
    "RealNVP",
    "MAF",
    "NSF",
    "Glow",
    "EIW",
    "LatticeFlow",
    "RigidBodyFlow",
    "PRESETS",
    "PRESET_NAMES",
    "build_flow",
    "parse_hidden",
]
