"""The notebooks are committed executed, with outputs from one top-to-bottom run (the docs show them).

`FLOWKIT_SMALL=1 jupyter nbconvert --to notebook --execute --inplace notebooks/NN_name.ipynb` refreshes one.
These checks read the files only (no kernel), so they run in the fast suite; `tests/test_notebooks.py` executes
the notebooks.
"""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
REFRESH = "refresh it: FLOWKIT_SMALL=1 jupyter nbconvert --to notebook --execute --inplace {}"


def _code_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_committed_with_outputs_of_one_run(path):
    cells = _code_cells(path)
    counts = [c.get("execution_count") for c in cells]
    # One run from the top: every code cell executed, in order, with no cell added or rerun since.
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: execution counts {counts}; " + REFRESH.format(path)
    errors = [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name} was committed with an error output; " + REFRESH.format(path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_figures_committed(path):
    cells = _code_cells(path)
    images = {i for i, c in enumerate(cells) for o in c.get("outputs", []) if "image/png" in o.get("data", {})}
    assert images, f"{path.name} shows no figure (the docs show every notebook with its figures)"
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        if "plt.show()" in source or "display(" in source:
            assert i in images, f"{path.name}: no figure committed for the cell\n{source}\n" + REFRESH.format(path)
