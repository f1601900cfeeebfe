"""The flow presets the command line offers, read from their declarations ([`preset`][flowkit.flows.preset]).

Read from the source: importing `flowkit.flows` would import torch, which `flowkit fit --help` does without
(`tests/test_architecture.py` checks that what is read here is what the registry registers).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

__all__ = ["declared_presets", "preset_names", "presets_help"]


@functools.cache
def declared_presets() -> dict[str, dict[str, Any]]:
    """Every declared preset, by name (sorted): its `kind`, `help`, `one_pass`, `bench` and `arguments`."""
    found = {}
    for path in sorted((Path(__file__).parents[1] / "flows").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "preset":
                name, text = (ast.literal_eval(arg) for arg in node.args)
                keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                flags = {flag: keywords.pop(flag, False) for flag in ("one_pass", "bench")}
                found[name] = {"kind": keywords.pop("kind", "vector"), "help": text, **flags, "arguments": keywords}
    return dict(sorted(found.items()))


def preset_names(*kinds: str, one_pass: bool = False) -> list[str]:
    """The names of the presets of `kinds` (None given: all), only those that sample in one pass if `one_pass`."""
    presets = declared_presets().items()
    return [name for name, p in presets if (not kinds or p["kind"] in kinds) and (p["one_pass"] or not one_pass)]


def presets_help(names: list[str], arguments: bool = True) -> str:
    """One line `name  help [default arguments]` for each of `names`, for a parser's epilog (raw text)."""
    width, lines = max(map(len, names)), []
    for name in names:
        declared = declared_presets()[name]
        given = ", ".join(f"{key}={value}" for key, value in declared["arguments"].items())
        lines.append(f"  {name:<{width}}  {declared['help']}" + (f" [{given}]" if arguments and given else ""))
    return "\n".join(lines).replace("%", "%%")
