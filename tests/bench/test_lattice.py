"""bench/lattice.py runs end to end at a tiny size and reports every sampler."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "lattice.py"


@pytest.mark.filterwarnings("ignore:log_Z:RuntimeWarning")  # an untrained flow has few effective samples
def test_bench_lattice_tiny(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_lattice", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "l.json"
    argv = ["--L", "4", "--transforms", "1", "--hidden", "2", "--steps", "2", "--batch-size", "8"]
    argv += ["--eval-samples", "100", "--imh-steps", "100", "--hmc-chains", "2", "--hmc-steps", "40"]
    argv += ["--burn-in", "10", "--flow-hmc-chains", "2", "--flow-hmc-steps", "5", "--blocks", "2", "--pilot", "2"]
    assert module.main(argv + ["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for name in ("hmc", "imh", "flow_hmc"):
        entry = result[name]
        assert 0 <= entry["acceptance"] <= 1 and len(entry["chi2"]) == 2
        assert entry["cpu_s_per_eff_sample_chi2_with_training"] >= entry["cpu_s_per_eff_sample_chi2"] or math.isinf(
            entry["cpu_s_per_eff_sample_chi2"]
        )
    assert math.isfinite(result["imh"]["chi2_vs_hmc_sigma"])
    assert result["training"]["steps"] == 2
    capsys.readouterr()
