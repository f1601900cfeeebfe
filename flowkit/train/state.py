"""The state of a run of [`fit`][flowkit.train.fit]: counters, history and the RNG bookkeeping of exact resume.

[`TrainState`][flowkit.train.state.TrainState] is what callbacks receive: the
step, the position in the data, the [`History`][flowkit.train.History] and the
last step's loss. Its RNG fields let a resumed run replay the data order of an
interrupted epoch: the RNG state at the start of the epoch is kept, so that a
shuffling loader, rebuilt on resume, draws the same order again.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .batches import Batch

__all__ = ["History", "TrainState", "StepOutcome", "seed_everything", "rng_state", "set_rng_state"]

_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class History:
    """What happened during [`fit`][flowkit.train.fit], one entry per step (and per validation).

    Attributes:
        step: step numbers, from 1.
        loss: the minimised loss at each step (objective plus auxiliary loss),
            averaged over ranks; NaN or inf at skipped steps.
        lr: learning rate used at each step.
        time: seconds since the start of training (cumulative over resumes).
        grad_norm: global gradient norm before clipping (NaN when skipped before backward).
        metrics: the objective's [`metrics`][flowkit.train.objective.Objective.metrics] (and
            `auxiliary_loss`) at each step, by name.
        val_step: steps after which the validation loss was computed.
        val_loss: validation losses at those steps.
        skipped: steps skipped by the non-finite guard.
        best_step: step of the best validation loss (None without validation).
        best_val_loss: the best validation loss.
        stopped_early: True if early stopping ended training.
    """

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    val_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    best_step: int | None = None
    best_val_loss: float | None = None
    stopped_early: bool = False

    def __len__(self) -> int:
        return len(self.step)

    @property
    def steps_run(self) -> int:
        """The number of steps taken (over resumes); the same as `len(history)`."""
        return len(self.step)

    def __repr__(self) -> str:
        parts = [f"steps_run={self.steps_run}"]
        if self.loss:
            parts.append(f"last_loss={self.loss[-1]:.6g}")
        if self.val_step:
            parts.append(f"validations={len(self.val_step)}, best_step={self.best_step}")
        if self.best_val_loss is not None:
            parts.append(f"best_val_loss={self.best_val_loss:.6g}")
        if self.skipped:
            parts.append(f"skipped={len(self.skipped)}")
        if self.stopped_early:
            parts.append("stopped_early=True")
        return f"History({', '.join(parts)})"

    def record(
        self, step: int, loss: float, lr: float, time: float, grad_norm: float, metrics: dict[str, float]
    ) -> None:
        """Append one step (metrics missing at earlier or later steps are NaN)."""
        n = len(self.step)
        self.step.append(step)
        self.loss.append(loss)
        self.lr.append(lr)
        self.time.append(time)
        self.grad_norm.append(grad_norm)
        for name in metrics:
            self.metrics.setdefault(name, [math.nan] * n)
        for name, column in self.metrics.items():
            column.append(float(metrics.get(name, math.nan)))

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python lists and numbers."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        """Rebuild from [`to_dict`][flowkit.train.state.History.to_dict] or a `to_json` file.

        In a JSON file nulls stand for non-finite numbers.
        """

        def floats(values: list[Any]) -> list[float]:
            return [math.nan if v is None else float(v) for v in values]

        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"History: unknown fields {sorted(unknown)}")
        return cls(
            step=[int(s) for s in d.get("step", [])],
            loss=floats(d.get("loss", [])),
            lr=floats(d.get("lr", [])),
            time=floats(d.get("time", [])),
            grad_norm=floats(d.get("grad_norm", [])),
            metrics={k: floats(v) for k, v in d.get("metrics", {}).items()},
            val_step=[int(s) for s in d.get("val_step", [])],
            val_loss=floats(d.get("val_loss", [])),
            skipped=[int(s) for s in d.get("skipped", [])],
            best_step=d.get("best_step"),
            best_val_loss=None if d.get("best_val_loss") is None else float(d["best_val_loss"]),
            stopped_early=bool(d.get("stopped_early", False)),
        )

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the history as JSON (non-finite numbers as null)."""

        def clean(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, list):
                return [clean(v) for v in value]
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value

        path = Path(path)
        path.write_text(json.dumps(clean(self.to_dict()), indent=1))
        return path

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> History:
        """Read a history written by [`to_json`][flowkit.train.state.History.to_json]."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write one row per step: step, loss, lr, time, grad_norm, skipped, val_loss (empty if none), metrics."""
        path = Path(path)
        val = dict(zip(self.val_step, self.val_loss, strict=True))
        skipped = set(self.skipped)
        names = list(self.metrics)
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "loss", "lr", "time", "grad_norm", "skipped", "val_loss", *names])
            for i, s in enumerate(self.step):
                writer.writerow(
                    [s, repr(self.loss[i]), repr(self.lr[i]), f"{self.time[i]:.6f}", repr(self.grad_norm[i]),
                     int(s in skipped), repr(val[s]) if s in val else "", *(repr(self.metrics[n][i]) for n in names)]
                )  # fmt: skip
        return path


