r"""Goodness of fit of an event model: time-rescaling residuals, the KS test, and summary metrics.

By the time-rescaling theorem, if the model is right the compensator increments between events,
$\Lambda(t_{i-1}, t_i) = \int_{t_{i-1}}^{t_i}\lambda^*(s)\,ds$, are i.i.d. $\mathrm{Exp}(1)$. For a density model
the increment is $-\log S(\tau_i \mid h_i)$, so no integral is needed. A Kolmogorov-Smirnov test of the residuals
against $\mathrm{Exp}(1)$ then accepts or rejects the model.

References:
    Brown, Barbieri, Ventura, Kass & Frank, *The time-rescaling theorem and its application to neural spike train
    data analysis*, Neural Computation 2002.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import stats

from .data import EventSequences

__all__ = ["rescaled_residuals", "ks_test", "evaluate"]


@torch.no_grad()
def rescaled_residuals(model: Any, sequences: EventSequences, batch_size: int = 256) -> np.ndarray:
    r"""The residuals $-\log S(\tau_i \mid h_i)$ of every event of `sequences` under `model` (flattened).

    Examples:
        >>> from flowkit.events import EventModel, Hawkes
        >>> seqs = Hawkes(0.5, 0.5, 1.0).sample(4, t_end=20.0, seed=0)
        >>> rescaled_residuals(EventModel(hidden=4).double(), seqs).shape == (seqs.num_events,)
        True
    """
    out = []
    for start in range(0, len(sequences), batch_size):
        batch = model._as_batch(sequences.batch(range(start, min(start + batch_size, len(sequences)))))
        h = model.histories(batch)[:, : batch.tau.shape[1]]
        residual = -model.distribution.log_survival(batch.tau, h)
        out.append(residual[batch.mask].cpu().double().numpy())
    return np.concatenate(out)


def ks_test(residuals: np.ndarray) -> tuple[float, float]:
    """The Kolmogorov-Smirnov statistic and p-value of `residuals` against Exp(1).

    Examples:
        >>> import numpy as np
        >>> statistic, p = ks_test(np.random.default_rng(0).exponential(size=2000))
        >>> p > 0.01
        True
    """
    result = stats.kstest(np.asarray(residuals, dtype=np.float64), "expon")
    return float(result.statistic), float(result.pvalue)


@torch.no_grad()
def evaluate(model: Any, sequences: EventSequences, batch_size: int = 256) -> dict[str, float | None]:
    """Test metrics of `model` on `sequences`.

    NLL per event (nats), next-time MAE, next-mark accuracy (None with one mark), and the KS statistic and
    p-value of the time-rescaling residuals.

    Examples:
        >>> from flowkit.events import EventModel, Hawkes
        >>> seqs = Hawkes(0.5, 0.5, 1.0).sample(4, t_end=20.0, seed=0)
        >>> sorted(evaluate(EventModel(hidden=4).double(), seqs))
        ['ks_pvalue', 'ks_statistic', 'mark_accuracy', 'nll_per_event', 'time_mae']
    """
    errors, hits = [], []
    for start in range(0, len(sequences), batch_size):
        batch = model._as_batch(sequences.batch(range(start, min(start + batch_size, len(sequences)))))
        mean, marks = model.predict(batch)
        errors.append((mean - batch.tau).abs()[batch.mask].cpu().double().numpy())
        hits.append((marks == batch.marks)[batch.mask].cpu().numpy())
    statistic, pvalue = ks_test(rescaled_residuals(model, sequences, batch_size))
    return {
        "nll_per_event": model.nll_per_event(sequences, batch_size),
        "time_mae": float(np.concatenate(errors).mean()),
        "mark_accuracy": float(np.concatenate(hits).mean()) if sequences.num_marks > 1 else None,
        "ks_statistic": statistic,
        "ks_pvalue": pvalue,
    }
