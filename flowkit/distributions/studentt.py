r"""Heavy-tailed bases: a product of Student-t densities, and the per-dimension Gaussian/Student-t product of mTAF.

A flow whose transforms are Lipschitz keeps the tail class of its base (Jaini et al. 2020;
Laszkiewicz et al. 2022), so a Gaussian base gives Gaussian tails whatever the data. These bases
give each dimension a Student-t marginal with $\nu_j$ degrees of freedom (tail index $\nu_j$:
$P(|z_j| > t) \sim t^{-\nu_j}$), or a Gaussian one.

Degrees of freedom are kept above a floor $\nu_{\min}$ by a softplus offset,
$\nu = \nu_{\min} + \operatorname{softplus}(\hat\nu)$, so a learnt $\nu$ never reaches 0
(at $\nu \le 2$ the variance is infinite, at $\nu \le 1$ the mean). The log density uses
`log1p`, and samples are $z = \varepsilon \sqrt{\nu / (2 g)}$ with $\varepsilon \sim \mathcal N(0, 1)$ and
$g \sim \mathrm{Gamma}(\nu / 2, 1)$ clamped away from 0 (both reparameterised), so they stay finite
at small $\nu$ in float32.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._config import get_config
from .._validation import check_number
from ..utils import sum_event
from .base import Distribution, as_shape

__all__ = ["StudentT", "TailAdaptiveBase"]

_LOG_2PI = math.log(2 * math.pi)


def _raw_df(df: Sequence[float], min_df: float, where: str) -> Tensor:
    """The unconstrained `log(expm1(df - min_df))` of checked degrees of freedom."""
    for value in df:
        check_number(value, "df", where=where, positive=True)
        if not value > min_df:
            raise ValueError(
                f"{where}: df must be above min_df={min_df:g} (the floor the softplus offset keeps), got {value!r}; "
                "lower min_df for heavier tails"
            )
    gap = torch.tensor([float(v) - min_df for v in df], dtype=torch.float64)
    return (gap + torch.log(-torch.expm1(-gap))).to(torch.get_default_dtype())  # log(expm1(gap)), stable


def _hold_df(module: nn.Module, raw: Tensor, learn: bool) -> None:
    """Keep the unconstrained degrees of freedom as the parameter `df_raw` (`learn`) or as a buffer."""
    if learn:
        module.df_raw = nn.Parameter(raw)
    else:
        module.register_buffer("df_raw", raw)


# log Γ(a + 1/2) - log Γ(a) - log(a) / 2 = Σ_k c_k a^(1 - 2k) for large a (error below 2e-15 at a >= 15).
_SERIES = (-1 / 8, 1 / 192, -1 / 640, 17 / 14336, -31 / 18432)
_SERIES_FROM = 15.0


def _student_log_normaliser(df: Tensor) -> Tensor:
    r"""$\log\Gamma(\frac{\nu+1}{2}) - \log\Gamma(\frac{\nu}{2}) - \frac12\log(\nu\pi)$, computed in float64.

    The two log-gammas nearly cancel at large $\nu$ (float32 lost the whole answer at $\nu = 10^7$), so for
    $\nu / 2 \ge 15$ the difference is the asymptotic series $\frac12 \log\frac{\nu}{2} + \sum_k c_k (\nu/2)^{1-2k}$,
    which leaves $-\frac12\log(2\pi) + \sum_k c_k (\nu/2)^{1-2k}$ and tends to the Gaussian's normaliser.
    """
    a = 0.5 * df.double()
    small = a.clamp_max(_SERIES_FROM)  # each branch of torch.where sees finite inputs (finite gradients)
    direct = torch.lgamma(small + 0.5) - torch.lgamma(small) - 0.5 * torch.log(2 * math.pi * small)
    large = a.clamp_min(_SERIES_FROM)
    inverse_square = large.reciprocal().square()
    series = torch.zeros_like(large)
    for c in reversed(_SERIES):
        series = series * inverse_square + c
    series = series / large - 0.5 * _LOG_2PI
    return torch.where(a < _SERIES_FROM, direct, series)


def _log1p_square(x: Tensor, df: Tensor) -> Tensor:
    r"""$\log(1 + x^2 / \nu)$ without squaring a large $|x|$ (1e20 overflowed float32 to inf).

    For $|x| > \sqrt\nu$ it is $2 \log|x| - \log\nu + \log(1 + \nu / x^2)$, with $\nu / x^2 = (\sqrt\nu / |x|)^2 < 1$.
    """
    root = df.sqrt()
    inside = torch.minimum(torch.maximum(x, -root), root)  # each branch of torch.where sees its own range
    outside = torch.maximum(x.abs(), root)
    near = torch.log1p((inside / root).square())
    far = 2 * torch.log(outside) - torch.log(df) + torch.log1p((root / outside).square())
    return torch.where(x.abs() <= root, near, far)


def _student_log_density(x: Tensor, df: Tensor) -> Tensor:
    r"""Elementwise $\log t_\nu(x)$ of the standard Student-t."""
    norm = _student_log_normaliser(df).to(torch.result_type(x, df))
    return norm - 0.5 * (df + 1) * _log1p_square(x, df)


def _student_sample(shape: torch.Size, df: Tensor) -> Tensor:
    """Reparameterised standard Student-t draws of shape `(*shape, *df.shape)`."""
    eps = torch.randn(*shape, *df.shape, dtype=df.dtype, device=df.device)
    concentration = (0.5 * df).expand(*shape, *df.shape)
    gamma = torch.distributions.Gamma(concentration, torch.ones_like(concentration)).rsample()
    gamma = gamma.clamp_min(torch.finfo(df.dtype).tiny)
    return eps * torch.sqrt(0.5 * df / gamma)


class StudentT(Distribution):
    r"""Product of standard Student-t densities with per-dimension degrees of freedom $\nu_j$.

    $$
    \log p(z) = \sum_j \log\Gamma\!\left(\tfrac{\nu_j + 1}{2}\right) - \log\Gamma\!\left(\tfrac{\nu_j}{2}\right)
    - \tfrac12 \log(\nu_j \pi) - \tfrac{\nu_j + 1}{2} \log\!\left(1 + \tfrac{z_j^2}{\nu_j}\right),
    \qquad \nu_j = \nu_{\min} + \operatorname{softplus}(\hat\nu_j).
    $$

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        df: degrees of freedom $\nu > \nu_{\min}$: one number for every element, or a list (or a 1-d tensor of
            any real dtype) with one per element of a vector event.
        learn_df: whether $\hat\nu$ is a trained parameter (TAF, gTAF) or a fixed buffer.
        min_df: the floor $\nu_{\min} > 0$ kept by the softplus offset.

    Raises:
        ValueError: for an empty event, `df <= min_df`, `min_df <= 0`, a `df` that is not a number, a list of
            numbers or a tensor (a string), or a list of `df` whose length is not `D`.

    Examples:
        >>> import torch, flowkit
        >>> base = flowkit.distributions.StudentT(2, df=[2.0, 5.0])
        >>> base.log_prob(torch.zeros(4, 2)).shape
        torch.Size([4])

    References:
        Jaini, Kobyzev, Yu & Brubaker, *Tails of Lipschitz Triangular Flows*, ICML 2020 (arXiv:1907.04481).
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        df: float | Sequence[float] = 3.0,
        learn_df: bool = False,
        min_df: float = 1.0,
    ) -> None:
        super().__init__()
        self.event_shape = as_shape(event_shape)
        if self.event_shape.numel() == 0:
            raise ValueError(f"StudentT: the event must hold at least one element, got shape {tuple(self.event_shape)}")
        self.min_df = check_number(min_df, "min_df", where="StudentT", positive=True)
        per_element = isinstance(df, Tensor) and df.dim() > 0
        if isinstance(df, Tensor):
            if df.dim() > 1 or df.is_complex() or df.dtype == torch.bool:
                raise ValueError(
                    f"StudentT: a tensor of df must be a real scalar or vector, got {df.dtype} {tuple(df.shape)}"
                )
            df = df.detach().cpu().double().tolist()  # a JSON-friendly list (or number) for io.save
            get_config(self)[1]["df"] = df
        elif isinstance(df, (str, bytes)) or not isinstance(df, (numbers.Real, Sequence)):
            raise ValueError(
                f"StudentT: df must be a number, a list of numbers or a tensor, got {type(df).__name__} {df!r}"
            )
        else:
            per_element = isinstance(df, Sequence)
        values = list(df) if per_element else [df]
        if per_element and (len(self.event_shape) != 1 or len(values) != self.event_shape[0]):
            raise ValueError(
                f"StudentT: a list of df needs one value per element of a vector event {tuple(self.event_shape)}, "
                f"got {len(values)}"
            )
        _hold_df(self, _raw_df(values, self.min_df, "StudentT").expand(self.event_shape).clone(), learn_df)

    @property
    def df(self) -> Tensor:
        r"""The degrees of freedom $\nu_{\min} + \operatorname{softplus}(\hat\nu)$, of the event shape."""
        return self.min_df + F.softplus(self.df_raw)

    def log_prob(self, x: Tensor) -> Tensor:
        return sum_event(_student_log_density(x, self.df), len(self.event_shape))

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        return _student_sample(as_shape(shape), self.df)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, min_df={self.min_df:g}"


