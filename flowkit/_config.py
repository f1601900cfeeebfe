"""Constructor-argument recording and the class registry behind [`flowkit.io`][flowkit.io].

Every flowkit module that can be saved derives from `Configurable`: the arguments of its constructor are
recorded when it is built, so that a model can be written as a JSON config plus its weights, and rebuilt
*only* from the classes registered here (a config never names a Python path to import).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from typing import Any, ClassVar

__all__ = ["Configurable", "registry", "get_config", "read_json", "json_depth", "MAX_DEPTH"]

#: The deepest nesting of lists and objects a config or checkpoint header may have (real ones have about 20).
MAX_DEPTH = 100

#: Registered classes, by name. `flowkit.io.load` builds nothing else.
registry: dict[str, type] = {}


class Configurable:
    """Mixin that records the arguments a module was built with.

    Subclasses are registered by class name. The arguments of the outermost `__init__` call are kept in
    `_flowkit_config` (parameter names to values); nested `super().__init__` calls do not overwrite them.
    """

    _flowkit_register: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_flowkit_register", True) and not cls.__name__.startswith("_"):
            other = registry.get(cls.__name__)
            if other is not None and other is not cls and other.__module__ != cls.__module__:
                raise TypeError(f"flowkit class name {cls.__name__!r} is already registered by {other.__module__}")
            registry[cls.__name__] = cls
        if "__init__" in cls.__dict__:
            init = cls.__dict__["__init__"]
            signature = inspect.signature(init)

            @functools.wraps(init)
            def wrapped(self: Any, *args: Any, **kw: Any) -> None:
                if "_flowkit_config" not in self.__dict__:
                    bound = signature.bind(self, *args, **kw)
                    bound.apply_defaults()
                    arguments = dict(bound.arguments)
                    arguments.pop(next(iter(signature.parameters)))
                    config: dict[str, Any] = {}
                    for name, value in arguments.items():
                        kind = signature.parameters[name].kind
                        if kind is inspect.Parameter.VAR_POSITIONAL:
                            config["*" + name] = list(value)
                        elif kind is inspect.Parameter.VAR_KEYWORD:
                            config.update(value)
                        else:
                            config[name] = value
                    object.__setattr__(self, "_flowkit_config", (type(self), config))
                init(self, *args, **kw)

            cls.__init__ = wrapped  # type: ignore[misc]


def get_config(module: Configurable) -> tuple[type, dict[str, Any]]:
    """Return `(class, arguments)` recorded when `module` was built."""
    try:
        return vars(module)["_flowkit_config"]
    except (KeyError, TypeError):
        raise TypeError(f"{type(module).__name__} was not built through a flowkit constructor") from None


class _NonFinite(ValueError):
    pass


def json_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of lists, tuples and dicts in `value` (a scalar is 0), counted without recursion.

    Stops counting past `limit` (returns `limit + 1`), so a hostile value costs little.
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json(text: str, what: str, *, allow_nan: bool = False) -> Any:
    """Parse JSON from a file, raising `ValueError` (naming `what`) for anything but plain, finite, shallow JSON.

    Refuses malformed JSON, nesting deeper than `MAX_DEPTH` levels and, unless `allow_nan`, `NaN`, `Infinity`,
    `-Infinity` and numbers that overflow to infinity (`1e400`).
    """

    def refuse(literal: str) -> float:
        raise _NonFinite(f"{what} holds {literal}, which is not a finite number (refusing non-standard JSON)")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            refuse(literal)
        return value

    hooks: dict[str, Any] = {} if allow_nan else {"parse_constant": refuse, "parse_float": number}
    try:
        value = json.loads(text, **hooks)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except _NonFinite:
        raise
    except ValueError as error:  # a JSONDecodeError, or an integer too long to convert
        raise ValueError(f"{what} is not valid JSON ({error})") from None
    if json_depth(value) > MAX_DEPTH:
        raise ValueError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)")
    return value
