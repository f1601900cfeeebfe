r"""Flows for heavy-tailed data: marginal tail-adaptive flows (mTAF, gTAF) and COMET copula flows.

A flow with a Gaussian base and Lipschitz layers (splines with identity tails) has Gaussian tails, whatever it is
trained on. [`TailAdaptive`][flowkit.flows.TailAdaptive] gives the heavy-tailed marginals a Student-t base and keeps
them from leaking into the light ones; [`COMET`][flowkit.flows.COMET] models each marginal with a fitted CDF whose tails
are generalized Pareto, and the dependence with a coupling flow on the Gaussian copula.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._validation import check_number
from ..bijectors import Bijector, Chain, MarginalTailCDF, Permutation, Standardization, TailLU
from ..distributions import Distribution, TailAdaptiveBase
from ..stats import estimate_tails
from ..transformers import RationalQuadraticSpline, Transformer
from .flow import Flow
from .presets import NSF, ConditionerFactory, _autoregressive, _base, _checked
from .registry import preset

__all__ = ["TailAdaptive", "COMET", "TAIL_VARIANTS"]

#: The [`TailAdaptive`][flowkit.flows.TailAdaptive] variants: estimated df fixed, estimated df trained,
#: every marginal Student-t with trained df (no estimation).
TAIL_VARIANTS = ("mtaf-fix", "mtaf", "gtaf")


def _group_permutation(light: int, features: int, seed: int) -> Permutation:
    """A seeded permutation of the light features among themselves and of the heavy ones among themselves."""
    layer = Permutation(features, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    order = torch.cat(
        [torch.randperm(light, generator=generator), light + torch.randperm(features - light, generator=generator)]
    )
    layer.perm.copy_(order)
    return layer


def _training_data(x: Tensor, where: str) -> Tensor:
    """A real `(N, D)` tensor as it is if floating, else in the default floating dtype; or a `ValueError`."""
    if not isinstance(x, Tensor) or x.dim() != 2 or x.is_complex():
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{where}: x must be a real tensor of shape (N, D), got {shape}")
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


class TailAdaptive(Flow):
    r"""Marginal tail-adaptive flow (mTAF): Student-t base marginals for the heavy-tailed features.

    With `df[j]` `None` for a light-tailed feature and $\nu_j$ for a heavy-tailed one, the flow

    1. (optionally) standardises each feature with a fixed `loc` and `scale`, then puts the light features first (undone
       when sampling);
    2. applies `transforms` masked autoregressive layers (rational-quadratic splines on $[-B, B]$ with identity tails),
       with a permutation within each group and a [`TailLU`][flowkit.bijectors.TailLU] between consecutive layers;
    3. ends at a [`TailAdaptiveBase`][flowkit.distributions.TailAdaptiveBase]: $\mathcal N(0, 1)$ on the light
       dimensions, $t_{\nu_j}$ on the heavy ones.

    Every layer is Lipschitz and triangular with the light features first, so each output marginal keeps
    its base marginal's tail (Laszkiewicz et al. 2022, Theorem 4). Build it from data with
    [`from_data`][flowkit.flows.TailAdaptive.from_data], which estimates the tails. Variants: `"mtaf-fix"`
    keeps the degrees of freedom fixed, `"mtaf"` trains them, and `"gtaf"` makes every marginal Student-t
    with trained degrees of freedom (starting at `df`, a number; 10 by default).

    Arguments:
        features: number of features `D`.
        df: one entry per feature (`None` for light, $\nu_j$ for heavy), or a number for every feature;
            `None` makes every feature light (`"mtaf"`, `"mtaf-fix"`) or starts gTAF at 10.
        variant: `"mtaf-fix"`, `"mtaf"` or `"gtaf"`.
        transforms: number of autoregressive layers.
        bins: spline bins.
        hidden: hidden sizes of each MADE.
        bound: the spline interval half-width `B` (identity outside).
        context: number of context features.
        activation: conditioner activation.
        min_df: the floor of the degrees of freedom.
        loc: per-feature location of a fixed [`Standardization`][flowkit.bijectors.Standardization] put
            first (with `scale`; [`from_data`][flowkit.flows.TailAdaptive.from_data] sets the median).
        scale: per-feature scale of that standardisation (`from_data`: the interquartile range / 1.349).
        transformer: the transformer instead of the spline (e.g. [`Affine`][flowkit.transformers.Affine]
            for MAF layers).
        conditioner: a factory `conditioner(features, params_per_feature, context=context)` of
            autoregressive conditioners (natural order).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.TailAdaptive(3, df=[None, 2.0, None], transforms=2, hidden=(16,))
        >>> flow.df.tolist()
        [inf, 2.0, inf]
        >>> flow.log_prob(torch.randn(4, 3)).shape
        torch.Size([4])

    References:
        Laszkiewicz, Lederer & Fischer, *Marginal Tail-Adaptive Normalizing Flows*, ICML 2022
        (arXiv:2206.10311); Jaini, Kobyzev, Yu & Brubaker, *Tails of Lipschitz Triangular Flows*,
        ICML 2020 (arXiv:1907.04481).
    """

    def __init__(
        self,
        features: int,
        df: float | Sequence[float | None] | None = None,
        variant: str = "mtaf",
        transforms: int = 5,
        bins: int = 8,
        hidden: Sequence[int] = (64, 64),
        bound: float = 3.0,
        context: int = 0,
        activation: str = "relu",
        min_df: float = 1.0,
        loc: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        *,
        transformer: Transformer | None = None,
        conditioner: ConditionerFactory | None = None,
    ) -> None:
        where = "TailAdaptive"
        sizes = {"features": (features, 1), "transforms": (transforms, 1), "context": (context, 0), "bins": (bins, 1)}
        _checked(where, transformer, conditioner, sizes, hidden)
        if variant not in TAIL_VARIANTS:
            raise ValueError(f"{where}: variant must be one of {', '.join(TAIL_VARIANTS)}, got {variant!r}")
        if variant == "gtaf":
            if not (df is None or isinstance(df, (int, float))):
                raise ValueError(f"{where}: gtaf estimates nothing; df is one starting number, got {df!r}")
            per_feature: list[float | None] = [10.0 if df is None else float(df)] * features
        elif df is None or isinstance(df, (int, float)):
            per_feature = [None if df is None else float(df)] * features
        else:
            per_feature = list(df)
            if len(per_feature) != features:
                raise ValueError(f"{where}: df needs one entry per feature ({features}), got {len(per_feature)}")
        heavy = [j for j, v in enumerate(per_feature) if v is not None]
        order = [j for j, v in enumerate(per_feature) if v is None] + heavy
        light = features - len(heavy)
        transformer = RationalQuadraticSpline(bins, bound) if transformer is None else transformer
        sort = Permutation(features, seed=0)
        sort.perm.copy_(torch.tensor(order))
        layers: list[Bijector] = [sort]
        if loc is not None or scale is not None:
            if loc is None or scale is None:
                raise ValueError(f"{where}: give both loc and scale of the standardisation, or neither")
            layers.insert(0, Standardization(loc, scale))
        for i in range(transforms):
            if i:
                layers += [_group_permutation(light, features, seed=i), TailLU(features, light)]
            layers.append(_autoregressive(transformer, features, hidden, context, False, activation, conditioner))
        base = TailAdaptiveBase([per_feature[j] for j in order], learn_df=variant != "mtaf-fix", min_df=min_df)
        super().__init__(Chain(*layers), base)

    @property
    def df(self) -> Tensor:
        """The base's degrees of freedom (`inf` for a light feature), put back in the data's order by the first sort.

        The layers mix the heavy latents (as in the reference), so a heavy output's tail is the heaviest of the
        heavy latents it depends on, not necessarily its own entry.
        """
        sort = next(layer for layer in self.bijector if isinstance(layer, Permutation)).perm
        return self.base.df.detach()[torch.argsort(sort)]

    def parameter_groups(self, lr: float, df_lr: float | None = None) -> list[dict]:
        r"""Optimizer parameter groups: the layers at `lr`, the base's degrees of freedom at `df_lr`.

        Adam moves each parameter by about its learning rate per step, so at `1e-3` a trained $\nu$
        travels about one unit per thousand steps: gTAF, started at 10, cannot reach 2 in a short run. The
        reference trains $\nu$ at its own learning rate (0.005 against 1e-5 for the layers).

        Arguments:
            lr: learning rate of the layers.
            df_lr: learning rate of the degrees of freedom (`lr` when None); unused by `"mtaf-fix"`,
                whose degrees of freedom are a buffer.

        Returns:
            A list for `torch.optim.Adam(groups)`; a schedule scales every group alike.

        Examples:
            >>> import torch, flowkit
            >>> from flowkit.train import MaximumLikelihood, fit
            >>> flow = flowkit.flows.TailAdaptive(2, df=10.0, variant="gtaf", transforms=1, hidden=(8,))
            >>> [group["lr"] for group in flow.parameter_groups(1e-3, df_lr=5e-3)]
            [0.001, 0.005]
            >>> history = fit(flow, MaximumLikelihood(), torch.randn(256, 2), steps=2, progress=False,
            ...               optimizer=lambda params, lr: torch.optim.Adam(flow.parameter_groups(lr, 5e-3)))
        """
        where = "TailAdaptive.parameter_groups"
        lr = check_number(lr, "lr", where=where, positive=True)
        df_lr = lr if df_lr is None else check_number(df_lr, "df_lr", where=where, positive=True)
        df = [p for p in self.base.parameters() if p.requires_grad]
        chosen = {id(p) for p in df}
        layers = [p for p in self.parameters() if p.requires_grad and id(p) not in chosen]
        return [{"params": layers, "lr": lr}] + ([{"params": df, "lr": df_lr}] if df else [])

    @classmethod
    def from_data(
        cls,
        x: Tensor,
        variant: str = "mtaf",
        *,
        light_below: float = 0.1,
        bootstraps: int = 200,
        seed: int = 0,
        standardize: bool = True,
        **kwargs: object,
    ) -> TailAdaptive:
        r"""Estimate each feature's tail on training data `x` (`(N, D)`) and build the flow.

        The light/heavy decision and $\nu_j = 1/\hat\xi_j$ come from [`estimate_tails`][flowkit.stats.estimate_tails]; a
        $\nu_j$ below the floor is raised to `1.05 * min_df`. gTAF estimates nothing.

        With `standardize`, the flow starts with a fixed robust standardisation (`loc` the median, `scale` the
        interquartile range / 1.349, per feature, by
        [`Standardization.statistics`][flowkit.bijectors.standardization.Standardization.statistics]`(robust=True)`):
        a standard deviation is dominated by (at $\nu \le 2$ does not exist for) the very tails the flow
        should model. Do not standardise the data again around this flow. The flow takes the dtype of floating
        `x`; integer data is converted to the default floating dtype.

        Arguments:
            x: training data, `(N, D)`.
            variant: `"mtaf-fix"`, `"mtaf"` or `"gtaf"`.
            light_below: the light threshold of [`estimate_tail`][flowkit.stats.estimate_tail].
            bootstraps: double-bootstrap resamples per stage.
            seed: seed of the resampling.
            standardize: put the robust standardisation first.
            **kwargs: the other arguments of `TailAdaptive`.

        Raises:
            ValueError: for `x` that is not a real `(N, D)` tensor, non-finite values, a constant feature (named),
                or a feature whose tail cannot be estimated (see [`estimate_tail`][flowkit.stats.estimate_tail]).
        """
        where = "TailAdaptive.from_data"
        x = _training_data(x, where).detach()
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{where}: x contains {int((~torch.isfinite(x)).sum())} non-finite value(s)")
        constant = torch.nonzero((x == x[:1]).all(0)).flatten().tolist() if x.shape[0] else []
        if constant:
            raise ValueError(
                f"{where}: feature(s) {constant} are constant in the data: a density on them is a spike and their "
                "tails cannot be estimated; drop them (or add noise of the data's resolution)"
            )
        features = x.shape[1]
        if standardize:
            loc, scale = Standardization.statistics(x, robust=True)
            kwargs = {"loc": loc.tolist(), "scale": scale.tolist(), **kwargs}
        if variant == "gtaf":
            return cls(features, variant=variant, **kwargs).to(x.dtype)  # type: ignore[arg-type]
        floor = 1.05 * check_number(kwargs.get("min_df", 1.0), "min_df", where="TailAdaptive", positive=True)
        estimates = estimate_tails(x, light_below=light_below, bootstraps=bootstraps, seed=seed)
        df = [max(e.df, floor) if e.df is not None else None for e in estimates]
        return cls(features, df=df, variant=variant, **kwargs).to(x.dtype)  # type: ignore[arg-type]


class COMET(Flow):
    r"""COMET flow: fitted marginal CDFs with generalized Pareto tails, then a coupling flow on the copula.

    $x \mapsto z_0 = \Phi^{-1}(F(x))$ per feature through a fixed [`MarginalTailCDF`][flowkit.bijectors.MarginalTailCDF]
    (kernel density body, generalized Pareto tails; `output="logit"` uses a logit as the reference does), then
    `transforms` rational-quadratic spline couplings ([`NSF`][flowkit.flows.NSF] with `coupling=True`) to the base. The
    marginals are fitted, not trained: call [`fit_marginals`][flowkit.flows.COMET.fit_marginals] before training (or
    build with [`from_data`][flowkit.flows.COMET.from_data]); they are saved with the weights. The reference's SoftFlow
    noise is not used.

    Arguments:
        features: number of features `D`. With one feature the flow is the fitted marginal alone (no
            context, nothing to train).
        transforms: number of coupling layers.
        bins: spline bins.
        hidden: hidden sizes of each conditioner.
        bound: the spline interval half-width `B`.
        output: `"normal"` (Gaussian copula) or `"logit"`.
        knots: spline knots of each marginal's body.
        lower: the lower tail mass of the marginals.
        upper: the upper cut of the marginals.
        anchors: the most points each marginal's KDE is built on.
        context: number of context features.
        activation: conditioner activation.
        transformer: the coupling transformer instead of the spline.
        conditioner: a factory `conditioner(in_features, out_features, context=context)`.
        base: the latent distribution (standard normal by default).

    Examples:
        >>> import torch, flowkit
        >>> x = torch.distributions.StudentT(2.0).sample((2000, 2))
        >>> flow = flowkit.flows.COMET.from_data(x, transforms=2, hidden=(16,))
        >>> flow.log_prob(x[:3]).shape
        torch.Size([3])

    References:
        McDonald, Tan & Luo, *COMET Flows: Towards Generative Modeling of Multivariate Extremes and Tail
        Dependence*, 2022 (arXiv:2205.01224).
    """

    def __init__(
        self,
        features: int,
        transforms: int = 5,
        bins: int = 8,
        hidden: Sequence[int] = (64, 64),
        bound: float = 4.0,
        output: str = "normal",
        knots: int = 256,
        lower: float = 0.05,
        upper: float = 0.95,
        anchors: int = 1000,
        context: int = 0,
        activation: str = "relu",
        *,
        transformer: Transformer | None = None,
        conditioner: ConditionerFactory | None = None,
        base: Distribution | None = None,
    ) -> None:
        check_number(features, "features", where="COMET", integer=True, low=1)
        marginals = MarginalTailCDF(features, knots, lower, upper, anchors, output)
        if features == 1:  # a one-dimensional copula is the base itself: nothing to couple
            sizes = {"transforms": (transforms, 1), "context": (context, 0), "bins": (bins, 1)}
            _checked("COMET", transformer, conditioner, sizes, hidden)
            if context:
                raise ValueError(
                    "COMET: with one feature COMET is its fitted marginal alone, which takes no context; "
                    "use NSF(1, context=...) for a conditional one-dimensional flow"
                )
            super().__init__(Chain(marginals), _base(base, features))
            return
        copula = NSF(
            features,
            transforms,
            bins,
            hidden,
            coupling=True,
            bound=bound,
            context=context,
            activation=activation,
            transformer=transformer,
            conditioner=conditioner,
            permutations="random",  # COMET's copula as it was measured (the NSF defaults changed in issue 38)
            near_identity=False,
        )
        super().__init__(Chain(marginals, *copula.bijector), _base(base, features))

    @property
    def marginals(self) -> MarginalTailCDF:
        """The fitted marginal layer."""
        return self.bijector[0]

    def fit_marginals(self, x: Tensor) -> COMET:
        """Fit the marginal CDFs to training data `x` (`(N, D)`, in place); returns the flow."""
        self.marginals.fit(x)
        return self

    @classmethod
    def from_data(cls, x: Tensor, **kwargs: object) -> COMET:
        """A COMET flow on the features of `x` (`(N, D)`) with its marginals fitted to `x`.

        The flow takes the dtype of floating `x`; integer (or boolean) data is converted to the default dtype.

        Arguments:
            x: training data.
            **kwargs: the other arguments of `COMET`.

        Raises:
            ValueError: for `x` that is not a real tensor of shape `(N, D)`, or whose features cannot be fitted
                (see [`MarginalTailCDF.fit`][flowkit.bijectors.MarginalTailCDF.fit]).
        """
        x = _training_data(x, "COMET.from_data")
        flow = cls(x.shape[1], **kwargs)  # type: ignore[arg-type]
        return flow.to(x.dtype).fit_marginals(x)


preset("comet", "copula NSF, fitted marginals", kind="data", transforms=5, hidden=(64, 64), bins=8)(COMET.from_data)


@preset("gtaf", "gTAF: Student-t marginals", kind="data", variant="gtaf", transforms=5, hidden=(64, 64), bins=8)
@preset("mtaf", "mTAF: estimated Student-t tails", kind="data", variant="mtaf", transforms=5, hidden=(64, 64), bins=8)
@preset("mtaf-fix", "mTAF, tails fixed", kind="data", variant="mtaf-fix", transforms=5, hidden=(64, 64), bins=8)
@preset("tail-adaptive", "the same as mtaf", kind="data", variant="mtaf", transforms=5, hidden=(64, 64), bins=8)
def _tail_adaptive(x: Tensor, **arguments: object) -> TailAdaptive:
    return TailAdaptive.from_data(x, **arguments)  # type: ignore[arg-type]
