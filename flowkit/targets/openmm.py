r"""A bridge to OpenMM force fields: batched reduced energies with forces as the backward pass.

An OpenMM `System` gives the potential energy $E(x)$ in kJ/mol of Cartesian positions $x$ in nm; the
target energy is the reduced energy $u(x) = E(x) / k_B T$ (the Boltzmann distribution at temperature $T$),
with gradient $-F(x)/k_B T$ from the OpenMM forces $F$, computed and returned in float64.

A bad configuration (two atoms on top of each other) has an enormous energy. As in boltzgen and FAB,
energies above a cut $u_c$ are damped logarithmically, and capped at $u_{max}$:

$$
\tilde u = \begin{cases} u & u < u_c \\ u_c + \log(1 + u - u_c) & u \ge u_c \end{cases},
\qquad u \leftarrow \min(u, u_{max}) \text{ first},
$$

with the force scaled by $d\tilde u / du = 1/(1 + u - u_c)$ above the cut (zero
where $u$ is capped or not finite), so that a bad sample cannot overflow a loss.

OpenMM is an optional dependency: `pip install flowkit[md]` (or `pip install openmm`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from .base import Target

__all__ = ["OpenMMEnergy", "require_openmm", "PLATFORMS"]

#: The OpenMM platforms an [`OpenMMEnergy`][flowkit.targets.OpenMMEnergy] may run on.
PLATFORMS = ("Reference", "CPU")


def require_openmm() -> Any:
    """Import and return the `openmm` module, or raise a ValueError naming the `md` extra.

    Raises:
        ValueError: when OpenMM is not installed.
    """
    try:
        import openmm
        import openmm.app
        import openmm.unit
    except ImportError:
        raise ValueError(
            "OpenMM is not installed; molecular targets need it: pip install 'flowkit[md]' (or pip install openmm)"
        ) from None
    return openmm


def _damp(u: np.ndarray, cut: float, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """Damped energies and the factor `d damped / du` (0 where capped or not finite)."""
    finite = np.isfinite(u)
    capped = np.where(finite, np.minimum(u, cap), cap)
    above = capped >= cut
    damped = np.where(above, cut + np.log1p(np.maximum(capped - cut, 0.0)), capped)
    slope = np.where(above, 1.0 / (1.0 + np.maximum(capped - cut, 0.0)), 1.0)
    slope = np.where(finite & (u < cap), slope, 0.0)
    return damped, slope


class _EnergyFunction(torch.autograd.Function):
    """Energies `u` of a batch `x` with their gradients `grad` computed outside torch: the backward uses `grad`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, u: Tensor, grad: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(grad)
        ctx.in_dtype = x.dtype
        return u.clone()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        return (g.to(grad.dtype)[..., None] * grad).to(ctx.in_dtype), None, None


