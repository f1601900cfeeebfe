"""bench/index.py at a tiny size: every structure answers, the table and the JSON."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_index_script_compares_learned_indexes_with_binary_search(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_index", BENCH / "index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "i.json"
    argv = ["--sizes", "3000", "--keys", "zipf,lognormal", "--queries", "500", "--steps", "3", "--components", "4"]
    argv += ["--keys-per-slice", "100", "--out", str(out)]
    assert module.main(argv) == 0
    assert "| zipf | 3e+03 |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["keys"] for r in rows] == ["zipf", "lognormal"]
    for r in rows:
        assert r["searchsorted"]["lookups_per_second"] > 0 and r["flow_index"]["bytes"] > r["raw_index"]["bytes"]
        assert r["pgm"] is None or r["pgm"]["bytes"] > 0
        assert r["slices"] == 30 and 0 < r["flow_index"]["transform_share"]
