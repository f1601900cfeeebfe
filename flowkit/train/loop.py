"""The fit loop: one loop for every objective.

:func:`fit` minimises ``objective.loss(flow, batch)`` (plus the flow's
auxiliary loss, if any) with a gradient optimiser. It knows nothing of a
particular objective: objectives that learn from data receive batches of it
(``x`` or ``(x, context)``); objectives with ``needs_data = False`` receive
latent batches ``z ~ flow.base`` when no data is given.

Around the step it provides a learning-rate schedule, gradient clipping,
progress, validation and early stopping, checkpoints and exact resume, a guard
that skips steps with a non-finite loss or gradient, and data-parallel
training under ``torchrun`` (:mod:`flowkit.train.distributed`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau
from tqdm import tqdm

from .batches import LatentBatches, make_batches, split_batch
from .checkpoint import load_state, save_state
from .distributed import DistributedContext, setup_distributed

__all__ = ["fit", "History", "CHECKPOINT_FILE"]

#: Name of the checkpoint file that :func:`fit` writes in ``checkpoint_dir``.
CHECKPOINT_FILE = "checkpoint.safetensors"
_MAX_WARNINGS = 10

_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
}


@dataclass
class History:
    """What happened during :func:`fit`, one entry per step (and per validation).

    Attributes:
        step: step numbers, from 1.
        loss: the minimised loss at each step (objective plus auxiliary loss),
            averaged over ranks; NaN or inf at skipped steps.
        lr: learning rate used at each step.
        time: seconds since the start of training (cumulative over resumes).
        grad_norm: global gradient norm before clipping (NaN when skipped before backward).
        metrics: the objective's :meth:`~flowkit.train.Objective.metrics` (and
            ``auxiliary_loss``) at each step, by name.
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

    def record(self, step: int, loss: float, lr: float, time: float, grad_norm: float, metrics: dict[str, float]) -> None:
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
    def from_dict(cls, d: dict[str, Any]) -> "History":
        """Rebuild from :meth:`to_dict` (or :meth:`to_json`'s file, where nulls stand for non-finite numbers)."""

        def floats(values: list[Any]) -> list[float]:
            return [math.nan if v is None else float(v) for v in values]

        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
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
    def from_json(cls, path: str | os.PathLike) -> "History":
        """Read a history written by :meth:`to_json`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write one row per step: step, loss, lr, time, grad_norm, skipped, val_loss (empty when not validated), metrics."""
        path = Path(path)
        val = dict(zip(self.val_step, self.val_loss))
        skipped = set(self.skipped)
        names = list(self.metrics)
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "loss", "lr", "time", "grad_norm", "skipped", "val_loss", *names])
            for i, s in enumerate(self.step):
                writer.writerow(
                    [s, repr(self.loss[i]), repr(self.lr[i]), f"{self.time[i]:.6f}", repr(self.grad_norm[i]),
                     int(s in skipped), repr(val[s]) if s in val else "", *(repr(self.metrics[n][i]) for n in names)]
                )
        return path