class OpenMMEnergy(Target):
    r"""Reduced energy $u(x) = E(x)/k_B T$ of an OpenMM `System`, on flattened Cartesian positions in nm.

    Configurations are vectors of `3 n_atoms` numbers `(x_1, y_1, z_1, x_2, ...)` in nm.
    [`energy`][flowkit.targets.base.Target.energy]'s backward pass uses the OpenMM forces; energies come
    back in float64, damped above `energy_cut` (see the module docstring); `evaluations` counts the
    configurations evaluated so far. It is not saved with a model (a `System` is not JSON).

    Arguments:
        system: an `openmm.System` (build it without constraints: a constrained system has
            no density in Cartesian space).
        temperature: temperature $T$ in kelvin.
        platform: `"Reference"` (fastest for small systems in vacuum) or `"CPU"` (faster for implicit solvent).
        energy_cut: reduced energy $u_c$ above which energies are damped logarithmically.
        energy_max: reduced energy $u_{max}$ at which energies are capped (non-finite ones too).
        threads: CPU threads of the `"CPU"` platform (its default when None).

    Raises:
        ValueError: when OpenMM is missing (install the `md` extra), for a system that is
            not an `openmm.System`, an unknown platform or bad numbers.

    References:
        Eastman et al., *OpenMM 8: molecular dynamics simulation with machine learning
        potentials*, J. Phys. Chem. B 128 (2024); Noé, Olsson, Köhler & Wu, *Boltzmann
        generators*, Science 365 (2019) (arXiv:1812.01729); Midgley et al., *Flow annealed
        importance sampling bootstrap*, ICLR 2023 (arXiv:2208.01893), for the energy damping.
    """

    _flowkit_register = False

    def __init__(
        self,
        system: Any,
        temperature: float,
        platform: str = "Reference",
        energy_cut: float = 1e8,
        energy_max: float = 1e20,
        threads: int | None = None,
    ) -> None:
        super().__init__()
        mm = require_openmm()
        if not isinstance(system, mm.System):
            raise ValueError(f"OpenMMEnergy: system must be an openmm.System, got {type(system).__name__}")
        if platform not in PLATFORMS:
            raise ValueError(f"OpenMMEnergy: unknown platform {platform!r}; choose one of {PLATFORMS}")
        self.temperature = check_number(temperature, "temperature", where="OpenMMEnergy", positive=True)
        self.energy_cut = check_number(energy_cut, "energy_cut", where="OpenMMEnergy", positive=True)
        self.energy_max = check_number(energy_max, "energy_max", where="OpenMMEnergy", positive=True)
        if self.energy_max <= self.energy_cut:
            raise ValueError(
                f"OpenMMEnergy: energy_max must exceed energy_cut, got {self.energy_max} <= {self.energy_cut}"
            )
        if threads is not None:
            threads = int(check_number(threads, "threads", where="OpenMMEnergy", integer=True, low=1))
        self.system = system
        self.platform = platform
        self.threads = threads
        self.n_atoms = int(system.getNumParticles())
        self.event_shape = torch.Size([3 * self.n_atoms])
        #: $k_B T$ in kJ/mol.
        self.kT = float(mm.unit.MOLAR_GAS_CONSTANT_R.value_in_unit(mm.unit.kilojoule_per_mole / mm.unit.kelvin))
        self.kT *= self.temperature
        self.evaluations = 0
        self._context: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # An OpenMM Context cannot be copied; a copy builds its own on first use.
        state = dict(self.__dict__)
        state["_context"] = None
        return state

    @property
    def context(self) -> Any:
        """The OpenMM `Context` the energies are computed in (built on first use)."""
        if self._context is None:
            mm = require_openmm()
            properties = {} if self.threads is None or self.platform != "CPU" else {"Threads": str(self.threads)}
            platform = mm.Platform.getPlatformByName(self.platform)
            integrator = mm.VerletIntegrator(0.001)
            self._context = mm.Context(self.system, integrator, platform, properties)
            self._integrator = integrator
        return self._context

    def energies_and_forces(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw (not damped nor reduced) energies (kJ/mol) and forces (kJ/mol/nm) of `(N, n_atoms, 3)` positions."""
        mm = require_openmm()
        kj, nm = mm.unit.kilojoule_per_mole, mm.unit.nanometer
        context = self.context
        energies = np.empty(len(positions))
        forces = np.empty((len(positions), self.n_atoms, 3))
        for i, pos in enumerate(positions):
            context.setPositions(pos)
            state = context.getState(getEnergy=True, getForces=True)
            energies[i] = state.getPotentialEnergy().value_in_unit(kj)
            forces[i] = state.getForces(asNumpy=True).value_in_unit(kj / nm)
        self.evaluations += len(positions)
        return energies, forces

    def _evaluate(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Damped reduced energies (batch shape) and their gradients (shape of `x`), float64 on `x`'s device."""
        batch = x.shape[:-1]
        pos = x.detach().to(device="cpu", dtype=torch.float64).reshape(-1, self.n_atoms, 3).numpy()
        bad = ~np.isfinite(pos).all(axis=(1, 2))
        energies = np.full(len(pos), math.inf)
        forces = np.zeros_like(pos)
        if (~bad).any():
            energies[~bad], forces[~bad] = self.energies_and_forces(pos[~bad])
        u, slope = _damp(energies / self.kT, self.energy_cut, self.energy_max)
        grad = -forces.reshape(len(pos), -1) / self.kT * slope[:, None]
        grad = np.where(np.isfinite(grad), grad, 0.0)
        out = torch.from_numpy(u).to(x.device).reshape(batch)
        return out, torch.from_numpy(grad).to(x.device).reshape(*batch, -1)

    def _energy(self, x: Tensor) -> Tensor:
        return _EnergyFunction.apply(x, *self._evaluate(x))

    def _force(self, x: Tensor) -> Tensor:
        return -self._evaluate(x)[1].to(x.dtype)

    def energy_and_force(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Energy (with its graph, if `x` has one) and force, from one OpenMM evaluation per configuration."""
        self._check(x, "energy_and_force")
        u, grad = self._evaluate(x)
        return _EnergyFunction.apply(x, u, grad), -grad.to(x.dtype)

    def extra_repr(self) -> str:
        return f"n_atoms={self.n_atoms}, temperature={self.temperature}, platform={self.platform!r}"
