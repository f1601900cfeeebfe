"""Save and load flows as a JSON config plus safetensors weights; loading never unpickles.

A saved model is a directory holding `config.json` (the constructor arguments of every flowkit object in the model,
nested) and `weights.safetensors` (the state dict). [`load`][flowkit.io.load] rebuilds the model *only* from classes in
flowkit's registry: a config naming anything else is refused, and nothing is imported by name from the file. A model
directory from an untrusted source can at worst be refused (see [`load`][flowkit.io.load]'s errors).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from safetensors.torch import save as _safetensors_bytes
from torch import nn
from torch.overrides import TorchFunctionMode

from ._config import MAX_DEPTH, Configurable, get_config, json_depth, read_json, registry
from ._legacy import migrate
from ._validation import file_in_the_way

__all__ = ["save", "load", "to_config", "from_config"]

FORMAT = "flowkit-model"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


#: While a config is written: how often each flowkit object (by `id`) occurs in it, and the objects numbered so far.
_WRITING: contextvars.ContextVar[tuple[dict[int, int], dict[int, int]] | None] = contextvars.ContextVar(
    "flowkit_io_writing", default=None
)
#: While a config is read: the objects built so far for its `__shared__` entries, by number.
_READING: contextvars.ContextVar[dict[int, Any] | None] = contextvars.ContextVar("flowkit_io_reading", default=None)


def _count_objects(value: Any, counts: dict[int, int]) -> None:
    """Count the occurrences of each flowkit object among `value`'s recorded arguments, nested (each walked once)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Configurable):
            counts[id(item)] = counts.get(id(item), 0) + 1
            if counts[id(item)] == 1 and "_flowkit_config" in vars(item):  # to_config refuses the others, by name
                stack.extend(get_config(item)[1].values())
        elif isinstance(item, functools.partial):
            stack.extend(item.keywords.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, Configurable):
        _check_buildable(value, where)
        writing = _WRITING.get()
        if writing is None or writing[0].get(id(value), 1) == 1:
            return to_config(value)
        # An object several parents hold (a trunk shared by the conditioners of several layers): written in full at its
        # first occurrence, referred to by number at the others, so that `load` builds it once.
        numbers = writing[1]
        if id(value) in numbers:
            return {"__shared__": {"id": numbers[id(value)]}}
        numbers[id(value)] = len(numbers)
        return {"__shared__": {"id": numbers[id(value)], "object": to_config(value)}}
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


def _check_buildable(module: Configurable, where: str) -> None:
    """Refuse to save a flowkit object that [`load`][flowkit.io.load] would refuse to build (an `Energy`, say)."""
    cls = type(module)
    if registry.get(cls.__name__) is not cls:
        kind = "a target defined by user code, which a config cannot hold" if hasattr(module, "energy") else ""
        raise TypeError(
            f"cannot save {where}: {cls.__name__} is {kind or 'not a model class'} (a flowkit config builds "
            "registered model classes only)"
        )


def to_config(module: Configurable) -> dict[str, Any]:
    """The nested JSON-ready config of a flowkit object: `{"class": name, "args": {...}}`.

    Raises:
        TypeError: for an argument a config cannot hold (a function, a tensor, a target defined by
            user code such as [`Energy`][flowkit.targets.Energy], which [`load`][flowkit.io.load] would not build).
    """
    cls, args = get_config(module)
    _check_buildable(module, cls.__name__)
    if _WRITING.get() is None:  # the outermost call: count the objects that occur more than once
        counts: dict[int, int] = {}
        _count_objects(module, counts)
        token = _WRITING.set((counts, {}))
        try:
            return to_config(module)
        finally:
            _WRITING.reset(token)
    return {"class": cls.__name__, "args": {k: _encode(v, f"{cls.__name__}.{k}") for k, v in args.items()}}


def _decode(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__dict__"} and isinstance(value["__dict__"], dict):
            return {k: _decode(v, f"{where}.{k}") for k, v in value["__dict__"].items()}
        if set(value) == {"__factory__"}:
            return _decode_factory(value["__factory__"], where)
        if set(value) == {"__shared__"}:
            return _decode_shared(value["__shared__"], where)
        return _build(value, where)
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"invalid value at {where} in the model config")


#: The modules that define saveable (`Configurable`) classes; `tests/test_io.py` checks that none is missing.
SAVEABLE_MODULES = (
    "applications",
    "bijectors",
    "distributions",
    "embeddings",
    "events",
    "flows",
    "inference",
    "lattice",
    "nn",
    "targets",
    "train",
    "transformers",
)


