"""Fixed elementwise standardisation, stored with the model so that densities stay in data units."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from statistics import NormalDist

import torch
from torch import Tensor

from .base import Bijector

__all__ = ["Standardization"]

#: The interquartile range of a standard normal, $2\,\Phi^{-1}(3/4) \approx 1.349$.
_IQR_PER_SIGMA = 2 * NormalDist().inv_cdf(0.75)


def _column_quantiles(x: Tensor, probs: Sequence[float]) -> Tensor:
    """Quantiles of each column of `x` (`(N, D)`) at `probs`, `(len(probs), D)`, by linear interpolation.

    One sort instead of `torch.quantile`, which refuses inputs of more than 2**24 elements.
    """
    ordered = x.sort(0).values
    position = torch.tensor(probs, dtype=x.dtype, device=x.device) * (x.shape[0] - 1)
    below = position.floor().long()
    above = torch.clamp(below + 1, max=x.shape[0] - 1)
    weight = (position - below)[:, None]
    return ordered[below] * (1 - weight) + ordered[above] * weight


class Standardization(Bijector):
    r"""Fixed affine map `z = (x - loc) / scale` per feature, with its constant log-determinant.

    Put it first in a flow's chain (data side) so that the rest of the flow
    sees standardised data while `log_prob` is reported in the original
    units:

    $$
    \log|\det \partial z / \partial x| = -\sum_i \log s_i .
    $$

    `loc` and `scale` are buffers (not trained); they travel with the
    model through [`flowkit.io`][flowkit.io]. Build one from training data with
    [`from_data`][flowkit.bijectors.standardization.Standardization.from_data].

    Arguments:
        loc: per-feature location `m` (a list of `D` numbers).
        scale: per-feature scale `s > 0` (a list of `D` numbers).

    Examples:
        >>> import torch, flowkit
        >>> x = torch.randn(100, 3) * 5 + 2
        >>> b = flowkit.bijectors.Standardization.from_data(x)
        >>> z, ladj = b(x)
    """

    ladj_is_constant = True
    standardizes_data = True

    def __init__(self, loc: Sequence[float], scale: Sequence[float]) -> None:
        super().__init__()
        loc_t = torch.as_tensor(loc, dtype=torch.get_default_dtype())
        scale_t = torch.as_tensor(scale, dtype=torch.get_default_dtype())
        if loc_t.dim() != 1 or scale_t.shape != loc_t.shape:
            raise ValueError(
                f"Standardization: loc and scale must be lists of the same length, got shapes "
                f"{tuple(loc_t.shape)} and {tuple(scale_t.shape)}"
            )
        if not bool(torch.isfinite(loc_t).all() and torch.isfinite(scale_t).all()):
            raise ValueError("Standardization: loc and scale must be finite")
        if not bool((scale_t > 0).all()):
            raise ValueError(f"Standardization: scale must be positive, got minimum {float(scale_t.min())}")
        self.event_shape = torch.Size([loc_t.shape[0]])
        self._exact = torch.stack(
            [torch.as_tensor(loc, dtype=torch.float64), torch.as_tensor(scale, dtype=torch.float64)]
        )
        self.register_buffer("loc", loc_t)
        self.register_buffer("scale", scale_t)

    def _apply(self, fn: Callable, recurse: bool = True) -> Standardization:
        # A dtype change re-reads the exact statistics: converting float32 buffers
        # to float64 would keep their float32 rounding.
        super()._apply(fn, recurse)
        self.loc = self._exact[0].to(self.loc)
        self.scale = self._exact[1].to(self.scale)
        return self

    @staticmethod
    def statistics(x: Tensor, robust: bool = False, min_scale: float = 1e-6) -> tuple[Tensor, Tensor]:
        r"""Per-feature `(loc, scale)` of `x` (shape `(N, D)`), in float64.

        By default the mean and the standard deviation. With `robust`, the median and the
        interquartile range in units of a Gaussian standard deviation,

        $$
        m = \operatorname{median}(x), \qquad s = \frac{q_{0.75} - q_{0.25}}{2\,\Phi^{-1}(0.75)}
        \approx \frac{\mathrm{IQR}}{1.349},
        $$

        (quantiles by linear interpolation, as numpy's default), which equals the standard deviation
        on Gaussian data. For heavy tails the moments are the wrong scale: the standard deviation is
        dominated by the few extreme points (and at tail index $\nu \le 2$ does not exist), so dividing
        by it squeezes the body of the distribution. A feature whose IQR is 0 (more than half of
        its points tied) falls back to its standard deviation.

        Arguments:
            x: training data, `(N, D)` with `N >= 2`, finite.
            robust: median and IQR / 1.349 instead of mean and standard deviation.
            min_scale: lower bound on the scale, for constant features (warned about).

        Raises:
            ValueError: for a non-tensor, a shape other than `(N >= 2, D)`, or non-finite values.
        """
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[0] < 2:
            raise ValueError("Standardization.from_data: x must be a tensor of shape (N, D) with N >= 2")
        x = x.detach().double()
        if not bool(torch.isfinite(x).all()):
            raise ValueError("Standardization.from_data: x has non-finite values (NaN or inf)")
        std = x.std(0)
        if robust:
            lower, loc, upper = _column_quantiles(x, (0.25, 0.5, 0.75))
            scale = torch.where(upper > lower, (upper - lower) / _IQR_PER_SIGMA, std)
        else:
            loc, scale = x.mean(0), std
        constant = torch.nonzero(scale < min_scale).flatten().tolist()
        if constant:
            warnings.warn(
                f"Standardization.from_data: feature(s) {constant} are constant in the data; their scale is set to "
                f"{min_scale}, so a density there is a spike and log-likelihoods are not meaningful",
                RuntimeWarning,
                stacklevel=3,
            )
        return loc, scale.clamp_min(min_scale)

    @classmethod
    def from_data(cls, x: Tensor, min_scale: float = 1e-6, robust: bool = False) -> Standardization:
        """Standardisation with the mean and standard deviation of `x` (shape `(N, D)`), or robust statistics.

        Arguments:
            x: training data.
            min_scale: lower bound on the scale, for constant features.
            robust: the median and the interquartile range / 1.349 (see
                [`statistics`][flowkit.bijectors.standardization.Standardization.statistics]), for heavy tails.

        Examples:
            >>> import torch, flowkit
            >>> x = torch.distributions.StudentT(1.5).sample((10_000, 1))
            >>> plain = flowkit.bijectors.Standardization.from_data(x)
            >>> robust = flowkit.bijectors.Standardization.from_data(x, robust=True)
            >>> bool(robust.scale < plain.scale)
            True
        """
        loc, scale = cls.statistics(x, robust, min_scale)
        return cls(loc.tolist(), scale.tolist())

    def _ladj(self, batch: torch.Size) -> Tensor:
        return (-self.scale.log().sum()).expand(batch)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return (x - self.loc) / self.scale, self._ladj(x.shape[:-1])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return z * self.scale + self.loc, -self._ladj(z.shape[:-1])

    def extra_repr(self) -> str:
        return f"features={self.event_shape[0]}"
