"""mkdocs hook: the table of flow presets, generated from their `@preset` declarations where a page says so.

A page that holds the line `<!-- flow presets -->` gets, in its place, one row per preset of
`flowkit.flows.registry` (name, kind with *one pass* and *benchmark* marks, what it is, its default arguments), so
that the table is never out of date.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- flow presets -->"


def presets_table() -> str:
    """The markdown table of every declared preset, by kind and name."""
    from flowkit.flows import registry

    rows = ["| name | kind | flow | default arguments |", "|---|---|---|---|"]
    marks = {"one_pass": "one pass", "bench": "benchmark"}
    presets = {**registry.PRESETS, **registry.IMAGE_PRESETS, **registry.DATA_PRESETS}
    for name, preset in presets.items():
        path = preset.build.__qualname__
        flow = preset.help if path.startswith("_") else f"[`{path}`][flowkit.flows.{path}]: {preset.help}"
        arguments = ", ".join(f"`{key}={value!r}`" for key, value in preset.arguments.items())
        kind = ", ".join([preset.kind, *(mark for field, mark in marks.items() if getattr(preset, field))])
        rows.append(f"| `{name}` | {kind} | {flow} | {arguments} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace the marker line of a page with the table."""
    return markdown.replace(MARKER, presets_table()) if MARKER in markdown else markdown
