"""``flowkit boltzmann``: a short run writes the model, metrics and plots."""

import json
import subprocess
import sys

import pytest
import torch

import flowkit
from flowkit.cli import main


def test_boltzmann_double_well_writes_model_metrics_and_plots(tmp_path):
    out = tmp_path / "dw"
    code = main(
        [
            "boltzmann",
            "double-well",
            "--steps",
            "20",
            "--samples",
            "500",
            "--transforms",
            "2",
            "--hidden",
            "16",
            "--eval-samples",
            "500",
            "--imh-steps",
            "200",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 20 and 0 < metrics["ess"] <= 1 and 0 <= metrics["imh_acceptance"] <= 1
    assert metrics["log_Z_exact"] == pytest.approx(10.2935, abs=1e-4)
    assert {"density.png", "target.png", "history.csv"} <= {p.name for p in out.iterdir()}
    flow = flowkit.io.load(out / "model")
    assert flow.sample((3,)).shape == (3, 2)


@pytest.mark.slow
def test_boltzmann_phi4_lattice_plots(tmp_path):
    out = tmp_path / "phi4"
    code = main(
        [
            "boltzmann",
            "phi4",
            "--L",
            "4",
            "--m2",
            "1",
            "--lam",
            "0",
            "--steps",
            "5",
            "--transforms",
            "2",
            "--hidden",
            "8",
            "--eval-samples",
            "300",
            "--imh-steps",
            "100",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    assert {"configurations.png", "magnetization.png"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "metrics.json").read_text())["event_shape"] == [4, 4]


def test_boltzmann_bad_arguments_exit_2(tmp_path, capsys, usage_error):
    assert main(["boltzmann", "phi4", "--samples", "10", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert "cannot draw exact samples" in capsys.readouterr().err
    bad = usage_error(["boltzmann", "double-well", "--imh-steps", "1", "--steps", "1", "--out", str(tmp_path)])
    assert "argument --imh-steps: must be an integer of at least 2" in bad
    bad = usage_error(["boltzmann", "double-well", "--threads", "-2", "--steps", "1", "--out", str(tmp_path)])
    assert "argument --threads: must be a positive integer" in bad
    assert not (tmp_path / "model").exists()  # refused before any training


def test_boltzmann_refuses_to_overwrite_a_run_unless_forced(tmp_path, capsys):
    args = ["boltzmann", "double-well", "--steps", "2", "--transforms", "1", "--hidden", "4", "--eval-samples", "50"]
    args += ["--imh-steps", "10", "--no-plots", "--no-progress", "--out", str(tmp_path)]
    assert main(args) == 0
    first = (tmp_path / "metrics.json").read_text()
    assert main(args) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (tmp_path / "metrics.json").read_text() == first  # the old run is untouched
    assert main([*args, "--force"]) == 0


def test_every_target_spec_has_what_the_command_needs():
    from flowkit.cli.boltzmann import DEFAULTS, OUTPUTS, TARGETS
    from flowkit.cli.targets import FLOWS, TARGET_SPECS, TargetSpec
    from flowkit.flows import PRESETS

    assert TARGETS == tuple(TARGET_SPECS)
    for name, spec in TARGET_SPECS.items():
        assert isinstance(spec, TargetSpec), name
        for field in ("build_target", "build_flow", "samples", "metrics", "plots"):
            assert callable(getattr(spec, field)), (name, field)
        assert spec.plot_files and set(spec.plot_files) <= set(OUTPUTS), name  # --force clears what a run wrote
        assert callable(spec.write) and set(spec.data_files) <= set(OUTPUTS), name
        assert set(spec.defaults) <= set(DEFAULTS), name  # a target changes only the defaults the command resolves
    plot_files = {f for spec in TARGET_SPECS.values() for f in spec.plot_files}
    data_files = {f for spec in TARGET_SPECS.values() for f in spec.data_files}
    assert set(OUTPUTS) == {"model", "metrics.json", "history.csv"} | plot_files | data_files  # no stale output name
    assert all(callable(build) for build in FLOWS.values())
    # The one-pass presets (sampled by their exact inverse in one pass), and nsf: the old name of nsf-coupling.
    one_pass = {name for name, preset in PRESETS.items() if preset.one_pass}
    assert {"realnvp", "nsf-coupling", "lattice"} <= one_pass and "nsf" not in one_pass
    assert set(FLOWS) == one_pass | {"nsf"}


def test_the_cli_guide_lists_every_target():
    """Issue 38: `boltzmann --help` listed yukawa, the target table of docs/guide/cli.md did not."""
    from pathlib import Path

    from flowkit.cli.targets import TARGET_SPECS

    guide = (Path(__file__).parents[2] / "docs" / "guide" / "cli.md").read_text()
    section = guide[guide.index("## `flowkit boltzmann TARGET`") :]
    rows = [line for line in section[: section.index("Each row is one entry")].splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in row.split("|")[1].split("`")[1::2]}
    assert set(TARGET_SPECS) <= listed, set(TARGET_SPECS) - listed


@pytest.mark.parametrize("argv", [["nope"], ["gmm", "--flow", "maf"]], ids=["target", "flow"])
def test_an_unknown_target_or_flow_is_refused_with_the_names(capsys, argv):
    from flowkit.cli.boltzmann import TARGETS
    from flowkit.cli.targets import FLOWS

    with pytest.raises(SystemExit) as exit:
        main(["boltzmann", *argv])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err
    assert all(repr(name) in err for name in (TARGETS if argv == ["nope"] else FLOWS))


_HELP_WITHOUT_TORCH = """
import contextlib, sys
from flowkit.cli import main
with contextlib.suppress(SystemExit):
    main(["boltzmann", "--help"])
assert "torch" not in sys.modules, "flowkit boltzmann --help imported torch"
"""


def test_boltzmann_help_imports_no_torch():
    result = subprocess.run([sys.executable, "-c", _HELP_WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "alanine-dipeptide" in result.stdout


@pytest.mark.parametrize(
    ("argv", "plots"),
    [
        (["gmm", "--flow", "nsf-coupling", "--samples", "200"], {"density.png", "target.png"}),
        (["many-well", "--dim", "4"], set()),  # many-well: no plot
    ],
)
def test_boltzmann_gmm_with_nsf_and_many_well(tmp_path, argv, plots):
    from flowkit.cli.boltzmann import OUTPUTS

    out = tmp_path / "run"
    args = ["boltzmann", *argv, "--steps", "3", "--transforms", "2", "--hidden", "8", "--eval-samples", "200"]
    assert main([*args, "--imh-steps", "20", "--no-progress", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["target"] == argv[0] and ("modes_covered" in metrics) == (argv[0] == "gmm")
    plot_files = set(OUTPUTS) - {"model", "metrics.json", "history.csv"}
    assert {p.name for p in out.iterdir()} & plot_files == plots


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("option", "clip"), [([], 10.0), (["--clip", "3"], 3.0), (["--clip", "0"], float("inf"))])
def test_boltzmann_clips_at_the_objective_default_unless_told(tmp_path, monkeypatch, option, clip):
    from flowkit.train.loop import _Arguments

    seen = []

    def fit(flow, objective, **kwargs):  # the clip fit would use, then stop before training
        seen.append(_Arguments(flow, objective, None, **{"epochs": None, **_FIT_DEFAULTS, **kwargs}).clip)
        raise _Stop

    monkeypatch.setattr(flowkit.train, "fit", fit)  # the command imports it when it runs
    args = ["boltzmann", "double-well", "--steps", "2", "--transforms", "1", "--hidden", "4", "--no-progress"]
    with pytest.raises(_Stop):
        main([*args, *option, "--out", str(tmp_path / "run")])
    assert seen == [clip]


def test_flow_nsf_is_still_the_coupling_nsf_with_a_future_warning(tmp_path, monkeypatch, capsys):
    """Issue 39: `--flow nsf` was the coupling NSF here and the autoregressive one in `flowkit fit`."""
    built = []

    def fit(flow, objective, **kwargs):
        built.append(flow)
        raise _Stop

    monkeypatch.setattr(flowkit.train, "fit", fit)
    args = ["boltzmann", "double-well", "--steps", "2", "--transforms", "2", "--hidden", "4", "--no-progress"]
    for name in ("nsf", "nsf-coupling"):
        with pytest.raises(_Stop):
            main([*args, "--flow", name, "--out", str(tmp_path / name)])
    err = capsys.readouterr().err
    assert "flowkit boltzmann: warning: --flow nsf is nsf-coupling; it will mean the nsf of flowkit fit" in err
    assert err.count("warning") == 1
    old, new = (flow.state_dict() for flow in built)
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)  # the same flow, bit for bit


def test_boltzmann_refuses_a_negative_clip(tmp_path, usage_error):
    bad = usage_error(["boltzmann", "double-well", "--clip", "-1", "--steps", "1", "--out", str(tmp_path)])
    assert "argument --clip: must be a non-negative number" in bad


_FIT_DEFAULTS = dict(
    batch_size=256, lr=1e-3, optimizer=None, schedule="cosine", clip=None, val_data=None, patience=None,
    checkpoint_dir=None, resume=False, progress=False, seed=None, val_every=None, checkpoint_every=1000,
    restore_best=None, ddp_options=None, ema=None, callbacks=(),
)  # fmt: skip
