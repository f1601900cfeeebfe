"""bench/interventional.py at a tiny size: both target flows per run, the summary per shift."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_interventional_script_pairs_plug_in_and_corrected(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_interventional", BENCH / "interventional.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "inf.json"
    argv = ["--shifts", "0,3", "--seeds", "2", "--n", "200", "--nuisance-steps", "3", "--propensity-steps", "3"]
    argv += ["--target-steps", "3", "--out", str(out)]
    assert module.main(argv) == 0
    assert "| 3 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 4 and [s["shift"] for s in result["summary"]] == [0.0, 3.0]
    runs = [r for r in result["runs"] if r["shift"] == 3.0]
    difference = sum(r["corrected_w1"] - r["plug_in_w1"] for r in runs) / 2
    assert result["summary"][1]["w1_difference"][0] == pytest.approx(difference)
    assert all(r["plug_in_w1"] > 0 and r["max_weight"] <= 1 / 0.05 + 1e-4 for r in runs)
