"""bench/lowdata.py at a small size: both models on the same points, the paired difference, the table and JSON."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_lowdata_pairs_the_kernel_flow_with_the_mlp_flow_seed_by_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_lowdata", BENCH / "lowdata.py")
    lowdata = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lowdata)
    out = tmp_path / "lowdata.json"
    argv = ["--datasets", "moons", "--sizes", "40", "--seeds", "2", "--steps", "3", "--transforms", "2"]
    argv += ["--inducing", "4", "--hidden", "8", "--n-test", "200", "--out", str(out)]
    assert lowdata.main(argv) == 0
    assert "| moons | 40 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and len(result["runs"]) == 4
    (row,) = result["summary"]
    by = {(r["model"], r["seed"]): r["test_nll"] for r in result["runs"]}
    assert row["difference"] == pytest.approx(sum(by[("kernel", s)] - by[("mlp", s)] for s in (0, 1)) / 2)
    assert row["kernel_parameters"] == 2 * (4 * (1 + 2) + 1 + 2)  # M (d + P) + L + P per layer
    assert row["mlp_parameters"] == 2 * ((1 * 8 + 8) + (8 * 2 + 2))
