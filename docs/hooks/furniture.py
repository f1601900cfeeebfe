"""mkdocs hook: the version in the footer, and arXiv references as links.

The footer of every page names flowkit's version (`flowkit.__version__`). A reference written in the prose or a
docstring as `arXiv 2307.14839` (or `arXiv:2307.14839`) becomes a link to its abstract page, except inside
code and existing links, so the references of every API page are one click away.
"""

from __future__ import annotations

import re
from typing import Any

ARXIV = re.compile(r"(?<![\w/.])(arXiv[: ]\s*)(\d{4}\.\d{4,5})(v\d+)?")
TAG = re.compile(r"(<[^>]+>)")
OPAQUE = {"a", "code", "pre", "script", "style"}


def on_config(config: Any) -> Any:
    """Put the version in the footer."""
    import flowkit

    config.copyright = f"flowkit {flowkit.__version__} · MIT license"
    return config


def link_arxiv(html: str) -> str:
    """Link each `arXiv NNNN.NNNNN` of the text outside code and links to `https://arxiv.org/abs/NNNN.NNNNN`."""
    parts = TAG.split(html)
    depth = 0
    for i, part in enumerate(parts):
        if part.startswith("<"):
            name = re.match(r"</?\s*([a-zA-Z0-9]+)", part)
            if name and name.group(1).lower() in OPAQUE and not part.endswith("/>"):
                depth += -1 if part.startswith("</") else 1
            continue
        if depth <= 0 and "arXiv" in part:
            parts[i] = ARXIV.sub(
                lambda m: f'<a href="https://arxiv.org/abs/{m[2]}{m[3] or ""}">{m[1]}{m[2]}{m[3] or ""}</a>', part
            )
    return "".join(parts)


def on_page_content(html: str, **kwargs: Any) -> str:
    """Link the arXiv references of a page."""
    return link_arxiv(html) if "arXiv" in html else html
