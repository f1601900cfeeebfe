"""The test cases: builders for the bijectors, stochastic blocks, transformers and base distributions, FlowJAX-style.

Each entry maps a case name to a function that builds the object (and, for
bijectors, an input batch), so importing this table is cheap and every test
builds its cases afresh under the suite's seed (see ``conftest.py``).

A new public bijector, stochastic block, transformer, base distribution or
flow preset (an ``@preset`` declaration) needs one entry here: the completeness
tests (``tests/bijectors/test_sweep.py``, ``tests/flows/test_stochastic.py``,
``tests/transformers/test_base.py``, ``tests/distributions/test_sweep.py``) fail for a
concrete public class that no case builds, and ``tests/test_architecture.py``
for a declared preset without a case.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
from collections.abc import Callable

import torch
from torch import Tensor

import flowkit
from flowkit.applications.mcmc_proposals import FunnelTransport
from flowkit.bijectors import (
    ActNorm,
    AffineCoupling,
    Bijector,
    BlockNeuralAutoregressive,
    BoundedSupport,
    Chain,
    CircularSplineCoupling,
    ContinuousFlow,
    ConvexDoubleMoebius,
    ConvexMoebius,
    Coupling,
    DoubleMoebius,
    ElementwiseTransformer,
    Householder,
    InternalCoordinates,
    Invert,
    Linear,
    Logit,
    LULinear,
    MarginalTailCDF,
    MaskedAffineAutoregressive,
    MaskedAutoregressive,
    MaskedCoupling,
    MaskedSplineAutoregressive,
    Moebius,
    Permutation,
    Planar,
    Radial,
    RegressionWhitening,
    Reshape,
    Residual,
    Reverse,
    RigidCoupling,
    SmoothLeakyReLU,
    SmoothTanh,
    SplineCoupling,
    Standardization,
    Sylvester,
    TailLU,
)
from flowkit.bijectors.image import Conv1x1, EIWShuffle, FactorOut, Squeeze
from flowkit.bijectors.transformer_autoregressive import TransformerAutoregressive
from flowkit.distributions import (
    DependentNormal,
    DiagNormal,
    Distribution,
    RigidBase,
    SphereUniform,
    StandardNormal,
    StudentT,
    TailAdaptiveBase,
)
from flowkit.domains import Circle
from flowkit.flows import FlowModel, LangevinBlock, MetropolisBlock
from flowkit.flows.images import EIW
from flowkit.flows.registry import build_data_flow, build_flow, build_image_flow
from flowkit.lattice import Z2Equivariant
from flowkit.nn import MLP, ConvNet, KernelMachine, MaskedKernelMachine, SharedConditioner, SharedTrunk, VectorField
from flowkit.testing import randomize
from flowkit.transformers import (
    Affine,
    Bernstein,
    CircularSpline,
    Gaussianization,
    MonotonicMLP,
    RationalQuadraticSpline,
    SmoothMixture,
    SumOfSquares,
    Transformer,
    UnconstrainedMonotonic,
)

Case = Callable[[], tuple[Bijector, Tensor]]


def _initialised(layer: ActNorm, data: Tensor) -> ActNorm:
    layer(data)  # data-dependent initialisation
    return layer


def _contractive(layer: Residual) -> Residual:
    """A residual block with weights large enough that every layer is at its spectral-norm bound."""
    return randomize(layer, scale=1.0)


def _standardization() -> tuple[Bijector, Tensor]:
    gen = torch.Generator().manual_seed(0)
    b = Standardization.from_data(torch.randn(50, 3, generator=gen) * torch.tensor([0.1, 2.0, 30.0]) + 4)
    return b, torch.randn(5, 3, generator=gen) * 3


def _regression_whitening() -> tuple[Bijector, Tensor]:
    gen = torch.Generator().manual_seed(0)
    context = torch.randn(60, 2, generator=gen)
    theta = context @ torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.2, -1.0]]) + 0.3 * torch.randn(60, 3, generator=gen)
    return RegressionWhitening.from_data(theta, context), torch.randn(5, 3, generator=gen) * 3


def _internal_coordinates() -> tuple[Bijector, Tensor]:
    from flowkit.targets.alanine import alanine_dipeptide_positions, alanine_internal_coordinates

    b = alanine_internal_coordinates(alanine_dipeptide_positions())
    assert isinstance(b, InternalCoordinates)
    return b, b.domain.sample((4, 66), dtype=torch.get_default_dtype())


def _marginal_tail_cdf(output: str) -> tuple[Bijector, Tensor]:
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(2000, 3, generator=gen) / torch.rand(2000, 3, generator=gen).sqrt()  # t-like tails
    layer = MarginalTailCDF(3, knots=64, anchors=300, output=output).fit(data)
    return layer, torch.randn(6, 3, generator=gen) * 4


def _shared_couplings() -> tuple[Bijector, Tensor]:
    """Three spline couplings of 5 features on one conditioner trunk (NanoFlow), identity parts of 2 and 3 features."""
    trunk = SharedTrunk(3, (16,), context=2, embedding=4)
    layers = [
        Coupling(
            RationalQuadraticSpline(4, 3.0), 5, parity=k % 2, context=2, conditioner=SharedConditioner(trunk, n, o)
        )
        for k, (n, o) in enumerate([(2, 33), (3, 22), (2, 33)])
    ]
    return randomize(Chain(*layers), scale=0.2), torch.randn(6, 5)


def _shared_autoregressive() -> tuple[Bijector, Tensor]:
    """Two affine autoregressive layers on one masked trunk (NanoFlow), with a context and a reversal between."""
    trunk = SharedTrunk(3, (12, 12), context=2, embedding=4, autoregressive=True, order=[1, 2, 0])
    first, second = (
        MaskedAutoregressive(Affine(), 3, context=2, conditioner=SharedConditioner(trunk, 3, 6)) for _ in "ab"
    )
    return randomize(Chain(first, Reverse(3), second)), torch.randn(6, 3)


def _shared_convolutional() -> tuple[Bijector, Tensor]:
    """Three channel couplings of `(3, 4, 4)` grids on one convolutional trunk, with a context, circular padding."""
    trunk = SharedTrunk(2, (6,), context=2, embedding=3, kernel=3, padding_mode="circular")
    layers = [
        MaskedCoupling(Affine(), (3, 4, 4), "channel", k % 2, context=2, conditioner=SharedConditioner(trunk, n, o))
        for k, (n, o) in enumerate([(2, 2), (1, 4), (2, 2)])
    ]
    return randomize(Chain(*layers), scale=0.1), torch.randn(5, 3, 4, 4)


def _angles() -> Tensor:
    return Circle().sample((6, 4), dtype=torch.get_default_dtype())


def _quaternions(n: int) -> Tensor:
    return torch.nn.functional.normalize(torch.randn(n, 4), dim=-1)


#: Two rigid bodies in a periodic box and an auxiliary coordinate.
_RIGID = ["quaternion", "angle", "angle", "angle", "quaternion", "angle", "angle", "angle", "real"]


#: Invertible bijectors: name -> ``() -> (bijector, x)``; checked by ``check_bijector`` in float64.
BIJECTORS: dict[str, Case] = {
    # base
    "Chain": lambda: (Chain(LULinear(3), randomize(AffineCoupling(3, hidden=(8,)))), torch.randn(5, 3)),
    "Invert": lambda: (Invert(randomize(AffineCoupling(4, hidden=(8,)))), torch.randn(5, 4)),
    "Reshape": lambda: (Reshape((2, 3), (6,)), torch.randn(5, 2, 3)),
    "Chain(Reshape, coupling, Reshape)": lambda: (
        Chain(Reshape((2, 2), (4,)), randomize(AffineCoupling(4, hidden=(8,))), Reshape((4,), (2, 2))),
        torch.randn(5, 2, 2),
    ),
    # permutations
    "Permutation": lambda: (Permutation(5, seed=1), torch.randn(5, 5)),
    "Reverse": lambda: (Reverse(4), torch.randn(5, 4)),
    # linear
    "Linear": lambda: (randomize(Linear(4)), torch.randn(5, 4)),
    "LULinear": lambda: (randomize(LULinear(4)), torch.randn(5, 4)),
    # normalization
    "ActNorm": lambda: (_initialised(ActNorm(3), torch.randn(64, 3) * 2 + 1), torch.randn(5, 3)),
    "ActNorm(image)": lambda: (
        _initialised(ActNorm((2, 3, 3)), torch.randn(16, 2, 3, 3) * 3 - 1),
        torch.randn(5, 2, 3, 3),
    ),
    # coupling
    "AffineCoupling": lambda: (randomize(AffineCoupling(5, hidden=(16,))), torch.randn(6, 5)),
    "ContinuousFlow(context)": lambda: (
        ContinuousFlow(VectorField(2, hidden=(8,), activation="tanh", context=2), 2, atol=1e-8, rtol=1e-8),
        torch.randn(4, 2),
    ),
    "AffineCoupling(context)": lambda: (
        randomize(AffineCoupling(4, parity=1, hidden=(16,), context=2)),
        torch.randn(6, 4),
    ),
    "Chain(Coupling, shared conditioner)": _shared_couplings,
    "Chain(MaskedAutoregressive, shared conditioner, context)": _shared_autoregressive,
    "Chain(MaskedCoupling, shared convolutional conditioner, context)": _shared_convolutional,
    "Coupling(Affine, mask)": lambda: (
        randomize(Coupling(Affine(), 4, mask=[1, 1, 0, 1], hidden=(8, 8))),
        torch.randn(6, 4),
    ),
    "Coupling(Affine, halves)": lambda: (
        randomize(Coupling(Affine(), 5, mask=[1, 1, 0, 0, 0], hidden=(8,))),
        torch.randn(6, 5),
    ),
    "MaskedCoupling(image, checkerboard)": lambda: (
        randomize(MaskedCoupling(Affine(), (2, 4, 4), hidden=(4,))),
        torch.randn(5, 2, 4, 4),
    ),
    "MaskedCoupling(image, channel, context)": lambda: (
        randomize(MaskedCoupling(Affine(), (2, 3, 3), mask="channel", parity=1, hidden=(4,), context=2)),
        torch.randn(5, 2, 3, 3),
    ),
    "MaskedCoupling(lattice, spline, circular)": lambda: (
        randomize(
            MaskedCoupling(RationalQuadraticSpline(4, 3.0), (4, 4), hidden=(4,), padding_mode="circular"), scale=0.2
        ),
        1.5 * torch.randn(5, 4, 4),
    ),
    "MaskedCoupling(lattice, Z2Equivariant spline)": lambda: (
        randomize(
            MaskedCoupling(
                RationalQuadraticSpline(4, 3.0),
                (4, 4),
                conditioner=Z2Equivariant(
                    ConvNet(1, 11, (4,), padding_mode="circular"), RationalQuadraticSpline(4, 3.0)
                ),
            ),
            scale=0.2,
        ),
        1.5 * torch.randn(5, 4, 4),
    ),
    # spline coupling
    "SplineCoupling": lambda: (
        randomize(SplineCoupling(5, bins=6, bound=2.0, hidden=(16,)), scale=0.2),
        1.5 * torch.randn(6, 5),
    ),
    "SplineCoupling(context)": lambda: (
        randomize(SplineCoupling(4, bins=4, bound=2.0, parity=1, hidden=(16, 16), context=3), scale=0.2),
        1.5 * torch.randn(6, 4),
    ),
    "CircularSplineCoupling": lambda: (
        randomize(CircularSplineCoupling(3, bins=5, hidden=(16,)), scale=0.2),
        _angles()[:, :3],
    ),
    "CircularSplineCoupling(context)": lambda: (
        randomize(CircularSplineCoupling(4, bins=4, parity=1, hidden=(16,), context=2), scale=0.2),
        _angles(),
    ),
    # autoregressive
    "MaskedAffineAutoregressive": lambda: (
        randomize(MaskedAffineAutoregressive(4, hidden=(16, 16))),
        torch.randn(6, 4),
    ),
    "MaskedAffineAutoregressive(context, order)": lambda: (
        randomize(MaskedAffineAutoregressive(3, hidden=(12,), context=2, order=[2, 0, 1])),
        torch.randn(6, 3),
    ),
    "MaskedSplineAutoregressive": lambda: (
        randomize(MaskedSplineAutoregressive(4, bins=5, bound=2.0, hidden=(16, 16)), scale=0.2),
        1.5 * torch.randn(6, 4),
    ),
    "MaskedSplineAutoregressive(context, residual)": lambda: (
        randomize(
            MaskedSplineAutoregressive(3, bins=4, bound=2.0, hidden=(12, 12), context=2, residual=True), scale=0.2
        ),
        1.5 * torch.randn(6, 3),
    ),
    "MaskedAutoregressive(1 feature, context)": lambda: (
        randomize(MaskedAutoregressive(RationalQuadraticSpline(4, 2.0), 1, hidden=(8,), context=2), scale=0.2),
        1.5 * torch.randn(6, 1),
    ),
    # kernel-machine conditioners (Ferumal flows)
    "Coupling(Affine, KernelMachine, context)": lambda: (
        randomize(Coupling(Affine(), 4, parity=1, context=2, conditioner=KernelMachine(2, 4, inducing=6, context=2))),
        torch.randn(6, 4),
    ),
    "Coupling(spline, KernelMachine matern32, shared lengthscale)": lambda: (
        randomize(
            Coupling(
                RationalQuadraticSpline(4, 2.0),
                5,
                conditioner=KernelMachine(2, 3 * 11, inducing=5, kernel="matern32", ard=False),
            ),
            scale=0.2,
        ),
        1.5 * torch.randn(6, 5),
    ),
    "MaskedAutoregressive(Affine, MaskedKernelMachine matern52, context, order)": lambda: (
        randomize(
            MaskedAutoregressive(
                Affine(),
                4,
                context=2,
                conditioner=MaskedKernelMachine(4, 2, 6, "matern52", context=2, order=[2, 0, 3, 1]),
            )
        ),
        torch.randn(6, 4),
    ),
    "MaskedAutoregressive(spline, MaskedKernelMachine)": lambda: (
        randomize(
            MaskedAutoregressive(RationalQuadraticSpline(4, 2.0), 3, conditioner=MaskedKernelMachine(3, 11, 5)),
            scale=0.2,
        ),
        1.5 * torch.randn(6, 3),
    ),
    # activations
    "SmoothLeakyReLU": lambda: (SmoothLeakyReLU(4, alpha=0.3), torch.randn(5, 4) * 3),
    "SmoothLeakyReLU(image)": lambda: (SmoothLeakyReLU((2, 2, 2), alpha=0.1), torch.randn(5, 2, 2, 2) * 3),
    "SmoothTanh": lambda: (SmoothTanh(3, scale=2.0, leak=0.2), torch.randn(5, 3) * 2),
    "Logit": lambda: (Logit(3, alpha=0.05), torch.rand(5, 3) * 0.96 + 0.02),
    # bounded supports: a box side, a half-line each way, the real line
    "BoundedSupport": lambda: (
        BoundedSupport([-1.0, 0.5, None, None], [2.0, None, -3.0, None]),
        torch.stack([3 * torch.rand(6) - 1, 0.5 + 3 * torch.rand(6), -3 - 3 * torch.rand(6), torch.randn(6)], -1),
    ),
    # standardization
    "Standardization": _standardization,
    "RegressionWhitening(context)": _regression_whitening,
    # heavy tails
    "TailLU": lambda: (randomize(TailLU(5, light=2)), torch.randn(5, 5)),
    "TailLU(all heavy, no bias)": lambda: (randomize(TailLU(3, light=0, bias=False)), torch.randn(5, 3)),
    "MarginalTailCDF": lambda: _marginal_tail_cdf("normal"),
    "MarginalTailCDF(logit)": lambda: _marginal_tail_cdf("logit"),
    # images (multiscale flows)
    "Squeeze": lambda: (Squeeze((2, 4, 6)), torch.randn(5, 2, 4, 6)),
    "Conv1x1": lambda: (randomize(Conv1x1((3, 3, 3))), torch.randn(5, 3, 3, 3)),
    "FactorOut(squeeze, 1x1 conv, channel coupling)": lambda: (
        FactorOut(
            Chain(
                Squeeze((2, 4, 4)),
                randomize(Conv1x1((8, 2, 2)), scale=0.05),
                randomize(MaskedCoupling(Affine(), (8, 2, 2), mask="channel", parity=1, hidden=(4,)), scale=0.1),
                Invert(Squeeze((2, 4, 4))),
            ),
            4,
        ),
        torch.randn(5, 4, 4, 4),
    ),
    "EIWShuffle": lambda: (randomize(EIWShuffle((4, 2, 3))), torch.randn(5, 4, 2, 3)),
    "Chain(EIW, 2 levels)": lambda: (
        _initialised(
            randomize(EIW((1, 4, 4), levels=2, steps=1, hidden=(4,), alpha=None).bijector, scale=0.1),
            torch.randn(64, 1, 4, 4),
        ),
        torch.randn(5, 1, 4, 4),
    ),
    # transformer autoregressive flows (TarFlow): random output weights, not the identity of a fresh block
    "TransformerAutoregressive": lambda: (
        randomize(TransformerAutoregressive((2, 4, 4), patch=2, width=8, layers=2, heads=2), scale=0.2),
        torch.randn(5, 2, 4, 4),
    ),
    "TransformerAutoregressive(reverse, classes)": lambda: (
        randomize(TransformerAutoregressive((1, 4, 6), patch=2, width=8, layers=1, heads=2, reverse=True, classes=3)),
        torch.randn(5, 1, 4, 6),
    ),
    # sphere (rigid bodies): inputs on S^3 and the torus, ladj against the tangent-space Jacobian
    "Moebius": lambda: (randomize(Moebius(4), scale=1.0), _quaternions(6)),
    "Moebius(circle, 2 heads)": lambda: (
        randomize(Moebius(2, heads=2), scale=1.0),
        torch.nn.functional.normalize(torch.randn(6, 2), dim=-1),
    ),
    "DoubleMoebius(3 heads)": lambda: (randomize(DoubleMoebius(4, heads=3), scale=1.0), _quaternions(6)),
    "DoubleMoebius(context)": lambda: (
        randomize(DoubleMoebius(4, heads=2, context=3, hidden=(8,)), scale=1.0),
        _quaternions(6),
    ),
    "ConvexDoubleMoebius(3 components, 2 heads)": lambda: (
        randomize(ConvexDoubleMoebius(4, components=3, heads=2), scale=1.0),
        _quaternions(6),
    ),
    "ConvexDoubleMoebius(context)": lambda: (
        randomize(ConvexDoubleMoebius(4, components=2, context=3, hidden=(8,)), scale=1.0),
        _quaternions(6),
    ),
    "ConvexMoebius(torus, 3 components, 2 heads)": lambda: (
        randomize(ConvexMoebius(3, components=3, heads=2), scale=1.0),
        Circle().sample((6, 3)),
    ),
    "ConvexMoebius(context)": lambda: (
        randomize(ConvexMoebius(2, components=2, context=2, hidden=(8,)), scale=0.5),
        Circle().sample((6, 2)),
    ),
    "RigidCoupling(convex, quaternions and angles)": lambda: (
        randomize(RigidCoupling(_RIGID, [0, 1, 2, 3], heads=2, hidden=(16,), components=3), scale=0.3),
        RigidBase(_RIGID).sample((6,)),
    ),
    "RigidCoupling(quaternions)": lambda: (
        randomize(RigidCoupling(_RIGID, [0, 4], heads=2, hidden=(16,)), scale=0.5),
        RigidBase(_RIGID).sample((6,)),
    ),
    "RigidCoupling(angles, real, context)": lambda: (
        randomize(RigidCoupling(_RIGID, [1, 2, 3, 8], heads=2, hidden=(16,), context=2), scale=0.5),
        RigidBase(_RIGID).sample((6,)),
    ),
    # molecules (alanine dipeptide: 66 Cartesian coordinates to 60 internal ones)
    "InternalCoordinates": _internal_coordinates,
    # smooth normalizing flows (bump-CDF mixtures, root-finding inverse)
    "Coupling(SmoothMixture)": lambda: (
        randomize(Coupling(SmoothMixture(3), 4, hidden=(16,), activation="tanh"), scale=0.3),
        torch.rand(6, 4) * 0.96 + 0.02,
    ),
    "Coupling(SmoothMixture, circle)": lambda: (
        randomize(
            Coupling(SmoothMixture(3, circular=True), 4, conditioner=MLP(2, 26, (16,), "tanh", periodic=True)),
            scale=0.3,
        ),
        _angles(),
    ),
    # residual flows (spectral-normalised blocks, fixed-point inverse; eval mode: the exact log-det)
    "Residual": lambda: (_contractive(Residual(3, hidden=(16, 16), coefficient=0.9)), torch.randn(6, 3)),
    "Residual(2 features, elu)": lambda: (
        _contractive(Residual(2, hidden=(8, 8), coefficient=0.95, activation="elu")),
        torch.randn(6, 2),
    ),
    "Residual(1 feature)": lambda: (_contractive(Residual(1, hidden=(8,), coefficient=0.9)), torch.randn(6, 1)),
    "Residual(series, tanh)": lambda: (
        _contractive(Residual(4, hidden=(8,), coefficient=0.8, activation="tanh", logdet="series")),
        torch.randn(6, 4),
    ),
    # planar and radial layers (Rezende & Mohamed 2015)
    "Planar": lambda: (randomize(Planar(3), scale=1.0), 2 * torch.randn(6, 3)),
    "Radial": lambda: (randomize(Radial(3), scale=1.0), 2 * torch.randn(6, 3)),
    "Radial(1 feature)": lambda: (randomize(Radial(1), scale=1.0), 2 * torch.randn(6, 1)),
    # Householder reflections and Sylvester flows (van den Berg et al. 2018; back-substitution inverse)
    "Householder": lambda: (Householder(4, reflections=3), torch.randn(6, 4)),
    "FunnelTransport": lambda: (FunnelTransport(4, scale=1.5, beta=0.3), torch.randn(6, 4)),
    "Householder(1 reflection, 1 feature)": lambda: (Householder(1), torch.randn(6, 1)),
    "Sylvester(orthogonal, 2 of 4 columns)": lambda: (
        randomize(Sylvester(4, columns=2), scale=1.0),
        2 * torch.randn(6, 4),
    ),
    "Sylvester(householder)": lambda: (
        randomize(Sylvester(3, variant="householder", reflections=2), scale=1.0),
        2 * torch.randn(6, 3),
    ),
    "Sylvester(triangular, reverse)": lambda: (
        randomize(Sylvester(4, variant="triangular", reverse=True), scale=1.0),
        2 * torch.randn(6, 4),
    ),
    "MaskedAutoregressive(SmoothMixture)": lambda: (
        randomize(MaskedAutoregressive(SmoothMixture(2, low=-2.0, high=2.0), 3, hidden=(12,), activation="tanh")),
        torch.rand(6, 3) * 3.8 - 1.9,
    ),
    # neural autoregressive flows (monotonic networks, numerical inverses)
    "Coupling(MonotonicMLP, 2 layers)": lambda: (
        randomize(Coupling(MonotonicMLP(4, layers=2), 4, hidden=(8,))),
        1.5 * torch.randn(6, 4),
    ),
    "MaskedAutoregressive(MonotonicMLP, context)": lambda: (
        randomize(MaskedAutoregressive(MonotonicMLP(3), 3, hidden=(8,), context=2)),
        1.5 * torch.randn(6, 3),
    ),
    "Coupling(UnconstrainedMonotonic)": lambda: (
        randomize(Coupling(UnconstrainedMonotonic(4), 4, hidden=(8,)), scale=0.3),
        1.5 * torch.randn(6, 4),
    ),
    "MaskedAutoregressive(UnconstrainedMonotonic)": lambda: (
        randomize(MaskedAutoregressive(UnconstrainedMonotonic(5, nodes=24), 3, hidden=(8,)), scale=0.3),
        1.5 * torch.randn(6, 3),
    ),
    # polynomial and Gaussianization transformers (numerical inverses on a bracket)
    "Coupling(Bernstein)": lambda: (
        randomize(Coupling(Bernstein(degree=6, bound=3.0), 4, hidden=(8,))),
        1.5 * torch.randn(6, 4),
    ),
    "MaskedAutoregressive(Bernstein, context)": lambda: (
        randomize(MaskedAutoregressive(Bernstein(degree=5, bound=2.0), 3, hidden=(8,), context=2)),
        1.5 * torch.randn(6, 3),
    ),
    "Coupling(SumOfSquares)": lambda: (
        randomize(Coupling(SumOfSquares(degree=3, polynomials=2, bound=3.0), 4, hidden=(8,))),
        1.5 * torch.randn(6, 4),
    ),
    "MaskedAutoregressive(SumOfSquares)": lambda: (
        randomize(MaskedAutoregressive(SumOfSquares(degree=2, polynomials=3, bound=2.0), 3, hidden=(8,))),
        1.5 * torch.randn(6, 3),
    ),
    "ElementwiseTransformer(Gaussianization)": lambda: (
        randomize(ElementwiseTransformer(Gaussianization(3), 3)),
        1.5 * torch.randn(6, 3),
    ),
    "ElementwiseTransformer(Bernstein, context)": lambda: (
        randomize(ElementwiseTransformer(Bernstein(degree=6, bound=2.0), 3, context=2, hidden=(8,))),
        1.5 * torch.randn(6, 3),
    ),
    "Coupling(Gaussianization)": lambda: (
        randomize(Coupling(Gaussianization(3), 4, hidden=(8,))),
        1.5 * torch.randn(6, 4),
    ),
    "MaskedAutoregressive(Gaussianization, normal, context)": lambda: (
        randomize(MaskedAutoregressive(Gaussianization(3, kernel="normal"), 3, hidden=(8,), context=2)),
        1.5 * torch.randn(6, 3),
    ),
    "BlockNeuralAutoregressive": lambda: (randomize(BlockNeuralAutoregressive(3, hidden=(6, 5))), torch.randn(6, 3)),
    "BlockNeuralAutoregressive(context)": lambda: (
        randomize(BlockNeuralAutoregressive(2, hidden=(4,), context=2)),
        2 * torch.randn(6, 2),
    ),
}


def _target() -> DiagNormal:
    return DiagNormal(3, loc=1.0, scale=0.5, trainable=False)


#: Stochastic blocks (Markov kernels, no inverse): name -> ``() -> (block, x)``; see tests/flows/test_stochastic.py.
STOCHASTIC_BLOCKS: dict[str, Callable[[], tuple[torch.nn.Module, Tensor]]] = {
    "MetropolisBlock": lambda: (MetropolisBlock(_target(), lam=0.5, n_steps=3), torch.randn(6, 3)),
    "LangevinBlock": lambda: (LangevinBlock(_target(), lam=0.5, n_steps=3, step_size=0.05), torch.randn(6, 3)),
    "LangevinBlock(base)": lambda: (
        LangevinBlock(_target(), lam=0.3, n_steps=2, base=DiagNormal((3,), scale=2.0, trainable=False)),
        torch.randn(6, 3),
    ),
}

#: Elementwise transformers: name -> ``() -> transformer``; see tests/transformers/test_base.py.
TRANSFORMERS: dict[str, Callable[[], Transformer]] = {
    "Affine": Affine,
    "RationalQuadraticSpline": lambda: RationalQuadraticSpline(bins=5, bound=3.0),
    "CircularSpline": lambda: CircularSpline(bins=5),
    "SmoothMixture": lambda: SmoothMixture(4),
    "SmoothMixture(circle)": lambda: SmoothMixture(3, circular=True, power=2),
    "MonotonicMLP": lambda: MonotonicMLP(4, layers=2),
    "UnconstrainedMonotonic": lambda: UnconstrainedMonotonic(4),
    "Bernstein": lambda: Bernstein(degree=8, bound=3.0),
    "SumOfSquares": lambda: SumOfSquares(degree=3, polynomials=2, bound=3.0),
    "Gaussianization": lambda: Gaussianization(4),
    "Gaussianization(normal)": lambda: Gaussianization(3, kernel="normal"),
}

#: Base distributions: name -> ``() -> distribution``, events of at most two elements (checked by
#: ``check_flow``, which integrates the density); see tests/distributions/test_sweep.py.
DISTRIBUTIONS: dict[str, Callable[[], Distribution]] = {
    "StandardNormal": lambda: StandardNormal(2),
    "DependentNormal": lambda: DependentNormal(2, parameters=3, value=0.3),
    "DiagNormal": lambda: randomize(DiagNormal(2, loc=0.5, scale=1.5)),
    "DiagNormal(fixed)": lambda: DiagNormal(1, loc=-1.0, scale=0.3, trainable=False),
    "SphereUniform": lambda: SphereUniform(4),
    "SphereUniform(2 bodies)": lambda: SphereUniform((2, 4)),
    "RigidBase": lambda: RigidBase(["quaternion", "angle", "angle", "angle"]),
    "StudentT": lambda: StudentT(2, df=[1.5, 4.0]),
    "StudentT(learn_df)": lambda: randomize(StudentT(1, df=3.0, learn_df=True, min_df=0.5)),
    "TailAdaptiveBase": lambda: TailAdaptiveBase([None, 2.5], learn_df=True),
}


def _heavy_tailed() -> Tensor:
    """2000 points of two features with tail indices 2 and 5 (`z u^{-1/a}`): enough for the data presets' fits."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(2000, 2, generator=g) * torch.rand(2000, 2, generator=g).pow(-1 / torch.tensor([2.0, 5.0]))


