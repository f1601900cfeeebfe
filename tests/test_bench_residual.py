"""bench/residual_bound.py: a tiny run reports each residual flow's layer norms, grid mass and test NLL."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_residual_bound_script_reports_norms_mass_and_nll(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_residual_bound", BENCH / "residual_bound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "r.json"
    argv = ["--steps", "3", "--n-train", "500", "--points", "40", "--out", str(out)]
    assert module.main(argv) == 0
    rows = {row["model"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"flowkit-residual", "normflows-residual"}
    flowkit_row = rows["flowkit-residual"]
    assert flowkit_row["max_layer_norm"] <= 0.97 * (1 + 1e-6) and flowkit_row["layers_above_bound"] == 0
    assert flowkit_row["layers"] == 15 and 0.9 < flowkit_row["grid_mass"] < 1.01  # 5 blocks of 3 layers
