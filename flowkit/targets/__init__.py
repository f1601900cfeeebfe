"""Targets: unnormalised densities ``exp(-u(x))`` given by an energy, for training without data.

Each target has :meth:`~flowkit.targets.Target.energy`, ``event_shape``,
:meth:`~flowkit.targets.Target.force` (``-grad u``), and, when known,
``log_Z`` and exact :meth:`~flowkit.targets.Target.sample`.
"""

from .base import Energy, Target
from .lattice import Phi4
from .mixture import GaussianMixture
from .wells import DoubleWell, ManyWell

__all__ = ["Target", "Energy", "DoubleWell", "ManyWell", "GaussianMixture", "Phi4"]