def _vector(name: str, features: int = 3, **sizes: object) -> tuple[FlowModel, Tensor]:
    return build_flow(name, features, **{"hidden": (8,), **sizes}), torch.randn(6, features)


def _image(name: str) -> tuple[FlowModel, Tensor]:
    return build_image_flow(name, (1, 4, 4), levels=2, steps=1, hidden=(4,)), torch.rand(6, 1, 4, 4)


def _fitted(name: str) -> tuple[FlowModel, Tensor]:
    x = _heavy_tailed()
    return build_data_flow(name, x, transforms=1, hidden=(4,), bins=4), x[:6]


#: Flow presets, one per ``@preset`` declaration: name -> ``() -> (flow, x)`` at small sizes; see
#: tests/test_registry.py.
FLOW_PRESETS: dict[str, Callable[[], tuple[FlowModel, Tensor]]] = {
    "bnaf": lambda: _vector("bnaf", transforms=2, hidden=(4,)),
    "bpf": lambda: _vector("bpf", transforms=2),
    "cnf": lambda: _vector("cnf"),
    "free-form": lambda: _vector("free-form"),
    "gf": lambda: _vector("gf", transforms=2),
    "kernel-coupling": lambda: _vector("kernel-coupling", transforms=2),
    "lattice": lambda: _vector("lattice", 16, transforms=2),
    "maf": lambda: _vector("maf", transforms=2),
    "nanoflow": lambda: _vector("nanoflow", transforms=2, bins=4),
    "naf": lambda: _vector("naf", transforms=2),
    "nsf": lambda: _vector("nsf", transforms=2, bins=4),
    "nsf-coupling": lambda: _vector("nsf-coupling", transforms=2, bins=4),
    "planar": lambda: _vector("planar", transforms=2),
    "realnvp": lambda: _vector("realnvp", transforms=2),
    "residual": lambda: _vector("residual", transforms=2),
    "sospf": lambda: _vector("sospf", transforms=2),
    "sylvester": lambda: _vector("sylvester", transforms=2),
    "unaf": lambda: _vector("unaf", transforms=2),
    "eiw": lambda: _image("eiw"),
    "glow": lambda: _image("glow"),
    "tarflow": lambda: _image("tarflow"),
    "comet": lambda: _fitted("comet"),
    "gtaf": lambda: _fitted("gtaf"),
    "mtaf": lambda: _fitted("mtaf"),
    "mtaf-fix": lambda: _fitted("mtaf-fix"),
    "tail-adaptive": lambda: _fitted("tail-adaptive"),
}


