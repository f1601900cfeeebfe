"""Batches for the fit loop: tensors, datasets, data loaders and latent draws, sharded and resumable.

Every source yields the batches an objective receives: `x` or `(x, context)`, with the points' indices last
for data made by [`with_indices`][flowkit.train.batches.with_indices]. Shuffling follows
`torch.utils.data.DistributedSampler` (a permutation seeded by `seed + epoch`, rank `r` of `N` taking every
`N`-th index), so a resumed run can jump straight to the batch where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler, Sampler

from ..flows.base import FlowModel

__all__ = [
    "Batch",
    "split_batch",
    "split_indexed_batch",
    "with_indices",
    "ShardedBatchSampler",
    "make_batches",
    "LatentBatches",
]

#: What an objective's `loss` receives: `x` or `(x, context)`.
Batch = Tensor | tuple[Tensor, Tensor]


def split_batch(batch: Any, where: str | None = None) -> tuple[Tensor, Tensor | None]:
    """Split a batch into `(x, context)`; `context` is None for a bare tensor.

    Arguments:
        batch: a tensor `x` or a pair `(x, context)` of tensors.
        where: the caller's name, put at the start of the error message.

    Raises:
        ValueError: if `batch` is neither a tensor nor a pair of tensors.
    """
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(b, Tensor) for b in batch):
        return batch[0], batch[1]
    raise ValueError(
        ("" if where is None else f"{where}: ")
        + f"a batch must be a tensor x or a pair (x, context) of tensors, got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


def split_indexed_batch(batch: Any, where: str | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """Split a batch made by [`with_indices`][flowkit.train.batches.with_indices] into `(x, context, index)`.

    Arguments:
        batch: a pair `(x, index)` or a triple `(x, context, index)` of tensors, `index` holding
            integers (the positions of the batch's points in the training set).
        where: the caller's name, put at the start of the error message.

    Raises:
        ValueError: if `batch` has no integer index of one entry per point.
    """
    prefix = "" if where is None else f"{where}: "
    parts = tuple(batch) if isinstance(batch, (tuple, list)) else ()
    if len(parts) not in (2, 3) or not all(isinstance(b, Tensor) for b in parts):
        raise ValueError(
            prefix + "a batch must be (x, index) or (x, context, index) with the points' indices; "
            f"give the data as with_indices(x), got {type(batch).__name__}"
        )
    x, index = parts[0], parts[-1]
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool or index.dim() != 1:
        raise ValueError(
            prefix + f"index must be a 1-D integer tensor, got {index.dtype} of shape {tuple(index.shape)}"
        )
    if x.dim() == 0 or index.shape[0] != x.shape[0]:
        raise ValueError(prefix + f"x has {x.shape[0] if x.dim() else 0} points but index has {index.shape[0]}")
    return x, (parts[1] if len(parts) == 3 else None), index


def with_indices(data: Any) -> tuple[Tensor, ...]:
    """`data` with the index of each point, for objectives that need to know which points a batch holds.

    Arguments:
        data: a tensor (or array) `x`, or a pair `(x, context)`.

    Returns:
        `(x, index)` or `(x, context, index)` with `index = arange(len(x))`; [`fit`][flowkit.train.fit]
        batches it like any data, and each batch carries the indices of its points.

    Examples:
        >>> x, index = with_indices(torch.zeros(3, 2))
        >>> index
        tensor([0, 1, 2])
    """
    tensors = _as_tensors(data, "data")
    if tensors is None or len(tensors) == 3:
        raise ValueError(f"with_indices: data must be a tensor x or a pair (x, context), got {type(data).__name__}")
    return (*tensors, torch.arange(tensors[0].shape[0], device=tensors[0].device))


def _to_model(t: Tensor, device: torch.device, dtype: torch.dtype | None) -> Tensor:
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        t = t.to(dtype)
    return t.to(device, non_blocking=True)


def _normalise(batch: Any, device: torch.device, dtype: torch.dtype | None) -> Batch:
    if isinstance(batch, (tuple, list)) and len(batch) == 1:  # a loader over TensorDataset(x) yields [x]
        batch = batch[0]
    if isinstance(batch, (tuple, list)) and len(batch) == 3:  # (x, context, index) from with_indices
        return tuple(_to_model(t, device, dtype) for t in split_indexed_batch(batch))  # type: ignore[return-value]
    x, context = split_batch(batch)
    x = _to_model(x, device, dtype)
    return x if context is None else (x, _to_model(context, device, dtype))


class ShardedBatchSampler(Sampler[list[int]]):
    """Batches of indices of this rank's shard of `range(n)`, with a seeded per-epoch order.

    The order is `DistributedSampler`'s when `shuffle`, else every `world_size`-th index without padding
    (for validation: each point counted once over the ranks).

    Arguments:
        n: number of points.
        batch_size: points per batch on this rank.
        world_size: number of ranks.
        rank: this rank.
        seed: seed of the permutation (the same on every rank).
        shuffle: shuffle each epoch (training) or keep the order (validation).
    """

    def __init__(
        self, n: int, batch_size: int, world_size: int = 1, rank: int = 0, seed: int = 0, shuffle: bool = True
    ) -> None:
        self.n, self.batch_size, self.world_size, self.rank = n, batch_size, world_size, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Select the epoch's order and the number of leading batches to leave out (when resuming)."""
        self.epoch, self.skip = epoch, skip

    def _indices(self) -> Tensor:
        if self.shuffle:  # DistributedSampler's order (shuffled, padded by wrapping), as one tensor
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=generator)
            total = math.ceil(self.n / self.world_size) * self.world_size
            if total > self.n:
                order = torch.cat([order, order.repeat(math.ceil((total - self.n) / self.n))[: total - self.n]])
            return order[self.rank : total : self.world_size]
        return torch.arange(self.rank, self.n, self.world_size)

    def index_batches(self) -> Iterator[Tensor]:
        """This epoch's batches of indices, as int64 tensors, after the skipped ones."""
        indices = self._indices()
        for start in range(self.skip * self.batch_size, len(indices), self.batch_size):
            yield indices[start : start + self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        for index in self.index_batches():
            yield index.tolist()

    def __len__(self) -> int:
        per_rank = (
            math.ceil(self.n / self.world_size) if self.shuffle else len(range(self.rank, self.n, self.world_size))
        )
        return math.ceil(per_rank / self.batch_size)


class _Source:
    """A source of batches: `steps_per_epoch` and `points` (None when unknown) and `epoch(e, skip)`."""

    steps_per_epoch: int | None
    points: int | None = None

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        raise NotImplementedError


class _TensorSource(_Source):
    def __init__(
        self, tensors: Sequence[Tensor], sampler: ShardedBatchSampler, device: torch.device, dtype: torch.dtype | None
    ) -> None:
        self.tensors, self.sampler, self.device, self.dtype = tensors, sampler, device, dtype
        self.steps_per_epoch = len(sampler)
        self.points = int(tensors[0].shape[0])

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch, skip)
        device = self.tensors[0].device
        for index in self.sampler.index_batches():
            if index.device != device:
                index = index.to(device)
            yield _normalise(tuple(t[index] for t in self.tensors), self.device, self.dtype)


