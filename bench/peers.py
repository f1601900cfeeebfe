"""Peer flows for the benchmarks: zuko, nflows and normflows flows built to match flowkit's presets.

The one home of the peer models: `speed.py` times the NSFs of `nsf`, and
`likelihood.py` trains the models of `build_peer` next to flowkit's. The
benchmark scripts import it as `import peers` (a script's folder comes first
on `sys.path`); flowkit itself never imports zuko, nflows or normflows.

Matched means the same layers, bins, spline bound (linear tails outside),
conditioner widths and parameter counts, permutations (or alternating orders)
between layers, and a standard normal base.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "LIBRARIES",
    "PEERS",
    "PeerFlow",
    "build_peer",
    "interface",
    "maf",
    "normflows_glow",
    "normflows_residual",
    "nsf",
]

#: Libraries with an NSF in `nsf`.
LIBRARIES = ("zuko", "nflows", "normflows")
#: Peer models of the likelihood benchmark: `library-preset`, matched to flowkit's preset of that name.
PEERS = (
    "zuko-nsf",
    "zuko-maf",
    "zuko-realnvp",
    "nflows-nsf",
    "nflows-maf",
    "zuko-nsf-coupling",
    "nflows-nsf-coupling",
    "normflows-residual",
    "zuko-naf",
    "zuko-unaf",
    "zuko-bpf",
    "zuko-sospf",
    "zuko-gf",
)
#: Layers and hidden sizes of the presets at the command line's defaults (`flowkit.flows.registry`).
_DEFAULTS = {
    "nsf": (5, (128, 128)),
    "nsf-coupling": (5, (128, 128)),
    "maf": (5, (64, 64)),
    "realnvp": (8, (128, 128)),
    "residual": (5, (64, 64)),
    "naf": (3, (64, 64)),
    "unaf": (3, (64, 64)),
    "bpf": (3, (64, 64)),
    "sospf": (3, (64, 64)),
    "gf": (3, (64, 64)),  # no network without a context
}


class _IgnoreContext(nn.Module):
    """Adapt a plain MLP to nflows' `net(inputs, context)` calling convention."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self.net(x)


def _made_blocks(library: str, hidden: Sequence[int]) -> tuple[int, int]:
    """Nflows' and normflows' MADEs: one width, an input layer plus `blocks` hidden-to-hidden layers."""
    if len(set(hidden)) != 1:
        raise ValueError(f"{library} MADEs have equal hidden widths; got {tuple(hidden)}")
    return hidden[0], len(hidden) - 1


