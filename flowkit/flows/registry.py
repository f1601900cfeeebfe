"""Flow presets by name, at the sizes the command line uses.

`flowkit fit --flow NAME`, `flowkit boltzmann --flow NAME` and
`flowkit bench likelihood --models flowkit-NAME` build their flows here:

| name | preset | default size |
|---|---|---|
| `nsf` | [`NSF`][flowkit.flows.NSF], autoregressive | 5 layers, hidden `(128, 128)`, 8 bins |
| `nsf-coupling` | [`NSF`][flowkit.flows.NSF] with `coupling=True` | 5 layers, hidden `(128, 128)`, 8 bins |
| `realnvp` | [`RealNVP`][flowkit.flows.RealNVP] | 8 layers, hidden `(128, 128)` |
| `maf` | [`MAF`][flowkit.flows.MAF] | 5 layers, hidden `(64, 64)` |
| `lattice` | [`LatticeFlow`][flowkit.flows.LatticeFlow] on `D = L^2` features (an `L x L` lattice) | 16, `(8, 8)` |
| `naf` | [`NAF`][flowkit.flows.NAF], deep sigmoidal flows from MADEs | 3 layers, hidden `(64, 64)`, 16 units |
| `unaf` | [`UNAF`][flowkit.flows.UNAF], integrals of positive networks from MADEs | 3 layers, hidden `(64, 64)` |
| `bnaf` | [`BNAF`][flowkit.flows.BNAF], block neural autoregressive layers | 3 layers, hidden `(16,)` per feature |
| `residual` | [`ResidualFlow`][flowkit.flows.ResidualFlow] (series log-det above 4 features) | 5, `(64, 64)` |
| `planar` | [`PlanarFlow`][flowkit.flows.PlanarFlow] | 16 layers |
| `cnf` | [`CNF`][flowkit.flows.CNF], a continuous normalizing flow (FFJORD) | 1 ODE block, hidden `(64, 64)` |
| `free-form` | [`FreeFormFlow`][flowkit.flows.FreeFormFlow] of residual MLPs | hidden `(64, 64)`, 2 blocks |

Example:
    ```python
    from flowkit.flows import build_flow, parse_hidden

    flow = build_flow("maf", 3, transforms=2, hidden=parse_hidden("16,16"))
    ```
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

from torch import Tensor, nn

from .continuous import CNF
from .flow import Flow
from .free_form import FreeFormFlow, ResidualMLP
from .images import EIW, Glow
from .lattice import LatticeFlow
from .neural import BNAF, NAF, UNAF
from .presets import MAF, NSF, RealNVP
from .residual import PlanarFlow, ResidualFlow
from .tails import COMET, TailAdaptive

__all__ = [
    "PRESETS",
    "PRESET_NAMES",
    "build_flow",
    "parse_hidden",
    "count_parameters",
    "DATA_PRESETS",
    "build_data_flow",
    "IMAGE_PRESETS",
    "build_image_flow",
]


def _nsf(
    features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int, coupling: bool = False
) -> Flow:
    return NSF(features, transforms=transforms or 5, bins=bins, hidden=tuple(hidden or (128, 128)), coupling=coupling)


def _realnvp(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    if features < 2:
        raise ValueError(f"realnvp needs at least 2 features, got {features}")
    return RealNVP(features, transforms=transforms or 8, hidden=tuple(hidden or (128, 128)))


def _maf(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return MAF(features, transforms=transforms or 5, hidden=tuple(hidden or (64, 64)))


def _lattice(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    from ..bijectors import Chain, Reshape

    L = math.isqrt(features)
    if L < 2 or L * L != features:
        raise ValueError(f"lattice needs a square number L * L of features with L >= 2, got {features}")
    flow = LatticeFlow(L, transforms=transforms or 16, hidden=tuple(hidden or (8, 8)))
    return Flow(Chain(Reshape((features,), (L, L)), flow.bijector), flow.base)


def _cnf(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return CNF(features, transforms=transforms or 1, hidden=tuple(hidden or (64, 64)))


def _residual(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    logdet = "exact" if features <= 4 else "series"
    return ResidualFlow(features, transforms=transforms or 5, hidden=tuple(hidden or (64, 64)), logdet=logdet)


def _planar(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return PlanarFlow(features, transforms=transforms or 16)


def _free_form(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> FreeFormFlow:
    # `transforms` does not apply: one encoder and one decoder network (2 residual blocks each), sized by `hidden`.
    hidden = tuple(hidden or (64, 64))
    return FreeFormFlow(ResidualMLP(features, hidden), ResidualMLP(features, hidden), features)


def _naf(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return NAF(features, transforms=transforms or 3, hidden=tuple(hidden or (64, 64)))


def _unaf(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return UNAF(features, transforms=transforms or 3, hidden=tuple(hidden or (64, 64)))


def _bnaf(features: int, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return BNAF(features, transforms=transforms or 3, hidden=tuple(hidden or (16,)))


PRESETS: dict[str, Callable[[int, int | None, Sequence[int] | None, int], Flow]] = {
    "nsf": _nsf,
    "nsf-coupling": partial(_nsf, coupling=True),
    "realnvp": _realnvp,
    "maf": _maf,
    "lattice": _lattice,
    "naf": _naf,
    "unaf": _unaf,
    "bnaf": _bnaf,
    "residual": _residual,
    "planar": _planar,
    "cnf": _cnf,
    "free-form": _free_form,
}
"""Preset name -> constructor `(features, transforms, hidden, bins) -> Flow`.

