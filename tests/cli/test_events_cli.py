"""`flowkit events fit`: a simulator or a file in, the model, metrics.json and plots out; errors in one line."""

import json
import subprocess
import sys

import pytest

import flowkit
from flowkit.cli import main
from flowkit.cli.events import MODELS, SIMULATOR_NAMES
from flowkit.events import SIMULATORS
from flowkit.events.model import DISTRIBUTIONS


def test_the_command_lists_the_package_s_names():
    assert set(MODELS) == set(DISTRIBUTIONS)
    assert set(SIMULATOR_NAMES) == set(SIMULATORS)


@pytest.mark.slow
def test_fit_a_simulator_writes_model_metrics_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["events", "fit", "hawkes-multi", "--events", "600", "--epochs", "2", "--hidden", "8", "--out", str(out)]
    assert main(argv) == 0
    assert "gap" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("nll_per_event", "time_mae", "mark_accuracy", "ks_statistic", "exact_nll_per_event", "gap_to_exact"):
        assert isinstance(metrics[key], float), key
    assert metrics["gap_to_exact"] == pytest.approx(metrics["nll_per_event"] - metrics["exact_nll_per_event"])
    for name in ("qq.png", "intensity.png", "inter_event_times.png", "training_curves.png"):
        assert (out / name).stat().st_size > 0, name
    model = flowkit.io.load(out / "model")
    assert model.num_marks == 2
    assert main(argv) == 2  # a run is there: refused without --force
    assert "--force" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_a_csv_file_with_the_flow(tmp_path):
    csv, out = tmp_path / "events.csv", tmp_path / "run"
    seqs, _ = flowkit.events.simulate("renewal-gamma", 400, seed=0)
    rows = [f"{s.name},{t},{m}" for s in seqs for t, m in zip(s.times, s.marks, strict=True)]
    csv.write_text("seq_id,time,mark\n" + "\n".join(rows) + "\n")
    argv = ["events", "fit", str(csv), "--model", "flow", "--epochs", "1", "--hidden", "4", "--out", str(out)]
    assert main([*argv, "--no-plots", "--window-end", "100"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mark_accuracy"] is None and "exact_nll_per_event" not in metrics


def test_bad_sources_are_one_line_errors(tmp_path, capsys):
    assert main(["events", "fit", "nope", "--out", str(tmp_path / "a")]) == 2
    assert "neither a file nor a simulator" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("seq_id,time\ns1,2.0\ns1,1.0\n")
    assert main(["events", "fit", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert "sequence 's1'" in capsys.readouterr().err


def test_help_and_parse_errors_do_not_import_torch():
    code = (
        "import sys\n"
        "from flowkit.cli import main\n"
        "try:\n"
        "    main(['events', 'fit', 'hawkes', '--out', 'x', '--epochs', '0'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 2, exit.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--epochs: must be a positive integer" in result.stderr
