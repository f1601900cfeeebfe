"""The fit loop: one loop for every objective.

[`fit`][flowkit.train.fit] minimises `objective.loss(flow, batch)` plus the flow's auxiliary loss with a
gradient optimiser, on batches of data (`x` or `(x, context)`) or, for objectives with `needs_data = False`,
latent batches `z ~ flow.base`. [`train_step`][flowkit.train.loop.train_step] takes one step (skipped when
the loss or the gradient is not finite); a [`TrainState`][flowkit.train.state.TrainState] holds the counters,
the history and the RNG bookkeeping of exact resume; [callbacks][flowkit.train.callbacks] do everything
around the step. Data-parallel training under `torchrun` is in [`distributed`][flowkit.train.distributed].
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from .._validation import check_number
from ..utils import auxiliary_loss_modules, sum_auxiliary_losses
from .batches import LatentBatches, make_batches
from .callbacks import (
    CHECKPOINT_FILE,
    EMA,
    Callback,
    CallbackList,
    Checkpoint,
    Progress,
    SaveModel,
    Validation,
    _BoundWarning,
)
from .checkpoint import load_checkpoint
from .distributed import DistributedContext, setup_distributed
from .objective import Objective, as_objective, objective_name
from .state import History, StepOutcome, TrainState, seed_everything, warn

__all__ = ["fit", "train_step", "default_threads"]  # History and CHECKPOINT_FILE are imported from here too

_MAX_WARNINGS = 10

#: torch's warning when a schedule steps before its optimiser has (a regular expression: the parentheses escaped).
_SCHEDULE_BEFORE_STEP = re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`")

_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
}


class _LossModule(nn.Module):
    """The objective's loss as a module's forward, so DistributedDataParallel sees the parameters' use."""

    def __init__(self, flow: nn.Module, objective: Objective) -> None:
        super().__init__()
        self.flow = flow
        self.objectives = [objective]  # a plain list: the objective is not part of the model
        self.auxiliary_modules = auxiliary_loss_modules(flow)  # found once per run, not at every step

    def forward(self, batch: Any) -> tuple[Tensor, Tensor | None]:
        return self.objectives[0].loss(self.flow, batch), sum_auxiliary_losses(self.auxiliary_modules)


def train_step(
    model: nn.Module,
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    *,
    clip: float | None = None,
    ctx: DistributedContext | None = None,
) -> StepOutcome:
    """One optimisation step on `batch`; the update is skipped when the loss or the gradient norm is not finite.

    Arguments:
        model: a module whose forward maps the batch to `(loss, auxiliary loss or None)`.
        objective: the objective (for its `metrics()`).
        optimizer: the optimiser; the global gradient norm (clipped, and checked for
            finiteness) is taken over the trainable parameters it updates.
        batch: the batch.
        clip: maximum global gradient norm (None: no clipping).
        ctx: the distributed context; the logged numbers are averaged over its ranks.

    Returns:
        The [`StepOutcome`][flowkit.train.state.StepOutcome].
    """
    ctx = ctx or DistributedContext()
    optimizer.zero_grad(set_to_none=True)
    loss, auxiliary = model(batch)
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ValueError(f"fit: {objective_name(objective)}.loss must return a scalar tensor, got {shape}")
    total = loss if auxiliary is None else loss + auxiliary
    metrics = {k: float(v) for k, v in objective.metrics().items()}
    if auxiliary is not None:
        metrics["auxiliary_loss"] = float(auxiliary.detach())
    value = float(total.detach())
    if ctx.active:  # averaged over the processes (one process builds no tensor of statistics)
        names = sorted(metrics)
        stats = ctx.mean(torch.tensor([value, *(metrics[n] for n in names)], dtype=torch.float64))
        value, metrics = stats[0].item(), dict(zip(names, stats[1:].tolist(), strict=True))
    lr = optimizer.param_groups[0]["lr"]
    if not math.isfinite(value):
        return StepOutcome(value, lr, math.nan, metrics, skipped="loss")
    if not total.requires_grad:
        raise ValueError(f"fit: {objective_name(objective)}.loss returned a tensor without gradient")
    total.backward()
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    norm = _global_norm([p.grad for p in params if p.grad is not None])
    if clip is not None:
        torch.nn.utils.clip_grads_with_norm_(params, clip, norm)  # what clip_grad_norm_ does after its norm
    grad_norm = float(norm)
    if not math.isfinite(grad_norm):
        return StepOutcome(value, lr, grad_norm, metrics, skipped="gradient")
    optimizer.step()
    return StepOutcome(value, lr, grad_norm, metrics)


