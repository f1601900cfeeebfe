"""mkdocs hook: the notebooks in `notebooks/` as tutorial pages, with their committed outputs.

Each `notebooks/NN_name.ipynb` becomes the page `tutorials/NN_name.md`: markdown cells as they are (their
`$...$` maths goes to MathJax like any page's), code cells as Python blocks, text outputs as plain blocks
(progress bars reduced to their last state), figures as PNG files beside the page, and a link to download
the notebook itself. Nothing runs at build time: the page shows the outputs committed with the notebook
(`tests/test_notebooks.py` checks that they are there and fresh), so the build stays fast and offline.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import nbformat
from mkdocs.structure.files import File, Files

MAX_OUTPUT_LINES = 40
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _fence(text: str, language: str = "") -> str:
    """A fenced block longer than any run of backticks in `text`."""
    ticks = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}"


def _clean_stream(text: str) -> str:
    """Terminal text as it ends up on screen: ANSI colours dropped, each carriage-returned line at its last state."""
    lines = [line.rsplit("\r", 1)[-1] for line in ANSI.sub("", text).split("\n")]
    lines = [line for line in lines if line.strip()]
    if len(lines) > MAX_OUTPUT_LINES:
        cut = len(lines) - MAX_OUTPUT_LINES
        lines = [*lines[: MAX_OUTPUT_LINES // 2], f"... ({cut} lines cut)", *lines[-MAX_OUTPUT_LINES // 2 :]]
    return "\n".join(lines)


def _output_markdown(output: Any, stem: str, images: dict[str, bytes]) -> str:
    """The markdown of one output; a figure is added to `images` under a name unique in the notebook."""
    kind = output.get("output_type")
    if kind == "stream":
        text = _clean_stream(output.get("text", ""))
        return _fence(text, "text") if text else ""
    if kind == "error":
        return _fence(_clean_stream("\n".join(output.get("traceback", []))), "text")
    data = output.get("data", {})
    if "image/png" in data:
        name = f"figure_{len(images) + 1}.png"
        images[name] = base64.b64decode(data["image/png"])
        return f"![figure {len(images)}]({stem}/{name})"
    if "text/markdown" in data:
        return data["text/markdown"]
    if "text/plain" in data and "application/vnd.jupyter.widget-view+json" not in data:
        text = _clean_stream(data["text/plain"])
        return _fence(text, "text") if text else ""
    return ""


def notebook_markdown(path: Path) -> tuple[str, dict[str, bytes]]:
    """The page of a notebook and its figures by file name."""
    notebook = nbformat.read(path, as_version=4)
    images: dict[str, bytes] = {}
    parts: list[str] = []
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            if number == 0:
                parts.append(
                    f"[Download the notebook]({path.name}) · run it with "
                    f"`FLOWKIT_SMALL=1 jupyter nbconvert --to notebook --execute notebooks/{path.name}` "
                    "(drop `FLOWKIT_SMALL=1` for the full budget). The outputs below come from the small budget."
                )
        elif cell.cell_type == "code" and cell.source.strip():
            # IPython magics (`%matplotlib inline`) are the notebook's business, not the reader's.
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
            if source.strip():
                parts.append(_fence(source, "python"))
            for output in cell.get("outputs", []):
                text = _output_markdown(output, path.stem, images)
                if text:
                    parts.append(text)
    return "\n\n".join(parts) + "\n", images


def on_files(files: Files, config: Any) -> Files:
    """Add one page per notebook, its figures and the notebook itself under `tutorials/`."""
    root = Path(config.config_file_path).parent
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        markdown, images = notebook_markdown(path)
        files.append(File.generated(config, f"tutorials/{path.stem}.md", content=markdown))
        files.append(File.generated(config, f"tutorials/{path.name}", content=path.read_bytes()))
        for name, data in images.items():
            files.append(File.generated(config, f"tutorials/{path.stem}/{name}", content=data))
    return files