class _LossModule(nn.Module):
    """The objective's loss as a module's forward, so DistributedDataParallel sees the parameters' use."""

    def __init__(self, flow: nn.Module, objective: Any) -> None:
        super().__init__()
        self.flow = flow
        self.objectives = [objective]  # a plain list: the objective is not part of the model

    def forward(self, batch: Any) -> tuple[Tensor, Tensor | None]:
        loss = self.objectives[0].loss(self.flow, batch)
        auxiliary = getattr(self.flow, "auxiliary_loss", None)
        return loss, (auxiliary() if callable(auxiliary) else None)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _make_optimizer(optimizer: Any, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if optimizer is None:
        return torch.optim.Adam(params, lr=lr)
    if isinstance(optimizer, str):
        if optimizer.lower() not in _OPTIMIZERS:
            raise ValueError(f"fit: unknown optimizer {optimizer!r}; choose from {sorted(_OPTIMIZERS)}")
        return _OPTIMIZERS[optimizer.lower()](params, lr=lr)
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


def _make_schedule(schedule: Any, optimizer: torch.optim.Optimizer, total: int | None) -> Any:
    if schedule is None:
        return None
    if isinstance(schedule, str):
        if schedule not in ("cosine", "step"):
            raise ValueError(f"fit: unknown schedule {schedule!r}; choose 'cosine', 'step', None or a scheduler factory")
        if total is None:
            raise ValueError(f"fit: the {schedule!r} schedule needs the number of steps; give steps=")
        if schedule == "cosine":

            def factor(t: int) -> float:
                return 0.5 * (1.0 + math.cos(math.pi * min(t, total) / total))

        else:
            milestones = (total // 2, (3 * total) // 4)

            def factor(t: int) -> float:
                return 0.1 ** sum(t >= m for m in milestones)

        return LambdaLR(optimizer, factor)
    if isinstance(schedule, (LRScheduler, ReduceLROnPlateau)):
        return schedule
    if callable(schedule):
        built = schedule(optimizer)
        if not isinstance(built, (LRScheduler, ReduceLROnPlateau)):
            raise ValueError(f"fit: the schedule factory returned {type(built).__name__}, not a torch LR scheduler")
        return built
    raise ValueError(f"fit: schedule must be 'cosine', 'step', None or a factory(optimizer); got {schedule!r}")


def _validate(flow: nn.Module, objective: Any, source: Any, ctx: DistributedContext) -> float:
    """Mean validation loss over the points (each rank its shard; weighted by batch sizes)."""
    custom = getattr(objective, "validation_loss", None)
    was_training = flow.training
    flow.eval()
    total, count = 0.0, 0
    try:
        for batch in source.epoch(0):
            n = split_batch(batch)[0].shape[0]
            if callable(custom):
                value = custom(flow, batch)
            else:
                with torch.no_grad():
                    value = objective.loss(flow, batch)
            total += float(value.detach()) * n
            count += n
    finally:
        flow.train(was_training)
    sums = ctx.sum(torch.tensor([total, float(count)], dtype=torch.float64))
    return float(sums[0] / sums[1]) if sums[1] > 0 else math.nan


def _check_positive_int(value: Any, name: str, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"fit: {name} must be a positive integer, got {value!r}")


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
) -> History:
    """Train ``flow`` by minimising ``objective.loss(flow, batch)``; returns the :class:`History`.

    Each step draws a batch, computes the loss (plus ``flow.auxiliary_loss()``
    when it is not None), back-propagates, clips the global gradient norm to
    ``clip``, and takes an optimiser step. A step whose loss or gradient norm
    is not finite is skipped (no update), counted in ``History.skipped`` and
    warned about.

    Arguments:
        flow: the model (a :class:`~flowkit.Flow`, or any module the objective understands).
        objective: an :class:`~flowkit.train.Objective`.
        data: training data: a tensor ``x`` (or array), a pair ``(x, context)``,
            a :class:`~torch.utils.data.Dataset` yielding either, or a
            :class:`~torch.utils.data.DataLoader` (used as given; ``batch_size``
            is then ignored). Floating tensors are cast to the flow's dtype and
            moved to its device. ``None`` for objectives with
            ``needs_data = False``: each step then draws ``z = flow.base.sample((batch_size,))``.
        steps: number of optimisation steps (give this or ``epochs``).
        epochs: number of passes over ``data`` (1 when neither ``steps`` nor ``epochs`` is given).
        batch_size: points per batch (per process under ``torchrun``).
        lr: learning rate.
        optimizer: None (Adam), a name (``"adam"``, ``"adamw"``, ``"sgd"``,
            ``"rmsprop"``), a torch optimizer over the flow's parameters, or a
            factory called as ``factory(params, lr=lr)``.
        schedule: ``"cosine"`` (cosine decay to 0 over the run), ``"step"``
            (times 0.1 at 50% and 75% of the run), None (constant), a torch LR
            scheduler, or a factory ``factory(optimizer) -> scheduler``. A
            :class:`~torch.optim.lr_scheduler.ReduceLROnPlateau` is stepped with
            the validation loss; others once per step.
        clip: maximum global gradient norm (None: no clipping).
        val_data: validation data, in any of the forms of ``data``. The
            validation loss is ``objective.validation_loss(flow, batch)`` when the
            objective defines it, else ``objective.loss`` under ``torch.no_grad``;
            the flow is in eval mode; batch losses are weighted by batch size.
        patience: stop after this many validations without improvement and
            restore the best weights (needs ``val_data``).
        checkpoint_dir: directory for the checkpoint (``checkpoint.safetensors``,
            pickle-free), ``history.csv``/``history.json`` and, at the end, the
            model saved with :func:`flowkit.io.save` in ``model/``.
        resume: continue from the checkpoint in ``checkpoint_dir`` if there is
            one (flow, optimizer, schedule, step, data order, RNG states, history):
            a run interrupted and resumed with the same arguments ends with the
            same parameters as an uninterrupted run. Without a checkpoint the run
            starts afresh. A larger ``steps`` extends a finished run.
        progress: show a tqdm progress bar (only on a terminal, only on rank 0).
        seed: seed of torch, numpy and random (rank ``r`` uses ``seed + r``) and
            of the data order; makes runs reproducible.
        val_every: validate every this many steps (default: every epoch, or 20
            times per run if that is more often) and at the last step.
        checkpoint_every: write a checkpoint every this many steps (and at the end).
        restore_best: restore the weights of the best validation loss at the end
            (default: when ``patience`` is given).
        ddp_options: keyword arguments of :class:`~torch.nn.parallel.DistributedDataParallel`
            (e.g. ``{"find_unused_parameters": True}`` for objectives that leave
            some parameters unused).

    Returns:
        The :class:`History` (also written to ``checkpoint_dir``).

    Raises:
        ValueError: for inconsistent arguments (no ``steps`` or ``epochs``, data
            missing for an objective that needs it, ``patience`` without
            ``val_data``, ``resume`` without ``checkpoint_dir``, ...).

    Example:
        >>> import torch, flowkit
        >>> from flowkit.train import MaximumLikelihood, fit
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
        >>> x = torch.randn(1000, 2)
        >>> history = fit(flow, MaximumLikelihood(), x, steps=20, batch_size=100, val_data=x[:200], progress=False)
        >>> len(history.loss), len(history.val_loss) > 0
        (20, True)
    """
    # ---- arguments
    if not isinstance(flow, nn.Module):
        raise ValueError(f"fit: flow must be a torch.nn.Module, got {type(flow).__name__}")
    if not callable(getattr(objective, "loss", None)):
        raise ValueError(f"fit: objective must have a loss(flow, batch) method, got {type(objective).__name__}")
    _check_positive_int(steps, "steps")
    _check_positive_int(epochs, "epochs")
    _check_positive_int(batch_size, "batch_size", allow_none=False)
    _check_positive_int(patience, "patience")
    _check_positive_int(val_every, "val_every")
    _check_positive_int(checkpoint_every, "checkpoint_every", allow_none=False)
    if steps is not None and epochs is not None:
        raise ValueError("fit: give steps= or epochs=, not both")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"fit: lr must be a positive number, got {lr!r}")
    if clip is not None and not (isinstance(clip, (int, float)) and clip > 0):
        raise ValueError(f"fit: clip must be a positive number (the maximum gradient norm) or None, got {clip!r}")
    needs_data = getattr(objective, "needs_data", True)
    if data is None and needs_data:
        raise ValueError(f"fit: {type(objective).__name__} learns from data; pass data=")
    if data is None and steps is None:
        raise ValueError("fit: without data (latent batches) give steps=")
    if steps is None and epochs is None:
        epochs = 1
    if patience is not None and val_data is None:
        raise ValueError("fit: patience (early stopping) needs val_data")
    if resume and checkpoint_dir is None:
        raise ValueError("fit: resume=True needs checkpoint_dir")
    restore_best = patience is not None if restore_best is None else bool(restore_best)
    if restore_best and val_data is None:
        raise ValueError("fit: restore_best needs val_data")
    params = [p for p in flow.parameters() if p.requires_grad]
    if not params:
        raise ValueError("fit: the flow has no trainable parameters")

    # ---- processes, seeds, data
    ctx = setup_distributed(flow)
    if seed is not None:
        _seed_everything(seed + ctx.rank)
    elif ctx.active:
        _seed_everything(ctx.broadcast_int(int(torch.randint(2**31 - 1, ()).item())) + ctx.rank)
    data_seed = seed if seed is not None else ctx.broadcast_int(int(torch.randint(2**31 - 1, ()).item()))
    dtype = next((p.dtype for p in flow.parameters() if p.is_floating_point()), None)
    shard = dict(world_size=ctx.world_size, rank=ctx.rank, device=ctx.device, dtype=dtype)
    if data is None:
        source: Any = LatentBatches(flow, batch_size)
    else:
        source = make_batches(data, batch_size, seed=data_seed, shuffle=True, name="data", **shard)
    val_source = None
    if val_data is not None:
        val_source = make_batches(val_data, batch_size, seed=data_seed, shuffle=False, name="val_data", **shard)
    per_epoch = source.steps_per_epoch
    if per_epoch == 0:
        raise ValueError("fit: data yields no batches")
    total = steps if steps is not None else (epochs * per_epoch if per_epoch is not None else None)
    if val_every is None:
        val_every = max(1, total // 20) if total is not None else (per_epoch or 1)
        if per_epoch is not None:
            val_every = min(val_every, per_epoch)

    # ---- optimiser and schedule
    opt = _make_optimizer(optimizer, params, float(lr))
    scheduler = _make_schedule(schedule, opt, total)
    plateau = isinstance(scheduler, ReduceLROnPlateau)
    if plateau and val_source is None:
        raise ValueError("fit: ReduceLROnPlateau is stepped with the validation loss; give val_data")

    # ---- state, possibly resumed
    history = History()
    step = epoch = batch_in_epoch = bad_validations = 0
    elapsed = 0.0
    best_state: dict[str, Tensor] | None = None
    epoch_rng: dict[str, Any] | None = None
    resumed_rng: dict[str, Any] | None = None
    directory = Path(checkpoint_dir) if checkpoint_dir is not None else None
    checkpoint_path = directory / CHECKPOINT_FILE if directory is not None else None
    if resume and checkpoint_path is not None and checkpoint_path.exists():
        state = load_state(checkpoint_path)
        try:
            flow.load_state_dict(state["flow"])
            opt.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError) as error:
            raise ValueError(f"fit: the checkpoint {checkpoint_path} does not fit this flow and optimizer: {error}") from None
        if scheduler is not None:
            if state["scheduler"] is None:
                raise ValueError("fit: the checkpoint was written without a schedule; resume with the same schedule")
            scheduler.load_state_dict(state["scheduler"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        data_seed, elapsed, bad_validations = state["data_seed"], state["elapsed"], state["bad_validations"]
        history = History.from_dict(state["history"])
        best_state = state["best_state"]
        rngs = state["rng"]
        if len(rngs) != ctx.world_size:
            warnings.warn(
                f"fit: the checkpoint was written by {len(rngs)} process(es), now {ctx.world_size}; the resumed "
                "run will not repeat the uninterrupted one exactly",
                RuntimeWarning,
                stacklevel=2,
            )
        resumed_rng = rngs[ctx.rank % len(rngs)]
        epoch_rng = resumed_rng["epoch_start"]
        if data is not None:
            source = make_batches(data, batch_size, seed=data_seed, shuffle=True, name="data", **shard)
        if per_epoch is not None and batch_in_epoch >= per_epoch:
            epoch, batch_in_epoch = epoch + 1, 0
        if batch_in_epoch == 0:  # at an epoch boundary: nothing to replay
            _set_rng_state(resumed_rng["current"])
            resumed_rng = None

    def write_checkpoint() -> None:
        if checkpoint_path is None:
            return
        rng = ctx.gather_objects({"current": _rng_state(), "epoch_start": epoch_rng})
        if not ctx.is_main:
            return
        save_state(
            {
                "flow": flow.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "step": step,
                "epoch": epoch,
                "batch_in_epoch": batch_in_epoch,
                "data_seed": data_seed,
                "elapsed": time.perf_counter() - start,
                "bad_validations": bad_validations,
                "best_state": best_state,
                "history": history.to_dict(),
                "rng": rng,
            },
            checkpoint_path,
        )
        history.to_csv(checkpoint_path.parent / "history.csv")
        history.to_json(checkpoint_path.parent / "history.json")

    def validate() -> bool:
        """Validate, update the best weights; return True when patience is exhausted."""
        nonlocal best_state, bad_validations
        value = _validate(flow, objective, val_source, ctx)
        history.val_step.append(step)
        history.val_loss.append(value)
        if plateau:
            scheduler.step(value)
        if math.isfinite(value) and (history.best_val_loss is None or value < history.best_val_loss):
            history.best_val_loss, history.best_step, bad_validations = value, step, 0
            if restore_best:
                best_state = {k: v.detach().clone() for k, v in flow.state_dict().items()}
        else:
            bad_validations += 1
        return patience is not None and bad_validations >= patience

    # ---- the loop
    model = ctx.wrap(_LossModule(flow, objective), **(ddp_options or {}))
    bar = tqdm(total=total, initial=step, disable=None if progress and ctx.is_main else True, desc="fit", leave=True)
    start = time.perf_counter() - elapsed
    first_step = step
    flow.train()
    done = history.stopped_early or (total is not None and step >= total)
    try:
        while not done and (epochs is None or epoch < epochs):
            if resumed_rng is not None:  # replay the epoch's start so loaders draw the same order, then continue
                _set_rng_state(epoch_rng)
                batches = source.epoch(epoch, batch_in_epoch)
                _set_rng_state(resumed_rng["current"])
                resumed_rng = None
            else:
                epoch_rng = _rng_state()
                batches = source.epoch(epoch, 0)
            drew_batch = False
            for batch in batches:
                drew_batch = True
                opt.zero_grad(set_to_none=True)
                loss, auxiliary = model(batch)
                if not isinstance(loss, Tensor) or loss.dim() != 0:
                    raise ValueError(
                        f"fit: {type(objective).__name__}.loss must return a scalar tensor, got "
                        f"{tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__}"
                    )
                total_loss = loss if auxiliary is None else loss + auxiliary
                metrics = {k: float(v) for k, v in objective.metrics().items()} if hasattr(objective, "metrics") else {}
                if auxiliary is not None:
                    metrics["auxiliary_loss"] = float(auxiliary.detach())
                names = sorted(metrics)
                stats = ctx.mean(
                    torch.tensor([float(total_loss.detach()), *(metrics[n] for n in names)], dtype=torch.float64)
                ).tolist()
                loss_value, metrics = stats[0], dict(zip(names, stats[1:]))
                grad_norm = math.nan
                skipped = not math.isfinite(loss_value)
                if not skipped:
                    if not total_loss.requires_grad:
                        raise ValueError(f"fit: {type(objective).__name__}.loss returned a tensor without gradient")
                    total_loss.backward()
                    if clip is not None:
                        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
                    else:
                        grads = [p.grad for p in params if p.grad is not None]
                        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
                    skipped = not math.isfinite(grad_norm)
                    if not skipped:
                        opt.step()
                lr_used = opt.param_groups[0]["lr"]
                if scheduler is not None and not plateau:
                    with warnings.catch_warnings():  # a skipped first step calls the schedule before the optimiser
                        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
                        scheduler.step()
                if step == first_step and ctx.active:  # layers initialised from each rank's data: take rank 0's
                    ctx.broadcast_module(flow)
                step += 1
                batch_in_epoch += 1
                history.record(step, loss_value, lr_used, time.perf_counter() - start, grad_norm, metrics)
                if skipped:
                    history.skipped.append(step)
                    if len(history.skipped) <= _MAX_WARNINGS:
                        what = "loss" if not math.isfinite(loss_value) else "gradient"
                        more = "; further skipped steps are counted in History.skipped" if len(history.skipped) == _MAX_WARNINGS else ""
                        warnings.warn(
                            f"fit: non-finite {what} at step {step}; the step was skipped "
                            f"({len(history.skipped)} so far){more}",
                            RuntimeWarning,
                            stacklevel=2,
                        )
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4g}", refresh=False)
                if val_source is not None and (step % val_every == 0 or step == total):
                    history.stopped_early = validate()
                    bar.set_postfix(loss=f"{loss_value:.4g}", val=f"{history.val_loss[-1]:.4g}", refresh=False)
                if step % checkpoint_every == 0:
                    write_checkpoint()
                if history.stopped_early or (total is not None and step >= total):
                    done = True
                    break
            if not done:
                if not drew_batch and batch_in_epoch == 0:
                    raise ValueError("fit: data yields no batches")
                epoch, batch_in_epoch = epoch + 1, 0
        if val_source is not None and not history.stopped_early and (not history.val_step or history.val_step[-1] != step):
            history.stopped_early = validate()
    finally:
        bar.close()
    if len(history.skipped) > _MAX_WARNINGS:
        warnings.warn(f"fit: {len(history.skipped)} steps were skipped for non-finite values", RuntimeWarning, stacklevel=2)
    if checkpoint_path is not None:
        write_checkpoint()
    if restore_best and best_state is not None:
        flow.load_state_dict(best_state)
    if directory is not None and ctx.is_main:
        from .. import io
        from .._config import Configurable

        if isinstance(flow, Configurable):
            io.save(flow, directory / "model")
    ctx.barrier()
    return history