def public_subclasses(base: type) -> set[type]:
    """Concrete public subclasses of ``base`` reachable as attributes of flowkit's modules.

    A class counts when it is defined in flowkit, its name does not start with
    ``_``, it is not ``base`` itself, and it is not an abstract base: those set
    ``_flowkit_register = False`` in their own body (they are not saved by
    name either) or have abstract methods. Factory functions are not classes
    and do not count; the class they return does.
    """
    found = set()
    modules = [flowkit] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(flowkit.__path__, "flowkit.")
        if not info.name.endswith("__main__")  # runs the command line on import
    ]
    for module in modules:
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and not name.startswith("_")
                and not obj.__name__.startswith("_")
                and obj.__module__.split(".")[0] == "flowkit"
                and issubclass(obj, base)
                and obj is not base
                and obj.__dict__.get("_flowkit_register", True)
                and not inspect.isabstract(obj)
            ):
                found.add(obj)
    return found


def missing_cases(base: type, builders: dict[str, Callable[[], object]]) -> list[str]:
    """Names of the concrete public subclasses of ``base`` of which no builder makes an instance of that exact type."""
    built = set()
    for build in builders.values():
        with torch.random.fork_rng():
            torch.manual_seed(0)
            obj = build()
        built.add(type(obj[0] if isinstance(obj, tuple) else obj))
    return sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in public_subclasses(base) - built)


#: The start of the error that refuses `mismatched_free_form`'s flow for importance weighting (a regex).
MISMATCH = r"FreeFormFlow's samples do not come from the density it reports \(its samples are decoder outputs"


def mismatched_free_form() -> tuple[flowkit.flows.FreeFormFlow, flowkit.targets.Energy]:
    """A free-form flow whose samples do not follow its density, and a target with a known log Z (issue 38, 3).

    Encoder `I`, decoder `3 I` (float64): `log_prob` is N(0, I), the samples are N(0, 9 I). The target is
    N(0, 4 I) in 2-D, `log Z = log(8 pi) = 3.224`; AIS with this flow returned 15.8 +- 0.8.
    """
    encoder, decoder = (torch.nn.Linear(2, 2, bias=False).double() for _ in range(2))
    with torch.no_grad():
        encoder.weight.copy_(torch.eye(2))
        decoder.weight.copy_(3 * torch.eye(2))
    target = flowkit.targets.Energy(lambda x: x.square().sum(-1) / 8, 2, log_Z=math.log(8 * math.pi))
    return flowkit.flows.FreeFormFlow(encoder, decoder, 2), target