def nsf(
    library: str,
    features: int,
    *,
    transforms: int,
    bins: int,
    hidden: Sequence[int],
    bound: float = 5.0,
    coupling: bool = False,
) -> nn.Module:
    """The NSF of `library` matched to `flowkit.flows.NSF` with the same arguments.

    Coupling layers have plain MLP conditioners on half the features
    (alternating halves); autoregressive layers have plain MADEs (no residual
    blocks) with reversed orders between layers.
    """
    hidden = tuple(hidden)
    if library == "zuko":
        from functools import partial

        import zuko
        from zuko.flows import MaskedAutoregressiveTransform
        from zuko.flows.coupling import GeneralCouplingTransform
        from zuko.transforms import MonotonicRQSTransform

        univariate = partial(MonotonicRQSTransform, bound=bound)
        shapes = [(bins,), (bins,), (bins - 1,)]
        if coupling:
            layers = [
                GeneralCouplingTransform(
                    features,
                    mask=torch.arange(features) % 2 == i % 2,
                    univariate=univariate,
                    shapes=shapes,
                    hidden_features=hidden,
                )
                for i in range(transforms)
            ]
        else:
            layers = [
                MaskedAutoregressiveTransform(
                    features,
                    order=torch.arange(features) if i % 2 == 0 else torch.arange(features).flip(0),
                    univariate=univariate,
                    shapes=shapes,
                    hidden_features=hidden,
                )
                for i in range(transforms)
            ]
        base = zuko.flows.UnconditionalDistribution(
            zuko.distributions.DiagNormal, torch.zeros(features), torch.ones(features), buffer=True
        )
        return zuko.flows.Flow(layers, base)
    if library == "nflows":
        import torch.nn.functional as F
        from nflows.distributions import StandardNormal
        from nflows.flows import Flow
        from nflows.nn.nets import MLP
        from nflows.transforms import (
            CompositeTransform,
            MaskedPiecewiseRationalQuadraticAutoregressiveTransform,
            PiecewiseRationalQuadraticCouplingTransform,
            RandomPermutation,
            ReversePermutation,
        )
        from nflows.utils import create_alternating_binary_mask

        if not coupling:
            width, blocks = _made_blocks(library, hidden)
        chain: list[nn.Module] = []
        for i in range(transforms):
            if i:
                chain.append(RandomPermutation(features) if coupling else ReversePermutation(features))
            if coupling:
                chain.append(
                    PiecewiseRationalQuadraticCouplingTransform(
                        create_alternating_binary_mask(features, even=i % 2 == 0),
                        lambda a, b: _IgnoreContext(MLP((a,), (b,), hidden, activation=F.relu)),
                        num_bins=bins,
                        tails="linear",
                        tail_bound=bound,
                    )
                )
            else:
                chain.append(
                    MaskedPiecewiseRationalQuadraticAutoregressiveTransform(
                        features,
                        width,
                        num_bins=bins,
                        tails="linear",
                        tail_bound=bound,
                        num_blocks=blocks,
                        use_residual_blocks=False,
                    )
                )
        return Flow(CompositeTransform(chain), StandardNormal([features]))
    if library == "normflows":
        import normflows as nf
        from normflows.flows.neural_spline.autoregressive import MaskedPiecewiseRationalQuadraticAutoregressive
        from normflows.flows.neural_spline.coupling import PiecewiseRationalQuadraticCoupling
        from normflows.utils.masks import create_alternating_binary_mask

        if not coupling:
            width, blocks = _made_blocks(library, hidden)
        flows = []
        for i in range(transforms):
            if coupling:
                layer = nf.flows.CoupledRationalQuadraticSpline(features, 1, hidden[0], num_bins=bins, tail_bound=bound)
                # Matched conditioner: a plain MLP instead of the default residual net.
                layer.prqct = PiecewiseRationalQuadraticCoupling(
                    mask=create_alternating_binary_mask(features, even=i % 2 == 0),
                    transform_net_create_fn=lambda a, b: _IgnoreContext(nf.nets.MLP([a, *hidden, b])),
                    num_bins=bins,
                    tails="linear",
                    tail_bound=bound,
                )
            else:
                layer = nf.flows.AutoregressiveRationalQuadraticSpline(
                    features, 1, width, num_bins=bins, tail_bound=bound
                )
                # Matched conditioner: a plain MADE instead of residual blocks.
                layer.mprqat = MaskedPiecewiseRationalQuadraticAutoregressive(
                    features=features,
                    hidden_features=width,
                    num_bins=bins,
                    tails="linear",
                    tail_bound=bound,
                    num_blocks=blocks,
                    use_residual_blocks=False,
                )
            flows.append(layer)
            if i < transforms - 1:
                flows.append(nf.flows.Permute(features, mode="shuffle" if coupling else "swap"))
        return nf.NormalizingFlow(nf.distributions.DiagGaussian(features, trainable=False), flows)
    raise ValueError(f"unknown library {library!r}; choose one of {', '.join(LIBRARIES)}")


def maf(library: str, features: int, *, transforms: int, hidden: Sequence[int]) -> nn.Module:
    """The affine MAF of zuko or nflows matched to `flowkit.flows.MAF` (reversed orders between layers)."""
    hidden = tuple(hidden)
    if library == "zuko":
        import zuko

        return zuko.flows.MAF(features, transforms=transforms, hidden_features=hidden)
    if library == "nflows":
        from nflows.distributions import StandardNormal
        from nflows.flows import Flow
        from nflows.transforms import CompositeTransform, MaskedAffineAutoregressiveTransform, ReversePermutation

        width, blocks = _made_blocks(library, hidden)
        chain: list[nn.Module] = []
        for i in range(transforms):
            if i:
                chain.append(ReversePermutation(features))
            chain.append(
                MaskedAffineAutoregressiveTransform(features, width, num_blocks=blocks, use_residual_blocks=False)
            )
        return Flow(CompositeTransform(chain), StandardNormal([features]))
    raise ValueError(f"no MAF peer from {library!r}; choose zuko or nflows")


