"""bench/sbi.py at a tiny size: both estimators on the same simulations, the paired table, the transit toy, JSON."""

import importlib.util
import json

import pytest


@pytest.mark.slow
def test_sbi_bench_pairs_flowkit_with_sbi_seed_by_seed(script, tmp_path, capsys):
    bench = script("sbi")
    out = tmp_path / "sbi.json"
    argv = ["--tasks", "two_moons", "--budgets", "200", "--seeds", "2", "--observations", "1", "--samples", "60",
            "--epochs", "1", "--transforms", "1", "--hidden", "8", "--transit-budget", "1000", "--calibration", "20",
            "--calibration-samples", "10", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    assert "| two_moons | 200 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and len(result["transit"]) == 4  # 2 seeds x the plain and regression recipes
    assert sorted((t["seed"], t["recipe"]) for t in result["transit"]) == [
        (0, "plain"), (0, "regression"), (1, "plain"), (1, "regression")
    ]  # fmt: skip
    methods = {r["method"] for r in result["runs"]}
    (row,) = result["summary"]
    if "sbi" in methods:  # sbi is in the bench extra, not needed by the tests
        assert len(result["runs"]) == 4
        by = {(r["method"], r["seed"]): r["c2st"] for r in result["runs"]}
        assert row["c2st_difference"] == pytest.approx(sum(by[("flowkit", s)] - by[("sbi", s)] for s in (0, 1)) / 2)
    else:
        assert methods == {"flowkit"} and "sbi_c2st" not in row
    assert all(0.4 <= r["c2st"] <= 1 for r in result["runs"])
    assert all(0 <= t["tarp_coverage_error"] <= 1 and 0.4 <= t["linear_c2st"] <= 1 for t in result["transit"])


@pytest.mark.slow
def test_sbi_bench_splits_the_gaussian_linear_mean_error_into_spread_and_bias(script, tmp_path, capsys):
    bench = script("sbi")
    out = tmp_path / "sbi.json"
    argv = ["--no-comparison", "--no-transit", "--moments", "2", "--moments-budget", "300", "--moments-samples", "400",
            "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    assert "literal gate" in capsys.readouterr().out
    moments = json.loads(out.read_text())["moments"]
    assert moments["seeds"] == 2 and moments["mc_se"] == pytest.approx(0.05)
    assert 0 < moments["exact_family_rms_mean_error"] < moments["rms_mean_error"] < 2
    assert 0 <= moments["literal_gate_npe"] <= 2 and 0 <= moments["bias_t_over_3"] <= 50


@pytest.mark.slow
def test_sbi_bench_pairs_flowkit_recipes_with_the_default_seed_by_seed(script, tmp_path, capsys):
    bench = script("sbi")
    out = tmp_path / "sbi.json"
    argv = ["--tasks", "two_moons", "--budgets", "200", "--seeds", "2", "--observations", "1", "--samples", "60",
            "--epochs", "2", "--transforms", "1", "--hidden", "8", "--no-transit", "--flowkit-recipes",
            "default,cosine", "--sbi-builder", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    assert "| two_moons | 200 | flowkit:cosine |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    by = {(r["method"], r["seed"]): r["c2st"] for r in result["runs"]}
    assert {m for m, _ in by} >= {"flowkit", "flowkit:cosine"}
    rows = {r["method"]: r for r in result["summary"]}
    with_sbi = importlib.util.find_spec("sbi") is not None  # the sbi builder's row needs sbi (the bench extra)
    assert set(rows) == {"flowkit", "flowkit:cosine"} | ({"flowkit-in-sbi"} if with_sbi else set())
    assert "c2st_difference_to_default" not in rows["flowkit"]
    expected = sum(by[("flowkit:cosine", s)] - by[("flowkit", s)] for s in (0, 1)) / 2
    assert rows["flowkit:cosine"]["c2st_difference_to_default"] == pytest.approx(expected)
    with pytest.raises(SystemExit):
        bench.main(argv[:-5] + ["--flowkit-recipes", "nonsense", "--out", str(out)])
    assert "--flowkit-recipes: choose from default" in capsys.readouterr().err
