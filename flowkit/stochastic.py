"""Deprecated alias: the stochastic flows moved to `flowkit.flows` (`energy_of` to `flowkit.targets`); they warn."""

from typing import Any

from . import targets as _targets
from ._deprecation import moved_names
from .flows import stochastic as _stochastic

__all__: list[str] = []
_flows = moved_names("flowkit.stochastic", "flowkit.flows", _stochastic)
_energy = moved_names("flowkit.stochastic", "flowkit.targets", _targets, ["energy_of"])


def __getattr__(name: str) -> Any:
    return (_energy if name == "energy_of" else _flows)(name)
