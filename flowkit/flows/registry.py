"""Flow presets by name: each family declares its presets once, beside its code, with [`preset`][flowkit.flows.preset].

A declaration gives the name users type (`flowkit fit --flow NAME`, `flowkit boltzmann --flow NAME`,
`flowkit-NAME` in `flowkit bench likelihood`), its kind, default sizes and a one-line help; the tables below,
the command line's choices and help and the guide's table of presets are all read from the declarations:
`build_flow("maf", 3, transforms=2, hidden=parse_hidden("16,16"))` builds the `maf` preset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import Tensor, nn

from .._validation import check_number
from ..embeddings import ConditionEmbedding
from .embedded import EmbeddedFlow
from .flow import Flow

__all__ = [
    "Preset",
    "preset",
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

#: The kinds of preset, by what `build` takes first: features `D`; an `(L, L)` lattice (or `D = L^2` features);
#: an image shape `(C, H, W)` (images in `[0, 1]`); training data `x` `(N, D)`, to which the flow is fitted.
KINDS = ("vector", "lattice", "image", "data")


@dataclass(frozen=True)
class Preset:
    """A flow preset: a family's constructor with its name, kind, default sizes and a one-line help.

    Attributes:
        name: the name users type (lower case; `-` between words).
        kind: one of `KINDS`: what `build` takes first.
        help: one line for `--help` and the docs.
        build: the constructor, `build(first, **arguments)`.
        arguments: the keyword arguments of `build`: default sizes (`transforms`, `hidden`, ...) and options.
        one_pass: the flow samples in one differentiable pass of its exact inverse (coupling layers): what
            reverse-KL training needs (`flowkit boltzmann --flow` offers these).
        bench: run by default by `flowkit bench likelihood` (the presets compared with zuko and nflows).
    """

    name: str
    kind: str
    help: str
    build: Callable[..., Any]
    arguments: dict[str, Any] = field(default_factory=dict)
    one_pass: bool = False
    bench: bool = False

    def __call__(
        self, first: Any, *, context: int = 0, embedding: ConditionEmbedding | None = None, **sizes: Any
    ) -> Any:
        """Build on `first` (see `kind`) with `sizes` for its arguments (None, or one it does not take: ignored).

        Every preset takes `context`, the number of context features of a conditional flow (0, the default:
        unconditional), passed on only when positive; and `embedding`, a
        [`ConditionEmbedding`][flowkit.embeddings.ConditionEmbedding] of the raw condition: the flow is then built
        with `context=embedding.out_features` and returned inside an [`EmbeddedFlow`][flowkit.flows.EmbeddedFlow].

        Raises:
            ValueError: for a number of transforms below 1, bad hidden sizes, a negative `context`, or both
                `context` and an `embedding` whose sizes differ.
        """
        if embedding is not None:
            if not isinstance(embedding, ConditionEmbedding):
                raise ValueError(
                    f"preset {self.name!r}: embedding must be a flowkit.embeddings.ConditionEmbedding, "
                    f"got {type(embedding).__name__}"
                )
            if context and context != embedding.out_features:
                raise ValueError(
                    f"preset {self.name!r}: context={context} differs from the embedding's {embedding.out_features} "
                    "features; give the embedding alone"
                )
            return EmbeddedFlow(self(first, context=embedding.out_features, **sizes), embedding)
        given = {k: v for k, v in sizes.items() if v is not None and k in self.arguments}
        if "hidden" in given:
            given["hidden"] = parse_hidden(given["hidden"])
        if given.get("transforms", 1) < 1:
            raise ValueError(f"transforms must be at least 1, got {given['transforms']}")
        context = check_number(context, "context", where=f"preset {self.name!r}", integer=True, low=0)
        if context:
            given["context"] = context
        return self.build(first, **{**self.arguments, **given})


PRESETS: dict[str, Preset] = {}
"""Presets on vectors (and lattices as vectors), by name: [`build_flow`][flowkit.flows.build_flow] builds them."""

DATA_PRESETS: dict[str, Preset] = {}
"""Presets fitted to training data `x` of shape `(N, D)`, by name: [`build_data_flow`][flowkit.flows.build_data_flow]
builds them (heavy tails: [`TailAdaptive`][flowkit.flows.TailAdaptive], [`COMET`][flowkit.flows.COMET])."""

IMAGE_PRESETS: dict[str, Preset] = {}
"""Multiscale image flows for images in `[0, 1]`, by name: `build_image_flow` builds them."""

PRESET_NAMES: tuple[str, ...]  # served by __getattr__ below
"""The names [`build_flow`][flowkit.flows.build_flow] accepts: the keys of `PRESETS`, in order."""

_TABLES = {"vector": PRESETS, "lattice": PRESETS, "data": DATA_PRESETS, "image": IMAGE_PRESETS}

Built = TypeVar("Built", bound=Callable[..., Any])


def preset(
    name: str, help: str, kind: str = "vector", *, one_pass: bool = False, bench: bool = False, **arguments: Any
) -> Callable[[Built], Built]:
    """Declare the decorated constructor (a flow class or a factory) a preset; returns it unchanged.

    The command line reads declarations from the source, without torch: give every argument as a literal.

    Arguments:
        name: the name users type.
        help: one line.
        kind: one of `KINDS`.
        one_pass: see [`Preset`][flowkit.flows.Preset].
        bench: see [`Preset`][flowkit.flows.Preset].
        **arguments: the constructor's keyword arguments: default sizes and options.

    Example:
        ```python
        @preset("maf", "masked autoregressive flow of affine MADE layers", transforms=5, hidden=(64, 64))
        class MAF(Flow): ...
        ```
    """
    if kind not in KINDS:
        raise ValueError(f"preset {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")

    def declare(build: Built) -> Built:
        table = _TABLES[kind]
        ordered = sorted({**table, name: Preset(name, kind, help, build, arguments, one_pass, bench)}.items())
        table.clear()
        table.update(ordered)  # by name, as the command line lists them
        return build

    return declare


def __getattr__(name: str) -> Any:
    if name == "PRESET_NAMES":  # read when asked: the families declare their presets as their modules run
        return tuple(PRESETS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build(table: dict[str, Preset], what: str, name: str, first: Any, **sizes: Any) -> Any:
    key = name.lower() if isinstance(name, str) else None
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(table)}")
    return table[key](first, **sizes)


def build_flow(
    name: str,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int | None = None,
    context: int = 0,
    embedding: ConditionEmbedding | None = None,
) -> Flow | EmbeddedFlow:
    """Build the preset called `name` (case-insensitive; one of `PRESET_NAMES`) on vectors of `features`.

    Arguments:
        name: a name of `PRESETS`.
        features: data dimension `D`.
        transforms: number of layers (None: the preset's default, in `PRESETS[name].arguments`).
        hidden: conditioner hidden sizes (None: the preset's).
        bins: spline bins (the presets with splines; None: the preset's).
        context: number of context features (0: an unconditional flow).
        embedding: an embedding of raw conditions (a [`ConditionEmbedding`][flowkit.embeddings.ConditionEmbedding]):
            the flow takes its output as context, inside an [`EmbeddedFlow`][flowkit.flows.EmbeddedFlow].

    Returns:
        A flow on vectors `(D,)`, conditional on a context of `context` features when positive.

    Raises:
        ValueError: for an unknown name (the message lists the known ones) or bad sizes.
    """
    sizes = {"transforms": transforms, "hidden": hidden, "bins": bins, "context": context, "embedding": embedding}
    return _build(PRESETS, "flow", name, features, **sizes)


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


def build_data_flow(
    name: str,
    x: Tensor,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int | None = None,
    context: int = 0,
) -> Flow:
    """Build the preset called `name` (one of `DATA_PRESETS`) from training data `x` of shape `(N, D)`.

    `context` is the number of context features (0: an unconditional flow).

    Raises:
        ValueError: for an unknown name, bad sizes or data the tail estimates or marginal fits refuse.
    """
    sizes = {"transforms": transforms, "hidden": hidden, "bins": bins, "context": context}
    return _build(DATA_PRESETS, "data-fitted flow", name, x, **sizes)


def build_image_flow(
    name: str,
    shape: Sequence[int],
    *,
    levels: int | None = None,
    steps: int | None = None,
    hidden: Sequence[int] | None = None,
    context: int = 0,
) -> Flow:
    """Build the image preset called `name` (one of `IMAGE_PRESETS`) for images of `shape` `(C, H, W)`.

    `context` is the number of context features, such as one-hot class labels (0: an unconditional flow).

    Raises:
        ValueError: for an unknown name or bad sizes.
    """
    sizes = {"levels": levels, "steps": steps, "hidden": hidden, "context": context}
    return _build(IMAGE_PRESETS, "image flow", name, tuple(shape), **sizes)
