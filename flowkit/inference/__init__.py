"""Simulation-based inference and the use of conditional flows on simulated events: unpaired morphing."""

from .morphing import DiphotonToy, MMDToData, UnpairedMorphing, mmd2, morphing_flow

__all__ = ["DiphotonToy", "MMDToData", "UnpairedMorphing", "mmd2", "morphing_flow"]
