"""bench/weak_supervision.py at a tiny size: every method's accuracy for both kinds of bounds."""

import json

import pytest


@pytest.mark.slow
def test_weak_supervision_script_reports_each_method(script, tmp_path, capsys):
    module = script("weak_supervision")
    out = tmp_path / "ws.json"
    argv = ["--seeds", "1", "--steps", "3", "--methods", "constrained,penalty", "--out", str(out)]
    assert module.main(argv) == 0
    assert "| oracle | penalty | mean |" in capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    assert [(r["bounds"], r["method"]) for r in runs] == [
        ("estimated", "constrained"),
        ("estimated", "penalty"),
        ("oracle", "constrained"),
        ("oracle", "penalty"),
    ]
    for r in runs:
        assert 0.5 < r["majority_vote"] < 1 and 0 <= r["llf"] <= 1 and 0 <= r["class_1_share"] <= 1
        assert r["snorkel"] is None or 0 <= r["snorkel"] <= 1
        assert set(r["penalties"]) == {"below_zero", "above_one", "simplex", "error_bounds"}
