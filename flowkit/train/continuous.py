r"""Training continuous normalizing flows: RNODE regularisers, a learnt end time (TO-FLOW), flow matching.

- [`RegularizedLikelihood`][flowkit.train.continuous.RegularizedLikelihood]: maximum likelihood plus the
  kinetic energy and the Jacobian Frobenius norm along the trajectory (RNODE, Finlay et al. 2020);
- [`LearnEndTime`][flowkit.train.continuous.LearnEndTime]: a callback that learns the end time $T$ of every
  [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow] (TO-FLOW, Du et al. 2022);
- [`FlowMatching`][flowkit.train.continuous.FlowMatching]: conditional flow matching with the Gaussian
  (Lipman et al. 2023) or minibatch optimal-transport (Tong et al. 2024) paths, without ODE solves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from .._validation import check_number
from ..bijectors import Bijector, Chain
from ..bijectors.continuous import ContinuousFlow, continuous_layers, function_evaluations
from ..flows.base import FlowModel
from .batches import split_batch
from .callbacks import Callback
from .objective import Objective
from .state import TrainState

__all__ = ["RegularizedLikelihood", "LearnEndTime", "FlowMatching", "FLOW_MATCHING_PATHS", "REGULARIZERS"]

#: The regularisers by name: RNODE's two and OT-Flow's HJB penalty (for a potential field).
REGULARIZERS = ("kinetic", "jacobian", "hjb")
#: The probability paths of flow matching.
FLOW_MATCHING_PATHS = ("gaussian", "ot")


def _end_times(flow: nn.Module) -> float:
    layers = continuous_layers(flow)
    return sum(float(layer.t1.detach()) for layer in layers) / len(layers) if layers else float("nan")


class RegularizedLikelihood(Objective):
    r"""Maximum likelihood with the RNODE regularisers of the flow's continuous layers.

    For a batch $x_1, \dots, x_B$ with trajectories $x_i(t)$ through every
    [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow] of the flow,

    $$
    L = -\frac1B \sum_i \log q(x_i)
        + \lambda_K \frac1B \sum_i \int_0^T \|f(x_i(t), t)\|^2 dt
        + \lambda_J \frac1B \sum_i \int_0^T \|\partial_x f(x_i(t), t)\|_F^2 dt
        + \lambda_H \frac1B \sum_i \int_0^T \big|\partial_t \Phi - \tfrac12 \|\nabla_x \Phi\|^2\big| dt .
    $$

    The last term, the Hamilton–Jacobi–Bellman residual of OT-Flow (Onken et al. 2021), needs a potential
    field $f = -\nabla_x\Phi$ ([`PotentialField`][flowkit.nn.PotentialField]). The kinetic term straightens
    the paths and the Jacobian term smooths the field, cutting an adaptive solver's steps. The integrals are
    extra states of the log-density's solve
    ([`forward_with_integrals`][flowkit.bijectors.ContinuousFlow.forward_with_integrals]); the Frobenius norm
    is Hutchinson's estimate with the solve's probe unless the trace is exact. `metrics` gives `nll`, `nfe`
    (field evaluations of the step's forward solves), `t1` (mean end time) and the regularisers asked for.

    Arguments:
        kinetic: weight $\lambda_K \ge 0$ of the kinetic energy.
        jacobian: weight $\lambda_J \ge 0$ of the Jacobian Frobenius norm.
        hjb: weight $\lambda_H \ge 0$ of the HJB residual (a potential field only).

    Raises:
        ValueError: for a negative or non-finite weight; at the first loss, a flow without a ContinuousFlow.

    References:
        Finlay, Jacobsen, Nurbekyan & Oberman, *How to train your neural ODE: the world of
        Jacobian and kinetic regularization*, ICML 2020 (arXiv:2002.02798). Onken, Wu Fung, Li &
        Ruthotto, *OT-Flow: fast and accurate continuous normalizing flows via optimal transport*,
        AAAI 2021 (arXiv:2006.00104).
    """

    progress_metrics = ("nfe", "t1")

    def __init__(self, kinetic: float = 0.0, jacobian: float = 0.0, hjb: float = 0.0) -> None:
        where = type(self).__name__
        self.kinetic = check_number(kinetic, "kinetic", where=where, low=0.0)
        self.jacobian = check_number(jacobian, "jacobian", where=where, low=0.0)
        self.hjb = check_number(hjb, "hjb", where=where, low=0.0)
        self._last: dict[str, float] = {}

    @property
    def regularizers(self) -> tuple[str, ...]:
        """The names of the regularisers with a positive weight."""
        return tuple(name for name in REGULARIZERS if getattr(self, name) > 0)

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        x, context = split_batch(batch)
        names = self.regularizers
        layers = continuous_layers(flow)
        if names and not layers:
            raise ValueError(f"{type(self).__name__}: the flow has no ContinuousFlow to regularise")
        log_likelihood, records = flow.path_log_likelihood_with_integrals(x, context, names)
        if names and len(records) < len(layers):
            raise ValueError(
                f"{type(self).__name__}: {type(flow).__name__} returns the integrals of {len(records)} of its "
                f"{len(layers)} ContinuousFlow layers (the others sit in a layer that does not pass them on)"
            )
        nll = -log_likelihood.mean()
        total = nll
        self._last = {"nll": float(nll.detach()), "nfe": float(function_evaluations(flow)), "t1": _end_times(flow)}
        for name in names:
            value = sum(record[name].mean() for record in records)
            total = total + getattr(self, name) * value
            self._last[name] = float(value.detach())
        return total

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The mean negative log-likelihood, without gradients and without the regularisers."""
        x, context = split_batch(batch)
        with torch.no_grad():
            return -flow.path_log_likelihood(x, context).mean()

    def metrics(self) -> dict[str, float]:
        return dict(self._last)


class LearnEndTime(Callback):
    r"""TO-FLOW: learn the end time $T$ of the flow's continuous layers, alternating with the weights.

    After each step of the fit loop's optimiser on the weights $\theta$, one projected, clipped gradient
    step on $T$ with $\theta$ held fixed,

    $$
    T \leftarrow \Pi_{[T_{\min}, T_{\max}]}\Big(T - \eta\,
        \operatorname{clip}_c\big(\partial_T L(\theta, T) + \alpha\big)\Big),
    $$

    the coordinate descent of Du et al. (2022) on $L(\theta, T) + \alpha T$ (short integration times).
    $\partial_T L$ comes from the weights' backward pass (the layers integrate in normalised time).

    Arguments:
        flow: the flow being fitted (the one passed to [`fit`][flowkit.train.fit]).
        lr: step size $\eta > 0$ of the end time.
        penalty: weight $\alpha \ge 0$ of the temporal regulariser.
        clip: bound $c > 0$ of the clipped gradient.
        bounds: $(T_{\min}, T_{\max})$, $0 < T_{\min} < T_{\max}$.

    Raises:
        ValueError: for bad arguments, or a flow without a ContinuousFlow.

    References:
        Du, Luo, Chen, Xu & Zeng, *TO-FLOW: Efficient continuous normalizing flows with
        temporal optimization adjoint with moving speed*, CVPR 2022 (arXiv:2203.10335).
    """

    def __init__(
        self,
        flow: nn.Module,
        lr: float = 0.01,
        penalty: float = 0.1,
        clip: float = 1.0,
        bounds: Sequence[float] = (0.05, 10.0),
    ) -> None:
        where = type(self).__name__
        self.layers = continuous_layers(flow)
        if not self.layers:
            raise ValueError(f"{where}: the flow has no ContinuousFlow whose end time to learn")
        self.lr = check_number(lr, "lr", where=where, positive=True)
        self.penalty = check_number(penalty, "penalty", where=where, low=0.0)
        self.clip = check_number(clip, "clip", where=where, positive=True)
        if len(bounds) != 2:
            raise ValueError(f"{where}: bounds must be (T_min, T_max), got {bounds!r}")
        low = check_number(bounds[0], "bounds[0]", where=where, positive=True)
        high = check_number(bounds[1], "bounds[1]", where=where, positive=True)
        if not low < high:
            raise ValueError(f"{where}: bounds must have T_min < T_max, got {tuple(bounds)}")
        self.bounds = (low, high)
        self.history: list[float] = []

    def on_start(self, state: TrainState) -> None:
        for layer in self.layers:
            layer.t1.requires_grad_(True)
            layer.t1.grad = None

    def on_step_end(self, state: TrainState) -> None:
        skipped = state.last is None or state.last.skipped is not None
        with torch.no_grad():
            for layer in self.layers:
                grad, layer.t1.grad = layer.t1.grad, None
                if skipped or grad is None or not torch.isfinite(grad):
                    continue
                step = (grad + self.penalty).clamp(-self.clip, self.clip)
                layer.t1.sub_(self.lr * step).clamp_(*self.bounds)
        self.history.append(_end_times(self.layers[0]))

    def on_end(self, state: TrainState) -> None:
        for layer in self.layers:
            layer.t1.requires_grad_(False)
            layer.t1.grad = None


def _leaves(b: Bijector) -> list[Bijector]:
    """The layers of a bijector, nested chains flattened, data side first."""
    return [leaf for layer in b for leaf in _leaves(layer)] if isinstance(b, Chain) else [b]


def _continuous_end(flow: FlowModel, where: str) -> tuple[ContinuousFlow, list[Bijector]]:
    """The ContinuousFlow that ends a bijective flow and the parameter-free layers before it."""
    if not getattr(flow, "bijective", False):
        raise ValueError(f"{where}: the flow must be a Flow whose bijector ends with a ContinuousFlow")
    layers = _leaves(flow.bijector)
    if not isinstance(layers[-1], ContinuousFlow):
        raise ValueError(
            f"{where}: the flow's bijector must end with a ContinuousFlow (its last layer is a "
            f"{type(layers[-1]).__name__}); flow matching regresses that layer's vector field"
        )
    before = layers[:-1]
    trainable = [type(b).__name__ for b in before if any(p.requires_grad for p in b.parameters())]
    if trainable:
        raise ValueError(
            f"{where}: the layers before the ContinuousFlow must be fixed (no trainable parameters), "
            f"got {trainable}; flow matching cannot train them"
        )
    return layers[-1], before


def _ot_pairing(x: Tensor, z: Tensor) -> Tensor:
    """The permutation of `z` that minimises the summed squared distances to `x` (exact minibatch OT)."""
    cost = torch.cdist(x.flatten(1).double(), z.flatten(1).double()).square()
    _, columns = linear_sum_assignment(cost.cpu().numpy())
    return torch.as_tensor(np.asarray(columns), device=z.device)


class FlowMatching(Objective):
    r"""Conditional flow matching of the [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow] that ends a flow.

    Data $x$ sit at normalised time $s = 0$ and base samples $z$ at $s = 1$. For $s \sim U(0, 1)$ and a
    conditional path $x_s$ with velocity $u_s$, the loss regresses the layer's velocity $v(x, s) = T f(x, sT, c)$
    ([`ContinuousFlow.velocity`][flowkit.bijectors.ContinuousFlow.velocity]) onto it,

    $$
    L = E_{s, (x, z)}\, \big\| v(x_s, s) - u_s \big\|^2 ,
    $$

    whose minimiser is the marginal field that carries the data distribution to the base (Lipman et al. 2023).

    - `path="gaussian"`: independent pairs, $x_s = (1 - s)\, x + (\sigma + (1 - \sigma) s)\, z$,
      $u_s = (1 - \sigma) z - x$ (Lipman et al.'s optimal-transport conditional Gaussian path, data to noise).
    - `path="ot"`: pairs $(x, z)$ coupled by the minibatch's exact optimal transport plan, then
      $x_s = (1 - s) x + s z + \sigma \epsilon$, $u_s = z - x$ (OT-CFM, Tong et al.): straighter paths.

    Layers before the ContinuousFlow (a fixed [`Standardization`][flowkit.bijectors.Standardization]) map
    the data first; they must have no trainable parameters. `validation_loss` is the flow-matching loss.

    Arguments:
        path: `"gaussian"` or `"ot"`.
        sigma: the path's width $\sigma \ge 0$ (default `1e-3`).

    Raises:
        ValueError: for an unknown path, a bad sigma; at the loss, a flow that does not end with a
            ContinuousFlow, and a context with `path="ot"` (the minibatch plan ignores it).

    References:
        Lipman, Chen, Ben-Hamu, Nickel & Le, *Flow matching for generative modeling*, ICLR 2023
        (arXiv:2210.02747). Tong, Fatras, Malkin, Huguet, Zhang, Rector-Brooks, Wolf & Bengio,
        *Improving and generalizing flow-based generative models with minibatch optimal
        transport*, TMLR 2024 (arXiv:2302.00482).
    """

    def __init__(self, path: str = "gaussian", sigma: float = 1e-3) -> None:
        where = type(self).__name__
        if path not in FLOW_MATCHING_PATHS:
            raise ValueError(f"{where}: path must be one of {list(FLOW_MATCHING_PATHS)}, got {path!r}")
        self.path = path
        self.sigma = check_number(sigma, "sigma", where=where, low=0.0, below=1.0)

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        where = type(self).__name__
        x, context = split_batch(batch)
        layer, before = _continuous_end(flow, where)
        if context is not None and self.path == "ot":
            raise ValueError(f"{where}: path='ot' couples a minibatch without its context; use path='gaussian'")
        with torch.no_grad():
            for b in before:
                x = b.call(x, context if b.context_features else None)
        n = x.shape[0]
        z = flow.base.sample((n,)).to(dtype=x.dtype, device=x.device)
        if self.path == "ot":
            z = z[_ot_pairing(x, z)]
        s = torch.rand(n, dtype=x.dtype, device=x.device)
        shape = (n,) + (1,) * (x.dim() - 1)
        t = s.view(shape)
        if self.path == "gaussian":
            xs = (1 - t) * x + (self.sigma + (1 - self.sigma) * t) * z
            target = (1 - self.sigma) * z - x
        else:
            xs = (1 - t) * x + t * z + self.sigma * torch.randn_like(x)
            target = z - x
        v = layer.velocity(xs, s, context)
        return (v - target).square().flatten(1).sum(-1).mean()
