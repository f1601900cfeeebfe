"""Training checkpoints without pickle: one safetensors file holding the tensors and a JSON header.

A checkpoint is a nested structure of dicts, lists, tuples, numbers, strings,
None and tensors (the flow's and optimizer's state dicts, the schedule, RNG
states, the history). [`save_state`][flowkit.train.checkpoint.save_state] stores every tensor in a
safetensors file and the rest as JSON in the file's metadata; [`load_state`][flowkit.train.checkpoint.load_state]
rebuilds it. Nothing is unpickled, so a checkpoint from an untrusted source
cannot run code. The file is written to a temporary name and renamed, so an
interruption never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

__all__ = ["save_state", "load_state"]

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
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if "__dict__" in obj:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__dict__"]}
        raise ValueError(f"unknown entry {sorted(obj)} in the checkpoint header")
    return obj


def save_state(state: Any, path: str | os.PathLike) -> Path:
    """Write `state` (nested dicts, lists, tuples, scalars, strings, None, tensors) to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    header = _encode(state, tensors, "state")
    metadata = {"format": _FORMAT, "version": str(_VERSION), "state": json.dumps(header)}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
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
    try:
        return _decode(json.loads(metadata["state"]), tensors)
    except (KeyError, json.JSONDecodeError, TypeError) as error:
        raise ValueError(f"{path} has a corrupt checkpoint header ({error})") from None