def register_every_class() -> None:
    """Import every module of `SAVEABLE_MODULES`: their classes are then registered.

    The subpackages load on first use (`import flowkit` does not import torch), so a config may name a class
    whose module is not loaded yet. They are imported by name, at run time: `io` sits below `train`, whose
    objectives are saveable too.
    """
    for name in SAVEABLE_MODULES:
        importlib.import_module(f"flowkit.{name}")


def _registered_class(config: Any, where: str, shape: str) -> tuple[type, str]:
    """The registered class a `{"class": name, "args": {...}}` node names, and that name."""
    if not isinstance(config, dict) or set(config) != {"class", "args"} or not isinstance(config["args"], dict):
        raise ValueError(f"invalid model config at {where}: {shape}")
    name = config["class"]
    if isinstance(name, str) and name not in registry:  # a class of a subpackage not imported yet
        register_every_class()
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"model config at {where} names {name!r}, which is not a flowkit class; refusing to build it")
    return cls, name


def _decode_shared(entry: Any, where: str) -> Any:
    """An object several parents hold: built at its first occurrence (`{"id": n, "object": ...}`), then referred to."""
    built = _READING.get()
    if built is None or not isinstance(entry, dict) or not isinstance(entry.get("id"), int):
        raise ValueError(f"invalid model config at {where}: a shared object needs an integer 'id'")
    number = entry["id"]
    if set(entry) == {"id", "object"} and number not in built:
        built[number] = _build(entry["object"], where)
        return built[number]
    if set(entry) == {"id"} and number in built:
        return built[number]
    raise ValueError(f"invalid model config at {where}: shared object {number} is defined twice or used before it is")


def _decode_factory(config: Any, where: str) -> Any:
    """A registered class (no arguments) or a `functools.partial` of one, from `{"class": name, "args": {...}}`."""
    cls, name = _registered_class(config, where, "a factory needs 'class' and 'args'")
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
    """Build a flowkit object from [`to_config`][flowkit.io.to_config]'s output, using registered classes only.

    Raises:
        ValueError: for a malformed config, one nested deeper than 100 levels, a class that is not
            registered, or arguments its constructor rejects (whatever the constructor raised).
    """
    if json_depth(config) > MAX_DEPTH:
        raise ValueError(f"invalid model config at {where}: nested too deeply (more than {MAX_DEPTH} levels)")
    token = _READING.set({})
    try:
        return _build(config, where)
    finally:
        _READING.reset(token)


def _build(config: Any, where: str) -> Any:
    cls, name = _registered_class(config, where, "expected an object with 'class' and 'args'")
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
    except _TooMuchWork:
        raise
    except Exception as error:  # any failure of a constructor on a file's arguments is a bad config
        detail = str(error) if isinstance(error, (TypeError, ValueError)) else f"{type(error).__name__}: {error}"
        raise ValueError(f"cannot build {name} from the model config at {where}: {detail}") from error


def _holds_tensor(value: Any) -> bool:
    """Whether a tensor is among the arguments `value` (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v) for v in value)
    return isinstance(value, dict) and any(_holds_tensor(v) for v in value.values())


class _TooMuchWork(ValueError):
    """Building the model from its config did more work than its weights file accounts for."""


class _WorkBudget(TorchFunctionMode):
    """Stops a model's build once it allocates more than its weights file can account for.

    A few bytes of config (`transforms=200000`) could build for minutes or allocate gigabytes. Each
    tensor a factory (`randn`, `empty`, ...) would create is first sized on the `meta` device, and the
    build stops before an allocation past four times the file's elements plus $2^{20}$, or past 32 torch
    operations per tensor plus 1000 (layers allocate about their weights, in about ten operations each).
    """

    def __init__(self, elements: int, tensors: int) -> None:
        super().__init__()
        self.elements, self.tensors = elements, tensors
        self.elements_left = 4 * elements + 2**20
        self.operations_left = 32 * (tensors + 1) + 1000

    def _refuse(self, what: str) -> _TooMuchWork:
        return _TooMuchWork(
            f"the model config describes a bigger model than its weights file holds ({self.tensors} tensors, "
            f"{self.elements} numbers): building it stopped at {what}; the config and the weights do not match"
        )

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self.operations_left -= 1
        if self.operations_left < 0:
            raise self._refuse("too many operations")
        if not _holds_tensor((args, kwargs)):  # a factory
            meta = {k: v for k, v in kwargs.items() if k != "generator"}
            try:
                sized = func(*args, **{**meta, "device": torch.device("meta")})
            except Exception:  # noqa: BLE001 - an operation with no meta form allocates nothing big
                sized = None
            for tensor in sized if isinstance(sized, (tuple, list)) else [sized]:
                if isinstance(tensor, torch.Tensor):
                    self.elements_left -= tensor.numel()
            if self.elements_left < 0:
                raise self._refuse(
                    f"a tensor of shape {tuple(sized.shape) if isinstance(sized, torch.Tensor) else '?'}"
                )
        return func(*args, **kwargs)


def _device(map_location: Any) -> torch.device:
    """`map_location` as a torch device that exists here, or a `ValueError` that says why not."""
    if not isinstance(map_location, (str, torch.device)):
        raise ValueError(f"load: map_location must be a device name such as 'cpu', got {type(map_location).__name__}")
    try:
        device = torch.device(map_location)
        if device.type == "meta":
            raise ValueError("the meta device holds no values")
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, NotImplementedError, ValueError) as error:
        raise ValueError(f"load: cannot load onto map_location={str(map_location)!r}: {error}") from None
    return device


def _weights_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """`{key: (shape, dtype name)}` of every tensor in a safetensors file, from its header (no data is read)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = {}
            for key in f.keys():
                part = f.get_slice(key)
                header[key] = (tuple(part.get_shape()), str(part.get_dtype()))
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise ValueError(f"load: {path} is not a valid safetensors file ({error})") from None
    return header


