"""Training checkpoints without pickle: one safetensors file holding the tensors and a JSON header.

A checkpoint is a nested structure of dicts, lists, tuples, numbers, strings,
None and tensors (the flow's and optimizer's state dicts, the schedule, RNG
states, the objective's state, the history).
[`save_state`][flowkit.train.checkpoint.save_state] stores every tensor in a
safetensors file and the rest as JSON in the file's metadata; [`load_state`][flowkit.train.checkpoint.load_state]
rebuilds it. Nothing is unpickled, so a checkpoint from an untrusted source
cannot run code. The file is written to a temporary name and renamed, so an
interruption never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json as _json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from .._config import read_json
from ..io import write_safetensors

__all__ = ["save_state", "load_state", "load_checkpoint"]

_FORMAT = "flowkit-checkpoint"
_VERSION = 1


def _encode(obj: Any, tensors: dict[str, Tensor], where: str) -> Any:
    if isinstance(obj, Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}.{k}")] for k, v in obj.items()]}
    raise TypeError(f"cannot store {where} of type {type(obj).__name__} in a checkpoint")


def _decode(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            key = obj["__tensor__"]
            if not isinstance(key, str) or key not in tensors:
                raise ValueError(f"the header refers to a tensor {key!r} that the file does not hold")
            return tensors[key]
        if set(obj) == {"__tuple__"} and isinstance(obj["__tuple__"], list):
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if set(obj) == {"__dict__"} and isinstance(obj["__dict__"], list):
            items = {}
            for entry in obj["__dict__"]:
                if not (isinstance(entry, list) and len(entry) == 2):
                    raise ValueError(f"a dict entry must be a [key, value] pair, got {str(entry)[:60]}")
                key = _decode(entry[0], tensors)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise ValueError(f"a dict key must be a string or a number, got {type(key).__name__}")
                items[key] = _decode(entry[1], tensors)
            return items
        raise ValueError(f"unknown entry {sorted(obj)[:5]} in the checkpoint header")
    return obj


def save_state(state: Any, path: str | os.PathLike) -> Path:
    """Write `state` (nested dicts, lists, tuples, scalars, strings, None, tensors) to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    header = _encode(state, tensors, "state")
    metadata = {"format": _FORMAT, "version": str(_VERSION), "state": _json.dumps(header)}
    tmp = path.with_name(path.name + ".tmp")
    write_safetensors(tensors, tmp, metadata=metadata)
    os.replace(tmp, path)
    return path


def load_state(path: str | os.PathLike) -> Any:
    """Read a state written by [`save_state`][flowkit.train.checkpoint.save_state] (tensors on the CPU).

    Raises:
        ValueError: if the file is not a flowkit checkpoint.
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a readable flowkit checkpoint ({error})") from None
    if metadata.get("format") != _FORMAT or metadata.get("version") != str(_VERSION):
        raise ValueError(f"{path} is not a flowkit checkpoint (format {metadata.get('format')!r})")
    if not isinstance(metadata.get("state"), str):
        raise ValueError(f"{path} has a corrupt checkpoint header (no state)")
    header = read_json(metadata["state"], f"{path}: the checkpoint header", allow_nan=True)
    try:
        return _decode(header, tensors)
    except ValueError as error:
        raise ValueError(f"{path} has a corrupt checkpoint header ({error})") from None


# The contents of a checkpoint written by `fit`, checked field by field before anything uses them.

_Check = Callable[[Any], bool]


def _int(low: int = 0, high: int = 2**63 - 1) -> _Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _optional(check: _Check) -> _Check:
    return lambda v: v is None or check(v)


def _list_of(check: _Check) -> _Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _tensors(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(t, Tensor) for k, t in v.items())


def _dict(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) for k in v)


def _optimizer(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and isinstance(v.get("state"), dict)
        and all(isinstance(s, dict) for s in v["state"].values())
        and _list_of(lambda g: _dict(g) and _list_of(_int())(g.get("params")) and _number(g.get("lr", 0.0)))(
            v.get("param_groups")
        )
    )


def _scheduler(v: Any) -> bool:
    """A torch LR scheduler's state dict: its step counters are integers, its learning rates numbers."""
    counters = all(_int(-1)(v.get(k, 0)) for k in ("last_epoch", "_step_count")) if _dict(v) else False
    return counters and "last_epoch" in v and all(_list_of(_number)(v.get(k, [])) for k in ("base_lrs", "_last_lr"))


