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


EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
LOADING = {"script": "src", "img": "src", "iframe": "src", "link": "href", "source": "src", "embed": "src"}
LINKED = {"stylesheet", "icon", "preload", "preconnect", "manifest"}
SKIPPED = {"script", "style", "code", "pre", "kbd", "samp", "svg", "math"}
TYPESET = {"arithmatex", "md-nav__link"}  # what docs/javascripts/mathjax.js has MathJax typeset
VOID = {"br", "img", "input", "meta", "link", "hr", "wbr", "source", "col", "area", "base", "embed"}
LATEX = re.compile(r"\\(?:[a-zA-Z]{2,}|[{}_^,;!])|\^\{|_\{")


class _Page(HTMLParser):
    """One page: what it loads and the prose a reader sees.

    It loads scripts, images, frames, stylesheets and icons (hyperlinks are not loads); its prose is the text
    outside code, scripts and what MathJax typesets.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self.skip: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag in LOADING and values.get(LOADING[tag]):
            if tag != "link" or LINKED & set((values.get("rel") or "").split()):
                self.urls.append(values[LOADING[tag]])
        if tag in VOID:
            return
        if self.skip or tag in SKIPPED or TYPESET & set((values.get("class") or "").split()):
            self.skip.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.skip:  # close what the tag opened, and any unclosed tag inside it
            while self.skip.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.text.append(data)


@pytest.fixture(scope="module")
def pages(build):
    _, site = build
    parsed = {}
    for page in sorted(site.rglob("*.html")):
        parser = _Page()
        parser.feed(page.read_text(encoding="utf-8"))
        parsed[str(page.relative_to(site))] = parser
    return parsed


@pytest.mark.slow
def test_site_loads_nothing_from_another_host(build, pages):
    _, site = build
    found = [f"{name}: {url}" for name, page in pages.items() for url in page.urls if EXTERNAL.match(url)]
    assert not found, "the site loads from another host (serve it from docs/ instead):\n" + "\n".join(found)
    assert (site / "javascripts" / "mathjax" / "tex-svg-full.js").exists()


@pytest.mark.slow
def test_no_stray_dollar_or_raw_latex_in_prose(pages):
    found = []
    for name, page in pages.items():
        for text in page.text:
            for kind, pattern in (("'$'", re.compile(r"\$")), ("LaTeX", LATEX)):
                for match in pattern.finditer(text):
                    found.append(f"{name}: {kind} in ...{text[max(0, match.start() - 60) : match.end() + 60]!r}")
    found = list(dict.fromkeys(found))
    assert not found, (
        "a `$` or LaTeX outside math (a `$` in a docstring needs its pair, or code quotes):\n" + "\n".join(found[:50])
    )
