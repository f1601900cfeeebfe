"""bench/events.py at a tiny size, without EasyTPP: flowkit's model, the exact references, the table and JSON."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load():
    spec = importlib.util.spec_from_file_location("bench_events", BENCH / "events.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_events_bench_reports_the_gap_to_the_exact_nll(tmp_path, capsys):
    events = _load()
    out = tmp_path / "events.json"
    argv = ["--simulators", "hawkes,renewal-gamma", "--models", "flowkit-lognormmix", "--events", "600"]
    argv += ["--epochs", "1", "--seeds", "2", "--hidden", "4", "--out", str(out)]
    assert events.main(argv) == 0
    assert "| hawkes | flowkit-lognormmix |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and len(result["runs"]) == 4
    for run in result["runs"]:
        assert run["gap"] == pytest.approx(run["nll"] - run["exact_nll"])
        assert run["conditional_gap"] == pytest.approx(run["conditional_nll"] - run["exact_conditional_nll"])
    row = next(r for r in result["summary"] if r["simulator"] == "hawkes")
    gaps = [r["gap"] for r in result["runs"] if r["simulator"] == "hawkes"]
    assert row["gap"] == pytest.approx(sum(gaps) / 2)


def test_exact_conditional_nll_of_a_poisson_process():
    # events 2..n of a Poisson process of rate 2: each log 2 - 2 tau_i, the first event and the tail left out
    events = _load()
    from flowkit.events import Hawkes

    process = Hawkes(mu=2.0, alpha=0.0)
    seqs = process.sample(5, t_end=10.0, seed=0)
    total, count = events.exact_conditional(process, seqs)
    expected = sum((len(s) - 1) * 0.6931471805599453 - 2 * (s.times[-1] - s.times[0]) for s in seqs)
    assert count == seqs.num_events - 5 and total == pytest.approx(expected)
