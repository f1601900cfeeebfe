"""Save and load flows as a JSON config plus safetensors weights; loading never unpickles.

A saved model is a directory holding `config.json` (the constructor
arguments of every flowkit object in the model, nested) and
`weights.safetensors` (the state dict). [`load`][flowkit.io.load] rebuilds the model
*only* from classes in flowkit's registry: a config naming anything else is
refused, and nothing is imported by name from the file.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ._config import Configurable, get_config, registry
from ._legacy import migrate

__all__ = ["save", "load", "to_config", "from_config"]

FORMAT = "flowkit-model"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, Configurable):
        return to_config(value)
    factory = value.func if isinstance(value, functools.partial) and not value.args else value
    if isinstance(factory, type) and registry.get(factory.__name__) is factory:
        # A registered class, or a functools.partial of one with keyword arguments (a preset's conditioner=).
        keywords = value.keywords if factory is not value else {}
        args = {k: _encode(v, f"{where}.{k}") for k, v in keywords.items()}
        return {"__factory__": {"class": factory.__name__, "args": args}}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, torch.Size)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__dict__": {k: _encode(v, f"{where}.{k}") for k, v in value.items()}}
    raise TypeError(
        f"cannot save argument {where} of type {type(value).__name__}: flowkit configs hold numbers, strings, "
        "lists and flowkit objects only"
    )


def to_config(module: Configurable) -> dict[str, Any]:
    """The nested JSON-ready config of a flowkit object: `{"class": name, "args": {...}}`."""
    cls, args = get_config(module)
    return {"class": cls.__name__, "args": {k: _encode(v, f"{cls.__name__}.{k}") for k, v in args.items()}}


def _decode(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__dict__"} and isinstance(value["__dict__"], dict):
            return {k: _decode(v, f"{where}.{k}") for k, v in value["__dict__"].items()}
        if set(value) == {"__factory__"}:
            return _decode_factory(value["__factory__"], where)
        return from_config(value, where)
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"invalid value at {where} in the model config")


def _decode_factory(config: Any, where: str) -> Any:
    """A registered class (no arguments) or a `functools.partial` of one, from `{"class": name, "args": {...}}`."""
    if not isinstance(config, dict) or set(config) != {"class", "args"} or not isinstance(config["args"], dict):
        raise ValueError(f"invalid model config at {where}: a factory needs 'class' and 'args'")
    name = config["class"]
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"model config at {where} names {name!r}, which is not a flowkit class; refusing to build it")
    args = {k: _decode(v, f"{where}.{name}.{k}") for k, v in config["args"].items()}
    return functools.partial(cls, **args) if args else cls


def _leading_arguments(cls: type, args: dict[str, Any]) -> list[Any]:
    """Pop, in order, the named arguments that precede `*args` in `cls`'s signature (they must go by position)."""
    leading = []
    for parameter in inspect.signature(cls).parameters.values():
        if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            break
        if parameter.name in args:
            leading.append(args.pop(parameter.name))
        elif parameter.default is not parameter.empty:
            leading.append(parameter.default)
        else:
            raise TypeError(f"missing argument {parameter.name!r}")
    return leading


def from_config(config: Any, where: str = "config") -> Any:
    """Build a flowkit object from [`to_config`][flowkit.io.to_config]'s output, using registered classes only."""
    if not isinstance(config, dict) or set(config) != {"class", "args"} or not isinstance(config["args"], dict):
        raise ValueError(f"invalid model config at {where}: expected an object with 'class' and 'args'")
    name = config["class"]
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"model config at {where} names {name!r}, which is not a flowkit class; refusing to build it")
    args: dict[str, Any] = {}
    positional: list[Any] = []
    for key, value in config["args"].items():
        decoded = _decode(value, f"{where}.{name}.{key}")
        if key.startswith("*"):
            if not isinstance(decoded, list):
                raise ValueError(f"invalid model config at {where}.{name}: {key} must be a list")
            positional = decoded
        else:
            args[key] = decoded
    try:
        if positional:
            return cls(*_leading_arguments(cls, args), *positional, **args)
        return cls(**args)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"cannot build {name} from the model config at {where}: {error}") from error


def save(model: nn.Module, path: str | os.PathLike) -> Path:
    """Save a flowkit model to the directory `path` (created if needed).

    Writes `config.json` and `weights.safetensors`. Returns the directory.
    """
    if not isinstance(model, Configurable):
        raise ValueError(f"save: {type(model).__name__} is not a flowkit model")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    dtypes = {str(v.dtype).removeprefix("torch.") for v in state.values() if v.is_floating_point()}
    header = {
        "format": FORMAT,
        "version": VERSION,
        # "mixed": each tensor keeps the dtype it was saved with.
        "dtype": dtypes.pop() if len(dtypes) == 1 else ("mixed" if dtypes else "float32"),
        "model": to_config(model),
    }
    (directory / CONFIG_FILE).write_text(json.dumps(header, indent=2))
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    return directory


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> nn.Module:
    """Load a model written by [`save`][flowkit.io.save]; raises `ValueError` on a corrupt or foreign file."""
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"load: no such model directory: {directory}")
    if not directory.is_dir():
        raise ValueError(
            f"load: {directory} is not a flowkit model directory (expected {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for p in (config_path, weights_path):
        if not p.exists():
            raise FileNotFoundError(f"load: missing {p.name} in {directory}")
    try:
        header = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"load: {config_path} is not valid JSON ({error})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"load: {config_path} is not a flowkit model config")
    if header.get("version") != VERSION:
        raise ValueError(f"load: unsupported flowkit model format version {header.get('version')!r}")
    mixed = header.get("dtype") == "mixed"
    dtype = None if mixed else _DTYPES.get(header.get("dtype", "float32"))
    if dtype is None and not mixed:
        raise ValueError(f"load: unknown dtype {header.get('dtype')!r} in {config_path}")
    model = from_config(migrate(header.get("model")), "model")
    if not isinstance(model, nn.Module):
        raise ValueError(f"load: {config_path} describes a {type(model).__name__}, which is not a model")
    try:
        state = load_file(str(weights_path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"load: {weights_path} is not a valid safetensors file ({error})") from None
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"load: {weights_path} holds non-finite values (NaN or inf) in {key!r}")
    if not mixed:
        model = model.to(dtype)
    try:
        # A mixed-precision model takes each saved tensor as it is (with its dtype).
        model.load_state_dict(state, strict=True, assign=mixed)
    except RuntimeError as error:
        raise ValueError(f"load: the weights in {weights_path} do not fit the model config: {error}") from None
    return model.to(map_location)
