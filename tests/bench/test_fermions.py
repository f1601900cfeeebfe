"""bench/fermions.py runs end to end at a tiny size and reports both baselines and flow IMH."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.filterwarnings("ignore:log_Z:RuntimeWarning")  # an untrained flow has few effective samples
def test_bench_fermions_tiny(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script reuses bench/lattice.py's report
    monkeypatch.delitem(sys.modules, "lattice", raising=False)
    spec = importlib.util.spec_from_file_location("bench_fermions", BENCH / "fermions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "f.json"
    argv = ["--L", "4", "--m2", "-1", "--lam", "0.5", "--g", "1", "--transforms", "1", "--hidden", "2"]
    argv += ["--steps", "2", "--batch-size", "8", "--eval-samples", "100", "--imh-steps", "100", "--hmc-chains", "2"]
    argv += ["--hmc-steps", "40", "--burn-in", "10", "--blocks", "2", "--pilot", "2", "--thin", "2"]
    assert module.main(argv + ["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for name in ("pf_hmc", "exact_hmc", "imh"):
        entry = result[name]
        assert 0 <= entry["acceptance"] <= 1 and len(entry["chi2"]) == 2
    for name in ("pf_hmc", "imh"):
        assert result[name]["abs_chiral_condensate"][0] > 0 and len(result[name]["fermion_correlator"][0]) == 4
    assert math.isfinite(result["imh"]["chi2_vs_pf_hmc_sigma"]) and result["training"]["steps"] == 2
    capsys.readouterr()