#: A model of at most this many trainable numbers is small: dispatch, not memory traffic, dominates its
#: optimiser step and gradient norm, so `fit` batches them into fewer calls (Adam's multi-tensor update
#: was faster on one CPU thread up to 5.8e5 parameters, slower from 1.8e6).
_SMALL_MODEL_NUMBERS = 1 << 20


def _global_norm(grads: list[Tensor]) -> Tensor:
    """The 2-norm of all gradients: of their concatenation for a small model (fewer calls), else of their norms."""
    if not grads:
        return torch.zeros(())
    device, dtype = grads[0].device, grads[0].dtype
    if any(g.device != device or g.dtype != dtype or g.is_sparse for g in grads):
        return torch.nn.utils.get_total_norm(grads)  # mixed devices or dtypes: torch groups them
    if sum(g.numel() for g in grads) <= _SMALL_MODEL_NUMBERS:
        return torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


# ---------------------------------------------------------------- torch's CPU threads during a run

#: Events of at most this many numbers train on one CPU thread by default (see `default_threads`).
SINGLE_THREAD_FEATURES = 16

#: torch's thread count when flowkit was imported: `fit` keeps a count the user has set since.
_THREADS_AT_IMPORT = torch.get_num_threads()

#: A thread count chosen by the user for the calls of `fit` inside `chosen_threads` (the `--threads` option).
_CHOSEN_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("flowkit_threads", default=None)


def default_threads(features: int) -> int | None:
    """The number of torch CPU threads `fit` and the `flowkit` commands use by default for events of `features` numbers.

    One thread up to `SINGLE_THREAD_FEATURES` (16) numbers per event, else None (torch's choice): a small
    flow's second thread costs more in synchronisation than it gives, tens of times more on a busy machine.
    """
    return 1 if features <= SINGLE_THREAD_FEATURES else None


@contextlib.contextmanager
def chosen_threads(threads: int | None) -> Iterator[None]:
    """Inside the block, `fit(threads=None)` uses `threads` (a user's choice, e.g. `--threads`) over its default."""
    token = _CHOSEN_THREADS.set(threads)
    try:
        yield
    finally:
        _CHOSEN_THREADS.reset(token)


@contextlib.contextmanager
def _run_threads(flow: nn.Module, threads: int | None) -> Iterator[None]:
    """The torch CPU threads of a run of `fit`, restored on exit.

    `threads`, an enclosing `chosen_threads`'s, a count set since flowkit was imported, or (on CPU)
    `default_threads` of the flow's event size.
    """
    chosen = torch.get_num_threads() != _THREADS_AT_IMPORT  # torch.set_num_threads was called: keep it
    if threads is None:
        threads = _CHOSEN_THREADS.get()
    if threads is None and not chosen and not any(p.is_cuda for p in flow.parameters()):
        threads = default_threads(_event_features(flow) or 0)
    previous = torch.get_num_threads()
    if threads is not None and threads != previous:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def _event_features(flow: nn.Module) -> int | None:
    shape = getattr(flow, "event_shape", None)
    return math.prod(shape) if shape is not None else None


# ---------------------------------------------------------------- setting up a run


