"""A Boltzmann-generator flow for molecules: internal coordinates, then spline couplings on them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..bijectors import Chain, CircularSplineCoupling, Coupling
from ..bijectors.internal import InternalCoordinates
from ..distributions import RigidBase
from ..nn import MLP
from ..transformers import RationalQuadraticSpline
from .flow import Flow

__all__ = ["internal_coordinate_flow"]


def internal_coordinate_flow(
    internal: InternalCoordinates,
    blocks: int = 4,
    hidden: Sequence[int] = (128, 128),
    bins: int = 8,
    bound: float = 5.0,
    seed: int = 0,
) -> Flow:
    r"""A Boltzmann-generator flow on Cartesian positions through internal coordinates.

    The [`InternalCoordinates`][flowkit.bijectors.InternalCoordinates] map, then `blocks` blocks of four couplings: each
    splits the real coordinates and the circular dihedrals into random halves and transforms each half in turn
    (rational-quadratic splines on `[-bound, bound]`, and
    [`CircularSplineCoupling`][flowkit.bijectors.CircularSplineCoupling]), conditioned on all the others through a
    periodic MLP. The base is uniform on the circular coordinates and standard normal on the others (FAB's `gauss-uni`).

    Arguments:
        internal: the internal-coordinate bijector (e.g.
            [`alanine_internal_coordinates`][flowkit.targets.alanine.alanine_internal_coordinates]).
        blocks: number of blocks of four couplings.
        hidden: hidden sizes of the conditioner MLPs.
        bins: spline bins.
        bound: spline interval of the real coordinates.
        seed: seed of the random halves.

    Returns:
        A [`Flow`][flowkit.flows.Flow] with `event_shape` `(3n,)`.
    """
    d = int(internal.latent_shape[0])
    circular = list(internal.circular_idx)
    real = [i for i in range(d) if i not in circular]
    gen = torch.Generator().manual_seed(seed)
    layers: list[Any] = [internal]
    for _ in range(blocks):
        real_perm = [real[i] for i in torch.randperm(len(real), generator=gen)]
        circ_perm = [circular[i] for i in torch.randperm(len(circular), generator=gen)]
        for half in (0, 1):
            part = real_perm[half::2]
            mask = [int(i in part) for i in range(d)]
            spline = RationalQuadraticSpline(bins, bound)
            net = MLP(d - len(part), len(part) * spline.params_per_element, hidden, periodic=True)
            layers.append(Coupling(spline, d, mask=mask, conditioner=net))
            if len(circ_perm) > 1:
                part = circ_perm[half::2]
                mask = [int(i in part) for i in range(d)]
                layers.append(CircularSplineCoupling(d, bins, mask=mask, hidden=hidden))
    base = RigidBase(["angle" if i in circular else "real" for i in range(d)])
    return Flow(Chain(*layers), base)
