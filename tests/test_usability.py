"""What a new user hits first (issue 20): threads, standardisation and the semantics of `fit`."""

import warnings

import pytest
import torch

import flowkit
from flowkit.bijectors import Standardization
from flowkit.train import Callback, MaximumLikelihood, default_threads, fit


class _Threads(Callback):
    """Records the torch thread count seen during the run."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def on_step_end(self, state) -> None:
        self.seen.add(torch.get_num_threads())


@pytest.fixture
def two_threads(monkeypatch):
    """Torch on two threads, as if that were its default (the count when flowkit was imported)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr("flowkit.train.loop._THREADS_AT_IMPORT", 2)
    yield
    torch.set_num_threads(before)


def test_default_threads_is_one_for_small_events_and_none_for_large():
    assert default_threads(2) == 1
    assert default_threads(16) == 1
    assert default_threads(17) is None


@pytest.mark.parametrize(("threads", "expected"), [(None, 1), (3, 3)])
def test_fit_sets_threads_during_the_run_and_restores_them(two_threads, threads, expected):
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    seen = _Threads()
    fit(flow, MaximumLikelihood(), torch.randn(64, 2), steps=3, batch_size=32, progress=False,
        threads=threads, callbacks=[seen])  # fmt: skip
    assert seen.seen == {expected}
    assert torch.get_num_threads() == 2


def test_fit_keeps_a_thread_count_the_user_has_set(two_threads, monkeypatch):
    monkeypatch.setattr("flowkit.train.loop._THREADS_AT_IMPORT", 4)  # torch's default was 4; the user chose 2
    seen = _Threads()
    fit(flowkit.flows.RealNVP(2, transforms=1, hidden=(8,)), MaximumLikelihood(), torch.randn(64, 2), steps=2,
        progress=False, callbacks=[seen])  # fmt: skip
    assert seen.seen == {2}


def test_fit_restores_threads_after_an_error(two_threads):
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    with pytest.raises(ValueError, match="data is empty"):
        fit(flow, MaximumLikelihood(), torch.randn(0, 2), steps=3, progress=False)
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        fit(flow, MaximumLikelihood(), torch.randn(8, 2), steps=3, progress=False, threads=0)


def _wide(n=600, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g, dtype=torch.float64).float() * torch.tensor([40.0, 0.01, 8.0]) + 100.0


def test_standardize_puts_the_data_statistics_first_in_the_flow_and_keeps_data_units(tmp_path):
    x = _wide()
    flow = flowkit.flows.NSF(3, transforms=1, hidden=(8,))
    fit(flow, MaximumLikelihood(), x, steps=2, progress=False, standardize=True)
    first = flow.bijector[0]
    assert isinstance(first, Standardization)
    torch.testing.assert_close(first.loc.double(), x.double().mean(0), rtol=0, atol=1e-4)
    torch.testing.assert_close(first.scale.double(), x.double().std(0), rtol=1e-6, atol=0)
    # log p(x) in data units: the flow behind the layer, at the standardised points, minus sum log s.
    inner = flowkit.flows.Flow(flow.bijector[1], flow.base)
    z = (x[:5] - first.loc) / first.scale
    torch.testing.assert_close(flow.log_prob(x[:5]), inner.log_prob(z) - first.scale.log().sum())
    # A second fit does not standardise twice; the saved model loads with the same density.
    fit(flow, MaximumLikelihood(), x, steps=1, progress=False, standardize=True)
    assert not isinstance(flow.bijector[1], Standardization)
    flowkit.io.save(flow, tmp_path / "model")
    torch.testing.assert_close(flowkit.io.load(tmp_path / "model").log_prob(x[:5]), flow.log_prob(x[:5]))


def test_robust_standardize_uses_the_median_and_the_quartile_scale():
    x = _wide()
    flow = flowkit.flows.NSF(3, transforms=1, hidden=(8,))
    fit(flow, MaximumLikelihood(), x, steps=1, progress=False, standardize="robust")
    first = flow.bijector[0]
    q1, median, q3 = torch.quantile(x.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)
    torch.testing.assert_close(first.loc.double(), median, rtol=0, atol=1e-4)
    torch.testing.assert_close(first.scale.double(), (q3 - q1) / 1.3489795003921634, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="standardize must be True, False or 'robust'"):
        fit(flow, MaximumLikelihood(), x, steps=1, progress=False, standardize="median")


def test_standardize_refuses_data_it_cannot_read():
    flow = flowkit.flows.NSF(3, transforms=1, hidden=(8,))
    dataset = torch.utils.data.TensorDataset(_wide())
    with pytest.raises(ValueError, match="standardize=True needs data as a floating tensor"):
        fit(flow, MaximumLikelihood(), dataset, steps=1, progress=False, standardize=True)


