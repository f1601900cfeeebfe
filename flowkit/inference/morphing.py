r"""Unpaired morphing of simulated events into data with a conditional flow chain, balanced by MDMM.

Gendreau-Distler, Le Pottier & Wang (2025) morph a Monte Carlo (MC) diphoton sample into one that models data with
a conditional normalizing flow built as a chain of bijectors (masked autoregressive layers, Gaussian base), trained
on *unpaired* samples with a Kullback-Leibler term and a maximum mean discrepancy (MMD) term balanced by the
Modified Differential Multiplier Method. This module follows that recipe with flowkit's parts; the paper's text
beyond its abstract and summary was not at hand, so the exact form of its two terms is ours, stated here:

**The morph.** A bijection $T_\phi(\cdot\,; c): x_{\rm MC} \mapsto x_{\rm data}$ conditioned on a kinematic
context $c$ (pile-up, say), built as the [`Chain`][flowkit.bijectors.Chain] of a standardisation by the MC
moments, spline autoregressive layers that start at the identity, and the inverse standardisation by the data
moments (so the morph starts as moment matching).

**The KL term** (a likelihood of the morphed MC under a data density). A conditional flow $p_{\rm data}(y \mid c)$
is first fitted to the data by maximum likelihood and frozen. The morphed MC has the density
$q_\phi = T_\phi{}_\# p_{\rm MC}$, and

$$
\mathrm{KL}(q_\phi \,\|\, p_{\rm data}) = E_{x \sim p_{\rm MC}}\big[\log p_{\rm MC}(x)
  - \log p_{\rm data}(T_\phi(x) \mid c) - \log|\det \partial_x T_\phi(x)|\big],
$$

whose $\phi$-dependent part is the negative log-likelihood of the MC events under the flow
`Flow(Chain(morph, data_flow.bijector), data_flow.base)` ([`morphing_flow`][flowkit.inference.morphing_flow]):
the KL term is plain [`MaximumLikelihood`][flowkit.train.MaximumLikelihood] on MC batches, in the one fit loop.

**The MMD constraint.** The squared MMD between a batch of morphed MC events and a batch of data events (with
their contexts, so that the conditional distributions are compared), with a sum of Gaussian kernels of several
bandwidths on standardised features ([`mmd2`][flowkit.inference.mmd2]), must stay below a bound $\epsilon$:
[`Constrained`][flowkit.train.Constrained] adds $\lambda h + \frac d2 h^2$ with $h = \max(\mathrm{MMD}^2 -
\epsilon, -\lambda/d)$ and moves $\lambda$ by gradient ascent. The bound has a physical meaning rather than being
an arbitrary loss weight: by default it is twice the standard deviation of the MMD estimate between two independent
data batches of the same size, i.e. "the morphed MC is indistinguishable from data at the statistical precision of
a batch"; $\lambda$ is then the price of that requirement in units of the KL term.

References:
    E. Gendreau-Distler, L. Le Pottier & H. Wang, *Transforming simulation to data without pairing*,
    arXiv:2504.12343 (2025); Gretton et al., *A kernel two-sample test*, JMLR 13 (2012); Platt & Barr,
    *Constrained differential optimization*, NeurIPS 1988.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_number, check_tensor
from ..bijectors import Bijector, Chain, Invert, Standardization
from ..flows import NSF, Flow
from ..train import AtMost, Constrained, History, MaximumLikelihood, fit
from ..train.batches import split_batch

__all__ = ["DiphotonToy", "mmd2", "MMDToData", "morphing_flow", "UnpairedMorphing"]

#: Kernel bandwidths of the MMD, on standardised features (a mixture covers fine and coarse differences).
BANDWIDTHS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class DiphotonToy:
    r"""Toy diphoton events: correlated "MC" and "data" samples related by a known distortion.

    Four features per event, $x = (p_{T,1}, p_{T,2}, \eta_1, \eta_2)$ (leading and sub-leading photon; GeV),
    and one context feature, a standardised pile-up $c \sim N(0, 1)$ shared by both samples. MC: from a Gaussian
    $u$ with $\rho(u_1, u_2) = 0.55$ and $\rho(u_3, u_4) = 0.5$,

    $$
    p_{T,1} = 35 + 20 e^{0.45 u_1}, \quad p_{T,2} = 25 + (p_{T,1} - 25)\,\sigma(1.2 u_2 + 0.3), \quad
    \eta_i = 2.2 \tanh(u_{i+2}/2).
    $$

    Data are MC events passed through the known distortion [`distort`][flowkit.inference.morphing.DiphotonToy.distort]:
    a pile-up dependent energy scale $s(c) = 1 + a + b c$ on both $p_T$, a non-linearity
    $1 + k \tanh((p_{T,2} - 40)/15)$ on the sub-leading one, a stretched and shifted $\eta_1$ and a cross-talk
    $\eta_2 + \kappa \eta_1$ that changes the correlation. The photons are taken back to back in azimuth, so that
    the diphoton invariant mass is $m_{\gamma\gamma} = \sqrt{2 p_{T,1} p_{T,2} (\cosh(\eta_1 - \eta_2) + 1)}$
    ([`invariant_mass`][flowkit.inference.morphing.DiphotonToy.invariant_mass]).

    Arguments:
        scale: the energy-scale offset $a$.
        pileup_scale: the pile-up slope $b$ of the energy scale.
        nonlinearity: $k$.
        eta_stretch: $\eta_1 \to (1 + \text{eta\_stretch})\,\eta_1 + \text{eta\_shift}$.
        eta_shift: see `eta_stretch`.
        crosstalk: $\kappa$.

    Examples:
        >>> import torch
        >>> from flowkit.inference import DiphotonToy
        >>> toy = DiphotonToy()
        >>> x, c = toy.sample_mc(1000, generator=torch.Generator().manual_seed(0))
        >>> x.shape, c.shape, bool((x[:, 0] >= x[:, 1]).all())
        (torch.Size([1000, 4]), torch.Size([1000, 1]), True)
        >>> toy.invariant_mass(x).shape
        torch.Size([1000])
    """

    features = ("pt_lead", "pt_sublead", "eta_lead", "eta_sublead")
    labels = (r"$p_{T,1}$ [GeV]", r"$p_{T,2}$ [GeV]", r"$\eta_1$", r"$\eta_2$")

    def __init__(
        self,
        scale: float = 0.02,
        pileup_scale: float = 0.01,
        nonlinearity: float = 0.04,
        eta_stretch: float = 0.03,
        eta_shift: float = 0.05,
        crosstalk: float = 0.12,
    ) -> None:
        where = "DiphotonToy"
        self.scale = check_number(scale, "scale", where=where, low=-0.5, high=0.5)
        self.pileup_scale = check_number(pileup_scale, "pileup_scale", where=where, low=-0.1, high=0.1)
        self.nonlinearity = check_number(nonlinearity, "nonlinearity", where=where, low=-0.5, high=0.5)
        self.eta_stretch = check_number(eta_stretch, "eta_stretch", where=where, low=-0.5, high=0.5)
        self.eta_shift = check_number(eta_shift, "eta_shift", where=where)
        self.crosstalk = check_number(crosstalk, "crosstalk", where=where, low=-1.0, high=1.0)

    @staticmethod
    def _check_size(n: int) -> int:
        return int(check_number(n, "n", where="DiphotonToy", integer=True, low=1))

    def sample_mc(
        self, n: int, generator: torch.Generator | None = None, dtype: torch.dtype | None = None
    ) -> tuple[Tensor, Tensor]:
        """`n` MC events `(x, context)` of shapes `(n, 4)` and `(n, 1)`."""
        n = self._check_size(n)
        dtype = dtype or torch.get_default_dtype()
        cov = torch.tensor([[1.0, 0.55, 0, 0], [0.55, 1.0, 0, 0], [0, 0, 1.0, 0.5], [0, 0, 0.5, 1.0]], dtype=dtype)
        u = torch.randn(n, 4, generator=generator, dtype=dtype) @ torch.linalg.cholesky(cov).T
        c = torch.randn(n, 1, generator=generator, dtype=dtype)
        pt1 = 35 + 20 * torch.exp(0.45 * u[:, 0])
        pt2 = 25 + (pt1 - 25) * torch.sigmoid(1.2 * u[:, 1] + 0.3)
        eta = 2.2 * torch.tanh(0.5 * u[:, 2:])
        return torch.cat([pt1[:, None], pt2[:, None], eta], 1), c

    def distort(self, x: Tensor, context: Tensor) -> Tensor:
        """The known map from MC events to data events at pile-up `context` (elementwise in the batch)."""
        check_tensor(x, (4,), name="x", where="DiphotonToy.distort")
        check_tensor(context, (1,), name="context", where="DiphotonToy.distort")
        s = 1 + self.scale + self.pileup_scale * context[..., 0]
        pt1 = x[..., 0] * s
        pt2 = x[..., 1] * s * (1 + self.nonlinearity * torch.tanh((x[..., 1] - 40) / 15))
        eta1 = (1 + self.eta_stretch) * x[..., 2] + self.eta_shift
        eta2 = x[..., 3] + self.crosstalk * x[..., 2]
        return torch.stack([pt1, pt2, eta1, eta2], -1)

    def sample_data(
        self, n: int, generator: torch.Generator | None = None, dtype: torch.dtype | None = None
    ) -> tuple[Tensor, Tensor]:
        """`n` data events `(x, context)`: fresh MC events, distorted (independent of any MC sample drawn)."""
        x, c = self.sample_mc(n, generator, dtype)
        return self.distort(x, c), c

    @staticmethod
    def invariant_mass(x: Tensor) -> Tensor:
        r"""$m_{\gamma\gamma}$ of events `x` (photons back to back in azimuth), shape `x.shape[:-1]`."""
        check_tensor(x, (4,), name="x", where="DiphotonToy.invariant_mass")
        pt1, pt2, eta1, eta2 = x.unbind(-1)
        return torch.sqrt((2 * pt1 * pt2 * (torch.cosh(eta1 - eta2) + 1)).clamp(min=0))


def mmd2(x: Tensor, y: Tensor, bandwidths: Sequence[float] = BANDWIDTHS) -> Tensor:
    r"""Unbiased squared maximum mean discrepancy between samples `x` `(n, D)` and `y` `(m, D)`.

    With the kernel $k(a, b) = \sum_\sigma \exp(-\lVert a - b \rVert^2 / (2 \sigma^2))$ (one term per bandwidth),

    $$
    \widehat{\mathrm{MMD}}^2 = \frac{1}{n(n-1)} \sum_{i \ne j} k(x_i, x_j) + \frac{1}{m(m-1)} \sum_{i \ne j} k(y_i, y_j)
        - \frac{2}{nm} \sum_{i, j} k(x_i, y_j)
    $$

    (Gretton et al. 2012); its expectation is 0 when both samples come from one distribution (it can be negative).

    Arguments:
        x: the first sample, at least 2 points.
        y: the second sample, at least 2 points, of the same width.
        bandwidths: the kernel widths $\sigma > 0$ (on the scale of the features: standardise them first).

    Examples:
        >>> import torch
        >>> from flowkit.inference import mmd2
        >>> g = torch.Generator().manual_seed(0)
        >>> same = mmd2(torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g))
        >>> shifted = mmd2(torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g) + 0.5)
        >>> bool(abs(same) < 0.01 < shifted)
        True
    """
    where = "mmd2"
    check_tensor(x, x.shape[-1:] if isinstance(x, Tensor) else (), name="x", where=where)
    check_tensor(y, x.shape[-1:], name="y", dtype=x.dtype, where=where)
    if x.dim() != 2 or y.dim() != 2 or len(x) < 2 or len(y) < 2:
        raise ValueError(f"{where}: x and y must be (N, D) with N >= 2, got {tuple(x.shape)} and {tuple(y.shape)}")
    widths = [float(check_number(b, "bandwidth", where=where, positive=True)) for b in bandwidths]
    if not widths:
        raise ValueError(f"{where}: give at least one bandwidth")
    n, m = len(x), len(y)
    both = torch.cat([x, y])
    d2 = torch.cdist(both, both).square()
    k = sum(torch.exp(d2 * (-0.5 / w**2)) for w in widths)
    kxx, kyy, kxy = k[:n, :n], k[n:, n:], k[:n, n:]
    return (
        (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
        + (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
        - 2 * kxy.mean()
    )


class MMDToData:
    r"""A constraint function: the squared MMD between a morphed MC batch and a random batch of data.

    Called as `fn(flow, batch)` by [`Constrained`][flowkit.train.Constrained], with `flow` the
    [`morphing_flow`][flowkit.inference.morphing_flow] (its first layer is the morph) and `batch` the MC batch
    `x` or `(x, context)`. The data batch, of the MC batch's size, is drawn with torch's global generator (which
    the checkpoints of [`fit`][flowkit.train.fit] replay). Features are standardised by the data's moments, the
    context is appended to the features (compared as it is: give it on a unit scale).

    Arguments:
        data: the data events `(N, D)`.
        context: their contexts `(N, C)` (None without context).
        bandwidths: the kernel widths on standardised features.

    Attributes:
        loc: the data's feature means (the standardisation).
        scale: the data's feature standard deviations.
    """

    def __init__(self, data: Tensor, context: Tensor | None = None, bandwidths: Sequence[float] = BANDWIDTHS) -> None:
        where = "MMDToData"
        check_tensor(data, data.shape[-1:] if isinstance(data, Tensor) else (), name="data", where=where)
        if data.dim() != 2 or len(data) < 4:
            raise ValueError(f"{where}: data must be (N, D) with N >= 4, got {tuple(data.shape)}")
        if context is not None:
            check_tensor(context, context.shape[-1:], name="context", dtype=data.dtype, where=where)
            if context.dim() != 2 or len(context) != len(data):
                raise ValueError(
                    f"{where}: context must be (N, C) with the data's N = {len(data)}, got {tuple(context.shape)}"
                )
        self.data, self.context = data, context
        self.bandwidths = tuple(float(b) for b in bandwidths)
        self.loc, self.scale = data.mean(0), data.std(0).clamp(min=1e-12)

    def _features(self, x: Tensor, context: Tensor | None) -> Tensor:
        z = (x - self.loc.to(x)) / self.scale.to(x)
        return z if context is None else torch.cat([z, context.to(x)], -1)

    def data_batch(self, n: int, device: torch.device | None = None) -> Tensor:
        """The standardised features (with context) of `n` data events drawn with replacement."""
        index = torch.randint(len(self.data), (n,))
        context = None if self.context is None else self.context[index]
        return self._features(self.data[index], context).to(device)

    def __call__(self, flow: Flow, batch: Any) -> Tensor:
        x, context = split_batch(batch, "MMDToData")
        if (context is None) != (self.context is None):
            raise ValueError("MMDToData: give contexts with both the MC batches and the data, or with neither")
        morphed = flow.bijector[0](x, context)[0]
        return mmd2(self._features(morphed, context), self.data_batch(len(x), x.device), self.bandwidths)

    def null_spread(self, batch_size: int, repeats: int = 50, generator: torch.Generator | None = None) -> float:
        """The standard deviation of the MMD estimate between two independent data batches of `batch_size` events."""
        batch_size = int(check_number(batch_size, "batch_size", where="MMDToData", integer=True, low=2))
        values = []
        for _ in range(int(repeats)):
            index = torch.randint(len(self.data), (2 * batch_size,), generator=generator)
            context = None if self.context is None else self.context[index]
            z = self._features(self.data[index], context)
            values.append(float(mmd2(z[:batch_size], z[batch_size:], self.bandwidths)))
        return float(torch.tensor(values, dtype=torch.float64).std())


def morphing_flow(morph: Bijector, data_flow: Flow) -> Flow:
    r"""The flow whose maximum likelihood on MC events trains `morph` against the data density `data_flow`.

    `Flow(Chain(morph, data_flow.bijector), data_flow.base)`: its log-density at an MC event is
    $\log p_{\rm data}(T(x) \mid c) + \log|\det \partial_x T(x)|$, so its negative log-likelihood on MC is the
    KL divergence from the morphed MC to the data density, up to a constant (module docstring). The data flow's
    parameters are frozen (`requires_grad = False`); `fit` trains the morph alone.

    Arguments:
        morph: the morph $T$ (MC to data), a [`Bijector`][flowkit.bijectors.Bijector].
        data_flow: the data density, a [`Flow`][flowkit.flows.Flow] of the same features and context.
    """
    if not isinstance(morph, Bijector):
        raise ValueError(f"morphing_flow: morph must be a flowkit Bijector, got {type(morph).__name__}")
    if not (isinstance(getattr(data_flow, "bijector", None), Bijector) and isinstance(data_flow, nn.Module)):
        raise ValueError(
            f"morphing_flow: data_flow must be a flowkit Flow (a bijector over a base), got {type(data_flow).__name__}"
        )
    for parameter in data_flow.parameters():
        parameter.requires_grad_(False)
    return Flow(Chain(morph, data_flow.bijector), data_flow.base)


class UnpairedMorphing(nn.Module):
    r"""Morph MC events into data without pairs: a data flow, then a conditional morph trained by KL under MMD.

    [`fit`][flowkit.inference.morphing.UnpairedMorphing.fit] runs [`fit`][flowkit.train.fit] twice: the data density
    `data_flow` (an [`NSF`][flowkit.flows.NSF], standardised) by maximum likelihood on the data, then the morph by
    maximum likelihood of the MC under [`morphing_flow`][flowkit.inference.morphing_flow] (the KL term), subject
    to $\mathrm{MMD}^2 \le \epsilon$ ([`MMDToData`][flowkit.inference.MMDToData], an
    [`AtMost`][flowkit.train.AtMost] constraint of [`Constrained`][flowkit.train.Constrained]). The morph
    (`morph`) is the chain `Standardization(MC) -> spline autoregressive layers (identity at the start) ->
    Standardization(data)^-1`, conditioned on the context. See the module docstring for the maths.

    Arguments:
        features: the number of event features $D$.
        context: the number of context features (0: none).
        transforms: autoregressive layers of the data flow.
        hidden: hidden sizes of the data flow's conditioners.
        morph_transforms: autoregressive layers of the morph.
        morph_hidden: hidden sizes of the morph's conditioners.
        bins: spline bins of both.

    Attributes:
        data_flow: the data density (after `fit`).
        morph: the morph, a [`Chain`][flowkit.bijectors.Chain] (after `fit`).
        flow: the [`morphing_flow`][flowkit.inference.morphing_flow] (after `fit`).
        objective: the [`Constrained`][flowkit.train.Constrained] objective of the morph's run, with its
            multiplier (after `fit`).

    Examples:
        >>> import torch
        >>> from flowkit.inference import DiphotonToy, UnpairedMorphing
        >>> toy, g = DiphotonToy(), torch.Generator().manual_seed(0)
        >>> mc, data = toy.sample_mc(512, g), toy.sample_data(512, g)
        >>> model = UnpairedMorphing(4, context=1, transforms=1, hidden=(8,), morph_transforms=1, morph_hidden=(8,))
        >>> histories = model.fit(mc, data, data_steps=2, morph_steps=2, batch_size=64, progress=False)
        >>> model(*mc).shape, sorted(histories[1].metrics)
        (torch.Size([512, 4]), ['constraint_mmd', 'multiplier_mmd', 'objective'])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        morph_transforms: int = 3,
        morph_hidden: Sequence[int] = (64, 64),
        bins: int = 8,
    ) -> None:
        super().__init__()
        where = "UnpairedMorphing"
        self.features = int(check_number(features, "features", where=where, integer=True, low=1))
        self.context_features = int(check_number(context, "context", where=where, integer=True, low=0))
        self.data_flow = NSF(features, transforms, bins, hidden, context=context)
        self._morph_layers = NSF(features, morph_transforms, bins, morph_hidden, context=context, start="identity")
        self.morph: Chain | None = None
        self.flow: Flow | None = None
        self.objective: Constrained | None = None

    def _check(self, sample: Any, name: str) -> tuple[Tensor, Tensor | None]:
        where = "UnpairedMorphing"
        x, context = split_batch(sample, f"{where}: {name}")
        dtype = next(self.data_flow.parameters()).dtype
        check_tensor(x, (self.features,), name=f"{name} events", dtype=dtype, where=where)
        if x.dim() != 2:
            raise ValueError(f"{where}: {name} events must be (N, {self.features}), got {tuple(x.shape)}")
        if self.context_features == 0:
            if context is not None:
                raise ValueError(f"{where}: built without context (context=0), but {name} has one")
            return x, None
        if context is None:
            raise ValueError(
                f"{where}: {name} must be a pair (x, context) with {self.context_features} context features"
            )
        check_tensor(context, (self.context_features,), name=f"{name} context", dtype=dtype, where=where)
        if context.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"{where}: {name} has {len(x)} events but {len(context)} contexts")
        return x, context

    def fit(
        self,
        mc: Any,
        data: Any,
        *,
        data_steps: int = 2000,
        morph_steps: int = 1000,
        batch_size: int = 512,
        lr: float = 3e-3,
        mmd_bound: float | str = "auto",
        damping: float = 10.0,
        multiplier_lr: float = 1.0,
        seed: int | None = None,
        progress: bool = True,
    ) -> tuple[History, History]:
        r"""Fit the data flow, then the morph; returns the two runs' histories.

        Arguments:
            mc: the MC events `x` `(N, D)` or `(x, context)`.
            data: the data events, in the same form (not paired with `mc`; any number).
            data_steps: steps of the data flow's maximum likelihood.
            morph_steps: steps of the morph's constrained run.
            batch_size: events per batch (MC and data batches alike).
            lr: the flows' learning rate (Adam, cosine schedule).
            mmd_bound: $\epsilon$ of $\mathrm{MMD}^2 \le \epsilon$; `"auto"`: twice the spread of the MMD between
                two independent data batches (`MMDToData.null_spread`).
            damping: the constraint's damping $d$.
            multiplier_lr: the multiplier's learning rate.
            seed: seed of both runs (None: not seeded).
            progress: progress bars.

        Raises:
            ValueError: for events of the wrong width, dtype or shape, non-finite values, a context missing or
                unexpected, or a bad bound.
        """
        x_mc, c_mc = self._check(mc, "mc")
        x_data, c_data = self._check(data, "data")
        as_batch = lambda x, c: x if c is None else (x, c)  # noqa: E731
        options = dict(batch_size=batch_size, lr=lr, progress=progress, seed=seed)
        data_history = fit(self.data_flow, MaximumLikelihood(), as_batch(x_data, c_data), steps=data_steps,
                           standardize=True, **options)  # fmt: skip
        standardization = self.data_flow.bijector[0]
        to_data = Standardization(standardization.loc.tolist(), standardization.scale.tolist())
        self.morph = Chain(Standardization.from_data(x_mc), *self._morph_layers.bijector, Invert(to_data))
        self.flow = morphing_flow(self.morph, self.data_flow)
        mmd = MMDToData(x_data, c_data)
        if mmd_bound == "auto":
            generator = None if seed is None else torch.Generator().manual_seed(seed)
            bound = 2 * mmd.null_spread(batch_size, generator=generator)
        elif isinstance(mmd_bound, str):
            raise ValueError(f"UnpairedMorphing: mmd_bound must be a number or 'auto', got {mmd_bound!r}")
        else:
            bound = check_number(mmd_bound, "mmd_bound", where="UnpairedMorphing", low=0.0)
        self.objective = Constrained(MaximumLikelihood(), [AtMost("mmd", mmd, bound, damping=damping)], multiplier_lr)
        morph_history = fit(self.flow, self.objective, as_batch(x_mc, c_mc), steps=morph_steps, **options)
        return data_history, morph_history

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """The morphed events $T(x; c)$ (MC to data)."""
        if self.morph is None:
            raise ValueError("UnpairedMorphing: call fit first")
        x, context = self._check(x if context is None else (x, context), "x")
        return self.morph(x, context)[0]
