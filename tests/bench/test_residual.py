"""bench/residual_bound.py: a tiny run reports each residual flow's layer norms, grid mass, test NLL and comparisons."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_residual_bound_script_reports_norms_mass_and_nll(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_residual_bound", BENCH / "residual_bound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "r.json"
    argv = ["--datasets", "moons", "--seeds", "2", "--steps", "3", "--n-train", "500", "--points", "40"]
    assert module.main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    runs = [run for run in result["runs"] if run["seed"] == 0]
    rows = {run["model"]: run for run in runs}
    assert set(rows) == {"flowkit-residual", "normflows-residual", "gaussian"}
    flowkit_row = rows["flowkit-residual"]
    assert flowkit_row["max_layer_norm"] <= 0.97 * (1 + 1e-6) and flowkit_row["layers_above_bound"] == 0
    assert flowkit_row["layers"] == 15 and 0.9 < flowkit_row["grid_mass"] < 1.01  # 5 blocks of 3 layers
    references = {row["reference"] for row in result["comparisons"]}
    assert references == {"normflows-residual", "gaussian"}
    assert all(row["seeds"] == 2 and row["model"] == "flowkit-residual" for row in result["comparisons"])
