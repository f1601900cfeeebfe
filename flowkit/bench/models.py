"""Flow presets by name for the command line and the benchmarks, and peer flows (zuko, nflows) of matched size."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..data.standardize import standardize
from ..flows import MAF, NSF, Flow, RealNVP

__all__ = ["FLOWS", "PEERS", "build_flow", "build_peer", "count_parameters", "parse_hidden"]

#: flowkit presets the command line knows.
FLOWS = ("nsf", "realnvp", "maf")
#: Peer implementations: ``library-flow``.
PEERS = ("zuko-nsf", "zuko-maf", "zuko-realnvp", "nflows-nsf", "nflows-maf")


def parse_hidden(text: str | Sequence[int]) -> tuple[int, ...]:
    """Hidden sizes from ``"128,128"`` (or a sequence); raises :class:`ValueError` on anything else."""
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


def build_flow(
    name: str,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int = 8,
    coupling: bool = False,
    standardize_with: Tensor | None = None,
) -> Flow:
    """Build a flowkit preset by name: ``nsf`` (autoregressive, or coupling with ``coupling=True``), ``realnvp``, ``maf``.

    Arguments:
        name: the preset.
        features: data dimension ``D``.
        transforms: number of layers (default 5 for NSF and MAF, 8 for RealNVP).
        hidden: conditioner hidden sizes (default (128, 128) for NSF and RealNVP, (64, 64) for MAF).
        bins: spline bins (NSF only).
        coupling: coupling layers instead of autoregressive ones (NSF only; RealNVP is always coupling).
        standardize_with: training data; when given, a
            :class:`~flowkit.bijectors.Standardization` fitted to it is put first
            (see :func:`flowkit.data.standardize`).
    """
    key = name.lower()
    if key not in FLOWS:
        raise ValueError(f"unknown flow {name!r}; choose one of {', '.join(FLOWS)}")
    if coupling and key != "nsf":
        raise ValueError(f"--coupling applies to nsf only ({key} is {'always' if key == 'realnvp' else 'never'} coupling)")
    if transforms is not None and transforms < 1:
        raise ValueError(f"transforms must be at least 1, got {transforms}")
    if key == "nsf":
        flow: Flow = NSF(features, transforms or 5, bins, tuple(hidden or (128, 128)), coupling=coupling)
    elif key == "realnvp":
        if features < 2:
            raise ValueError("realnvp needs at least 2 features")
        flow = RealNVP(features, transforms or 8, tuple(hidden or (128, 128)))
    else:
        flow = MAF(features, transforms or 5, tuple(hidden or (64, 64)))
    return flow if standardize_with is None else standardize(flow, standardize_with)


class PeerFlow(nn.Module):
    """A zuko or nflows flow behind flowkit's ``log_prob(x)`` / ``sample(shape)`` interface (for benchmarks)."""

    def __init__(self, library: str, model: nn.Module, loc: Tensor | None = None, scale: Tensor | None = None) -> None:
        super().__init__()
        self.library = library
        self.model = model
        d = None if loc is None else loc.shape[-1]
        self.register_buffer("loc", torch.zeros(d or 1) if loc is None else loc.detach().clone().float())
        self.register_buffer("scale", torch.ones(d or 1) if scale is None else scale.detach().clone().float())

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        z = (x - self.loc) / self.scale
        if self.library == "zuko":
            lp = self.model().log_prob(z)
        else:
            lp = self.model.log_prob(z)
        return lp - self.scale.log().sum()

    def forward(self, x: Tensor) -> Tensor:
        return self.log_prob(x)

    @torch.no_grad()
    def sample(self, shape: Sequence[int] | int) -> Tensor:
        n = shape if isinstance(shape, int) else int(torch.Size(shape).numel())
        z = self.model().sample((n,)) if self.library == "zuko" else self.model.sample(n)
        return z * self.scale + self.loc


def build_peer(
    name: str,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int = 8,
    standardize_with: Tensor | None = None,
) -> PeerFlow:
    """A zuko or nflows flow matched to :func:`build_flow`'s preset of the same name (same layers, widths, bins, bound 5).

    ``zuko-nsf``/``nflows-nsf`` are autoregressive NSFs with linear tails on
    ``[-5, 5]``; ``zuko-maf``/``nflows-maf`` affine MAFs; ``zuko-realnvp``
    an affine coupling flow. Standardisation (when ``standardize_with`` is
    given) is the same fixed map as flowkit's, with its log-determinant.
    """
    key = name.lower()
    if key not in PEERS:
        raise ValueError(f"unknown peer flow {name!r}; choose one of {', '.join(PEERS)}")
    library, kind = key.split("-")
    defaults = {"nsf": (5, (128, 128)), "maf": (5, (64, 64)), "realnvp": (8, (128, 128))}[kind]
    transforms = transforms or defaults[0]
    hidden = tuple(hidden or defaults[1])
    loc = scale = None
    if standardize_with is not None:
        x = standardize_with.double()
        loc, scale = x.mean(0), x.std(0).clamp_min(1e-6)
    if library == "zuko":
        import zuko

        if kind == "nsf":
            model = zuko.flows.NSF(features, bins=bins, transforms=transforms, hidden_features=hidden)
        elif kind == "maf":
            model = zuko.flows.MAF(features, transforms=transforms, hidden_features=hidden)
        else:
            model = zuko.flows.RealNVP(features, transforms=transforms, hidden_features=hidden)
    else:
        model = _nflows(kind, features, transforms, hidden, bins)
    return PeerFlow(library, model, loc, scale)


def _nflows(kind: str, features: int, transforms: int, hidden: tuple[int, ...], bins: int) -> nn.Module:
    from nflows.distributions import StandardNormal as NflowsNormal
    from nflows.flows import Flow as NflowsFlow
    from nflows.transforms import CompositeTransform, ReversePermutation
    from nflows.transforms.autoregressive import (
        MaskedAffineAutoregressiveTransform,
        MaskedPiecewiseRationalQuadraticAutoregressiveTransform,
    )

    if len(set(hidden)) != 1:
        raise ValueError(f"nflows MADEs have equal hidden widths; got {hidden}")
    width, blocks = hidden[0], len(hidden) - 1  # nflows: input layer + `blocks` hidden-to-hidden layers
    layers: list[nn.Module] = []
    for i in range(transforms):
        if i:
            layers.append(ReversePermutation(features))
        if kind == "nsf":
            layers.append(
                MaskedPiecewiseRationalQuadraticAutoregressiveTransform(
                    features, width, num_bins=bins, tails="linear", tail_bound=5.0, num_blocks=blocks,
                    use_residual_blocks=False,
                )
            )
        elif kind == "maf":
            layers.append(
                MaskedAffineAutoregressiveTransform(features, width, num_blocks=blocks, use_residual_blocks=False)
            )
        else:
            raise ValueError("nflows peers: nsf and maf only")
    return NflowsFlow(CompositeTransform(layers), NflowsNormal([features]))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
