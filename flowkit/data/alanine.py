"""Reference configurations of alanine dipeptide made here: Langevin molecular dynamics with OpenMM, cached on disk.

Nothing is downloaded: the frames are simulated from the shipped AMBER files (see
[`AlanineDipeptide`][flowkit.targets.AlanineDipeptide]) and cached as a NumPy file in the data directory (`root`, else
`$FLOWKIT_DATA`, else `./data`), under `alanine_dipeptide/`. A second call with the same arguments reads the cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from ..targets.alanine import AlanineDipeptide
from ..targets.openmm import require_openmm
from .tabular import data_root

__all__ = ["alanine_dipeptide_md"]


def _cache_path(root: Path, temperature: float, ns: float, seed: int, solvent: str | None, interval: float) -> Path:
    name = f"md_T{temperature:g}_{solvent or 'vacuum'}_ns{ns:g}_every{interval:g}ps_seed{seed}.npy"
    return root / "alanine_dipeptide" / name


def alanine_dipeptide_md(
    temperature: float = 1000.0,
    ns: float = 5.0,
    seed: int = 0,
    *,
    solvent: str | None = None,
    interval: float = 0.2,
    equilibration: float = 10.0,
    timestep: float = 1.0,
    friction: float = 1.0,
    root: str | os.PathLike | None = None,
    cache: bool = True,
    progress: bool = False,
) -> Tensor:
    """Frames of Langevin MD of alanine dipeptide (no constraints), `(N, 66)` float64 in nm, cached on disk.

    The run starts at the minimised shipped coordinates with velocities drawn at `temperature`, is equilibrated for
    `equilibration` ps (not stored), then stores one frame every `interval` ps for `ns` ns with OpenMM's
    `LangevinMiddleIntegrator` on the Reference platform in vacuum (the CPU platform in solvent), seeded by `seed`. In
    vacuum at 1000 K, 5 ns take a few minutes on 2 cores.

    Arguments:
        temperature: temperature in kelvin.
        ns: length of the stored trajectory in nanoseconds.
        seed: seed of the initial velocities and of the Langevin noise.
        solvent: `None` (vacuum) or `"obc"` (implicit solvent).
        interval: time between stored frames, in ps.
        equilibration: unstored equilibration time, in ps.
        timestep: integration time step, in fs.
        friction: Langevin friction, in 1/ps.
        root: data directory (default `$FLOWKIT_DATA`, else `./data`).
        cache: read and write the cache file (False: always simulate, write nothing).
        progress: show a progress bar.

    Returns:
        The frames, `(round(1000 ns / interval), 66)` float64.

    Raises:
        ValueError: for bad numbers, or when OpenMM is missing (install the `md` extra).
    """
    from tqdm.auto import tqdm

    where = "alanine_dipeptide_md"
    temperature = check_number(temperature, "temperature", where=where, positive=True)
    ns = check_number(ns, "ns", where=where, positive=True)
    seed = int(check_number(seed, "seed", where=where, integer=True, low=0))
    interval = check_number(interval, "interval", where=where, positive=True)
    equilibration = check_number(equilibration, "equilibration", where=where, low=0)
    timestep = check_number(timestep, "timestep", where=where, positive=True)
    friction = check_number(friction, "friction", where=where, positive=True)
    steps_per_frame = round(interval * 1000 / timestep)
    n_frames = round(ns * 1000 / interval)
    if steps_per_frame < 1 or n_frames < 1:
        raise ValueError(f"{where}: interval and ns give no frames (interval={interval} ps, ns={ns})")
    path = _cache_path(data_root(root), temperature, ns, seed, solvent, interval)
    if cache and path.is_file():
        frames = np.load(path, allow_pickle=False)
        if frames.shape == (n_frames, 66) and np.isfinite(frames).all():
            return torch.from_numpy(frames)

    mm = require_openmm()
    u = mm.unit
    target = AlanineDipeptide(temperature, solvent=solvent)
    integrator = mm.LangevinMiddleIntegrator(temperature * u.kelvin, friction / u.picosecond, timestep * u.femtosecond)
    integrator.setRandomNumberSeed(seed + 1)  # OpenMM reads a seed of 0 as "pick one at random"
    platform = mm.Platform.getPlatformByName(target.platform)
    context = mm.Context(target.system, integrator, platform)
    context.setPositions(target.minimum().reshape(-1, 3).numpy())
    context.setVelocitiesToTemperature(temperature * u.kelvin, seed + 1)
    integrator.step(round(equilibration * 1000 / timestep))
    frames = np.empty((n_frames, 66))
    for i in tqdm(range(n_frames), desc="alanine MD", disable=not progress, mininterval=2.0):
        integrator.step(steps_per_frame)
        pos = context.getState(getPositions=True).getPositions(asNumpy=True).value_in_unit(u.nanometer)
        frames[i] = np.asarray(pos).reshape(-1)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, frames, allow_pickle=False)
        os.replace(tmp, path)
    return torch.from_numpy(frames)