`None` sizes take the defaults listed at [`build_flow`][flowkit.flows.build_flow].
"""

PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)
"""The names [`build_flow`][flowkit.flows.build_flow] accepts, in the order of `PRESETS`."""


def build_flow(
    name: str,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int = 8,
) -> Flow:
    """Build the preset called `name` (case-insensitive; one of `PRESET_NAMES`).

    Arguments:
        name: a name of `PRESETS` (the table of the module: `nsf`, `nsf-coupling`, `realnvp`, `maf`, ...).
        features: data dimension `D`.
        transforms: number of layers (default 5; 8 for `realnvp`, 16 for `lattice`).
        hidden: conditioner hidden sizes (default `(128, 128)`; `(64, 64)` for `maf`, `(8, 8)` for `lattice`).
        bins: spline bins (the NSF presets only).

    Returns:
        An unconditional flow on vectors `(D,)` over a standard normal.

    Raises:
        ValueError: for an unknown name (the message lists the known ones) or bad sizes.
    """
    key = name.lower() if isinstance(name, str) else None
    if key not in PRESETS:
        raise ValueError(f"unknown flow {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    if transforms is not None and transforms < 1:
        raise ValueError(f"transforms must be at least 1, got {transforms}")
    return PRESETS[key](features, transforms, None if hidden is None else parse_hidden(hidden), bins)


def parse_hidden(text: str | Sequence[int]) -> tuple[int, ...]:
    """Hidden sizes from text such as `"128,128"` (or `"128x128"`), or from a sequence of integers.

    Raises:
        ValueError: when a part is not an integer, or a size is not positive, or there is none.
    """
    if not isinstance(text, str):
        sizes = tuple(int(h) for h in text)
    else:
        try:
            sizes = tuple(int(h) for h in text.replace("x", ",").split(","))
        except ValueError:
            raise ValueError(f"hidden sizes must be integers separated by commas, like 128,128; got {text!r}") from None
    if not sizes or any(h < 1 for h in sizes):
        raise ValueError(f"hidden sizes must be positive integers, got {text!r}")
    return sizes


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters of `model`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _tail_adaptive(variant: str, x: Tensor, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return TailAdaptive.from_data(x, variant, transforms=transforms or 5, hidden=tuple(hidden or (64, 64)), bins=bins)


def _comet(x: Tensor, transforms: int | None, hidden: Sequence[int] | None, bins: int) -> Flow:
    return COMET.from_data(x, transforms=transforms or 5, hidden=tuple(hidden or (64, 64)), bins=bins)


DATA_PRESETS: dict[str, Callable[[Tensor, int | None, Sequence[int] | None, int], Flow]] = {
    "tail-adaptive": partial(_tail_adaptive, "mtaf"),
    "mtaf": partial(_tail_adaptive, "mtaf"),
    "mtaf-fix": partial(_tail_adaptive, "mtaf-fix"),
    "gtaf": partial(_tail_adaptive, "gtaf"),
    "comet": _comet,
}
"""Presets fitted to training data: name -> constructor `(x, transforms, hidden, bins) -> Flow`.

`tail-adaptive` (= `mtaf`), `mtaf-fix` and `gtaf` are [`TailAdaptive`][flowkit.flows.TailAdaptive]
flows whose tails are estimated on `x`; `comet` is a [`COMET`][flowkit.flows.COMET] flow with its
marginals fitted to `x`. Default sizes: 5 layers, hidden `(64, 64)`.
"""


def build_data_flow(
    name: str, x: Tensor, *, transforms: int | None = None, hidden: Sequence[int] | None = None, bins: int = 8
) -> Flow:
    """Build the preset called `name` (one of `DATA_PRESETS`) from training data `x` of shape `(N, D)`.

    Raises:
        ValueError: for an unknown name, bad sizes or data the tail estimates or marginal fits refuse.
    """
    key = name.lower() if isinstance(name, str) else None
    if key not in DATA_PRESETS:
        raise ValueError(f"unknown data-fitted flow {name!r}; choose one of {', '.join(DATA_PRESETS)}")
    if transforms is not None and transforms < 1:
        raise ValueError(f"transforms must be at least 1, got {transforms}")
    return DATA_PRESETS[key](x, transforms, None if hidden is None else parse_hidden(hidden), bins)


IMAGE_PRESETS: dict[str, Callable[[tuple[int, int, int], int | None, int | None, Sequence[int] | None], Flow]] = {
    "glow": lambda shape, levels, steps, hidden: Glow(shape, levels or 2, steps or 4, tuple(hidden or (64, 64))),
    "eiw": lambda shape, levels, steps, hidden: EIW(shape, levels or 2, steps or 4, tuple(hidden or (64, 64))),
}
"""Multiscale image flows: name -> constructor `(shape, levels, steps, hidden) -> Flow` for images in `[0, 1]`.

`glow` is [`Glow`][flowkit.flows.Glow], `eiw` is [`EIW`][flowkit.flows.EIW]; default sizes: 2 levels of
4 steps, conditioners with hidden channels `(64, 64)`.
"""


def build_image_flow(
    name: str,
    shape: Sequence[int],
    *,
    levels: int | None = None,
    steps: int | None = None,
    hidden: Sequence[int] | None = None,
) -> Flow:
    """Build the image preset called `name` (one of `IMAGE_PRESETS`) for images of `shape` `(C, H, W)`.

    Raises:
        ValueError: for an unknown name or bad sizes.
    """
    key = name.lower() if isinstance(name, str) else None
    if key not in IMAGE_PRESETS:
        raise ValueError(f"unknown image flow {name!r}; choose one of {', '.join(IMAGE_PRESETS)}")
    return IMAGE_PRESETS[key](tuple(shape), levels, steps, None if hidden is None else parse_hidden(hidden))