class _LoaderSource(_Source):
    """A DataLoader; resuming skips batches by drawing them (the iterator is made eagerly, see `epoch`)."""

    def __init__(self, loader: DataLoader, device: torch.device, dtype: torch.dtype | None) -> None:
        self.loader, self.device, self.dtype = loader, device, dtype
        dataset = loader.dataset
        self.points = len(dataset) if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__") else None
        try:
            self.steps_per_epoch = len(loader)
        except TypeError:
            self.steps_per_epoch = None

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        batch_sampler = self.loader.batch_sampler
        if isinstance(batch_sampler, ShardedBatchSampler):
            batch_sampler.set_epoch(epoch, skip)
            skip = 0
        else:
            for sampler in (self.loader.sampler, getattr(batch_sampler, "sampler", None)):
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
        iterator = iter(self.loader)  # eagerly: the loop replays the epoch's RNG state around this call
        for _ in range(skip):
            if next(iterator, None) is None:
                break
        return (_normalise(batch, self.device, self.dtype) for batch in iterator)


class LatentBatches(_Source):
    """Endless latent batches `z = flow.base.sample((batch_size,))` for objectives that need no data."""

    steps_per_epoch = None

    def __init__(self, flow: FlowModel, batch_size: int) -> None:
        base = getattr(flow, "base", None)
        if base is None or not hasattr(base, "sample"):
            raise ValueError(
                "fit: without data the flow must have a base distribution (flow.base.sample) to draw latents"
            )
        self.base, self.batch_size = base, batch_size

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        while True:
            yield self.base.sample((self.batch_size,))


