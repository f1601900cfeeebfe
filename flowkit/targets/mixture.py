"""FAB's Gaussian-mixture target: many well-separated isotropic Gaussians in a box."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

from .._validation import check_number
from .base import Target

__all__ = ["GaussianMixture"]


class GaussianMixture(Target):
    r"""Equal-weight mixture of `n_modes` isotropic Gaussians, normalised ($\log Z = 0$).

    $$
    p(x) = \frac1K \sum_k \mathcal N(x; \mu_k, \sigma^2 I), \qquad
    \mu_k \sim \mathcal U[-s, s]^d,
    $$

    with $\sigma = \mathrm{softplus}(1) \approx 1.313$ and `s = 40` as in FAB's GMM-40. The means are drawn
    once from a private generator seeded by `seed` and kept in a buffer.

    Arguments:
        n_modes: number of components `K`.
        dim: dimension `d`.
        seed: seed of the means.
        loc_scaling: half-width `s` of the box of means.
        scale: standard deviation of every component.

    References:
        Midgley et al., *Flow annealed importance sampling bootstrap*, ICLR 2023 (arXiv:2208.01893).
    """

    has_samples = True
    log_Z = 0.0

    def __init__(
        self,
        n_modes: int = 40,
        dim: int = 2,
        seed: int = 0,
        loc_scaling: float = 40.0,
        scale: float = float(F.softplus(torch.tensor(1.0))),
    ) -> None:
        super().__init__()
        where = "GaussianMixture"
        n_modes = check_number(n_modes, "n_modes", where=where, integer=True, low=1)
        dim = check_number(dim, "dim", where=where, integer=True, low=1)
        seed = check_number(seed, "seed", where=where, integer=True, low=0)
        loc_scaling = check_number(loc_scaling, "loc_scaling", where=where, low=0)
        self.event_shape = torch.Size([dim])
        self.scale = check_number(scale, "scale", where=where, positive=True)
        generator = torch.Generator().manual_seed(seed)
        means = (torch.rand(n_modes, dim, generator=generator, dtype=torch.float64) - 0.5) * 2 * loc_scaling
        self.register_buffer("means", means.to(torch.get_default_dtype()))

    @property
    def n_modes(self) -> int:
        return self.means.shape[0]

    def _component_log_probs(self, x: Tensor) -> Tensor:
        """Log densities of the components at `x`, `(..., n_modes)`, in float64 (or wider) for range."""
        d = self.event_shape[0]
        y = x.to(torch.promote_types(x.dtype, torch.float64))
        sq = (y.unsqueeze(-2) - self.means.to(y)).square().sum(-1) / self.scale**2
        return -0.5 * sq - d * math.log(self.scale) - 0.5 * d * math.log(2 * math.pi)

    def _energy(self, x: Tensor) -> Tensor:
        return -(torch.logsumexp(self._component_log_probs(x), -1) - math.log(self.n_modes)).to(x.dtype)

    def _force(self, x: Tensor) -> Tensor:
        # -grad u = sum_k w_k (mu_k - x) / sigma^2 with the posterior weights w of the components.
        log_p = self._component_log_probs(x)
        w = torch.softmax(log_p, -1)
        # So far out that every component underflows: the nearest mean (in the max norm, which cannot overflow).
        y = x.to(log_p.dtype)
        diff = self.means.to(y) - y.unsqueeze(-2)
        nearest = torch.nn.functional.one_hot(diff.abs().amax(-1).argmin(-1), self.n_modes).to(w)
        w = torch.where(torch.isfinite(log_p).any(-1, keepdim=True), w, nearest)
        return ((w.unsqueeze(-1) * diff).sum(-2) / self.scale**2).to(x.dtype)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        means = self.means
        pick = torch.randint(0, self.n_modes, (n,), generator=generator, device=means.device)
        noise = torch.randn(n, self.event_shape[0], generator=generator, dtype=means.dtype, device=means.device)
        return self.means[pick] + self.scale * noise

    def mode_counts(self, x: Tensor, radius: float = 4.0) -> Tensor:
        """Number of samples within `radius` standard deviations of each mean, `(n_modes,)` (`> 0`: modes covered)."""
        self._check(x, "mode_counts")
        x = x.reshape(-1, self.event_shape[0])
        dist = torch.cdist(x.to(self.means), self.means)
        nearest, which = dist.min(-1)
        which = which[nearest < radius * self.scale]
        return torch.bincount(which, minlength=self.n_modes)

    def extra_repr(self) -> str:
        return f"n_modes={self.n_modes}, dim={self.event_shape[0]}"