def _data_tensor(data: Any) -> Tensor | None:
    """The points of `data` when it is a tensor or a pair `(x, context)` of tensors, else None."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], Tensor):
        data = data[0]
    return data if isinstance(data, Tensor) and data.is_floating_point() else None


def _standardize(flow: nn.Module, data: Any, robust: bool = False) -> None:
    """Standardise the flow's data in place (`FlowModel.standardize_`) with the points of `data`."""
    x = _data_tensor(data)
    if not hasattr(flow, "standardize_"):  # not a flowkit model (FlowModel)
        raise ValueError(f"fit: standardize=True needs a flowkit Flow, got {type(flow).__name__}")
    if x is None:
        raise ValueError(
            "fit: standardize=True needs data as a floating tensor of shape (N, D) or a pair (x, context); "
            "for a Dataset or DataLoader, standardise first with flowkit.data.standardize(flow, x)"
        )
    flow.standardize_(x, robust)


def _make_optimizer(optimizer: Any, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The run's optimiser; one built from a name (None: Adam) for a small model takes the `foreach` update.

    torch's multi-tensor update gives the same numbers as its per-tensor loop, bit for bit, in fewer calls.
    """
    if optimizer is None:
        optimizer = "adam"
    if isinstance(optimizer, str):
        if optimizer.lower() not in _OPTIMIZERS:
            raise ValueError(f"fit: unknown optimizer {optimizer!r}; choose from {sorted(_OPTIMIZERS)}")
        small = sum(p.numel() for p in params) <= _SMALL_MODEL_NUMBERS
        return _OPTIMIZERS[optimizer.lower()](params, lr=lr, foreach=True if small else None)
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        built = optimizer(params, lr=lr)
        if not isinstance(built, torch.optim.Optimizer):
            raise ValueError(f"fit: the optimizer factory returned {type(built).__name__}, not a torch optimizer")
        return built
    raise ValueError(
        "fit: optimizer must be None, a name ('adam', 'adamw', 'sgd', 'rmsprop'), a torch optimizer, or a "
        f"factory called as factory(params, lr=lr); got {type(optimizer).__name__}"
    )


def _schedule_factor(schedule: str, total: int) -> Callable[[int], float]:
    if schedule == "cosine":
        return lambda t: 0.5 * (1.0 + math.cos(math.pi * min(t, total) / total))
    milestones = (total // 2, (3 * total) // 4)
    return lambda t: 0.1 ** sum(t >= m for m in milestones)


def _make_schedule(schedule: Any, optimizer: torch.optim.Optimizer, total: int | None) -> Any:
    if schedule is None:
        return None
    if isinstance(schedule, str):
        if schedule not in ("cosine", "step"):
            raise ValueError(
                f"fit: unknown schedule {schedule!r}; choose 'cosine', 'step', None or a scheduler factory"
            )
        if total is None:
            raise ValueError(f"fit: the {schedule!r} schedule needs the number of steps; give steps=")
        return LambdaLR(optimizer, _schedule_factor(schedule, total))
    if isinstance(schedule, (LRScheduler, ReduceLROnPlateau)):
        return schedule
    if callable(schedule):
        built = schedule(optimizer)
        if not isinstance(built, (LRScheduler, ReduceLROnPlateau)):
            raise ValueError(f"fit: the schedule factory returned {type(built).__name__}, not a torch LR scheduler")
        return built
    raise ValueError(f"fit: schedule must be 'cosine', 'step', None or a factory(optimizer); got {schedule!r}")


@dataclass
class _Arguments:
    """The arguments of [`fit`][flowkit.train.fit], checked (and completed: `epochs`, `restore_best`)."""

    flow: nn.Module
    objective: Any
    data: Any
    steps: int | None
    epochs: int | None
    batch_size: int
    lr: float
    optimizer: Any
    schedule: Any
    clip: float | None
    val_data: Any
    patience: int | None
    checkpoint_dir: str | os.PathLike | None
    resume: bool
    progress: bool
    seed: int | None
    val_every: int | None
    checkpoint_every: int
    restore_best: bool | None
    ddp_options: dict[str, Any] | None
    ema: float | None
    callbacks: Sequence[Callback]
    threads: int | None = None
    standardize: bool | str = False

    def __post_init__(self) -> None:
        if not isinstance(self.flow, nn.Module):
            raise ValueError(f"fit: flow must be a torch.nn.Module, got {type(self.flow).__name__}")
        self.objective = as_objective(self.objective, "fit")
        self.clip = self.objective.default_clip if self.clip is None else self.clip
        for name in ("steps", "epochs", "batch_size", "patience", "val_every", "checkpoint_every", "threads"):
            value = getattr(self, name)
            if value is not None or name in ("batch_size", "checkpoint_every"):
                setattr(self, name, int(check_number(value, name, where="fit", integer=True, low=1)))
        if self.steps is not None and self.epochs is not None:
            raise ValueError("fit: give steps= or epochs=, not both")
        self.lr = check_number(self.lr, "lr", where="fit", positive=True, rule="a positive number")
        if self.clip is not None and not (isinstance(self.clip, float) and self.clip == math.inf):  # inf: no clipping
            rule = "a positive number (the maximum gradient norm) or None"
            self.clip = check_number(self.clip, "clip", where="fit", positive=True, rule=rule)
        if self.seed is not None:
            limit = 2**62 - 1
            self.seed = int(check_number(self.seed, "seed", where="fit", integer=True, low=-limit, high=limit,
                                         rule="an integer (or None)"))  # fmt: skip
        if self.ema is not None:
            rule = "a decay between 0 and 1 (exclusive) or None"
            self.ema = check_number(self.ema, "ema", where="fit", positive=True, below=1, rule=rule)
        bad = [type(c).__name__ for c in self.callbacks if not isinstance(c, Callback)]
        if bad:
            raise ValueError(f"fit: callbacks must be flowkit.train.Callback instances, got {bad}")
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.data is None and self.objective.needs_data:
            raise ValueError(f"fit: {objective_name(self.objective)} learns from data; pass data=")
        if self.data is None and self.steps is None:
            raise ValueError("fit: without data (latent batches) give steps=")
        if self.steps is None and self.epochs is None:
            self.epochs = 1
        if self.patience is not None and self.val_data is None:
            raise ValueError("fit: patience (early stopping) needs val_data")
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("fit: resume=True needs checkpoint_dir")
        self.restore_best = self.val_data is not None if self.restore_best is None else bool(self.restore_best)
        if self.restore_best and self.val_data is None:
            raise ValueError("fit: restore_best needs val_data")
        if not any(p.requires_grad for p in self.flow.parameters()):
            raise ValueError("fit: the flow has no trainable parameters")
        if not (isinstance(self.standardize, bool) or self.standardize == "robust"):
            raise ValueError(f"fit: standardize must be True, False or 'robust', got {self.standardize!r}")

    def saved_checkpoint(self) -> dict[str, Any] | None:
        """The contents of the checkpoint to resume from, if any."""
        if not self.resume or self.checkpoint_dir is None:
            return None
        path = Path(self.checkpoint_dir) / CHECKPOINT_FILE
        return load_checkpoint(path) if path.exists() else None


@dataclass
class _Run:
    """What the loop works with: the model, the optimiser, the batch sources and the length of the run."""

    args: _Arguments
    ctx: DistributedContext
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    source: Any
    val_source: Any
    total: int | None
    val_every: int
    first_step: int = 0

    def step(self, state: TrainState, batch: Any) -> StepOutcome:
        """One step, then the schedule; after the run's first step, rank 0's weights on every rank."""
        outcome = train_step(self.model, self.args.objective, self.optimizer, batch, clip=self.args.clip, ctx=self.ctx)
        if self.scheduler is not None and not isinstance(self.scheduler, ReduceLROnPlateau):
            if outcome.skipped is None:  # the optimiser stepped: torch has nothing to warn about
                self.scheduler.step()
            else:
                with warnings.catch_warnings():  # a skipped first step calls the schedule before the optimiser
                    warnings.filterwarnings("ignore", message=_SCHEDULE_BEFORE_STEP)
                    self.scheduler.step()
        if state.step == self.first_step and self.ctx.active:  # layers initialised from each rank's data
            self.ctx.broadcast_module(self.args.flow)
        return outcome

    def finished(self, state: TrainState) -> bool:
        return state.history.stopped_early or (self.total is not None and state.step >= self.total)


def _make_run(args: _Arguments, ctx: DistributedContext, data_seed: int) -> _Run:
    flow, batch_size = args.flow, args.batch_size
    dtype = next((p.dtype for p in flow.parameters() if p.is_floating_point()), None)
    shard = dict(world_size=ctx.world_size, rank=ctx.rank, device=ctx.device, dtype=dtype, seed=data_seed)
    if args.data is None:
        source: Any = LatentBatches(flow, batch_size)
    else:
        source = make_batches(args.data, batch_size, shuffle=True, name="data", **shard)
        args.objective.check_data(source.points)
    val_source = None
    if args.val_data is not None:
        val_source = make_batches(args.val_data, batch_size, shuffle=False, name="val_data", **shard)
    per_epoch = source.steps_per_epoch
    if per_epoch == 0:
        raise ValueError("fit: data yields no batches")
    total = args.steps if args.steps is not None else (args.epochs * per_epoch if per_epoch is not None else None)
    val_every = args.val_every
    if val_every is None:
        val_every = max(1, total // 20) if total is not None else (per_epoch or 1)
        val_every = min(val_every, per_epoch) if per_epoch is not None else val_every
    optimizer = _make_optimizer(args.optimizer, [p for p in flow.parameters() if p.requires_grad], float(args.lr))
    scheduler = _make_schedule(args.schedule, optimizer, total)
    if isinstance(scheduler, ReduceLROnPlateau) and val_source is None:
        raise ValueError("fit: ReduceLROnPlateau is stepped with the validation loss; give val_data")
    model = ctx.wrap(_LossModule(flow, args.objective), **(args.ddp_options or {}))
    return _Run(args, ctx, model, optimizer, scheduler, source, val_source, total, val_every)


def _make_callbacks(run: _Run) -> tuple[CallbackList, Progress, Checkpoint | None]:
    """The built-in callbacks in the order their hooks run; the user's before the checkpoint and the saved model."""
    args, ctx, flow = run.args, run.ctx, run.args.flow
    bound = None if args.standardize else _BoundWarning(flow, _data_tensor(args.data))
    ema = EMA(flow, args.ema) if args.ema is not None else None
    validation = None
    if run.val_source is not None:
        plateau = run.scheduler if isinstance(run.scheduler, ReduceLROnPlateau) else None
        validation = Validation(flow, args.objective, run.val_source, ctx, run.val_every, run.total, args.patience,
                                args.restore_best, plateau, ema.average if ema is not None else None)  # fmt: skip
    progress = Progress(run.total, enabled=args.progress and ctx.is_main, desc=_progress_title(run),
                        metrics=args.objective.progress_metrics)  # fmt: skip
    checkpoint = save = None
    if args.checkpoint_dir is not None:
        checkpoint = Checkpoint(args.checkpoint_dir, args.checkpoint_every, ctx, flow, run.optimizer, run.scheduler,
                                validation, ema, args.objective)  # fmt: skip
        save = SaveModel(flow, args.checkpoint_dir, ctx)
    hooks = CallbackList([bound, ema, validation, progress, *args.callbacks, checkpoint, save])
    return hooks, progress, checkpoint


def _progress_title(run: _Run) -> str:
    """`fit`, with the validation period and what `patience` means in steps when there is validation."""
    if run.val_source is None:
        return "fit"
    title = f"fit (val every {run.val_every} steps"
    if run.args.patience is not None:
        title += f", patience {run.args.patience} = {run.args.patience * run.val_every} steps"
    return title + ")"


def _warn_if_skipped(state: TrainState) -> None:
    skipped = state.history.skipped
    if not state.skipped or len(skipped) > _MAX_WARNINGS:
        return
    more = "; further skipped steps are counted in History.skipped" if len(skipped) == _MAX_WARNINGS else ""
    warn(
        f"fit: non-finite {state.last.skipped} at step {state.step}; the step was skipped ({len(skipped)} so far){more}"
    )


def _train(run: _Run, state: TrainState, callbacks: CallbackList) -> None:
    """Steps until the run's length, the end of the epochs or early stopping."""
    run.first_step = state.step
    run.args.flow.train()
    done = run.finished(state)
    while not done and (run.args.epochs is None or state.epoch < run.args.epochs):
        drew_batch = False
        for batch in state.open_epoch(run.source):
            drew_batch = True
            state.advance(run.step(state, batch))
            _warn_if_skipped(state)
            callbacks.on_step_end(state)
            done = run.finished(state)
            if done:
                break
        if not done:
            if not drew_batch and state.batch_in_epoch == 0:
                raise ValueError("fit: data yields no batches")
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    callbacks.on_train_end(state)
    if len(state.history.skipped) > _MAX_WARNINGS:
        warn(f"fit: {len(state.history.skipped)} steps were skipped for non-finite values")


def _seed(seed: int | None, ctx: DistributedContext) -> int:
    """Seed this rank (`seed + rank`); return the data order's seed, the same on every rank."""
    if seed is not None:
        seed_everything(seed + ctx.rank)
    elif ctx.active:
        seed_everything(ctx.broadcast_int(int(torch.randint(2**31 - 1, ()).item())) + ctx.rank)
    return seed if seed is not None else ctx.broadcast_int(int(torch.randint(2**31 - 1, ()).item()))


def _prepare(args: _Arguments) -> tuple[_Run, TrainState, CallbackList, Progress]:
    """Processes, seeds, data, optimiser and callbacks; the state, resumed from the checkpoint if asked."""
    ctx = setup_distributed(args.flow)
    data_seed = _seed(args.seed, ctx)
    saved = args.saved_checkpoint()
    state = TrainState(data_seed=data_seed if saved is None else saved["data_seed"])
    run = _make_run(args, ctx, state.data_seed)
    hooks, bar, checkpoint = _make_callbacks(run)
    state.record_epoch_rng = any(isinstance(hook, Checkpoint) for hook in hooks.callbacks)
    if saved is not None:
        checkpoint.restore(saved, state, run.source.steps_per_epoch)
    state.start_clock()
    hooks.on_start(state)
    return run, state, hooks, bar


def fit(
    flow: nn.Module,
    objective: Any,
    data: Any = None,
    *,
    steps: int | None = None,
    epochs: int | None = None,
    batch_size: int = 256,
    lr: float = 1e-3,
    optimizer: Any = None,
    schedule: str | Callable[[torch.optim.Optimizer], Any] | None = "cosine",
    clip: float | None = None,
    val_data: Any = None,
    patience: int | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
    seed: int | None = None,
    val_every: int | None = None,
    checkpoint_every: int = 1000,
    restore_best: bool | None = None,
    ddp_options: dict[str, Any] | None = None,
    ema: float | None = None,
    callbacks: Sequence[Callback] = (),
    threads: int | None = None,
    standardize: bool | str = False,
) -> History:
    """Train `flow` by minimising `objective.loss(flow, batch)` plus its auxiliary loss.

    A step whose loss or gradient norm is not finite is skipped, counted in `History.skipped` and warned about.

    Arguments:
        flow: the model (a [`Flow`][flowkit.flows.Flow], or any module the objective understands).
        objective: an [`Objective`][flowkit.train.Objective] (or any object with a `loss(flow, batch)` method).
        data: a tensor `x` (or array), a pair `(x, context)`, a `Dataset` yielding either, or a `DataLoader`,
            cast to the flow's dtype and device. None for objectives with `needs_data = False`: each step
            draws `z = flow.base.sample((batch_size,))`.
        steps: number of optimisation steps (give this or `epochs`).
        epochs: number of passes over `data` (1 when neither `steps` nor `epochs` is given).
        batch_size: points per batch (per process under `torchrun`).
        lr: learning rate.
        optimizer: None (Adam), `"adam"`, `"adamw"`, `"sgd"`, `"rmsprop"`, a torch optimizer over the flow's
            parameters, or a factory called as `factory(params, lr=lr)`.
        schedule: `"cosine"` (decay to 0 over the run), `"step"` (times 0.1 at 50% and 75%), None, a torch LR
            scheduler (a `ReduceLROnPlateau` is stepped with the validation loss), or `factory(optimizer)`.
        clip: maximum global gradient norm; None takes the objective's [`default_clip`][flowkit.train.Objective]
            (10 for the energy-based objectives, none for the likelihood ones); `float("inf")`: no clipping.
        val_data: validation data, in any form of `data`; the loss is the objective's
            [`validation_loss`][flowkit.train.objective.Objective.validation_loss] in eval mode, averaged over points.
        patience: stop after this many validations in a row without improvement (needs `val_data`), that is
            `patience * val_every` steps (the progress bar shows both).
        checkpoint_dir: directory for `checkpoint.safetensors` (pickle-free), `history.csv`,
            `history.json` and, at the end, the model saved with [`flowkit.io.save`][flowkit.io.save] in `model/`.
        resume: continue from the checkpoint in `checkpoint_dir`, if any: exactly as if uninterrupted
            (with the same arguments; a larger `steps` extends a finished run).
        progress: show a tqdm progress bar (only on a terminal, only on rank 0).
        seed: seed of torch, numpy and random (rank `r` uses `seed + r`) and of the data order.
        val_every: validate every this many steps (default: every epoch, or 20 times per run if
            that is more often) and at the last step.
        checkpoint_every: write a checkpoint every this many steps (and at the end).
        restore_best: put the weights of the best validation loss in the flow at the end
            (default: True whenever `val_data` is given; False keeps the last weights).
        ddp_options: keyword arguments of `DistributedDataParallel` (e.g. `{"find_unused_parameters": True}`).
        ema: decay `d` (`0 < d < 1`) of an exponential moving average of the weights
            ([`EMA`][flowkit.train.EMA]), updated after each step: validation uses the averaged
            weights, the checkpoint holds them, and they are copied into the flow at the end
            (before `restore_best`, whose best weights are then averaged ones).
        callbacks: [`Callback`][flowkit.train.Callback]s run after the built-in ones (before the checkpoint and
            the saved model, which then hold what they did).
        threads: torch CPU threads during the run, restored on exit (default:
            [`default_threads`][flowkit.train.default_threads] of the flow's event size, unless
            `torch.set_num_threads` has changed the count since flowkit was imported).
        standardize: put [`Standardization.from_data(x)`][flowkit.bijectors.Standardization.from_data] of the
            training data (a tensor or `(x, context)`) first in the flow's chain, in place; `"robust"`: by the
            median and the interquartile range / 1.349. Without it, `fit` warns when most points lie outside
            the splines' bound.

    Returns:
        The [`History`][flowkit.train.History] (also written to `checkpoint_dir`); `history.steps_run`
        is the number of steps taken.

    Raises:
        ValueError: for bad or inconsistent arguments (`patience` without `val_data`, ...).

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.train import MaximumLikelihood, fit
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
        >>> x = torch.randn(1000, 2)
        >>> history = fit(flow, MaximumLikelihood(), x, steps=20, batch_size=100, val_data=x[:200], progress=False)
        >>> len(history.loss), len(history.val_loss) > 0
        (20, True)
    """
    args = _Arguments(**locals())  # locals(): the arguments above
    with _run_threads(flow, args.threads):
        if args.standardize:
            _standardize(flow, data, robust=args.standardize == "robust")
        run, state, hooks, bar = _prepare(args)
        try:
            _train(run, state, hooks)
        finally:
            bar.close()
        hooks.on_end(state)
        run.ctx.barrier()
    return state.history
