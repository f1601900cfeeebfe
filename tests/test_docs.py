"""The documentation site builds in strict mode with no warning at all, and no RST markup reaches the HTML.

The build runs without `-q`, so griffe's docstring warnings (unknown parameters, missing
annotations) and unresolved cross-references are seen and fail the test.
"""

import os
import re
import subprocess
import sys
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
