"""`flowkit index build`: the JSON summary, the saved flow and index, and its errors."""

import json

import numpy as np

import flowkit
from flowkit.applications.learned_index import lognormal_keys
from flowkit.cli import main


def test_index_build_reports_and_saves(tmp_path, capsys):
    path = tmp_path / "keys.npy"
    np.save(path, lognormal_keys(5000))
    out = tmp_path / "index"
    argv = ["index", "build", str(path), "--steps", "5", "--queries", "1000", "--out", str(out), "--threads", "1"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["keys"] == 5000 and summary["slices"] == 5000 // 64 and summary["fallbacks"] == 0
    assert set(summary["lookups_per_second"]) == {"flow_index", "raw_index", "searchsorted"}
    assert set(summary["conflicts_flow"]) == {"max", "p99", "mean"}
    assert flowkit.io.load(out / "flow").transform(np.array([1e9])).shape == (1,)
    assert set(np.load(out / "index.npz")) == {"slope", "intercept", "below", "above", "bounds"}


def test_index_build_refuses_unsorted_keys_unless_asked(tmp_path, capsys):
    path = tmp_path / "keys.npy"
    np.save(path, np.random.default_rng(0).uniform(size=2000))
    assert main(["index", "build", str(path), "--steps", "2", "--queries", "10"]) == 2
    assert "sort them first or pass sort=True" in capsys.readouterr().err
    assert main(["index", "build", str(path), "--steps", "2", "--queries", "10", "--sort"]) == 0
    assert main(["index", "build", str(tmp_path / "keys.csv")]) == 2
