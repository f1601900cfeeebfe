"""bench/interventional.py at a tiny size: the plug-in and a corrected target flow per clip, the summary per shift."""

import json

import pytest


@pytest.mark.slow
def test_interventional_script_pairs_plug_in_and_corrected(script, tmp_path, capsys):
    module = script("interventional")
    out = tmp_path / "inf.json"
    argv = ["--shifts", "0,3", "--seeds", "2", "--n", "200", "--nuisance-steps", "3", "--propensity-steps", "3"]
    argv += ["--target-steps", "3", "--grid-points", "50", "--clips", "0.05,0.01", "--out", str(out)]
    assert module.main(argv) == 0
    assert "| 3 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 4 and [s["shift"] for s in result["summary"]] == [0.0, 3.0]
    runs = [r for r in result["runs"] if r["shift"] == 3.0]
    for clip in ("0.05", "0.01"):
        difference = sum(r[f"corrected_{clip}_w1"] - r["plug_in_w1"] for r in runs) / 2
        assert result["summary"][1][f"w1_difference_{clip}"][0] == pytest.approx(difference)
        assert all(r[f"max_weight_{clip}"] <= 1 / float(clip) + 1e-3 for r in runs)
        assert all(0 <= r[f"clipped_{clip}"] <= 1 and 0 <= r[f"below_clip_{clip}"] <= 1 for r in runs)
    assert all(r["plug_in_w1"] > 0 and r["mixture_w1"] > 0 for r in runs)


@pytest.mark.slow
def test_interventional_script_runs_the_sampled_objective(script, tmp_path, capsys):
    module = script("interventional")
    argv = ["--shifts", "1", "--seeds", "1", "--n", "100", "--nuisance-steps", "2", "--propensity-steps", "2"]
    assert module.main(argv + ["--target-steps", "2", "--clips", "0.05", "--objective", "samples"]) == 0
    assert "| 1 |" in capsys.readouterr().out