def test_fit_warns_when_most_points_are_outside_the_spline_bound():
    flow = flowkit.flows.NSF(3, transforms=1, hidden=(8,))
    with pytest.warns(RuntimeWarning, match=r"100% of the data points lie outside the splines' bound \[-5, 5\]"):
        fit(flow, MaximumLikelihood(), _wide(), steps=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(flowkit.flows.NSF(3, transforms=1, hidden=(8,)), MaximumLikelihood(), _wide() - 100.0, steps=1,
            progress=False, standardize=True)  # fmt: skip
        fit(flowkit.flows.NSF(3, transforms=1, hidden=(8,)), MaximumLikelihood(), torch.randn(50, 3), steps=1,
            progress=False)  # fmt: skip


def test_the_flow_says_whether_its_data_meet_the_splines_unscaled():
    x = _wide()
    nsf = flowkit.flows.NSF(3, transforms=1, hidden=(8,))
    assert nsf.spline_bound == 5.0 and flowkit.data.standardize(nsf, x).spline_bound is None
    comet = flowkit.flows.COMET.from_data(x, transforms=1, hidden=(8,))  # its fitted marginals scale the data
    assert comet.spline_bound is None and comet.bijector.standardizes_data
    layers = list(comet.bijector)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no bound warning either
        fit(comet, MaximumLikelihood(), x, steps=1, progress=False, standardize=True)
    assert list(comet.bijector) == layers  # nothing put before the marginals, which were fitted to the raw data
    free_form = flowkit.flows.build_flow("free-form", 3, hidden=(8,))
    assert free_form.spline_bound is None
    with pytest.raises(ValueError, match="FreeFormFlow cannot standardise its data in place"):
        fit(free_form, MaximumLikelihood(), x, steps=1, progress=False, standardize=True)
    with pytest.raises(ValueError, match="standardize=True needs a flowkit Flow, got Linear"):
        fit(torch.nn.Linear(3, 3), MaximumLikelihood(), x, steps=1, progress=False, standardize=True)


class _Weights(Callback):
    def __init__(self, flow) -> None:
        self.flow, self.states = flow, {}

    def on_step_end(self, state) -> None:
        self.states[state.step] = {k: v.clone() for k, v in self.flow.state_dict().items()}


def test_validation_data_restore_the_best_weights_by_default():
    torch.manual_seed(0)
    x = torch.randn(256, 2)
    flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    weights = _Weights(flow)
    # A large learning rate makes the validation loss go up and down: the best step is not the last.
    history = fit(flow, MaximumLikelihood(), x, steps=20, batch_size=32, lr=0.05, val_data=x[:64], val_every=1,
                  progress=False, seed=1, callbacks=[weights], schedule=None)  # fmt: skip
    assert history.best_step != history.steps_run
    best = weights.states[history.best_step]
    for name, value in flow.state_dict().items():
        torch.testing.assert_close(value, best[name])
    kept = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    last = _Weights(kept)
    fit(kept, MaximumLikelihood(), x, steps=20, batch_size=32, lr=0.05, val_data=x[:64], val_every=1,
        progress=False, seed=1, callbacks=[last], schedule=None, restore_best=False)  # fmt: skip
    for name, value in kept.state_dict().items():
        torch.testing.assert_close(value, last.states[20][name])


def test_history_reports_the_steps_run_and_the_progress_title_says_what_patience_is():
    from flowkit.train.distributed import DistributedContext
    from flowkit.train.loop import _Arguments, _make_run, _progress_title

    x = torch.randn(300, 2)
    history = fit(flowkit.flows.RealNVP(2, transforms=1, hidden=(8,)), MaximumLikelihood(), x, steps=7,
                  batch_size=50, progress=False)  # fmt: skip
    assert history.steps_run == 7 == len(history)
    assert repr(history).startswith("History(steps_run=7, last_loss=")
    flow = flowkit.flows.RealNVP(2, transforms=1, hidden=(8,))
    arguments = dict(flow=flow, objective=MaximumLikelihood(), data=x, steps=100, epochs=None, batch_size=50,
                     lr=1e-3, optimizer=None, schedule=None, clip=None, val_data=x[:50], patience=4,
                     checkpoint_dir=None, resume=False, progress=False, seed=0, val_every=None,
                     checkpoint_every=1000, restore_best=None, ddp_options=None, ema=None, callbacks=())  # fmt: skip
    run = _make_run(_Arguments(**arguments), DistributedContext(), 0)
    assert run.val_every == 5  # 100 steps // 20, within the 6 batches of an epoch
    assert _progress_title(run) == "fit (val every 5 steps, patience 4 = 20 steps)"


def test_toy_sets_are_shuffled_so_a_slice_shows_both_moons():
    from flowkit.data import toy, toy_splits

    x = toy("moons", 3000)
    # unshuffled, the first half would be the upper moon alone (y > 0.4 for 80% of it, 13% of the lower)
    first = x[:1500]
    upper = first[:, 1] > 0.4
    assert 0.4 < upper.mean() < 0.6
    assert 0.4 < (toy_splits("moons", n_train=1000).train[:500, 1] > 0.4).float().mean() < 0.6


def test_tsv_files_load_and_csv_headers_are_kept(tmp_path):
    import numpy as np

    from flowkit.data import load

    rows = np.random.default_rng(0).normal(size=(50, 2))
    path = tmp_path / "wine.tsv"
    path.write_text("alcohol\tmalic acid\n" + "\n".join(f"{a}\t{b}" for a, b in rows))
    splits = load(path)
    assert splits.info["columns"] == ["alcohol", "malic acid"]
    got = np.sort(np.concatenate([splits.train, splits.val, splits.test]).astype(np.float64), axis=0)
    np.testing.assert_allclose(got, np.sort(rows, axis=0), rtol=1e-6)
    path = tmp_path / "plain.csv"
    path.write_text("\n".join(f"{a},{b}" for a, b in rows))
    assert "columns" not in load(path).info


def test_plots_take_column_names_units_and_fit_their_data():
    import numpy as np

    from flowkit import plot

    x = np.random.default_rng(0).normal(size=(300, 3)) * np.array([4.0, 1.0, 1.0])
    fig = plot.pairwise(x, x[::-1], labels=["alcohol", "acid", "ash"], max_dims=2)
    assert [ax.get_xlabel() for ax in fig.axes[-2:]] == ["alcohol", "acid"]
    one = plot.pairwise(x[:, :1], x[:, :1])
    assert one._suptitle.get_text() == "data (filled) vs flow samples (line)"
    assert one.axes[0].get_ylabel() == "density"
    # A wide data range gives a short figure: no empty bands above and below equal-aspect panels.
    wide = plot.samples_vs_data(x[:, :2], x[:, :2], labels=["alcohol", "acid", "ash"])
    assert wide.get_figheight() < 4 and wide.axes[0].get_xlabel() == "alcohol"
    square = plot.samples_vs_data(x[:, 1:], x[:, 1:])
    assert square.get_figheight() > wide.get_figheight()
    curves = plot.training_curves({"loss": [3.0, 2.0, 1.5]}, ylabel="NLL (nats)")
    assert curves.axes[0].get_ylabel() == "NLL (nats)"
    curves = plot.training_curves({"loss": [-80.0, -90.0]}, ylabel="NLL (nats)", bits_per_dim=(64, 17))
    bits = curves.axes[0].child_axes[0]
    assert bits.get_ylabel() == "bits/dim"
    to_bits = bits._functions[0]  # the conversion of flowkit.data.bits_per_dim
    assert to_bits(-90.0) == pytest.approx(flowkit.data.bits_per_dim(90.0, 64, 17))
    with pytest.raises(ValueError, match="labels must name every dimension"):
        plot.pairwise(x, labels=["alcohol"])


# The command line. Tiny runs: the point is what the commands say and write, not the fit.
TINY = ["--transforms", "1", "--hidden", "4", "--no-progress"]


def _fit(out, *extra):
    from flowkit.cli import main

    return main(["fit", "moons", "--steps", "2", "--out", str(out), *TINY, *extra])


def test_fit_refuses_an_existing_run_unless_force_or_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert _fit(out, "--no-plots") == 0
    capsys.readouterr()
    assert _fit(out, "--no-plots") == 2
    err = capsys.readouterr().err
    assert "holds a run (model, metrics.json" in err and "--force" in err and "--resume" in err
    (out / "pairwise.png").write_bytes(b"old plot of another run")
    (out / "notes.txt").write_text("mine")
    assert _fit(out, "--no-plots", "--force") == 0
    assert not (out / "pairwise.png").exists()  # the old run's plots go with it
    assert (out / "notes.txt").read_text() == "mine"  # files flowkit did not write stay
    assert _fit(out, "--force", "--resume") == 2


def test_resume_steps_is_the_total_and_the_command_says_so(tmp_path, capsys):
    import json

    out = tmp_path / "run"
    assert _fit(out, "--no-plots") == 0
    capsys.readouterr()
    assert _fit(out, "--no-plots", "--resume") == 2  # --steps 2 again: nothing to do
    assert "has taken 2 steps and --steps 2 is the total; give more than 2" in capsys.readouterr().err
    from flowkit.cli import main

    assert main(["fit", "moons", "--steps", "5", "--out", str(out), "--resume", "--no-plots", *TINY]) == 0
    assert "steps 3-5 in" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 5 and metrics["resumed_from_step"] == 2
    assert _fit(tmp_path / "empty", "--resume") == 2
    assert "holds no checkpoint" in capsys.readouterr().err


def test_sample_finds_the_model_in_a_run_directory_prints_csv_and_keeps_column_names(tmp_path, capsys):
    import numpy as np

    from flowkit.cli import main

    rows = np.random.default_rng(0).normal(size=(400, 2))
    data = tmp_path / "wine.csv"
    data.write_text("alcohol,malic acid\n" + "\n".join(f"{a},{b}" for a, b in rows))
    run = tmp_path / "run"
    assert main(["fit", str(data), "--steps", "2", "--out", str(run), *TINY]) == 0
    assert (run / "samples.png").exists()
    capsys.readouterr()
    assert main(["sample", str(run), "-n", "5", "--seed", "0"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "alcohol,malic acid" and len(lines) == 6
    assert np.isfinite(np.array([[float(v) for v in line.split(",")] for line in lines[1:]])).all()
    assert main(["sample", str(run / "model"), "-n", "3", "--out", str(tmp_path / "s.tsv")]) == 0
    assert (tmp_path / "s.tsv").read_text().splitlines()[0] == "alcohol\tmalic acid"


def test_a_typo_in_a_subcommand_option_gets_that_subcommands_usage(capsys):
    from flowkit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["fit", "moons", "--stpes", "3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: flowkit fit ") and "flowkit fit: error: unrecognized arguments: --stpes 3" in err
    with pytest.raises(SystemExit):
        main(["bench", "likelihood", "--bogus", "1"])
    assert "flowkit bench likelihood: error: unrecognized arguments: --bogus 1" in capsys.readouterr().err


def test_library_warnings_print_as_one_line_without_source(tmp_path, capsys):
    from flowkit.cli import main

    path = tmp_path / "constant.csv"
    path.write_text("a,b\n" + "\n".join(f"{i / 10},1.0" for i in range(60)))
    assert main(["fit", str(path), "--steps", "1", "--out", str(tmp_path / "run"), "--no-plots", *TINY]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines and all(line.startswith("flowkit fit: warning: ") for line in lines), lines
    assert any("feature(s) [1] are constant" in line for line in lines)


def test_check_shows_progress_on_a_terminal_only():
    import io
    import time

    from flowkit.cli.check import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, pipe = Terminal(), io.StringIO()
    with progress("NSF (float64, 10 samples)", terminal, every=0.01):
        time.sleep(0.05)
    with progress("NSF", pipe):
        pass
    text = terminal.getvalue()
    assert text.startswith("\rflowkit check: checking NSF (float64, 10 samples) ... 0 s")
    assert text.count("\r") >= 3 and text.endswith(" (done)\n")
    assert pipe.getvalue() == ""


def test_bench_table_has_no_nan_for_one_seed():
    from flowkit.cli.bench import markdown_table

    row = {"dataset": "moons", "model": "flowkit-maf", "parameters": 10, "test_nll": 2.5,
           "test_nll_2se_points": 0.01, "test_nll_2se_seeds": float("nan"), "wall_s": 1.0, "cpu_s": 1.0}  # fmt: skip
    line = markdown_table([row], 5).splitlines()[-1]
    assert "nan" not in line and "| 0.010 | - |" in line


def test_help_and_version_answer_without_importing_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from flowkit.cli import main\n"
        "for argv in (['--version'], ['--help'], ['fit', '--help'], ['sample', '--help'], ['check', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, argv\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "flowkit 0.1.0" in result.stdout and "usage: flowkit fit" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_io_load_builds_classes_of_subpackages_not_imported_yet(tmp_path):
    import subprocess
    import sys

    flow = flowkit.data.standardize(flowkit.flows.NSF(2, transforms=1, hidden=(4,)), torch.randn(50, 2))
    flowkit.io.save(flow, tmp_path / "model")
    code = f"from flowkit.io import load\nprint(type(load({str(tmp_path / 'model')!r}).bijector[0]).__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.strip() == "Standardization"


def test_jupyter_nbconvert_is_installed_with_the_dev_extra():
    import configparser
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    assert "nbconvert" in config["options.extras_require"]["dev"]
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which("jupyter")
    assert jupyter is not None, "the jupyter command is not installed"
    result = subprocess.run([jupyter, "nbconvert", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip()[0].isdigit()


def test_a_threads_option_reaches_fit_even_when_it_equals_torchs_default(two_threads):
    from flowkit.train.loop import chosen_threads

    seen = _Threads()
    with chosen_threads(2):  # what `flowkit boltzmann --threads 2` does around its call of fit
        fit(flowkit.flows.RealNVP(2, transforms=1, hidden=(8,)), MaximumLikelihood(), torch.randn(64, 2), steps=2,
            progress=False, callbacks=[seen])  # fmt: skip
    assert seen.seen == {2}
