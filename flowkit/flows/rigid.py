"""A preset for rigid-body flows: couplings across bodies over uniform orientations and positions."""

from __future__ import annotations

from collections.abc import Sequence

from .._validation import check_number
from ..bijectors import Chain
from ..bijectors.sphere import GATE, ConvexDoubleMoebius, DoubleMoebius, RigidCoupling
from ..distributions import RigidBase
from ..domains import check_segments
from .flow import Flow

__all__ = ["RigidBodyFlow"]


def RigidBodyFlow(
    segments: Sequence[str],
    blocks: int = 4,
    heads: int = 2,
    hidden: Sequence[int] = (64, 64),
    context: int = 0,
    activation: str = "silu",
    gate: float = GATE,
    position_gate: float = GATE,
    components: int | None = None,
) -> Flow:
    r"""Flow over a rigid-body layout: blocks of [`RigidCoupling`][flowkit.bijectors.RigidCoupling] layers.

    The base is [`RigidBase`][flowkit.distributions.RigidBase] (uniform quaternions and
    angles, standard normal real coordinates).

    Each block maps, in turn, the real (auxiliary) coordinates given everything else, each quaternion given
    everything else, and all angles (positions) given the quaternions and real coordinates. A lone quaternion
    gets maps of $S^3$ ([`DoubleMoebius`][flowkit.bijectors.DoubleMoebius], or
    [`ConvexDoubleMoebius`][flowkit.bijectors.ConvexDoubleMoebius] with `components`) conditioned on the context
    alone. Every layer is antipodally equivariant in every quaternion and the base is symmetric, so the density
    is one on $SO(3)^N$ times the positions (see [`haar_log_prob`][flowkit.distributions.haar_log_prob]).

    Arguments:
        segments: the layout (`"quaternion"`, `"angle"`, `"real"`), e.g.
            `["quaternion", "real", "real", "real", "real"]` for one rigid body with four auxiliaries.
        blocks: the number of blocks.
        heads: double (or circle) Möbius maps per quaternion (or angle) and layer.
        hidden: hidden sizes of the conditioners.
        context: number of context features.
        activation: activation of the conditioners.
        gate: gate offset of the quaternion maps.
        position_gate: gate offset of the angle maps.
        components: maps per convex combination (None: single double and circle Möbius maps); see
            [`RigidCoupling`][flowkit.bijectors.RigidCoupling].

    Examples:
        >>> flow = RigidBodyFlow(["quaternion", "angle", "angle", "angle"] * 2, blocks=1, hidden=(16,))
        >>> x = flow.sample((3,))
        >>> x.shape, flow.log_prob(x).shape
        (torch.Size([3, 14]), torch.Size([3]))

    References:
        Köhler, Invernizzi, de Haan & Noé, *Rigid body flows for sampling molecular
        crystal structures*, ICML 2023 (arXiv:2301.11355).
    """
    segments = check_segments(segments, "RigidBodyFlow")
    blocks = check_number(blocks, "blocks", where="RigidBodyFlow", integer=True, low=1)
    groups: list[list[int]] = []
    reals = [i for i, s in enumerate(segments) if s == "real"]
    angles = [i for i, s in enumerate(segments) if s == "angle"]
    if reals:
        groups.append(reals)
    groups += [[i] for i, s in enumerate(segments) if s == "quaternion"]
    if angles:
        groups.append(angles)
    groups = [g for g in groups if len(g) < len(segments)]
    if segments == ("quaternion",):  # one body and nothing else: a stack of (context-conditioned) maps on S^3
        maps = [
            DoubleMoebius(4, heads=heads, context=context, hidden=hidden, gate=gate)
            if components is None
            else ConvexDoubleMoebius(4, components, heads=heads, context=context, hidden=hidden)
            for _ in range(blocks)
        ]
        return Flow(Chain(*maps), RigidBase(segments))
    if not groups:
        raise ValueError(f"RigidBodyFlow: the layout {list(segments)} has nothing to condition a coupling on")
    kwargs = dict(heads=heads, hidden=hidden, context=context, activation=activation, components=components)
    layers = [
        RigidCoupling(segments, group, gate=gate, position_gate=position_gate, **kwargs)  # type: ignore[arg-type]
        for _ in range(blocks)
        for group in groups
    ]
    return Flow(Chain(*layers), RigidBase(segments))
