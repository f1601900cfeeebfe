r"""Label learning flows (Lu et al.): weakly supervised classification with a conditional flow over labels.

No labels, only $m$ *weak signals* $q_j(x) \in [0, 1]$ (a rule's or a weak model's probability of class 1) with
*error bounds* $b_j$: the expected error of signal $j$ is at most $b_j$. For label probabilities $y_i$ (class 1),
signal $j$'s expected error is

$$
\hat c_j(y) = \frac1n \sum_i \big[ q_j(x_i)\,(1 - y_i) + (1 - q_j(x_i))\, y_i \big].
$$

A label learning flow is a conditional flow $y = g(z; x)$, $z \sim N(0, I)$, over the vector of the two label
probabilities (`y[..., 1]` for class 1), trained on its own samples: each step draws $y = g(z; x)$ given the
batch's $x$ and minimises the negative log-likelihood $-\log q(y \mid x) = -\log N(z) + \log|\det \partial g /
\partial z|$ of those samples, with the gradient through the sampling path (its mean is the entropy of the
labels' distribution: the flow is pushed to confident labels), subject to the constraints

$$
y \ge 0, \qquad y \le 1, \qquad \sum_k y_k = 1, \qquad \hat c_j(y) \le b_j \quad (j = 1, \dots, m),
$$

with $\hat c_j$ the batch mean (train in full batches: the bounds are about the whole training set). Lu et al.
add them as penalties $\lambda\,[\mathrm{relu}(-y)^2 + \mathrm{relu}(y - 1)^2 + (\sum_k y_k - 1)^2 + \sum_j
\mathrm{relu}(\hat c_j - b_j)^2]$ with a fixed $\lambda$ (`weight`); the NLL keeps falling as the samples
contract (to the limit of the clamped affine scales), and a fixed weight can lose to it (on the digits task
every seed collapses to one class).
[`LabelLearningObjective.constraints`][flowkit.applications.weak_supervision.LabelLearningObjective.constraints]
gives the same terms as constraints of [`Constrained`][flowkit.train.Constrained] (MDMM), whose multipliers grow
until they hold. Predictions average clipped samples
([`LabelLearningFlow.predict_proba`][flowkit.applications.weak_supervision.LabelLearningFlow.predict_proba]).

**Error bounds** are about the same quantity as the constraint: the expected error $\hat c_j$ of the soft signal
against the true labels (on labelled data), not the error of the rounded signal; with the latter, the true
labels themselves can break the constraints.

[`digits_weak_signals`][flowkit.applications.weak_supervision.digits_weak_signals] makes the data in code:
scikit-learn's digits, the binary task "digit >= 5", weak signals from logistic regressions on small random
pixel subsets fitted on about 20 labelled images, and each signal's error bound (its expected error) from a
separate small labelled set.

References:
    Lu, Chen, Wang & Song, *Weakly supervised classification using label learning flows*
    (arXiv:2302.09649);
    Arachie & Huang, *Adversarial label learning*, AAAI 2019.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from .._validation import check_number
from ..flows import RealNVP
from ..train import AtMost, Constraint, Equality, Objective

__all__ = [
    "WeakSignals",
    "digits_weak_signals",
    "expected_errors",
    "constraint_penalties",
    "majority_vote",
    "LabelLearningFlow",
    "LabelLearningObjective",
]


@dataclass
class WeakSignals:
    """A weakly supervised task: features, weak signals, their error bounds, and the true labels for scoring.

    Attributes:
        features: `(n, d)` float32 inputs.
        signals: `(n, m)` float32 probabilities of class 1, one column per weak signal.
        bounds: `(m,)` error bounds in [0, 1].
        labels: `(n,)` true labels (for evaluation only, never for training).
    """

    features: Tensor
    signals: Tensor
    bounds: Tensor
    labels: Tensor


def check_signals(signals: Tensor, bounds: Tensor, where: str) -> None:
    """Raise a `ValueError` for signals outside [0, 1] or bounds outside [0, 1] or of the wrong length."""
    if signals.dim() != 2 or not bool(torch.isfinite(signals).all()) or bool(((signals < 0) | (signals > 1)).any()):
        raise ValueError(f"{where}: signals must be an (n, m) array of probabilities in [0, 1]")
    if bounds.shape != (signals.shape[1],) or not bool(torch.isfinite(bounds).all()):
        raise ValueError(f"{where}: bounds must hold one finite error bound per signal ({signals.shape[1]})")
    if bool(((bounds < 0) | (bounds > 1)).any()):
        raise ValueError(f"{where}: error bounds must lie in [0, 1], got {bounds.tolist()}")


def digits_weak_signals(
    signals: int = 10,
    pixels: int = 8,
    labelled: int = 20,
    bound_points: int = 50,
    seed: int = 0,
    oracle_bounds: bool = False,
) -> WeakSignals:
    r"""Scikit-learn's digits as a weakly supervised binary task ("digit >= 5"), with weak signals in code.

    Each signal is a logistic regression on `pixels` random pixels, fitted to the same `labelled` images; its
    error bound is its expected error $\hat c_j$ (of its probabilities against the labels) on `bound_points`
    other labelled images (an estimate, which may fall below the true value: then no labelling meets every
    bound), or with `oracle_bounds=True` its true expected error on the unlabelled set (the setting of Arachie &
    Huang's experiments; for studies only). The rest are the unlabelled training set.

    Examples:
        >>> from flowkit.applications.weak_supervision import digits_weak_signals
        >>> task = digits_weak_signals(signals=3)
        >>> tuple(task.signals.shape), tuple(task.bounds.shape)
        ((1727, 3), (3,))
    """
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    where = "digits_weak_signals"
    signals = check_number(signals, "signals", where=where, integer=True, low=1)
    pixels = check_number(pixels, "pixels", where=where, integer=True, low=1, high=64)
    x, digit = load_digits(return_X_y=True)
    y = (digit >= 5).astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    fit_rows, bound_rows = order[:labelled], order[labelled : labelled + bound_points]
    rest = order[labelled + bound_points :]
    if len(set(y[fit_rows])) < 2:
        raise ValueError(f"{where}: the {labelled} labelled images hold one class only; take more or another seed")
    columns, bounds = [], []
    for _ in range(signals):
        chosen = rng.choice(64, pixels, replace=False)
        model = LogisticRegression(max_iter=1000).fit(x[fit_rows][:, chosen], y[fit_rows])
        rows = rest if oracle_bounds else bound_rows
        soft = torch.tensor(model.predict_proba(x[rows][:, chosen])[:, 1:])
        bounds.append(float(expected_errors(torch.tensor(y[rows], dtype=soft.dtype), soft)[0]))
        columns.append(model.predict_proba(x[rest][:, chosen])[:, 1])
    return WeakSignals(
        torch.tensor(x[rest] / 16.0, dtype=torch.float32),
        torch.tensor(np.stack(columns, 1), dtype=torch.float32),
        torch.tensor(bounds, dtype=torch.float32),
        torch.tensor(y[rest]),
    )


def expected_errors(labels: Tensor, signals: Tensor) -> Tensor:
    r"""$\hat c_j$: each signal's expected error against class-1 probabilities `labels` `(..., n)`, `(..., m)`."""
    return (signals * (1 - labels[..., None]) + (1 - signals) * labels[..., None]).mean(-2)


def constraint_penalties(y: Tensor, signals: Tensor, bounds: Tensor) -> dict[str, Tensor]:
    """The four penalties of a batch of label vectors `y` `(n, 2)`: range, simplex and each signal's bound."""
    return {
        "below_zero": F.relu(-y).square().sum(-1).mean(),
        "above_one": F.relu(y - 1).square().sum(-1).mean(),
        "simplex": (y.sum(-1) - 1).square().mean(),
        "error_bounds": F.relu(expected_errors(y[:, 1], signals) - bounds).square().sum(),
    }


def majority_vote(signals: Tensor) -> Tensor:
    """The majority of the signals' votes (each rounded at 1/2); ties go to class 1."""
    return ((signals > 0.5).float().mean(-1) >= 0.5).long()


class LabelLearningFlow(RealNVP):
    """The conditional flow $y = g(z; x)$ over the two label probabilities: a [`RealNVP`][flowkit.flows.RealNVP].

    Arguments:
        features: input features `d` (the context).
        transforms: coupling layers.
        hidden: hidden sizes of each conditioner.
    """

    def __init__(self, features: int, transforms: int = 4, hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__(2, transforms, hidden, context=features)

    @torch.no_grad()
    def predict_proba(self, x: Tensor, samples: int = 32) -> Tensor:
        """Probability of class 1: the mean over `samples` draws of $y_1$ clipped to [0, 1]."""
        draws = self.sample((samples,), context=x)[..., 1].clamp(0, 1)
        return draws.mean(0)


class LabelLearningObjective(Objective):
    r"""The LLF loss on batches of rows `[x_1, ..., x_d, q_1, ..., q_m]`: own-sample NLL plus `weight` x penalties.

    The NLL is $-\log q(y \mid x)$ of the flow's reparameterised samples, with the gradient through the samples
    (see [the module][flowkit.applications.weak_supervision]). With `weight=0` the penalties are left out of the
    loss (still reported), for [`Constrained`][flowkit.train.Constrained] with
    [`constraints`][flowkit.applications.weak_supervision.LabelLearningObjective.constraints].

    Arguments:
        bounds: the signals' error bounds `(m,)` in [0, 1].
        weight: the penalties' weight $\lambda \ge 0$.

    Raises:
        ValueError: for bounds outside [0, 1].

    Examples:
        >>> import torch
        >>> from flowkit.applications.weak_supervision import LabelLearningFlow, LabelLearningObjective
        >>> from flowkit.train import Constrained, fit
        >>> x, q = torch.randn(64, 3), torch.rand(64, 2)
        >>> objective = LabelLearningObjective(torch.tensor([0.45, 0.45]), weight=0.0)
        >>> constrained = Constrained(objective, objective.constraints(), lr=20.0)
        >>> [c.name for c in constrained.constraints]
        ['below_zero', 'above_one', 'simplex', 'error_0', 'error_1']
        >>> history = fit(LabelLearningFlow(3, 2, (8,)), constrained, torch.cat([x, q], 1), steps=2, batch_size=64,
        ...               progress=False)
    """

    _flowkit_register = False

    def __init__(self, bounds: Tensor, weight: float = 10.0) -> None:
        self.bounds = torch.as_tensor(bounds, dtype=torch.float32)
        if self.bounds.dim() != 1 or bool(((self.bounds < 0) | (self.bounds > 1)).any()):
            raise ValueError(f"LabelLearningObjective: error bounds must lie in [0, 1], got {self.bounds.tolist()}")
        self.weight = check_number(weight, "weight", where="LabelLearningObjective", low=0.0)
        self._last: dict[str, float] = {}
        self._latest: tuple[Tensor, Tensor, Tensor, dict[str, Tensor]] | None = None

    def loss(self, flow: LabelLearningFlow, batch: Tensor) -> Tensor:
        m = self.bounds.numel()
        x, q = batch[:, :-m], batch[:, -m:]
        y, log_q = flow.rsample_and_log_prob((1,), context=x)
        y, nll = y[0], -log_q[0].mean()
        penalties = constraint_penalties(y, q, self.bounds.to(y))
        self._latest = (batch, y, q, penalties)
        total = sum(penalties.values())
        self._last = {"nll": float(nll.detach()), "penalty": float(total.detach())}
        self._last.update({k: float(v.detach()) for k, v in penalties.items()})
        return nll + self.weight * total if self.weight > 0 else nll

    def _sample_of(self, batch: Any, name: str) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        if self._latest is None or self._latest[0] is not batch:
            raise ValueError(
                f"LabelLearningObjective: constraint {name!r} reads the samples of the last loss on the same batch; "
                "use it inside Constrained(objective, objective.constraints())"
            )
        return self._latest[1], self._latest[2], self._latest[3]

    def constraints(self, damping: float = 10.0) -> list[Constraint]:
        r"""The penalised terms as constraints of [`Constrained`][flowkit.train.Constrained].

        `below_zero`, `above_one` and `simplex` (each mean squared violation) equal to 0, and `error_j`:
        $\hat c_j \le b_j$, each evaluated on the samples that this objective's `loss` drew from the same batch
        (`Constrained` calls the objective first).

        Arguments:
            damping: MDMM's damping $d$ of each constraint.
        """

        def penalty(name: str) -> Callable[[Any, Any], Tensor]:
            return lambda flow, batch: self._sample_of(batch, name)[2][name]

        def error(j: int) -> Callable[[Any, Any], Tensor]:
            def value(flow: Any, batch: Any) -> Tensor:
                y, q, _ = self._sample_of(batch, f"error_{j}")
                return expected_errors(y[:, 1], q[:, j : j + 1])[0]

            return value

        names = ("below_zero", "above_one", "simplex")
        out: list[Constraint] = [Equality(name, penalty(name), damping=damping) for name in names]
        out += [AtMost(f"error_{j}", error(j), float(b), damping=damping) for j, b in enumerate(self.bounds.tolist())]
        return out

    def metrics(self) -> dict[str, float]:
        return dict(self._last)