def _rng(v: Any) -> bool:
    """A state of [`rng_state`][flowkit.train.state.rng_state]: torch's bytes, Python's and numpy's Mersenne twister."""
    if not (isinstance(v, dict) and {"torch", "python", "numpy"} <= set(v)):
        return False
    generator, python, numpy = v["torch"], v["python"], v["numpy"]
    return (
        isinstance(generator, Tensor)
        and generator.dtype == torch.uint8
        and generator.shape == torch.get_rng_state().shape
        and isinstance(python, tuple)
        and len(python) == 3
        and isinstance(python[1], tuple)
        and len(python[1]) == 625
        and all(_int(0, 2**32)(x) for x in python[1])
        and isinstance(numpy, tuple)
        and len(numpy) == 5
        and numpy[0] == "MT19937"
        and isinstance(numpy[1], Tensor)
        and numpy[1].shape == (624,)
        and not numpy[1].is_floating_point()
        and _int(0, 624)(numpy[2])
        and _int(0, 1)(numpy[3])
        and _number(numpy[4])
        and (_list_of(lambda t: isinstance(t, Tensor) and t.dtype == torch.uint8)(v["cuda"]) if "cuda" in v else True)
    )


def _history(v: Any) -> bool:
    floats = _list_of(lambda x: x is None or isinstance(x, (int, float)) and not isinstance(x, bool))
    steps = _list_of(_int())
    checks = {
        **dict.fromkeys(("loss", "lr", "time", "grad_norm", "val_loss"), floats),
        **dict.fromkeys(("step", "val_step", "skipped"), steps),
        "metrics": lambda m: _dict(m) and all(floats(x) for x in m.values()),
        "best_step": _optional(_int()),
        "best_val_loss": _optional(lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)),
        "stopped_early": lambda x: isinstance(x, bool),
    }
    return _dict(v) and all(k in checks and checks[k](x) for k, x in v.items())


_FIT_CHECKPOINT: dict[str, tuple[_Check, str]] = {
    "flow": (_tensors, "the flow's state dict (names to tensors)"),
    "optimizer": (_optimizer, "an optimizer state dict (state and param_groups)"),
    "scheduler": (_optional(_scheduler), "a scheduler state dict (with last_epoch) or null"),
    "step": (_int(), "a non-negative integer"),
    "epoch": (_int(), "a non-negative integer"),
    "batch_in_epoch": (_int(), "a non-negative integer"),
    "data_seed": (_int(-(2**62), 2**62), "an integer"),
    "elapsed": (lambda v: _number(v) and v >= 0, "a non-negative number of seconds"),
    "history": (_history, "a training history (lists of steps and finite-or-null numbers)"),
    "rng": (
        lambda v: (
            isinstance(v, list)
            and len(v) > 0
            and _list_of(lambda r: isinstance(r, dict) and _rng(r.get("current")) and _rng(r.get("epoch_start")))(v)
        ),
        "one {current, epoch_start} pair of RNG states per process",
    ),
    "bad_validations": (_int(), "a non-negative integer"),
    "best_state": (_optional(_tensors), "a state dict or null"),
    "ema": (
        _optional(
            lambda v: (
                _dict(v)
                and _number(v.get("decay"))
                and 0 < v["decay"] < 1
                and _int()(v.get("updates"))
                and _tensors(v.get("shadow"))
            )
        ),
        "an EMA state (decay in (0, 1), updates, shadow tensors) or null",
    ),
}


#: Fields that checkpoints of earlier versions lack: checked when present.
_FIT_CHECKPOINT_OPTIONAL: dict[str, tuple[_Check, str]] = {
    "objective": (
        lambda v: isinstance(v, list) and len(v) > 0 and _list_of(_dict)(v),
        "one objective state dict (string keys) per process",
    ),
}


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint written by [`fit`][flowkit.train.fit] and check every field before it is used.

    The objective's state (`"objective"`, one dict per process) is absent from checkpoints written before
    objectives' state was saved; such checkpoints still load. Its contents are checked by the objective's
    [`load_state_dict`][flowkit.train.objective.Objective.load_state_dict] when a run resumes.

    Raises:
        ValueError: if the file is not a flowkit checkpoint, its header is corrupt, or a field is
            missing or of the wrong kind (a step that is not a non-negative integer, no RNG state, ...);
            the message names the field.
    """
    saved = load_state(path)
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is not a fit checkpoint (it holds a {type(saved).__name__}, not a dict)")
    for key, (check, expected) in (*_FIT_CHECKPOINT.items(), *_FIT_CHECKPOINT_OPTIONAL.items()):
        if key not in saved:
            if key in _FIT_CHECKPOINT_OPTIONAL:
                continue
            raise ValueError(f"{path} is not a complete fit checkpoint: {key!r} is missing")
        if not check(saved[key]):
            raise ValueError(f"{path} has a corrupt fit checkpoint: {key!r} must be {expected}")
    return saved
