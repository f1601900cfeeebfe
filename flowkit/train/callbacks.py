"""Callbacks of [`fit`][flowkit.train.fit]: everything around the optimisation step.

The loop only draws batches and takes steps; around them run [`Callback`][flowkit.train.Callback]s, each
with one concern: EMA, validation and early stopping, the progress bar, checkpoints, the saved model (and,
without `standardize=True`, a warning about data outside the splines' bound). The user's `callbacks=` run
after the built-in ones, before the checkpoint and the saved model, which then hold what every callback did.

Hooks are called in list order, with the [`TrainState`][flowkit.train.state.TrainState]:

- `on_start`: once, before the first step (after a resume has restored the state);
- `on_step_end`: after each step (also a skipped one: `state.skipped`);
- `on_validation`: after each validation (`state.val_loss`);
- `on_train_end`: once, after the last step, while the flow holds the trained weights;
- `on_end`: once, after every `on_train_end`: the final weights are put in the
  flow (the EMA's, then the best ones) and saved.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from functools import partialmethod
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from .. import io
from .._config import Configurable
from .batches import split_batch
from .checkpoint import save_state
from .distributed import DistributedContext
from .objective import Objective, objective_name
from .state import TrainState, rng_state, warn

__all__ = ["Callback", "EMA", "Validation", "Progress", "Checkpoint", "SaveModel", "CallbackList", "CHECKPOINT_FILE"]

#: Name of the checkpoint file that [`fit`][flowkit.train.fit] writes in `checkpoint_dir`.
CHECKPOINT_FILE = "checkpoint.safetensors"

#: Above this fraction of data points outside the splines' bound, `fit` warns (without `standardize=True`).
_OUTSIDE_BOUND_WARNING = 0.5


class Callback:
    """Base of the callbacks of [`fit`][flowkit.train.fit]: every hook does nothing by default.

    Examples:
        >>> class PrintLoss(Callback):
        ...     def on_validation(self, state):
        ...         print(state.step, round(state.val_loss, 2))
    """

    def on_start(self, state: TrainState) -> None:
        """Before the first step of this call of `fit`."""

    def on_step_end(self, state: TrainState) -> None:
        """After each step; `state.last` holds its loss, learning rate and gradient norm."""

    def on_validation(self, state: TrainState) -> None:
        """After each validation; `state.val_loss` holds its loss."""

    def on_train_end(self, state: TrainState) -> None:
        """After the last step (the flow still holds the trained weights)."""

    def on_end(self, state: TrainState) -> None:
        """At the very end (the flow holds its final weights once the built-in callbacks have run)."""


class CallbackList:
    """Callbacks called in order; after a hook that validated, every `on_validation`."""

    def __init__(self, callbacks: Sequence[Callback | None]) -> None:
        self.callbacks = [c for c in callbacks if c is not None]

    def _call(self, hook: str, state: TrainState) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(state)
        if state.val_loss is not None:
            for callback in self.callbacks:
                callback.on_validation(state)
            state.val_loss = None

    on_start = partialmethod(_call, "on_start")
    on_step_end = partialmethod(_call, "on_step_end")
    on_train_end = partialmethod(_call, "on_train_end")
    on_end = partialmethod(_call, "on_end")


class _BoundWarning(Callback):
    """Warn at the start when most points `x` (None: not checked) lie outside the flow's `spline_bound`."""

    def __init__(self, flow: nn.Module, x: Tensor | None) -> None:
        self.flow, self.x = flow, x

    def on_start(self, state: TrainState) -> None:
        x, bound = self.x, getattr(self.flow, "spline_bound", None)  # a flowkit model's; None for another module
        if x is None or bound is None or x.dim() < 2 or len(x) == 0:
            return
        outside = float((x[:10_000].detach().flatten(1).abs() > bound).any(1).double().mean())  # a sample suffices
        if outside > _OUTSIDE_BOUND_WARNING:
            warn(
                f"fit: {100 * outside:.0f}% of the data points lie outside the splines' bound [-{bound:g}, {bound:g}], "
                "where the splines are the identity; pass standardize=True (or flowkit.data.standardize(flow, x))"
            )


