"""Flows: a bijector over a base distribution, stochastic flows, and presets that build common flows.

`Flow(bijector, base)` models `x = f^{-1}(z)`, `z ~ base`, with density `log p(x) = log p_Z(f(x)) + log|det J_f(x)|`.
"""

from .base import FlowModel, require_exact_weights
from .continuous import CNF
from .embedded import EmbeddedFlow
from .flow import Flow, FlowDistribution
from .free_form import FreeFormFlow, InjectiveFlow, ResidualMLP
from .gaussianization import GF
from .images import EIW, Glow
from .kernel import KernelCouplingFlow, init_inducing
from .latent import LatentFlow
from .lattice import LatticeFlow
from .molecules import internal_coordinate_flow
from .neural import BNAF, NAF, UNAF
from .polynomial import BPF, SOSPF
from .presets import MAF, NSF, RealNVP
from .residual import PlanarFlow, ResidualFlow, SylvesterFlow
from .rigid import RigidBodyFlow
from .stochastic import LangevinBlock, MetropolisBlock, StochasticBlock, StochasticFlow
from .support import bounded
from .tails import COMET, TailAdaptive
from .tarflow import TarFlow

# isort: split
# Last: the modules above fill the registry's tables as they run.
from .registry import DATA_PRESETS, PRESET_NAMES, PRESETS, Preset, build_data_flow, build_flow, parse_hidden, preset

__all__ = [  # in the order of the API page: the presets first
    "NSF",
    "RealNVP",
    "MAF",
    "FlowModel",
    "require_exact_weights",
    "Flow",
    "FlowDistribution",
    "EmbeddedFlow",
    "bounded",
    "FreeFormFlow",
    "InjectiveFlow",
    "ResidualMLP",
    "NAF",
    "UNAF",
    "BNAF",
    "BPF",
    "SOSPF",
    "GF",
    "KernelCouplingFlow",
    "init_inducing",
    "ResidualFlow",
    "PlanarFlow",
    "SylvesterFlow",
    "CNF",
    "Glow",
    "TarFlow",
    "LatentFlow",
    "EIW",
    "LatticeFlow",
    "RigidBodyFlow",
    "StochasticFlow",
    "StochasticBlock",
    "MetropolisBlock",
    "LangevinBlock",
    "internal_coordinate_flow",
    "TailAdaptive",
    "COMET",
    "Preset",
    "preset",
    "PRESETS",
    "PRESET_NAMES",
    "build_flow",
    "DATA_PRESETS",
    "build_data_flow",
    "parse_hidden",
]
