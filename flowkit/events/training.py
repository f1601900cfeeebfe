r"""Training an [`EventModel`][flowkit.events.EventModel] with flowkit's fit loop.

[`EventLikelihood`][flowkit.events.EventLikelihood] is the objective: the negative log-likelihood per event of
a batch of sequences (survival terms included), $-\sum_s \log p(s) / \sum_s n_s$.
[`fit_events`][flowkit.events.fit_events] standardises the log inter-event times on the training set and runs
[`flowkit.train.fit`][flowkit.train.fit] over batches of whole sequences (checkpoints, progress bar, validation
and early stopping as for any flow). Its batches hold sequences of similar lengths
([`LengthBucketSampler`][flowkit.events.LengthBucketSampler]), so that little of a batch is padding: the recurrent
encoder's cost is the batch's longest sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from .._validation import check_number
from ..train import History, Objective, fit
from ..train.batches import ShardedBatchSampler, split_batch
from .data import EventBatch, EventSequences

__all__ = ["EventLikelihood", "LengthBucketSampler", "fit_events"]


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


class LengthBucketSampler(ShardedBatchSampler):
    """Batches of sequences of similar lengths, in a seeded random order that changes every epoch.

    Each epoch permutes the sequences, sorts each run of `batch_size * pool` of them by length, cuts the runs into
    batches and shuffles the batches: every sequence once per epoch, batches of about equal lengths (less padding),
    still random. Resuming skips batches as [`ShardedBatchSampler`][flowkit.train.batches.ShardedBatchSampler] does.

    Arguments:
        lengths: the number of events of each sequence.
        batch_size: sequences per batch.
        seed: seed of the order (epoch `e` uses `seed + e`).
        pool: batches' worth of sequences sorted together.

    Examples:
        >>> sampler = LengthBucketSampler([5, 1, 4, 2, 3, 6], batch_size=2, pool=3)
        >>> sorted(len(b) for b in sampler), sorted(i for b in sampler for i in b)
        ([2, 2, 2], [0, 1, 2, 3, 4, 5])
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, pool: int = 50) -> None:
        super().__init__(len(lengths), int(batch_size), 1, 0, int(seed), True)
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.pool = max(1, int(pool))

    def index_batches(self) -> Iterator[Tensor]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=generator)
        batches: list[Tensor] = []
        chunk = self.batch_size * self.pool
        for start in range(0, self.n, chunk):
            run = order[start : start + chunk]
            run = run[torch.argsort(self.lengths[run], stable=True)]
            batches.extend(run.split(self.batch_size))
        for index in torch.randperm(len(batches), generator=generator)[self.skip :].tolist():
            yield batches[index]

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)


def fit_events(
    model: nn.Module,
    train: EventSequences,
    val: EventSequences | None = None,
    *,
    standardize: bool = True,
    bucket: bool = True,
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
        bucket: batch sequences of similar lengths together
            ([`LengthBucketSampler`][flowkit.events.LengthBucketSampler]); False: uniformly random batches.
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
    data: Any = train.as_fit_data(dtype)
    if bucket:
        sampler = LengthBucketSampler([len(s) for s in train], batch_size, seed=options.get("seed") or 0)
        data = DataLoader(TensorDataset(*data), batch_sampler=sampler)
    return fit(model, objective, data, val_data=val_data, batch_size=batch_size, lr=lr,
               **options)  # fmt: skip
