"""The documentation site builds in strict mode with no warning at all, and no RST markup reaches the HTML.

The build runs without `-q`, so griffe's docstring warnings (unknown parameters, missing
annotations) and unresolved cross-references are seen and fail the test. The built site loads nothing
from another host (MathJax is served from the site, so formulas render offline), and no page shows a
stray `$` or raw LaTeX outside its math.
"""

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RST = re.compile(r":(?:class|meth|func|attr|mod|math):`|\.\. math::")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    return result, site


@pytest.mark.slow
def test_docs_build_strict_without_warnings(build):
    result, site = build
    output = result.stdout + result.stderr
    problems = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert result.returncode == 0 and not problems, "\n".join(problems) or output
    assert (site / "index.html").exists()


def test_no_rst_markup_in_built_html(build):
    _, site = build
    pages = sorted(site.rglob("*.html"))
    assert pages, "the docs build wrote no HTML"
    found = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if RST.search(line):
                found.append(f"{page.relative_to(site)}:{number}: {line.strip()[:160]}")
    assert not found, "RST roles or math directives in the built HTML (convert the docstrings):\n" + "\n".join(found)


EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
LOADING = {"script": "src", "img": "src", "iframe": "src", "link": "href", "source": "src", "embed": "src"}


class _Loads(HTMLParser):
    """The URLs a page loads: scripts, images, frames and linked stylesheets, icons and fonts (not hyperlinks)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag not in LOADING or not values.get(LOADING[tag]):
            return
        if tag == "link" and not {"stylesheet", "icon", "preload", "preconnect", "manifest"} & set(
            (values.get("rel") or "").split()
        ):
            return
        self.urls.append(values[LOADING[tag]])


def test_every_notebook_is_a_tutorial_in_the_nav():
    """docs/hooks/notebooks.py makes a page of each notebook; the Tutorials section of the nav lists each once."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        entry = f"tutorials/{path.stem}.md"
        assert nav.count(entry) == 1, f"add `- TITLE: {entry}` to a group of the Tutorials section of mkdocs.yml"


def test_citation_names_the_version():
    sys.path.insert(0, str(ROOT))
    import flowkit

    version = flowkit.__version__
    assert f'version: "{version}"' in (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert f"version = {{{version}}}" in (ROOT / "docs" / "cite.md").read_text(encoding="utf-8")


def test_site_loads_nothing_from_another_host(build):
    _, site = build
    found = []
    for page in sorted(site.rglob("*.html")):
        parser = _Loads()
        parser.feed(page.read_text(encoding="utf-8"))
        found += [f"{page.relative_to(site)}: {url}" for url in parser.urls if EXTERNAL.match(url)]
    assert not found, "the site loads from another host (serve it from docs/ instead):\n" + "\n".join(found)
    assert (site / "javascripts" / "mathjax" / "tex-svg-full.js").exists()


SKIPPED = {"script", "style", "code", "pre", "kbd", "samp", "svg", "math"}
TYPESET = {"arithmatex", "md-nav__link"}  # what docs/javascripts/mathjax.js has MathJax typeset
LATEX = re.compile(r"\\(?:[a-zA-Z]{2,}|[{}_^,;!])|\^\{|_\{")


class _Prose(HTMLParser):
    """The text a reader sees as prose: not code, scripts, or the math spans that MathJax typesets."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skip: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in {"br", "img", "input", "meta", "link", "hr", "wbr", "source", "col", "area", "base", "embed"}:
            return
        classes = (dict(attrs).get("class") or "").split()
        if self.skip or tag in SKIPPED or TYPESET & set(classes):
            self.skip.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.skip:  # close what the tag opened, and any unclosed tag inside it
            while self.skip.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.text.append(data)


def test_no_stray_dollar_or_raw_latex_in_prose(build):
    _, site = build
    found = []
    for page in sorted(site.rglob("*.html")):
        parser = _Prose()
        parser.feed(page.read_text(encoding="utf-8"))
        for text in parser.text:
            for match in re.finditer(r"\$", text):
                found.append(
                    f"{page.relative_to(site)}: '$' in ...{text[max(0, match.start() - 60) : match.end() + 60]!r}"
                )
            for match in LATEX.finditer(text):
                found.append(
                    f"{page.relative_to(site)}: LaTeX in ...{text[max(0, match.start() - 60) : match.end() + 60]!r}"
                )
    found = list(dict.fromkeys(found))
    assert not found, (
        "a `$` or LaTeX outside math (a `$` in a docstring needs its pair, or code quotes):\n" + "\n".join(found[:50])
    )
