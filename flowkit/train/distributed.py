"""Data-parallel training with `torch.distributed`, as used by [`fit`][flowkit.train.fit].

Launch any script that calls [`fit`][flowkit.train.fit] with `torchrun`:

```bash
torchrun --nproc_per_node=4 train.py
```

and the fit loop notices the launcher's environment (`WORLD_SIZE > 1`),
initialises the process group if the script has not (`nccl` when CUDA is
available, `gloo` on CPU), wraps the loss computation in
`torch.nn.parallel.DistributedDataParallel`, shards the data with a
`torch.utils.data.DistributedSampler`, seeds each rank differently,
averages the logged metrics over the ranks and writes checkpoints and the
history from rank 0 only. After the first step of a run the parameters and
buffers are broadcast from rank 0 once more, so that layers with data-dependent
initialisation ([`ActNorm`][flowkit.bijectors.ActNorm]), which initialise on each
rank's own batch, agree from then on.

Each rank draws `batch_size` points per step, so the global batch is
`world_size * batch_size`; because DDP averages the ranks' gradients, a step
on `N` ranks equals a single-process step on the union of their batches.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["DistributedContext", "setup_distributed", "launched_distributed"]


def launched_distributed() -> bool:
    """True when running under a launcher (`torchrun`) with more than one process, or in an initialised group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        raise ValueError(
            f"the WORLD_SIZE environment variable must be an integer, got {os.environ['WORLD_SIZE']!r}"
        ) from None


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands in a (possibly single-process) run.

    Attributes:
        rank: this process's rank (0 when not distributed).
        world_size: number of processes (1 when not distributed).
        local_rank: rank on this machine (selects the GPU under `nccl`).
        device: device of the collective operations' tensors (the flow's device).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def active(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that writes files and shows progress."""
        return self.rank == 0

    def mean(self, values: Tensor) -> Tensor:
        """Average a tensor over the ranks (the identity in a single process)."""
        if not self.active:
            return values
        values = values.to(self.device).clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values / self.world_size

    def sum(self, values: Tensor) -> Tensor:
        """Sum a tensor over the ranks (the identity in a single process)."""
        if not self.active:
            return values
        values = values.to(self.device).clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def broadcast_int(self, value: int) -> int:
        """Rank 0's `value` on every rank."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=0)
        return int(t.item())

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (a one-element list in a single process)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_module(self, module: nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every rank's `module`, in place."""
        if not self.active:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.active:
            dist.barrier()

    def wrap(self, module: nn.Module, **ddp_options: Any) -> nn.Module:
        """Wrap `module` in `torch.nn.parallel.DistributedDataParallel` (unchanged in a single process).

        DDP broadcasts rank 0's parameters and buffers at construction, so the
        ranks start from the same weights whatever their initialisation.
        """
        if not self.active:
            return module
        if self.device.type == "cuda":
            ddp_options.setdefault("device_ids", [self.device.index])
        return nn.parallel.DistributedDataParallel(module, **ddp_options)


def setup_distributed(module: nn.Module) -> DistributedContext:
    """Join the launcher's process group (initialising it if needed) and place `module` on this rank's device.

    Without a launcher this returns a single-process context and leaves
    `module` where it is. Under `nccl` a flow on the CPU is moved to
    `cuda:LOCAL_RANK`.

    Raises:
        ValueError: when `WORLD_SIZE > 1` but `torch.distributed` is unavailable.
    """
    try:
        device = next(module.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    if not launched_distributed():
        return DistributedContext(device=device)
    if not dist.is_available():
        raise ValueError("WORLD_SIZE > 1 but this build of torch has no torch.distributed")
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        atexit.register(_destroy_process_group)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.get_backend() == "nccl":
        if device.type != "cuda":
            device = torch.device("cuda", local_rank)
            module.to(device)
        torch.cuda.set_device(device)
    return DistributedContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device
    )


def _destroy_process_group() -> None:
    """Leave the process group at exit, once every rank has got there.

    Without the barrier a rank that finishes first tears down its gloo
    connections while its peer's are still live, and the C++ side can abort
    the process (`terminate called without an active exception`).
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