def _as_tensors(data: Any, name: str) -> tuple[Tensor, ...] | None:
    """The tensors of `data` if it is a tensor, an array or a pair of them; None otherwise."""
    if isinstance(data, np.ndarray):
        data = torch.as_tensor(data)
    if isinstance(data, Tensor):
        tensors: tuple[Tensor, ...] = (data,)
    elif (
        isinstance(data, (tuple, list))
        and len(data) in (2, 3)
        and all(isinstance(d, (Tensor, np.ndarray)) for d in data)
    ):
        tensors = tuple(torch.as_tensor(d) for d in data)  # (x, context) or (x, context, index)
    else:
        return None
    if tensors[0].dim() == 0 or tensors[0].shape[0] == 0:
        raise ValueError(f"fit: {name} is empty (shape {tuple(tensors[0].shape)})")
    if len(tensors) == 3 and any(t.dim() == 0 or t.shape[0] != tensors[0].shape[0] for t in tensors[1:]):
        raise ValueError(f"fit: {name} x, context and index have different numbers of points")
    if len(tensors) == 2 and tensors[1].shape[0] != tensors[0].shape[0]:
        raise ValueError(
            f"fit: {name} x and context have different numbers of points "
            f"({tensors[0].shape[0]} and {tensors[1].shape[0]})"
        )
    return tensors


def make_batches(
    data: Any,
    batch_size: int,
    *,
    world_size: int = 1,
    rank: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    device: torch.device = torch.device("cpu"),
    dtype: torch.dtype | None = None,
    name: str = "data",
) -> _Source:
    """A batch source for `data`: a tensor (or array), a pair `(x, context)`, a Dataset or a DataLoader.

    Floating tensors are cast to `dtype` (the model's) and moved to `device`. A DataLoader is used as given
    unless it must be sharded and has no `DistributedSampler`: then it is rebuilt with a
    [`ShardedBatchSampler`][flowkit.train.batches.ShardedBatchSampler].

    Raises:
        ValueError: for an unsupported `data` type, an empty set or mismatched `x` and context.
    """
    tensors = _as_tensors(data, name)
    if tensors is not None:
        sampler = ShardedBatchSampler(tensors[0].shape[0], batch_size, world_size, rank, seed, shuffle)
        return _TensorSource(tensors, sampler, device, dtype)
    if isinstance(data, DataLoader):
        samplers = (data.sampler, getattr(data.batch_sampler, "sampler", None))
        if world_size > 1 and not any(isinstance(s, DistributedSampler) for s in samplers):
            if isinstance(data.dataset, IterableDataset) or data.batch_size is None:
                raise ValueError(
                    f"fit: to shard {name} over {world_size} processes give a map-style dataset, or a DataLoader "
                    "with a DistributedSampler"
                )
            sharded = ShardedBatchSampler(
                len(data.dataset), data.batch_size, world_size, rank, seed, isinstance(data.sampler, RandomSampler)
            )
            data = DataLoader(
                data.dataset,
                batch_sampler=sharded,
                num_workers=data.num_workers,
                collate_fn=data.collate_fn,
                pin_memory=data.pin_memory,
                worker_init_fn=data.worker_init_fn,
            )
        return _LoaderSource(data, device, dtype)
    if isinstance(data, IterableDataset):
        if world_size > 1:
            raise ValueError(f"fit: an IterableDataset {name} cannot be sharded automatically; give a DataLoader")
        return _LoaderSource(DataLoader(data, batch_size=batch_size), device, dtype)
    if isinstance(data, Dataset):
        if len(data) == 0:  # type: ignore[arg-type]
            raise ValueError(f"fit: {name} is empty")
        sampler = ShardedBatchSampler(len(data), batch_size, world_size, rank, seed, shuffle)  # type: ignore[arg-type]
        return _LoaderSource(DataLoader(data, batch_sampler=sampler), device, dtype)
    raise ValueError(
        f"fit: {name} must be a tensor, a pair (x, context) of tensors, a Dataset or a DataLoader, "
        f"got {type(data).__name__}"
    )
