"""bench/mcmc_proposals.py at a tiny size: both studies run and report their rows."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_mcmc_proposals_script_reports_mode_weights_and_ess(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_mcmc_proposals", BENCH / "mcmc_proposals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "m.json"
    argv = ["--dims", "2", "--funnel-dims", "3", "--steps", "3", "--n-train", "300", "--chains", "4"]
    argv += ["--chain-steps", "30", "--burn-in", "5", "--step-sizes", "0.3", "--out", str(out)]
    assert module.main(argv) == 0
    assert "| 2 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    (row,) = result["bimodal"]
    assert 0 <= row["imh_weight"] <= 1 and row["imh_se"] >= 0 and 0 <= row["neutra_weight"] <= 1
    (row,) = result["funnel"]
    assert row["dim"] == 3 and row["neutra_step_size"] == 0.3 and row["imh_ess_per_evaluation"] >= 0
