r"""Boltzmann-generator training: reverse KL to the target energy mixed with maximum likelihood on samples.

$$
\mathcal L = w_{KL}\, E_{z}[u(T(z)) + \log q(T(z))] + w_{ML}\, E_{x \sim \text{samples}}[-\log q(x)]
$$

(Noé et al. 2019). The KL term is mode-seeking and needs only the energy; the
ML term, on samples from MD or MCMC, is mass-covering and keeps the flow from
dropping modes. Stochastic normalizing flows ([`StochasticFlow`][flowkit.stochastic.StochasticFlow],
Wu et al. 2020) use their path weights for the KL term and their path
likelihood for the ML term.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_tensor
from ..flows import Flow
from ..targets import Target
from .objective import Objective
from .pathgrad import ESTIMATORS, _check_flow, _latent, _weight_metrics, forward_kl_loss, reverse_kl_loss

__all__ = ["BoltzmannGenerator"]

_ML_ESTIMATORS = ("nll", "path")


class BoltzmannGenerator(Objective):
    """Weighted reverse KL to a target plus maximum likelihood on (optional) target samples.

    `loss(flow, z)` takes the latent batch `z` the fit loop draws from the
    base (`needs_data` is False); when samples are given, the objective
    draws its own batch of them, of the same size, at each call.

    Arguments:
        target: the [`Target`][flowkit.targets.Target].
        samples: configurations `(N, *event_shape)` from the target (MD, MCMC or
            exact), or None for energy-only training.
        w_ml: weight of the maximum-likelihood term (ignored without samples).
        w_kl: weight of the reverse-KL term.
        estimator: gradient estimator of the KL term: `"fast"`, `"standard"`
            or `"reparam"` (see [`PathGradientVI`][flowkit.train.PathGradientVI]); a
            [`StochasticFlow`][flowkit.stochastic.StochasticFlow] always trains by its
            reparameterised path weights.
        ml_estimator: `"nll"` (plain maximum likelihood) or `"path"` (the
            forward-KL path gradient, which also uses the target's forces at the samples).

    Attributes:
        needs_data: False; samples are held by the objective, not fed by the loop.

    After each call, `metrics` gives `kl` and `nll` of the batch and
    the ESS and log Z estimate of the KL batch.

    References:
        Noé, Olsson, Köhler & Wu, *Boltzmann generators: sampling equilibrium states
        of many-body systems with deep learning*, Science 365 (2019) (arXiv:1812.01729);
        Wu, Köhler & Noé, *Stochastic normalizing flows*, NeurIPS 2020 (arXiv:2002.06707).
    """

    needs_data = False

    def __init__(
        self,
        target: Target,
        samples: Tensor | None = None,
        w_ml: float = 1.0,
        w_kl: float = 1.0,
        estimator: str = "fast",
        ml_estimator: str = "nll",
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
        if w_ml < 0 or w_kl < 0:
            raise ValueError(f"BoltzmannGenerator: weights must be non-negative, got w_ml={w_ml}, w_kl={w_kl}")
        if samples is not None:
            check_tensor(samples, target.event_shape, name="samples", where="BoltzmannGenerator")
            if samples.dim() != len(target.event_shape) + 1 or samples.shape[0] < 1:
                raise ValueError(
                    f"BoltzmannGenerator: samples must have shape (N, {', '.join(map(str, target.event_shape))}), "
                    f"got {tuple(samples.shape)}"
                )
        if w_kl == 0 and (samples is None or w_ml == 0):
            raise ValueError("BoltzmannGenerator: both terms are switched off (w_kl = 0 and no ML term)")
        self.target = target
        self.samples = samples
        self.w_ml = float(w_ml) if samples is not None else 0.0
        self.w_kl = float(w_kl)
        self.estimator = estimator
        self.ml_estimator = ml_estimator
        self._last: dict[str, Tensor] = {}

    def _kl(self, flow: Any, z: Tensor) -> tuple[Tensor, Tensor]:
        # Path-gradient estimators need a Flow's exact density; a StochasticFlow trains by its path weights.
        estimator = self.estimator if isinstance(flow, Flow) else "reparam"
        return reverse_kl_loss(flow, self.target, z, estimator)

    def _nll(self, flow: Any, n: int, like: Tensor) -> Tensor:
        assert self.samples is not None
        index = torch.randint(0, self.samples.shape[0], (n,), device=self.samples.device)
        x = self.samples[index].to(device=like.device, dtype=like.dtype)
        if self.ml_estimator == "path" and isinstance(flow, Flow):
            return forward_kl_loss(flow, self.target, x)
        return -flow.path_log_likelihood(x).mean()

    def loss(self, flow: Any, batch: Tensor | int) -> Tensor:
        _check_flow(flow, self.target, "BoltzmannGenerator", exact=False)
        z = _latent(flow, batch, "BoltzmannGenerator")
        total = z.new_zeros(())
        self._last = {}
        if self.w_kl > 0:
            kl, self._last["log_w"] = self._kl(flow, z)
            self._last["kl"] = kl.detach()
            total = total + self.w_kl * kl
        if self.w_ml > 0:
            nll = self._nll(flow, z.shape[0], z)
            self._last["nll"] = nll.detach()
            total = total + self.w_ml * nll
        return total

    def metrics(self) -> dict[str, float]:
        out = {name: float(self._last[name]) for name in ("kl", "nll") if name in self._last}
        out.update(_weight_metrics(self._last.get("log_w")))
        return out
