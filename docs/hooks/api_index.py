"""mkdocs hook: the page `api/index.md`, every public name of flowkit by module, generated from the `__all__`s.

For each public module directly under `flowkit` (`flowkit.flows`, `flowkit.train`, ...), one table row per name
of its `__all__`: the name, linked to where the API pages document it when they do, and the first paragraph of
its docstring. The page is never out of date: a name added to an `__all__` appears at the next build.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "api/index.md"


def _summary(obj: Any) -> str:
    """The first paragraph of a class's, function's or module's docstring, on one line."""
    if not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)):
        return ""
    doc = " ".join((inspect.getdoc(obj) or "").split("\n\n", 1)[0].split())
    # A table cell ends at any `|`: escape it in prose, and write it as \vert / \Vert inside the maths.
    parts = re.split(r"(\$[^$]+\$)", doc)
    return "".join(
        part.replace("\\|", "\\Vert{}").replace("|", "\\vert{}") if part.startswith("$") else part.replace("|", "\\|")
        for part in parts
    )


def index_markdown() -> str:
    """The markdown of the index: one section per module, one row per public name."""
    import flowkit

    parts = [
        "# Index of public names",
        "Every name a flowkit module exports (its `__all__`), by module, with the first paragraph of its "
        "docstring; a name links to its documentation. Generated at each build by `docs/hooks/api_index.py`.",
    ]
    for info in sorted(pkgutil.iter_modules(flowkit.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"flowkit.{info.name}")
        except ImportError:  # an optional dependency missing: the module's own page says so
            continue
        names = list(getattr(module, "__all__", []))
        if not names:
            continue
        rows = ["| name | what it is |", "|---|---|"]
        for name in sorted(names, key=str.lower):
            path = f"flowkit.{info.name}.{name}"
            link = f'<autoref identifier="{path}" optional><code>{name}</code></autoref>'
            rows.append(f"| {link} | {_summary(getattr(module, name, None))} |")
        parts += [f"## `flowkit.{info.name}`", _summary(module), "\n".join(rows)]
    return "\n\n".join(part for part in parts if part) + "\n"


def on_files(files: Files, config: Any) -> Files:
    """Add the generated index page."""
    files.append(File.generated(config, PAGE, content=index_markdown()))
    return files