@dataclass(frozen=True)
class StepOutcome:
    """What one optimisation step did.

    Attributes:
        loss: the minimised loss (objective plus auxiliary loss), averaged over ranks.
        lr: the learning rate of the step.
        grad_norm: global gradient norm before clipping (NaN when the loss was not finite).
        metrics: the objective's metrics (and `auxiliary_loss`), averaged over ranks.
        skipped: `"loss"` or `"gradient"` when the non-finite guard skipped the update, else None.
    """

    loss: float
    lr: float
    grad_norm: float
    metrics: dict[str, float]
    skipped: str | None = None


@dataclass
class TrainState:
    """Where a run stands; what every [`Callback`][flowkit.train.Callback] hook receives.

    Attributes:
        step: steps taken so far (over resumes).
        epoch: the current pass over the data.
        batch_in_epoch: batches of the current epoch already used.
        data_seed: seed of the data order.
        history: the [`History`][flowkit.train.History] so far.
        elapsed: seconds of training before this call of `fit` (resumed runs).
        last: the last step's [`StepOutcome`][flowkit.train.state.StepOutcome] (None before the first).
        val_loss: the validation loss computed at this step, None when there was no validation.
        epoch_rng: RNG states at the start of the current epoch (recorded only when `record_epoch_rng`).
        record_epoch_rng: record `epoch_rng` at each epoch's start: a run that writes checkpoints does
            (a resumed epoch replays it), others skip the copy of every generator's state.
        resumed_rng: RNG states to continue from once the resumed epoch is replayed.
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    data_seed: int = 0
    history: History = field(default_factory=History)
    elapsed: float = 0.0
    last: StepOutcome | None = None
    val_loss: float | None = None
    epoch_rng: dict[str, Any] | None = None
    record_epoch_rng: bool = True
    resumed_rng: dict[str, Any] | None = None
    _start: float = field(default=0.0, repr=False)

    @property
    def skipped(self) -> bool:
        """True when the non-finite guard skipped the last step's update."""
        return self.last is not None and self.last.skipped is not None

    def start_clock(self) -> None:
        """Start timing, continuing from `elapsed`."""
        self._start = time.perf_counter() - self.elapsed

    def time(self) -> float:
        """Seconds of training, over resumes."""
        return time.perf_counter() - self._start

    def advance(self, outcome: StepOutcome) -> None:
        """Count a step and record it in the history."""
        self.step += 1
        self.batch_in_epoch += 1
        self.last, self.val_loss = outcome, None
        self.history.record(self.step, outcome.loss, outcome.lr, self.time(), outcome.grad_norm, outcome.metrics)
        if outcome.skipped is not None:
            self.history.skipped.append(self.step)

    def open_epoch(self, source: Any) -> Iterator[Batch]:
        """The batches of the current epoch; a resumed epoch replays its starting RNG state to draw the same order."""
        if self.resumed_rng is None:
            if self.record_epoch_rng:
                self.epoch_rng = rng_state()
            return source.epoch(self.epoch, 0)
        set_rng_state(self.epoch_rng)
        batches = source.epoch(self.epoch, self.batch_in_epoch)
        set_rng_state(self.resumed_rng["current"])
        self.resumed_rng = None
        return batches

    def state_dict(self) -> dict[str, Any]:
        """The counters and history for a checkpoint (the RNG states are gathered over ranks by the caller)."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "data_seed": self.data_seed,
            "elapsed": self.time(),
            "history": self.history.to_dict(),
        }

    def load_state_dict(self, saved: dict[str, Any], rank: int, world_size: int, steps_per_epoch: int | None) -> None:
        """Continue from a checkpoint holding [`state_dict`][flowkit.train.state.TrainState.state_dict] and `rng`."""
        self.step, self.epoch, self.batch_in_epoch = saved["step"], saved["epoch"], saved["batch_in_epoch"]
        self.data_seed, self.elapsed = saved["data_seed"], saved["elapsed"]
        self.history = History.from_dict(saved["history"])
        rngs = saved["rng"]
        if len(rngs) != world_size:
            warn(
                f"fit: the checkpoint was written by {len(rngs)} process(es), now {world_size}; the resumed "
                "run will not repeat the uninterrupted one exactly"
            )
        self.resumed_rng = rngs[rank % len(rngs)]
        self.epoch_rng = self.resumed_rng["epoch_start"]
        if steps_per_epoch is not None and self.batch_in_epoch >= steps_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        if self.batch_in_epoch == 0:  # at an epoch boundary: nothing to replay
            set_rng_state(self.resumed_rng["current"])
            self.resumed_rng = None


def warn(message: str) -> None:
    """A RuntimeWarning attributed to the first caller outside `flowkit.train` (the user's call of `fit`)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def seed_everything(seed: int) -> None:
    """Seed torch, random and numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def rng_state() -> dict[str, Any]:
    """The RNG states of torch (and CUDA, when in use), random and numpy, storable in a checkpoint."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from [`rng_state`][flowkit.train.state.rng_state]."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