class EMA(Callback):
    """Exponential moving average of a module's weights, used for evaluation.

    After each optimiser step, [`update`][flowkit.train.callbacks.EMA.update] sets
    `avg <- d avg + (1 - d) w` for every floating parameter and buffer, with
    `d = min(decay, (1 + n) / (10 + n))` after `n` updates (a warm-up).
    [`average`][flowkit.train.callbacks.EMA.average] swaps the averages into the module for a `with` block;
    [`averaged`][flowkit.train.callbacks.EMA.averaged] returns a copy that holds them. `fit(..., ema=decay)`
    validates with the averages, checkpoints them and copies them into the module at the end.

    Arguments:
        module: the model whose weights are averaged.
        decay: the decay `d` (EBFlow uses 0.999).

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> ema = EMA(model, decay=0.99)
        >>> ema.update()
        >>> with ema.average():
        ...     _ = model(torch.zeros(1, 2))
    """

    def __init__(self, module: nn.Module, decay: float = 0.999) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"EMA: decay must be in [0, 1), got {decay}")
        self.module = module
        self.decay = float(decay)
        self.updates = 0
        self.shadow = {name: t.detach().clone() for name, t in self._tensors(module)}

    @staticmethod
    def _tensors(module: nn.Module) -> Iterator[tuple[str, Tensor]]:
        for name, t in module.state_dict(keep_vars=True).items():
            if t.is_floating_point():
                yield name, t

    @torch.no_grad()
    def update(self) -> None:
        """Fold the module's current weights into the averages."""
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for name, t in self._tensors(self.module):
            self.shadow[name].lerp_(t.detach(), 1 - d)
        self.updates += 1

    @classmethod
    @torch.no_grad()
    def _write(cls, module: nn.Module, values: dict[str, Tensor]) -> None:
        target = dict(cls._tensors(module))
        for name, value in values.items():
            target[name].copy_(value)

    def copy_to(self, module: nn.Module | None = None) -> None:
        """Write the averages into `module` (default: the tracked module)."""
        self._write(self.module if module is None else module, self.shadow)

    @contextlib.contextmanager
    def average(self) -> Iterator[nn.Module]:
        """Context in which the tracked module holds the averaged weights; restored on exit."""
        saved = {name: t.detach().clone() for name, t in self._tensors(self.module)}
        self.copy_to()
        try:
            yield self.module
        finally:
            self._write(self.module, saved)

    def averaged(self) -> nn.Module:
        """A copy of the module that holds the averaged weights."""
        model = copy.deepcopy(self.module)
        self.copy_to(model)
        return model

    def state_dict(self) -> dict[str, Any]:
        """The averages and the number of updates (for checkpoints)."""
        return {"decay": self.decay, "updates": self.updates, "shadow": {k: v.clone() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from [`state_dict`][flowkit.train.callbacks.EMA.state_dict]."""
        self.decay = float(state["decay"])
        self.updates = int(state["updates"])
        for name, avg in state["shadow"].items():
            self.shadow[name].copy_(avg)

    def on_step_end(self, state: TrainState) -> None:
        """Update after a step that changed the weights."""
        if not state.skipped:
            self.update()

    def on_end(self, state: TrainState) -> None:
        """Copy the averages into the module."""
        self.copy_to()


class Validation(Callback):
    """Validation loss every `every` steps and after the last one; early stopping; restoring the best weights.

    The loss is the objective's [`validation_loss`][flowkit.train.objective.Objective.validation_loss] of the
    `source`'s batches ([`make_batches`][flowkit.train.batches.make_batches]) in eval mode, averaged over the
    points of every rank, inside the context `weights()` makes
    (e.g. [`EMA.average`][flowkit.train.callbacks.EMA.average]); `plateau` is stepped with each validation loss.
    """

    def __init__(
        self,
        flow: nn.Module,
        objective: Objective,
        source: Any,
        ctx: DistributedContext,
        every: int,
        total: int | None = None,
        patience: int | None = None,
        restore_best: bool = False,
        plateau: Any = None,
        weights: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> None:
        self.flow, self.objective, self.source, self.ctx = flow, objective, source, ctx
        self.every, self.total, self.patience, self.restore_best = every, total, patience, restore_best
        self.plateau = plateau
        self.weights = weights if weights is not None else contextlib.nullcontext
        self.bad_validations = 0
        self.best_state: dict[str, Tensor] | None = None

    def mean_loss(self) -> float:
        """Mean validation loss over the points (each rank its shard)."""
        was_training = self.flow.training
        self.flow.eval()
        total, count = 0.0, 0
        try:
            for batch in self.source.epoch(0):
                n = split_batch(batch)[0].shape[0]
                total += float(self.objective.validation_loss(self.flow, batch).detach()) * n
                count += n
        finally:
            self.flow.train(was_training)
        sums = self.ctx.sum(torch.tensor([total, float(count)], dtype=torch.float64))
        return float(sums[0] / sums[1]) if sums[1] > 0 else math.nan

    def validate(self, state: TrainState) -> None:
        """Validate now: record the loss, keep the best weights, decide on early stopping."""
        history = state.history
        with self.weights():
            value = self.mean_loss()
            improved = math.isfinite(value) and (history.best_val_loss is None or value < history.best_val_loss)
            if improved and self.restore_best:
                self.best_state = {k: v.detach().clone() for k, v in self.flow.state_dict().items()}
        history.val_step.append(state.step)
        history.val_loss.append(value)
        if self.plateau is not None:
            self.plateau.step(value)
        if improved:
            history.best_val_loss, history.best_step, self.bad_validations = value, state.step, 0
        else:
            self.bad_validations += 1
        history.stopped_early = self.patience is not None and self.bad_validations >= self.patience
        state.val_loss = value

    def on_step_end(self, state: TrainState) -> None:
        if state.step % self.every == 0 or state.step == self.total:
            self.validate(state)

    def on_train_end(self, state: TrainState) -> None:
        history = state.history
        if not history.stopped_early and (not history.val_step or history.val_step[-1] != state.step):
            self.validate(state)

    def on_end(self, state: TrainState) -> None:
        if self.restore_best and self.best_state is not None:
            self.flow.load_state_dict(self.best_state)

    def state_dict(self) -> dict[str, Any]:
        """The early-stopping counter and the best weights (for checkpoints)."""
        return {"bad_validations": self.bad_validations, "best_state": self.best_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from [`state_dict`][flowkit.train.callbacks.Validation.state_dict]."""
        self.bad_validations, self.best_state = state["bad_validations"], state["best_state"]


class Progress(Callback):
    """A tqdm progress bar with the loss and the last validation loss (only on a terminal).

    Arguments:
        total: number of steps of the run, if known.
        enabled: False to show nothing (other ranks than 0, `progress=False`).
        desc: the bar's title.
        metrics: names of the step's metrics shown beside the loss (the objective's `progress_metrics`).
    """

    def __init__(self, total: int | None, enabled: bool = True, desc: str = "fit", metrics: Sequence[str] = ()) -> None:
        self.total, self.enabled, self.desc, self.metrics = total, enabled, desc, tuple(metrics)
        self.bar: tqdm | None = None
        self.shown: dict[str, str] = {}

    def on_start(self, state: TrainState) -> None:
        self.bar = tqdm(total=self.total, initial=state.step, disable=None if self.enabled else True, desc=self.desc)

    def on_step_end(self, state: TrainState) -> None:
        if self.bar.disable:  # no bar (progress=False, not a terminal, another rank): nothing to format
            return
        self.bar.update(1)
        self.shown = {n: f"{state.last.metrics[n]:.4g}" for n in self.metrics if n in state.last.metrics}
        self.bar.set_postfix(loss=f"{state.last.loss:.4g}", **self.shown, refresh=False)

    def on_validation(self, state: TrainState) -> None:
        loss = "nan" if state.last is None else f"{state.last.loss:.4g}"
        self.bar.set_postfix(loss=loss, **self.shown, val=f"{state.val_loss:.4g}", refresh=False)

    def on_train_end(self, state: TrainState) -> None:
        self.close()

    def close(self) -> None:
        """Close the bar (also after an error)."""
        if self.bar is not None:
            self.bar.close()


class Checkpoint(Callback):
    """Write everything a resumed run needs, every `every` steps and after the last one.

    The flow, optimizer and schedule states, the [`TrainState`][flowkit.train.state.TrainState] with every
    rank's RNG states and [objective state][flowkit.train.objective.Objective.state_dict], the validation's
    and the EMA's state; rank 0 writes it ([`save_state`][flowkit.train.checkpoint.save_state], pickle-free)
    with `history.csv` and `history.json` beside it.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        every: int,
        ctx: DistributedContext,
        flow: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        validation: Validation | None = None,
        ema: EMA | None = None,
        objective: Objective | None = None,
    ) -> None:
        self.path = Path(directory) / CHECKPOINT_FILE
        self.every, self.ctx, self.flow, self.optimizer, self.scheduler = every, ctx, flow, optimizer, scheduler
        self.validation, self.ema, self.objective = validation, ema, objective

    def write(self, state: TrainState) -> None:
        """Write the checkpoint now (every rank must call this: the RNG and objective states are gathered)."""
        objective = {} if self.objective is None else self.objective.state_dict()
        if self.ctx.active:  # each rank's tensors reach rank 0 through the CPU, whatever its device
            objective = _to_cpu(objective)
        gathered = self.ctx.gather_objects(
            {"rng": {"current": rng_state(), "epoch_start": state.epoch_rng}, "objective": objective}
        )
        if not self.ctx.is_main:
            return
        contents = {
            "flow": self.flow.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            **state.state_dict(),
            "rng": [rank["rng"] for rank in gathered],
            "objective": [rank["objective"] for rank in gathered],
            **(self.validation.state_dict() if self.validation else {"bad_validations": 0, "best_state": None}),
            "ema": None if self.ema is None else self.ema.state_dict(),
        }
        save_state(contents, self.path)
        state.history.to_csv(self.path.parent / "history.csv")
        state.history.to_json(self.path.parent / "history.json")

    def restore(self, saved: dict[str, Any], state: TrainState, steps_per_epoch: int | None) -> None:
        """Continue from the contents of a checkpoint (read with [`load_state`][flowkit.train.checkpoint.load_state]).

        The objective's state is this rank's; a checkpoint without one leaves it as it is (a warning if it has state).

        Raises:
            ValueError: when the checkpoint does not fit this flow, optimizer, schedule, EMA or objective.
        """
        if self.scheduler is not None and saved["scheduler"] is None:
            raise ValueError("fit: the checkpoint was written without a schedule; resume with the same schedule")
        if self.ema is not None:
            written = None if saved.get("ema") is None else float(saved["ema"]["decay"])
            if written != self.ema.decay:
                raise ValueError(f"fit: the checkpoint was written with ema={written}; resume with the same ema")
        try:
            self.flow.load_state_dict(saved["flow"])
            self.optimizer.load_state_dict(saved["optimizer"])
            if self.scheduler is not None:
                self.scheduler.load_state_dict(saved["scheduler"])
            if self.ema is not None:
                self.ema.load_state_dict(saved["ema"])
            if self.objective is not None:
                self._restore_objective(saved.get("objective"))
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise ValueError(
                f"fit: the checkpoint {self.path} does not fit this flow, optimizer, schedule, EMA or objective: "
                f"{error!r}"
            ) from None
        state.load_state_dict(saved, self.ctx.rank, self.ctx.world_size, steps_per_epoch)
        if self.validation is not None:
            self.validation.load_state_dict(saved)

    def _restore_objective(self, saved: list[dict[str, Any]] | None) -> None:
        assert self.objective is not None
        if saved is not None:
            self.objective.load_state_dict(saved[self.ctx.rank % len(saved)])
        elif self.objective.state_dict():
            warn(
                f"fit: the checkpoint {self.path} holds no objective state (it was written by an earlier version); "
                f"{objective_name(self.objective)} continues from its state as it is now, so the resumed run will "
                "not repeat the uninterrupted one exactly"
            )

    def on_step_end(self, state: TrainState) -> None:
        if state.step % self.every == 0:
            self.write(state)

    def on_train_end(self, state: TrainState) -> None:
        self.write(state)


def _to_cpu(obj: Any) -> Any:
    """`obj` (nested dicts, lists and tuples) with its tensors copied to the CPU."""
    if isinstance(obj, Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class SaveModel(Callback):
    """Save the final flow with [`flowkit.io.save`][flowkit.io.save] in `directory/model` (rank 0; saveable flows)."""

    def __init__(self, flow: nn.Module, directory: str | os.PathLike, ctx: DistributedContext) -> None:
        self.flow, self.directory, self.ctx = flow, Path(directory), ctx

    def on_end(self, state: TrainState) -> None:
        if self.ctx.is_main and isinstance(self.flow, Configurable):
            try:
                io.save(self.flow, self.directory / "model")
            except TypeError as error:  # a part a config cannot hold (a lambda, a user-defined energy)
                warnings.warn(f"fit: the model was not saved: {error}", RuntimeWarning, stacklevel=2)