def _dtype_checks(model: nn.Module, weights: Path, mixed: bool) -> list[Any]:
    """Pre-hooks refusing a saved tensor whose dtype is not its model tensor's (`load_state_dict` would cast it).

    In a mixed-precision model, a saved tensor need only be floating where the model's is.
    """

    def check(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        persistent = {k: v for k, v in module._buffers.items() if k not in module._non_persistent_buffers_set}
        for name, tensor in {**module._parameters, **persistent}.items():
            saved = state_dict.get(prefix + name)
            if tensor is None or not isinstance(saved, torch.Tensor):
                continue
            floating = saved.is_floating_point(), tensor.is_floating_point()
            if floating[0] != floating[1] or (not mixed and saved.dtype != tensor.dtype):
                raise ValueError(
                    f"load: {weights} holds {prefix + name!r} as {str(saved.dtype).removeprefix('torch.')}, "
                    f"but the model config gives it dtype {str(tensor.dtype).removeprefix('torch.')}"
                )

    return [m.register_load_state_dict_pre_hook(check) for m in model.modules()]


#: Dtypes whose loaded weights must stay within the square root of their largest value.
_MAGNITUDE_CHECKED = (torch.float32, torch.float64, torch.bfloat16)


def _check_magnitudes(model: nn.Module, weights: Path) -> None:
    """Refuse a loaded float32, float64 or bfloat16 value whose square overflows its dtype (every density NaN).

    float16, whose range is too narrow for that margin (the bound would be 256), is checked for non-finite values only.
    """
    for key, tensor in model.state_dict().items():
        if tensor.dtype not in _MAGNITUDE_CHECKED or not tensor.numel():
            continue
        bound = math.sqrt(torch.finfo(tensor.dtype).max)
        largest = float(tensor.detach().abs().max())
        if largest > bound:
            raise ValueError(
                f"load: {weights} holds {key!r} with a value of magnitude {largest:.3g}, beyond "
                f"{bound:.3g} (the square root of the largest {str(tensor.dtype).removeprefix('torch.')}): "
                "a density computed with it overflows; the file is corrupt or not a trained model"
            )


def save(model: nn.Module, path: str | os.PathLike) -> Path:
    """Save a flowkit model to the directory `path` (created if needed).

    Writes `config.json` and `weights.safetensors`. Returns the directory. An object that several parts of the model
    hold (a [`SharedTrunk`][flowkit.nn.SharedTrunk] under the conditioners of several layers) is written once, as are
    its weights, and [`load`][flowkit.io.load] builds it once.

    Raises:
        ValueError: `model` is not a flowkit model, or `path` (or a folder above it) is an existing file:
            a model is a directory of two files.
    """
    if not isinstance(model, Configurable):
        raise ValueError(f"save: {type(model).__name__} is not a flowkit model")
    directory = Path(path)
    if (where := file_in_the_way(directory)) is not None:
        raise ValueError(
            f"save: {directory} {where} an existing file; a model is saved as a directory "
            f"(new or existing) holding {CONFIG_FILE} and {WEIGHTS_FILE}: give a directory path"
        )
    directory.mkdir(parents=True, exist_ok=True)
    # A tensor several modules hold (a shared trunk's weights) is written once, under its first key.
    state = {first: v.detach().cpu().contiguous().clone() for first, v in _first_keys(model).items()}
    dtypes = {str(v.dtype).removeprefix("torch.") for v in state.values() if v.is_floating_point()}
    header = {
        "format": FORMAT,
        "version": VERSION,
        # "mixed": each tensor keeps the dtype it was saved with.
        "dtype": dtypes.pop() if len(dtypes) == 1 else ("mixed" if dtypes else "float32"),
        "model": to_config(model),
    }
    (directory / CONFIG_FILE).write_text(json.dumps(header, indent=2))
    write_safetensors(state, directory / WEIGHTS_FILE, metadata={"format": FORMAT})
    return directory


def _first_keys(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the keys of tensors it already holds under an earlier key (shared modules)."""
    first: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            first[key] = tensor
    return first


def _aliases(model: nn.Module) -> dict[str, str]:
    """Each state-dict key of a tensor held under an earlier key too, mapped to that first key."""
    first: dict[int, str] = {}
    aliases = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            aliases[key] = first[id(tensor)]
        else:
            first[id(tensor)] = key
    return aliases


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str]) -> None:
    """Write `tensors` as a safetensors file honouring the umask (`safetensors.torch.save_file` makes it 0600)."""
    with open(path, "wb") as file:
        file.write(_safetensors_bytes(tensors, metadata=metadata))


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> nn.Module:
    """Load a model written by [`save`][flowkit.io.save].

    Nothing is unpickled or imported by name: the config may name registered flowkit classes
    only, it must agree with the weights file (checked against the file's header while the model
    is built, so a tiny config cannot make `load` allocate gigabytes or build for minutes), and each
    layer checks the values it loads (a [`Permutation`][flowkit.bijectors.Permutation] must hold a
    permutation, an [`LULinear`][flowkit.bijectors.LULinear] a signed permutation matrix).

    Arguments:
        path: the model directory.
        map_location: the device to put the model on (`"cpu"`, `"cuda:0"`, ...).

    Raises:
        FileNotFoundError: the directory or one of its two files is missing.
        ValueError: a corrupt or foreign file: invalid or non-standard JSON (`NaN`), nesting deeper
            than 100 levels, a class that is not flowkit's, a config its weights do not fit
            (keys, shapes, dtypes, size), non-finite or invalid weights, a float32, float64 or bfloat16
            weight whose square overflows its dtype (above 1.8e19 in float32, 1.3e154 in float64: no
            density can be computed with it); or a `map_location` that is not available here.
    """
    device = _device(map_location)
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
        text = config_path.read_text()
    except UnicodeDecodeError as error:
        raise ValueError(f"load: {config_path} is not valid JSON ({error})") from None
    header = read_json(text, f"load: {config_path}")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"load: {config_path} is not a flowkit model config")
    if header.get("version") != VERSION:
        raise ValueError(f"load: unsupported flowkit model format version {header.get('version')!r}")
    mixed = header.get("dtype") == "mixed"
    dtype = None if mixed else _DTYPES.get(header.get("dtype", "float32"))
    if dtype is None and not mixed:
        raise ValueError(f"load: unknown dtype {header.get('dtype')!r} in {config_path}")
    shapes = _weights_header(weights_path)
    elements = sum(math.prod(shape) for shape, _ in shapes.values())
    with _WorkBudget(elements, len(shapes)):
        try:
            model = from_config(migrate(header.get("model")), "model")
        except _TooMuchWork as error:
            raise ValueError(f"load: {config_path}: {error}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"load: {config_path} describes a {type(model).__name__}, which is not a model")
    try:
        state = load_file(str(weights_path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"load: {weights_path} is not a valid safetensors file ({error})") from None
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"load: {weights_path} holds non-finite values (NaN or inf) in {key!r}")
    for key, first in _aliases(model).items():
        if key not in state and first in state:  # a shared tensor, saved once
            state[key] = state[first]
    if not mixed:
        model = model.to(dtype)
    hooks = _dtype_checks(model, weights_path, mixed)
    try:
        # A mixed-precision model takes each saved tensor as it is (with its dtype).
        model.load_state_dict(state, strict=True, assign=mixed)
    except RuntimeError as error:
        raise ValueError(f"load: the weights in {weights_path} do not fit the model config: {error}") from None
    except ValueError as error:  # a layer refused the values it was given
        message = str(error) if str(error).startswith("load:") else f"load: {weights_path}: {error}"
        raise ValueError(message) from None
    finally:
        for hook in hooks:
            hook.remove()
    _check_magnitudes(model, weights_path)
    return model.to(device)