def interface(library: str, model: nn.Module) -> tuple[Callable[[Tensor], Tensor], Callable[[int], Tensor]]:
    """The `log_prob(x)` and `sample(n)` calls of a peer `model` from `library`, with nothing added."""
    if library == "zuko":
        return (lambda x: model().log_prob(x)), (lambda n: model().sample((n,)))
    if library == "nflows":
        return model.log_prob, model.sample
    if library == "normflows":
        return model.log_prob, (lambda n: model.sample(n)[0])
    raise ValueError(f"unknown library {library!r}; choose one of {', '.join(LIBRARIES)}")


class PeerFlow(nn.Module):
    """A peer flow behind flowkit's `log_prob(x)` / `sample(shape)` interface, with an optional fixed standardisation.

    With `loc` and `scale` the model sees `(x - loc) / scale` and the
    log-density gains `-sum(log(scale))`, as flowkit's `Standardization` does.
    """

    def __init__(self, library: str, model: nn.Module, loc: Tensor | None = None, scale: Tensor | None = None) -> None:
        super().__init__()
        self.library = library
        self.model = model
        d = None if loc is None else loc.shape[-1]
        self.register_buffer("loc", torch.zeros(d or 1) if loc is None else loc.detach().clone().float())
        self.register_buffer("scale", torch.ones(d or 1) if scale is None else scale.detach().clone().float())

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        log_prob, _ = interface(self.library, self.model)
        return log_prob((x - self.loc) / self.scale) - self.scale.log().sum()

    def path_log_likelihood(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """What `flowkit.train.MaximumLikelihood` maximises: for a normalizing flow, `log_prob`."""
        return self.log_prob(x, context)

    def forward(self, x: Tensor) -> Tensor:
        return self.log_prob(x)

    @torch.no_grad()
    def sample(self, shape: Sequence[int] | int) -> Tensor:
        n = shape if isinstance(shape, int) else int(torch.Size(shape).numel())
        _, sample = interface(self.library, self.model)
        return sample(n) * self.scale + self.loc


def build_peer(
    name: str,
    features: int,
    *,
    transforms: int | None = None,
    hidden: Sequence[int] | None = None,
    bins: int = 8,
    standardize_with: Tensor | None = None,
) -> PeerFlow:
    """The peer `name` (one of `PEERS`) matched to flowkit's preset of the same name at the same sizes.

    `zuko-nsf`/`nflows-nsf` are autoregressive NSFs with linear tails outside
    `[-5, 5]`, `zuko-nsf-coupling`/`nflows-nsf-coupling` their coupling NSFs;
    `zuko-maf`/`nflows-maf` affine MAFs; `zuko-realnvp` an affine
    coupling flow; `zuko-naf`/`zuko-unaf` zuko's NAF and UNAF (MADEs of the same hidden sizes, zuko's
    monotonic and integrand networks at its defaults); `zuko-bpf`/`zuko-sospf`/`zuko-gf` zuko's polynomial and
    Gaussianization flows at its defaults. `None` sizes take the preset's defaults. Standardisation
    (when `standardize_with` is given) is the same fixed map as flowkit's,
    with its log-determinant.
    """
    key = name.lower()
    if key not in PEERS:
        raise ValueError(f"unknown peer flow {name!r}; choose one of {', '.join(PEERS)}")
    library, kind = key.split("-", 1)
    transforms = transforms or _DEFAULTS[kind][0]
    hidden = tuple(hidden or _DEFAULTS[kind][1])
    if kind in ("nsf", "nsf-coupling"):
        coupling = kind == "nsf-coupling"
        model = nsf(library, features, transforms=transforms, bins=bins, hidden=hidden, coupling=coupling)
    elif kind == "maf":
        model = maf(library, features, transforms=transforms, hidden=hidden)
    elif kind == "residual":
        model = normflows_residual(features, transforms=transforms, hidden=hidden)
    elif kind in ("naf", "unaf"):  # zuko's defaults: signal 16, monotonic / integrand networks (64, 64)
        import zuko

        model = getattr(zuko.flows, kind.upper())(features, transforms=transforms, hidden_features=hidden)
    elif kind in ("bpf", "sospf"):  # zuko's defaults: degree 16; degree 4 with 3 polynomials (as flowkit's presets)
        import zuko

        model = getattr(zuko.flows, kind.upper())(features, transforms=transforms, hidden_features=hidden)
    elif kind == "gf":  # zuko's defaults: 8 components per feature, random rotations in between
        import zuko

        model = zuko.flows.GF(features, transforms=transforms)
    else:
        import zuko

        model = zuko.flows.RealNVP(features, transforms=transforms, hidden_features=hidden)
    loc = scale = None
    if standardize_with is not None:
        x = standardize_with.double()
        loc, scale = x.mean(0), x.std(0).clamp_min(1e-6)
    return PeerFlow(library, model, loc, scale)


def normflows_residual(
    features: int, *, transforms: int, hidden: Sequence[int], coefficient: float = 0.97
) -> nn.Module:
    """The residual flow of normflows, matched to `flowkit.flows.ResidualFlow(features, transforms, hidden)`.

    `transforms` pairs of a residual block (`normflows.flows.Residual`, its defaults: the
    Russian-roulette log-det with a geometric number of terms, two exact terms, the
    memory-efficient Neumann gradient) on a `normflows.nets.LipschitzMLP` with the same widths
    and Lipschitz constant, and an ActNorm; a standard normal base. normflows' blocks put a
    LipSwish before every linear layer (flowkit's between them) and use the exact log-det in
    eval mode only in 2-D (elsewhere the roulette with 20 exact terms).
    """
    import normflows as nf

    layers: list[nn.Module] = []
    for _ in range(transforms):
        net = nf.nets.LipschitzMLP([features, *hidden, features], lipschitz_const=coefficient, init_zeros=True)
        layers += [nf.flows.Residual(net, reduce_memory=True), nf.flows.ActNorm(features)]
    model = nf.NormalizingFlow(q0=nf.distributions.DiagGaussian(features, trainable=False), flows=layers)
    return model.float()  # normflows makes the roulette's parameters float64 (from NumPy scalars)


def normflows_glow(
    shape: tuple[int, int, int], *, levels: int, steps: int, hidden: int, alpha: float = 0.0
) -> nn.Module:
    """The Glow of normflows, matched to `flowkit.flows.Glow(shape, levels, steps, (hidden, hidden), alpha=alpha)`.

    The same multiscale layout (a level squeezes when its grid is even, factors out
    the last half of the channels except at the last level), steps of ActNorm, an LU
    1x1 convolution and an affine channel coupling whose conditioner is three 3x3
    convolutions (the identity half to `hidden`, `hidden`, then shift and log-scale of the
    other half; normflows' GlowBlock hard-codes a 1x1 middle kernel, so the block is
    assembled from its parts), `exp` scales, a logit preprocessing and standard normal
    latents. Returns normflows' `MultiscaleFlow`; `model.log_prob(x, None)`.
    """
    import normflows as nf

    def block(c: int) -> list[nn.Module]:
        # normflows conditions on the first (c + 1) // 2 channels and transforms the others;
        # flowkit alternates halves, which is the same cost per step.
        net = nf.nets.ConvNet2d(((c + 1) // 2, hidden, hidden, 2 * (c // 2)), (3, 3, 3), 0.0, True)
        coupling = nf.flows.AffineCouplingBlock(net, True, "exp", "channel")
        return [coupling, nf.flows.Invertible1x1Conv(c, True), nf.flows.ActNorm((c, 1, 1))]

    c, h, w = shape
    shapes, squeezes = [], []
    for level in range(levels):
        squeeze = h % 2 == 0 and w % 2 == 0
        if squeeze:
            c, h, w = 4 * c, h // 2, w // 2
        shapes.append((c, h, w))
        squeezes.append(squeeze)
        if level < levels - 1:
            c = c // 2
    flows, q0 = [], []
    for level in reversed(range(levels)):  # normflows lists the levels latent side first
        c, h, w = shapes[level]
        layers = [layer for _ in range(steps) for layer in block(c)]
        flows.append(layers + ([nf.flows.Squeeze()] if squeezes[level] else []))
        # the deepest level's latent is all of it; the others score the channels they factor out
        scored = c if level == levels - 1 else c - c // 2
        q0.append(nf.distributions.DiagGaussian((scored, h, w), trainable=False))
    merges = [nf.flows.Merge() for _ in range(levels - 1)]
    return nf.MultiscaleFlow(q0, flows, merges, transform=nf.transforms.Logit(alpha=alpha), class_cond=False)
