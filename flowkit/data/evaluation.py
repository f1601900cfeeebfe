"""Held-out log-likelihood with its error bar, as the likelihood benchmarks report it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .digits import bits_per_dim

__all__ = ["NLL", "log_prob_batched", "evaluate_nll"]


@dataclass(frozen=True)
class NLL:
    """Mean negative log-likelihood (nats per point) and two standard errors over the points.

    Attributes:
        mean: mean of `-log p(x)` over the points.
        two_se: `2 s / sqrt(n)`, with `s` the standard deviation of `-log p(x)`.
        n: number of points.
    """

    mean: float
    two_se: float
    n: int

    def bits_per_dim(self, dims: int, levels: int) -> tuple[float, float]:
        """The same in bits/dim for dequantised data, `(mean, two_se)` ([`bits_per_dim`][flowkit.data.bits_per_dim])."""
        return float(bits_per_dim(-self.mean, dims, levels)), self.two_se / (dims * math.log(2))

    def __str__(self) -> str:
        return f"{self.mean:.3f} +- {self.two_se:.3f}"


@torch.no_grad()
def log_prob_batched(flow: torch.nn.Module, x: Tensor, batch_size: int = 4096) -> Tensor:
    """`flow.log_prob(x)` in batches, in eval mode, without gradients (the flow's mode is restored)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"log_prob_batched: batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[0] == 0:
        raise ValueError("log_prob_batched: x must be a tensor with a batch dimension and at least one point")
    was_training = flow.training
    flow.eval()
    try:
        # The flow's dtype and device: of its parameters, or of its buffers when it has none.
        tensors = (t for t in itertools.chain(flow.parameters(), flow.buffers()) if t.is_floating_point())
        anchor = next(tensors, x)
        dtype, device = anchor.dtype, anchor.device
        return torch.cat([flow.log_prob(b.to(device=device, dtype=dtype)).cpu() for b in x.split(batch_size)])
    finally:
        flow.train(was_training)


def evaluate_nll(flow: torch.nn.Module, x: Tensor, batch_size: int = 4096) -> NLL:
    """Mean NLL of `x` under `flow` in nats, with two standard errors over the points."""
    nll = -log_prob_batched(flow, x, batch_size).double()  # a point of zero density makes the mean inf
    n = nll.numel()
    two_se = 2 * float(nll.std()) / math.sqrt(n) if n > 1 else float("nan")
    return NLL(float(nll.mean()), two_se, n)