class TailAdaptiveBase(Distribution):
    r"""The mTAF base: a product of Gaussian marginals and Student-t marginals, chosen per dimension.

    $$
    p(z) = \prod_{j \in \text{light}} \mathcal N(z_j; 0, 1) \prod_{j \in \text{heavy}} t_{\nu_j}(z_j),
    $$

    with $\nu_j = \nu_{\min} + \operatorname{softplus}(\hat\nu_j)$ as in [`StudentT`][flowkit.distributions.StudentT].

    Arguments:
        df: one entry per dimension: `None` for a Gaussian (light) marginal, a number $\nu_j > \nu_{\min}$
            for a Student-t (heavy) one.
        learn_df: whether the heavy marginals' $\hat\nu$ are trained (mTAF) or fixed (mTAF fix).
        min_df: the floor $\nu_{\min} > 0$.

    Examples:
        >>> import torch, flowkit
        >>> base = flowkit.distributions.TailAdaptiveBase([None, None, 2.0])
        >>> base.heavy.tolist()
        [False, False, True]

    References:
        Laszkiewicz, Lederer & Fischer, *Marginal Tail-Adaptive Normalizing Flows*, ICML 2022 (arXiv:2206.10311).
    """

    def __init__(self, df: Sequence[float | None], learn_df: bool = False, min_df: float = 1.0) -> None:
        super().__init__()
        if isinstance(df, (str, bytes)) or not isinstance(df, Sequence) or not df:
            raise ValueError(f"TailAdaptiveBase: df must be a non-empty list of numbers or None, got {df!r}")
        self.event_shape = torch.Size([len(df)])
        self.min_df = check_number(min_df, "min_df", where="TailAdaptiveBase", positive=True)
        heavy = [value is not None for value in df]
        self.register_buffer("heavy", torch.tensor(heavy), persistent=False)
        raw = torch.zeros(len(df))
        if any(heavy):
            values = [float(check_number(v, "df", where="TailAdaptiveBase")) for v in df if v is not None]
            raw[torch.tensor(heavy)] = _raw_df(values, self.min_df, "TailAdaptiveBase")
        _hold_df(self, raw, learn_df)  # a Gaussian marginal's entry is unused (and gets no gradient)

    @property
    def df(self) -> Tensor:
        r"""Degrees of freedom per dimension (`inf` for a Gaussian marginal)."""
        return torch.where(self.heavy, self.min_df + F.softplus(self.df_raw), math.inf)

    def _heavy_df(self) -> Tensor:
        # A finite stand-in on the light dimensions keeps both branches of torch.where finite.
        return torch.where(self.heavy, self.min_df + F.softplus(self.df_raw), 1.0)

    def log_prob(self, x: Tensor) -> Tensor:
        gaussian = -0.5 * x.square() - 0.5 * _LOG_2PI
        return torch.where(self.heavy, _student_log_density(x, self._heavy_df()), gaussian).sum(-1)

    def rsample(self, shape: int | Sequence[int] = ()) -> Tensor:
        shape = as_shape(shape)
        student = _student_sample(shape, self._heavy_df())
        gaussian = torch.randn_like(student)
        return torch.where(self.heavy, student, gaussian)

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}, heavy={int(self.heavy.sum())}, min_df={self.min_df:g}"
