r"""Force matching: fit the model's forces $\nabla_x \log q$ to reference forces on data, with maximum likelihood.

On configurations $x_b$ with reference forces $F(x_b) = -\nabla u(x_b)$ (from MD
or the target), the force-matching loss is the mean squared distance between the
forces of the model and the reference,

$$
\mathcal L_F = \frac1B \sum_{b=1}^B \big\|\nabla_x \log q_\theta(x_b) - F(x_b)\big\|^2,
$$

zero exactly when $\log q_\theta = -u + \text{const}$ on the data. Its gradient is a double backward
through the flow, whose log-density must be twice differentiable: smooth transformers
([`SmoothMixture`][flowkit.transformers.SmoothMixture]) and activations (splines' forces jump at the knots).
[`ForceMatching`][flowkit.train.ForceMatching] mixes it with maximum likelihood; `BoltzmannGenerator(...,
w_force=)` adds it to reverse KL and maximum likelihood on the generator's samples.

References:
    Köhler, Krämer & Noé, *Smooth normalizing flows*, NeurIPS 2021 (arXiv:2110.00351).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_number, check_tensor
from ..flows import Flow
from ..flows.base import FlowModel
from ..sampling.importance import check_target
from ..targets import Target
from .batches import split_batch
from .objective import Objective

__all__ = ["ForceMatching", "model_forces", "force_matching_terms"]


def model_forces(flow: Flow, x: Tensor, create_graph: bool = True) -> tuple[Tensor, Tensor]:
    r"""`log q(x)` and the model forces $\nabla_x \log q(x)$, by autograd.

    Returns:
        `(log_q, forces)` at points `x` `(B, *event_shape)`; `log_q` keeps its graph, the forces theirs with
        `create_graph` (for a double backward).
    """
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        log_q = flow.log_prob(leaf)
        (forces,) = torch.autograd.grad(log_q.sum(), leaf, create_graph=create_graph)
    return log_q, forces


def force_matching_terms(flow: Flow, target: Target, x: Tensor) -> tuple[Tensor, Tensor]:
    """The negative log-likelihood and the force-matching loss of `flow` on the samples `x`, in one pass.

    Returns:
        `(nll, force_loss)`: `mean(-log q(x))` and the batch mean of `|grad log q(x) - F(x)|^2`, with `F` the
        target's forces, both scalars with graphs.
    """
    log_q, forces = model_forces(flow, x, create_graph=torch.is_grad_enabled())
    reference = target.force(x.detach()).to(forces)
    return -log_q.mean(), (forces - reference).square().flatten(1).sum(-1).mean()


class ForceMatching(Objective):
    r"""Maximum likelihood plus force matching on data: $w_{NLL}\,\mathrm{NLL} + w_F\,\mathcal L_F$.

    The batches are configurations `x` from the target (MD or MCMC samples); the reference forces are
    `target.force(x)`. `metrics` gives `nll` and `force_loss` of the batch.

    Arguments:
        target: the [`Target`][flowkit.targets.Target] whose forces are matched.
        w_force: weight $w_F \ge 0$ of the force-matching term.
        w_nll: weight $w_{NLL} \ge 0$ of the negative log-likelihood.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.train import ForceMatching, fit
        >>> target = flowkit.targets.DoubleWell()
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,), activation="tanh")
        >>> history = fit(flow, ForceMatching(target), target.sample(256), steps=3, progress=False)
        >>> len(history.loss)
        3
    """

    needs_data = True

    def __init__(self, target: Target, w_force: float = 1.0, w_nll: float = 1.0) -> None:
        if not isinstance(target, Target):
            raise ValueError(f"ForceMatching: target must be a flowkit.targets.Target, got {type(target).__name__}")
        self.target = target
        self.w_force = check_number(w_force, "w_force", where="ForceMatching", low=0)
        self.w_nll = check_number(w_nll, "w_nll", where="ForceMatching", low=0)
        if self.w_force == 0 and self.w_nll == 0:
            raise ValueError("ForceMatching: both terms are switched off (w_force = 0 and w_nll = 0)")
        self._last: dict[str, Tensor] = {}

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        x, context = split_batch(batch, "ForceMatching")
        if context is not None:
            raise ValueError("ForceMatching: batches are samples x only (targets have no context)")
        if not getattr(flow, "exact_log_prob", False):
            raise ValueError(f"ForceMatching: needs a flow with an exact density, got {type(flow).__name__}")
        check_target(flow, self.target, "ForceMatching")
        check_tensor(x, flow.event_shape, name="x", dtype=flow.base.dtype, where="ForceMatching")
        nll, force_loss = force_matching_terms(flow, self.target, x)
        self._last = {"nll": nll.detach(), "force_loss": force_loss.detach()}
        return self.w_nll * nll + self.w_force * force_loss

    def metrics(self) -> dict[str, float]:
        return {name: float(value) for name, value in self._last.items()}
