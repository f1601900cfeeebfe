r"""Training an [`EventModel`][flowkit.events.EventModel] with flowkit's fit loop.

[`EventLikelihood`][flowkit.events.EventLikelihood] is the objective: the negative log-likelihood per event of
a batch of sequences (survival terms included), $-\sum_s \log p(s) / \sum_s n_s$.
[`fit_events`][flowkit.events.fit_events] standardises the log inter-event times on the training set and runs
[`flowkit.train.fit`][flowkit.train.fit] over batches of whole sequences (checkpoints, progress bar, validation
and early stopping as for any flow).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .._validation import check_number
from ..train import History, Objective, fit
from ..train.batches import split_batch
from .data import EventBatch, EventSequences

__all__ = ["EventLikelihood", "fit_events"]


class EventLikelihood(Objective):
    r"""Negative log-likelihood per event of a batch of sequences.

    With `events_per_sequence` $\bar n$ (the training set's mean, as [`fit_events`][flowkit.events.fit_events]
    sets it) the loss is $-\sum_{s \in B} \log p(s) / (|B|\,\bar n)$, an unbiased estimate of the training set's
    NLL per event, whose minimiser is the maximum-likelihood estimate; without, it is the batch's own ratio
    $-\sum_s \log p(s) / \sum_s n_s$, which weights batches with few events more (biased when the number of
    events per sequence varies, as for a Hawkes process).

    The batch is the pair `(x, context)` of [`EventBatch.to_tensors`][flowkit.events.EventBatch.to_tensors]
    (what [`EventSequences.as_fit_data`][flowkit.events.EventSequences.as_fit_data] gives the fit loop).

    Arguments:
        events_per_sequence: the mean number of events per training sequence, or None.

    Examples:
        >>> import torch
        >>> from flowkit.events import EventModel, EventSequences, EventLikelihood
        >>> seqs = EventSequences([{"times": [0.5, 1.0, 2.5]}, {"times": [0.2]}])
        >>> model = EventModel(hidden=4).double()
        >>> EventLikelihood().loss(model, seqs.as_fit_data()).shape
        torch.Size([])
    """

    needs_data = True

    def __init__(self, events_per_sequence: float | None = None) -> None:
        if events_per_sequence is not None:
            events_per_sequence = check_number(
                events_per_sequence, "events_per_sequence", where="EventLikelihood", positive=True
            )
        self.events_per_sequence = events_per_sequence

    def loss(self, flow: nn.Module, batch: Any) -> Tensor:
        x, context = split_batch(batch, "EventLikelihood")
        if context is None:
            raise ValueError("EventLikelihood: a batch must be (x, context) from EventSequences.as_fit_data()")
        events = EventBatch.from_tensors(x, context)
        total = -flow.log_likelihood(events).sum()
        if self.events_per_sequence is None:
            return total / events.mask.sum()
        return total / (events.mask.shape[0] * self.events_per_sequence)


def fit_events(
    model: nn.Module,
    train: EventSequences,
    val: EventSequences | None = None,
    *,
    standardize: bool = True,
    batch_size: int = 64,
    lr: float = 1e-2,
    **options: Any,
) -> History:
    r"""Fit `model` to `train` by maximum likelihood with [`flowkit.train.fit`][flowkit.train.fit].

    Arguments:
        model: an [`EventModel`][flowkit.events.EventModel].
        train: the training sequences.
        val: validation sequences (early stopping with `patience`, best weights restored).
        standardize: first set the model's standardisation of $\log\tau$ from `train`.
        batch_size: sequences per batch.
        lr: learning rate (Adam).
        **options: further arguments of [`fit`][flowkit.train.fit] (`epochs`, `steps`, `checkpoint_dir`,
            `progress`, `seed`, `patience`, ...).

    Returns:
        The fit loop's [`History`][flowkit.train.History].

    Examples:
        >>> from flowkit.events import EventModel, Hawkes, fit_events
        >>> train = Hawkes(0.5, 0.5, 1.0).sample(20, t_end=20.0, seed=0)
        >>> model = EventModel(hidden=8).double()
        >>> history = fit_events(model, train, steps=3, progress=False)
        >>> len(history.loss)
        3
    """
    if standardize:
        model.standardize_(train)
    dtype = next(model.parameters()).dtype
    val_data = None if val is None else val.as_fit_data(dtype)
    objective = EventLikelihood(train.num_events / len(train))
    return fit(model, objective, train.as_fit_data(dtype), val_data=val_data, batch_size=batch_size, lr=lr,
               **options)  # fmt: skip
