r"""Boltzmann-generator training: reverse KL to the target energy mixed with maximum likelihood on samples.

$$
\mathcal L = w_{KL}\, E_{z}[u(T(z)) + \log q(T(z))] + w_{ML}\, E_{x \sim \text{samples}}[-\log q(x)]
+ w_F\, E_{x \sim \text{samples}}\|\nabla_x \log q(x) + \nabla_x u(x)\|^2
$$

(Noé et al. 2019): the mode-seeking KL term needs only the energy; the mass-covering ML term, on samples from
MD or MCMC, keeps the flow from dropping modes. A [`StochasticFlow`][flowkit.flows.StochasticFlow] (Wu et al.
2020) uses its path weights and path likelihood.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_tensor
from ..flows.base import FlowModel, require_exact_weights
from ..targets import Target
from .force_matching import force_matching_terms
from .objective import Objective
from .pathgrad import ESTIMATORS, _check_flow, _latent, _weight_metrics, forward_kl_loss, reverse_kl_loss

__all__ = ["BoltzmannGenerator"]

_ML_ESTIMATORS = ("nll", "path")


class BoltzmannGenerator(Objective):
    """Weighted reverse KL to a target plus maximum likelihood on (optional) target samples.

    `loss(flow, z)` takes the latent batch `z` the fit loop draws; the objective draws a batch of its samples,
    of the same size, at each call.

    Arguments:
        target: the [`Target`][flowkit.targets.Target].
        samples: configurations `(N, *event_shape)` from the target (MD, MCMC or exact), or None.
        w_ml: weight of the maximum-likelihood term (ignored without samples).
        w_kl: weight of the reverse-KL term.
        estimator: the KL term's gradient estimator, `"fast"`, `"standard"` or `"reparam"` (see
            [`PathGradientVI`][flowkit.train.PathGradientVI]; a stochastic flow's is always `"reparam"`).
        ml_estimator: `"nll"` (plain maximum likelihood) or `"path"` (the forward-KL path gradient).
        w_force: weight of the force-matching term on the samples ([`ForceMatching`][flowkit.train.ForceMatching];
            needs `ml_estimator="nll"`).

    Attributes:
        default_clip: 10, the gradient-norm clip [`fit`][flowkit.train.fit] uses unless given one.

    `metrics` gives `kl`, `nll` (and `force_loss`) of the batch and the KL batch's ESS and log Z estimate.

    References:
        Noé, Olsson, Köhler & Wu, *Boltzmann generators: sampling equilibrium states
        of many-body systems with deep learning*, Science 365 (2019) (arXiv:1812.01729);
        Wu, Köhler & Noé, *Stochastic normalizing flows*, NeurIPS 2020 (arXiv:2002.06707).
    """

    needs_data = False
    default_clip = 10.0

    def __init__(
        self,
        target: Target,
        samples: Tensor | None = None,
        w_ml: float = 1.0,
        w_kl: float = 1.0,
        estimator: str = "fast",
        ml_estimator: str = "nll",
        w_force: float = 0.0,
    ) -> None:
        if not isinstance(target, Target):
            raise ValueError(
                f"BoltzmannGenerator: target must be a flowkit.targets.Target, got {type(target).__name__}"
            )
        if estimator not in ESTIMATORS:
            raise ValueError(f"BoltzmannGenerator: unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
        if ml_estimator not in _ML_ESTIMATORS:
            raise ValueError(
                f"BoltzmannGenerator: unknown ml_estimator {ml_estimator!r}; choose one of {_ML_ESTIMATORS}"
            )
        if w_ml < 0 or w_kl < 0 or w_force < 0:
            raise ValueError(
                f"BoltzmannGenerator: weights must be non-negative, got w_ml={w_ml}, w_kl={w_kl}, w_force={w_force}"
            )
        if w_force > 0 and ml_estimator != "nll":
            raise ValueError("BoltzmannGenerator: w_force > 0 needs ml_estimator='nll'")
        if samples is not None:
            check_tensor(samples, target.event_shape, name="samples", where="BoltzmannGenerator")
            if samples.dim() != len(target.event_shape) + 1 or samples.shape[0] < 1:
                raise ValueError(
                    f"BoltzmannGenerator: samples must have shape (N, {', '.join(map(str, target.event_shape))}), "
                    f"got {tuple(samples.shape)}"
                )
        if w_kl == 0 and (samples is None or (w_ml == 0 and w_force == 0)):
            raise ValueError("BoltzmannGenerator: every term is switched off (w_kl = 0 and no ML or force term)")
        self.target = target
        self.samples = samples
        self.w_ml = float(w_ml) if samples is not None else 0.0
        self.w_kl = float(w_kl)
        self.estimator = estimator
        self.ml_estimator = ml_estimator
        self.w_force = float(w_force) if samples is not None else 0.0
        self._last: dict[str, Tensor] = {}

    def _kl(self, flow: FlowModel, z: Tensor) -> tuple[Tensor, Tensor]:
        # Path-gradient estimators walk an exact bijection's layers; a StochasticFlow trains by its path weights.
        estimator = self.estimator if flow.bijective else "reparam"
        return reverse_kl_loss(flow, self.target, z, estimator)

    def _nll(self, flow: FlowModel, n: int, like: Tensor) -> tuple[Tensor, Tensor | None]:
        """The ML term on a fresh batch of samples, and the force-matching term on it (None unless `w_force`)."""
        assert self.samples is not None
        index = torch.randint(0, self.samples.shape[0], (n,), device=self.samples.device)
        x = self.samples[index].to(device=like.device, dtype=like.dtype)
        if self.w_force > 0:
            if not flow.exact_log_prob:
                raise ValueError("BoltzmannGenerator: w_force > 0 needs a flow with an exact density")
            return force_matching_terms(flow, self.target, x)
        if self.ml_estimator == "path" and flow.bijective:
            return forward_kl_loss(flow, self.target, x), None
        return -flow.path_log_likelihood(x).mean(), None

    def loss(self, flow: FlowModel, batch: Tensor | int) -> Tensor:
        _check_flow(flow, self.target, "BoltzmannGenerator", exact=False)
        if self.w_kl > 0:  # the reverse-KL term weights the flow's own samples
            require_exact_weights(flow, "BoltzmannGenerator")
        z = _latent(flow, batch, "BoltzmannGenerator")
        total = z.new_zeros(())
        self._last = {}
        if self.w_kl > 0:
            kl, self._last["log_w"] = self._kl(flow, z)
            self._last["kl"] = kl.detach()
            total = total + self.w_kl * kl
        if self.w_ml > 0 or self.w_force > 0:
            nll, force_loss = self._nll(flow, z.shape[0], z)
            self._last["nll"] = nll.detach()
            total = total + self.w_ml * nll
            if force_loss is not None:
                self._last["force_loss"] = force_loss.detach()
                total = total + self.w_force * force_loss
        return total

    def validation_loss(self, flow: FlowModel, batch: Tensor) -> Tensor:
        """The held-out negative log-likelihood of target samples (`fit(..., val_data=samples)`), e.g. MD frames."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        with torch.no_grad():
            return -flow.path_log_likelihood(x).mean()

    def metrics(self) -> dict[str, float]:
        out = {name: float(self._last[name]) for name in ("kl", "nll", "force_loss") if name in self._last}
        out.update(_weight_metrics(self._last.get("log_w")))
        return out
