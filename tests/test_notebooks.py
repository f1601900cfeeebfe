"""Every notebook in notebooks/ runs top to bottom (with a small budget, FLOWKIT_SMALL=1)."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert any(p.name == "01_quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWKIT_SMALL", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend renders figures headless
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # Every cell that shows a figure does show one (a figure built without pyplot needs display()).
    for cell in code:
        if "plt.show()" in cell.source or "display(" in cell.source:
            images = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
            assert images, f"no figure shown by the cell:\n{cell.source}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_cells_have_ids(path):
    """Issue 38: a cell without an id made nbformat warn (MissingIDFieldWarning) on every run of the suite."""
    assert all("id" in cell for cell in json.loads(path.read_text())["cells"])
